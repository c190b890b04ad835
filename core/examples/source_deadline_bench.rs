//! What bounding source reads in time costs a healthy read: the same chunk reads with
//! `--source-timeout 0` (the read on the caller's thread) and with the default timeout (the
//! read on an I/O thread, the caller waiting on a channel), alternated in rounds in one process.
//!
//! `cargo run --release -p tierfs-core --example source_deadline_bench [FILE_DIR] [ROUNDS]`
//!
//! The file (64 MiB, written once) lives in FILE_DIR (default `/dev/shm`: a source in RAM, whose
//! reads are the cheapest there are, so the hop's share is the largest it can be). Each round
//! reads the whole file in 4 MiB, 1 MiB and 4 KiB chunks both ways (the last shows the hop
//! alone); the figure is the median time per chunk read and the ratio of the two. Results:
//! docs/RELIABILITY.md, "Source reads in bounded time".

use std::sync::Arc;
use std::time::{Duration, Instant};

use tierfs_core::source::deadline::{SourceIo, SourceIoConfig};
use tierfs_core::source::slot::SourceSlot;
use tierfs_core::source::{PlainPaths, SourceFile};

const FILE_BYTES: u64 = 64 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "/dev/shm".into());
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(15);
    let path = std::path::Path::new(&dir)
        .join(format!("tierfs-deadline-bench-{}.bin", std::process::id()));
    let bytes: Vec<u8> = (0..FILE_BYTES).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&path, &bytes)?;
    let result = run(&path, rounds);
    std::fs::remove_file(&path)?;
    result
}

fn run(path: &std::path::Path, rounds: usize) -> Result<(), Box<dyn std::error::Error>> {
    let source = Arc::new(SourceFile::open(path)?);
    let slot = |timeout| {
        SourceSlot::new(
            &source,
            None,
            Arc::new(PlainPaths),
            Arc::new(SourceIo::new(SourceIoConfig {
                timeout,
                ..SourceIoConfig::DEFAULT
            })),
        )
    };
    let inline = slot(None);
    let bounded = slot(SourceIoConfig::DEFAULT.timeout);
    println!(
        "source in {}, {} MiB, {rounds} rounds",
        path.parent()
            .map_or("?".into(), |p| p.display().to_string()),
        FILE_BYTES >> 20
    );
    for chunk in [4u64 << 20, 1 << 20, 4 << 10] {
        let (mut plain, mut hop) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            plain.push(pass(&inline, chunk)?);
            hop.push(pass(&bounded, chunk)?);
        }
        let (p, h) = (median(&mut plain), median(&mut hop));
        println!(
            "{} KiB chunks: on the caller's thread {:.1} us/read, on an I/O thread {:.1} us/read: \
             ratio {:.3} ({:+.1} us per read)",
            chunk >> 10,
            p.as_secs_f64() * 1e6,
            h.as_secs_f64() * 1e6,
            h.as_secs_f64() / p.as_secs_f64(),
            (h.as_secs_f64() - p.as_secs_f64()) * 1e6
        );
    }
    Ok(())
}

/// One pass over the file in `chunk`-byte reads: time per read.
fn pass(slot: &SourceSlot, chunk: u64) -> Result<Duration, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut n = 0u32;
    let mut start = 0;
    while start < FILE_BYTES {
        let got = slot.read_aligned(start, start + chunk)?;
        std::hint::black_box(got.as_slice()[0]);
        start += chunk;
        n += 1;
    }
    Ok(started.elapsed() / n)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}
