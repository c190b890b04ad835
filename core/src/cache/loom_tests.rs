//! Model-checked tests of the cache's locking (single flight, accounting, eviction, resizing):
//! loom runs each body under every interleaving of its threads, up to [`PREEMPTIONS`]
//! preemptions, and fails on a deadlock, a lost wake-up or a failed assertion in any of them.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p tierfs-core --release loom` (tests/run.sh
//! does). Chunks here are a few bytes in their own page (footprint 4 KiB), so a budget of
//! `n * PAGE` holds `n` chunks.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use loom::thread;

use super::*;

/// Preemptions explored per execution: 2 covers every bug class here (a lost wake-up needs one
/// preemption between a check and a wait, a stale entry one between a load and its cleanup)
/// while keeping each test to seconds; every test here ran with 3 too (minutes in all).
const PREEMPTIONS: usize = 2;

const PAGE: u64 = 4096;

fn model(body: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(PREEMPTIONS);
    builder.check(body);
}

fn key(chunk: u32) -> ChunkKey {
    ChunkKey { file: 1, chunk }
}

fn bytes_of(chunk: u32) -> [u8; 8] {
    [chunk as u8 + 1; 8]
}

fn cache(chunks: u64) -> Arc<ChunkCache> {
    Arc::new(ChunkCache::new(
        chunks * PAGE,
        Arc::new(Counters::default()),
    ))
}

/// Reads chunk `chunk` (bytes [`bytes_of`]), checking the bytes served.
fn read(cache: &ChunkCache, chunk: u32) -> Result<(), CacheError> {
    let (got, _) = cache.get_or_load(key(chunk), PAGE, Want::Read, None, || {
        Ok(AlignedBytes::copy_of(&bytes_of(chunk)).expect("a page of memory"))
    })?;
    assert_eq!(
        got.as_slice(),
        bytes_of(chunk),
        "wrong bytes for chunk {chunk}"
    );
    Ok(())
}

fn failing_read(cache: &ChunkCache, chunk: u32) -> Result<(), CacheError> {
    cache
        .get_or_load(key(chunk), PAGE, Want::Read, None, || {
            Err::<AlignedBytes, _>(SourceError::Truncated {
                path: "injected".into(),
                wanted_end: 8,
                got_end: 0,
            })
        })
        .map(|_| ())
}

/// A failing read and a second reader of the same chunk: whichever interleaving, both return
/// (the second with the shared error, or its own after the first read ended), nothing stays
/// registered, and the reservation is returned.
#[test]
fn loom_a_failing_read_wakes_its_waiter() {
    model(|| {
        let cache = cache(2);
        let other = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || failing_read(&cache, 0))
        };
        assert!(failing_read(&cache, 0).is_err());
        assert!(other.join().unwrap().is_err());
        cache.check_accounting();
        assert!(!cache.is_present(key(0)));
    });
}

/// A read that panics and a second reader of the same chunk: the second gets an error (if it
/// waited) or reads the chunk itself (if it came after); it never waits forever, and the
/// panicked read's reservation is returned.
#[test]
fn loom_a_panicking_read_wakes_its_waiter_and_returns_its_reservation() {
    model(|| {
        let cache = cache(2);
        let other = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || read(&cache, 0))
        };
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            let read = || -> Result<AlignedBytes, SourceError> { panic!("injected") };
            cache.get_or_load(key(0), PAGE, Want::Read, None, read)
        }));
        if let Ok(result) = panicked {
            // It found the other reader's read in flight or done: it never loaded.
            assert!(result.is_ok());
        }
        match other.join().unwrap() {
            Ok(()) | Err(CacheError::LoadPanicked) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
        cache.check_accounting();
    });
}

/// Three readers of distinct chunks on a budget of two: reads in flight are bounded by half
/// the budget (one chunk), so readers wait for room; all get their bytes, and the accounting
/// ends consistent and within the budget.
#[test]
fn loom_reads_in_flight_wait_for_room_and_the_accounting_balances() {
    model(|| {
        let cache = cache(2);
        let threads: Vec<_> = (1..3)
            .map(|chunk| {
                let cache = Arc::clone(&cache);
                thread::spawn(move || read(&cache, chunk))
            })
            .collect();
        read(&cache, 0).unwrap();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        cache.check_accounting();
        assert!(cache.snapshot().chunks <= 2);
    });
}

/// A reader of chunk 0 racing a reader that reads chunk 0 then chunk 1 on a budget of one
/// chunk (so chunk 1 evicts chunk 0, perhaps while the first reader holds it): every reader
/// gets the right bytes.
#[test]
fn loom_eviction_racing_reads_serves_the_right_bytes() {
    model(|| {
        let cache = cache(1);
        let other = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || read(&cache, 0))
        };
        read(&cache, 0).unwrap();
        read(&cache, 1).unwrap();
        other.join().unwrap().unwrap();
        cache.check_accounting();
    });
}

/// A budget shrink to nothing and a `drop` racing a read: the read gets its bytes, and once it
/// is done the cache holds nothing over the new budget (a chunk read while the budget shrank
/// does not stay resident past it).
#[test]
fn loom_resize_and_drop_racing_a_read_keep_the_bound() {
    model(|| {
        let cache = cache(2);
        let reader = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || read(&cache, 0))
        };
        cache.set_budget(0);
        cache.clear();
        reader.join().unwrap().unwrap();
        cache.check_accounting();
        assert_eq!(cache.snapshot().used_bytes, 0);
    });
}

/// A chunk of a page that compresses (its frame is far smaller than the page).
fn page_of(chunk: u32) -> Vec<u8> {
    (0..PAGE as usize)
        .map(|i| (i % 7) as u8 + chunk as u8)
        .collect()
}

fn read_page(cache: &ChunkCache, chunk: u32) {
    let (got, _) = cache
        .get_or_load(key(chunk), PAGE, Want::Read, None, || {
            Ok(AlignedBytes::copy_of(&page_of(chunk)).expect("a page of memory"))
        })
        .expect("a read");
    assert_eq!(
        got.as_slice(),
        page_of(chunk),
        "wrong bytes for chunk {chunk}"
    );
}

/// The compressor swaps a chunk for its frame while another thread reads it twice (a hit on
/// the raw chunk or on the frame, which makes a window): whichever interleaving, every reader
/// gets the chunk's bytes, and the accounting holds once both are done; in some interleavings
/// the chunk was compressed.
#[test]
fn loom_compressing_a_chunk_a_reader_hits() {
    model(|| {
        let config = CacheConfig {
            recently_read: std::time::Duration::ZERO,
            tier: TierConfig {
                mode: CompressMode::On,
                min_chunk_bytes: 1,
                ..TierConfig::default()
            },
            ..CacheConfig::default()
        };
        let cache = Arc::new(ChunkCache::with_config(
            4 * PAGE,
            Arc::new(Counters::default()),
            config,
        ));
        read_page(&cache, 0);
        let reader = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || {
                read_page(&cache, 0);
                read_page(&cache, 0);
            })
        };
        let mut encoder = crate::compress::Encoder::new(Default::default()).expect("an encoder");
        cache.compress_round(&mut encoder, &mut Vec::new(), true);
        reader.join().expect("the reader");
        if Counters::get(&cache.counters().encoded_bytes) == PAGE {
            COMPRESSED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        read_page(&cache, 0);
        cache.check_accounting();
    });
    // Where the reader got the chunk between the compressor's ranking and its pick, the chunk
    // was in use and stayed raw; in the others it was swapped under the reader.
    assert!(
        COMPRESSED.load(std::sync::atomic::Ordering::Relaxed),
        "never compressed"
    );
}

static COMPRESSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
