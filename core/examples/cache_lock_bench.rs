//! How long `drop`, a budget shrink and the stats' residency strips hold the cache lock, for a
//! full 16 GiB cache (the strips read the chunk marks, which take no lock: their row shows the
//! probe's noise floor).
//!
//! `cargo run --release -p tierfs-core --example cache_lock_bench [TOUCHED_GIB]`
//!
//! The cache is filled with 4 096 chunks of 4 MiB (4 files of 64 blocks of 16 chunks, so that
//! eviction ranks real blocks), each in its own anonymous mapping. Only the first TOUCHED_GIB
//! (default 2) are written to: 16 GiB of resident memory is more than a shared test machine
//! has, and the lock hold does not depend on it (unmapping happens after the lock is released),
//! while the unmap figure does, so it is measured on the touched part.
//!
//! A probe thread takes the cache lock in a loop ([`ChunkCache::budget`]) and records the
//! longest it waited, which is the longest the lock was held by the operation (plus scheduling
//! noise). The operation's whole time, unmapping included, is the baseline: how long the lock
//! would be held if unmapping were done under it. Results: the `cache_lock_bench` row of
//! [docs/PERFORMANCE.md](../../docs/PERFORMANCE.md#the-benchmarks).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tierfs_core::cache::{ChunkCache, ChunkKey, ChunkMarks, ChunkOwner, Want};
use tierfs_core::reader::ReaderTracker;
use tierfs_core::source::{AlignedBytes, SourceError};
use tierfs_core::stats::Counters;

const CHUNK: u64 = 4 << 20;
const FILES: u64 = 4;
const BLOCKS: usize = 64;
const CHUNKS_PER_BLOCK: u64 = 16;
const BUDGET: u64 = FILES * BLOCKS as u64 * CHUNKS_PER_BLOCK * CHUNK; // 16 GiB

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let touched_gib: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(2);
    let cache = Arc::new(ChunkCache::new(BUDGET, Arc::new(Counters::default())));
    let marks: Vec<Arc<ChunkMarks>> = (0..FILES)
        .map(|_| Arc::new(ChunkMarks::new(BLOCKS * CHUNKS_PER_BLOCK as usize)))
        .collect();
    println!(
        "cache: {} GiB budget, {} chunks of {} MiB; {touched_gib} GiB touched",
        BUDGET >> 30,
        BUDGET / CHUNK,
        CHUNK >> 20
    );
    let drop_all = |cache: &ChunkCache| cache.clear();
    let shrink = |cache: &ChunkCache| cache.set_budget(BUDGET / 16);
    // What one stats document does: every chunk's state of every file.
    let strips = |_: &ChunkCache| {
        for marks in &marks {
            std::hint::black_box(marks.states());
        }
    };
    for (name, op) in [
        (
            "residency strips (4 files)",
            &strips as &dyn Fn(&ChunkCache),
        ),
        ("drop (all 16 GiB)", &drop_all),
        ("shrink 16 GiB -> 1 GiB", &shrink),
    ] {
        cache.set_budget(BUDGET);
        fill(&cache, &marks, touched_gib << 30)?;
        let (hold, total) = measure(&cache, op);
        println!(
            "{name:26} lock held at most {:8.3} ms; whole operation (unmapping included, the \
             old lock hold) {:8.3} ms; ratio {:.4}",
            ms(hold),
            ms(total),
            hold.as_secs_f64() / total.as_secs_f64()
        );
    }
    Ok(())
}

fn fill(cache: &ChunkCache, marks: &[Arc<ChunkMarks>], touched: u64) -> std::io::Result<()> {
    let ones = vec![1u8; CHUNK as usize];
    let mut filled = 0;
    for (file, marks) in (1..=FILES).zip(marks) {
        let tracker = Arc::new(ReaderTracker::new(BLOCKS, None));
        for block in 0..BLOCKS {
            let owner = ChunkOwner {
                tracker: Arc::clone(&tracker),
                block,
                marks: Arc::clone(marks),
                codec: Default::default(),
                lower: None,
            };
            for c in 0..CHUNKS_PER_BLOCK {
                let key = ChunkKey {
                    file,
                    chunk: (block as u64 * CHUNKS_PER_BLOCK + c) as u32,
                };
                let touch = filled < touched;
                cache
                    .get_or_load(key, CHUNK, Want::Read, Some(&owner), || {
                        // A copy writes (so faults in) every page; an untouched mapping costs
                        // no memory.
                        let bytes = if touch {
                            AlignedBytes::copy_of(&ones)
                        } else {
                            AlignedBytes::anonymous(CHUNK as usize)
                        };
                        bytes.map_err(|source| SourceError::Alloc {
                            len: CHUNK as usize,
                            source,
                        })
                    })
                    .map_err(std::io::Error::other)?;
                filled += CHUNK;
            }
        }
    }
    Ok(())
}

/// Runs `op` while a probe thread keeps taking the lock; returns the probe's longest wait and
/// the operation's whole time.
fn measure(cache: &Arc<ChunkCache>, op: &dyn Fn(&ChunkCache)) -> (Duration, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let longest = Arc::new(AtomicU64::new(0));
    let probe = {
        let (cache, stop, longest) = (Arc::clone(cache), Arc::clone(&stop), Arc::clone(&longest));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let _ = cache.budget();
                longest.fetch_max(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        })
    };
    thread::sleep(Duration::from_millis(20)); // the probe is running
    let started = Instant::now();
    op(cache);
    let total = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = probe.join();
    (Duration::from_nanos(longest.load(Ordering::Relaxed)), total)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
