//! What measuring the source's reads costs ([`tierfs_core::source::meter`]): the meter's own
//! time per read (its issue and completion, one thread, and four threads on one meter), and
//! the time of small source reads with and without it, A/B alternating in the same process.
//!
//! `cargo run --release -p tierfs-core --example source_meter_cost [DIR]`
//!
//! The reads are `SourceFile::read_at`s of 256 KiB (smaller than any chunk, so the meter's share
//! is the largest it gets) from a 64 MiB file in DIR (default `/dev/shm`, tmpfs: no device time,
//! only the copy, which makes the meter's share as large as it can be). Results: the "Source"
//! section of [docs/STATS.md](../../docs/STATS.md#source).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tierfs_core::source::meter::{MeterConfig, MonotonicClock, SourceMeter, SourceMeters};
use tierfs_core::source::SourceFile;

const FILE: usize = 64 << 20;
const READ: usize = 256 << 10;
const ROUNDS: usize = 20;
const READS_PER_ROUND: usize = 4_000;
const PAIRS: u64 = 2_000_000;

/// Nanoseconds per start/finish pair on one meter, from `threads` threads at once.
fn pairs_ns(meter: &SourceMeter, threads: u64) -> f64 {
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..PAIRS / threads {
                    meter.start().finish(READ as u64);
                }
            });
        }
    });
    started.elapsed().as_nanos() as f64 / (PAIRS / threads) as f64
}

/// Time of `READS_PER_ROUND` reads of `source`, walking the file.
fn reads(source: &SourceFile, buf: &mut [u8]) -> Result<Duration, Box<dyn std::error::Error>> {
    let started = Instant::now();
    for i in 0..READS_PER_ROUND {
        let offset = (i * READ) % FILE;
        source.read_at(buf, offset as u64)?;
    }
    Ok(started.elapsed())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let meter = SourceMeter::new(
        1,
        MeterConfig::default(),
        Arc::new(MonotonicClock::default()),
    );
    println!(
        "meter, start + finish per read: {:.0} ns (1 thread), {:.0} ns (4 threads on one meter)",
        pairs_ns(&meter, 1),
        pairs_ns(&meter, 4)
    );

    let dir = std::env::args().nth(1).unwrap_or_else(|| "/dev/shm".into());
    let path = std::path::Path::new(&dir).join(format!("source-meter-cost-{}", std::process::id()));
    std::fs::write(&path, vec![7u8; FILE])?;
    let plain = SourceFile::open(&path)?;
    let meters = SourceMeters::default();
    let metered = SourceFile::open(&path)?.metered(&meters);
    let mut buf = vec![0u8; READ];
    let (mut without, mut with) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..ROUNDS {
        without += reads(&plain, &mut buf)?;
        with += reads(&metered, &mut buf)?;
    }
    std::fs::remove_file(&path)?;
    let per_read = |total: Duration| total.as_nanos() as f64 / (ROUNDS * READS_PER_ROUND) as f64;
    println!(
        "{} KiB reads from {dir}: {:.0} ns without the meter, {:.0} ns with it: {:.3}x the time",
        READ >> 10,
        per_read(without),
        per_read(with),
        with.as_secs_f64() / without.as_secs_f64()
    );
    let device = &meters.snapshot()[0];
    println!(
        "metered: {} reads, p50 {:.1} µs, {:.0} MiB/s while reading",
        device.reads,
        device.latency_p50_us.unwrap_or(0.0),
        device.throughput_bytes_per_second.unwrap_or(0.0) / f64::from(1 << 20)
    );
    Ok(())
}
