//! Per-operation counts, errors and latency of a front end's requests (`ops` in the stats).
//!
//! A front end (the FUSE adapter) wraps the work of each request in [`OpStats::time`]; a
//! snapshot turns the figures into count, errors, mean, p50 and p99 per operation.
//!
//! **Histogram.** Latencies go into the fixed log-linear buckets of [`crate::histogram`]: four
//! per power of two of nanoseconds, so a quantile read from them is at most 25 % above the true
//! value; the snapshot reports the bucket's upper bound, never an underestimate. 2 KiB per
//! operation. Recording is two relaxed `fetch_add`s (the bucket
//! and the nanosecond sum), plus one for an error: lock-free, no allocation, nothing to
//! configure, and a snapshot can read it while requests go on. The `hdrhistogram` crate would
//! need `&mut` to record (a lock, or per-thread histograms merged by a reader thread) for
//! precision that a p99 shown with two digits does not use.
//!
//! **Cost.** Below the noise of the warm read path
//! ([measured](../../../docs/PERFORMANCE.md#cost-of-the-per-operation-stats)).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

pub use crate::histogram::HISTOGRAM_BOUNDS_NS;
use crate::histogram::{bucket, coarse, quantile_ns, CoarseHistogram, BUCKETS};

/// The operations that are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Open,
    Read,
    /// Listing a directory (the FUSE adapter lists it at `opendir`; `readdir` pages through it).
    Readdir,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Lookup, Op::Getattr, Op::Open, Op::Read, Op::Readdir];

    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Open => "open",
            Op::Read => "read",
            Op::Readdir => "readdir",
        }
    }
}

/// Counts and latency histogram of one operation.
#[derive(Debug)]
struct OpRecord {
    buckets: [AtomicU64; BUCKETS],
    errors: AtomicU64,
    total_ns: AtomicU64,
}

impl Default for OpRecord {
    fn default() -> Self {
        OpRecord {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            errors: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
        }
    }
}

impl OpRecord {
    fn record(&self, elapsed: Duration, failed: bool) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn histogram(&self) -> OpHistogram {
        coarse(
            self.buckets.iter().map(|b| b.load(Ordering::Relaxed)),
            self.total_ns.load(Ordering::Relaxed),
        )
    }

    fn snapshot(&self) -> OpSnapshot {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let count: u64 = counts.iter().sum();
        let quantile = |q: f64| quantile_ns(&counts, q).map_or(0.0, |ns| ns as f64 / 1e3);
        let total_ns = self.total_ns.load(Ordering::Relaxed);
        OpSnapshot {
            count,
            errors: self.errors.load(Ordering::Relaxed),
            mean_us: if count == 0 {
                0.0
            } else {
                total_ns as f64 / count as f64 / 1e3
            },
            p50_us: quantile(0.50),
            p99_us: quantile(0.99),
        }
    }
}

/// The latency histogram of one operation in coarse buckets, for monitoring systems.
pub type OpHistogram = CoarseHistogram;

/// The figures of every [`Op`].
#[derive(Debug, Default)]
pub struct OpStats {
    records: [OpRecord; Op::ALL.len()],
}

impl OpStats {
    /// Runs `work`, the whole of one `op` request, and records its latency, and an error if it
    /// returned one. The caller replies to the request after this returns, so the figures
    /// are the daemon's own time, without the kernel's queueing or the reply's copy.
    pub fn time<T, E>(&self, op: Op, work: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let started = Instant::now();
        let result = work();
        self.record(op, started.elapsed(), result.is_err());
        result
    }

    pub fn record(&self, op: Op, elapsed: Duration, failed: bool) {
        self.records[op as usize].record(elapsed, failed);
    }

    /// Every operation's latency histogram in the coarse buckets of [`HISTOGRAM_BOUNDS_NS`].
    pub fn histograms(&self) -> Vec<(Op, OpHistogram)> {
        Op::ALL
            .iter()
            .map(|&op| (op, self.records[op as usize].histogram()))
            .collect()
    }

    pub fn snapshot(&self) -> OpsSnapshot {
        let get = |op: Op| self.records[op as usize].snapshot();
        OpsSnapshot {
            lookup: get(Op::Lookup),
            getattr: get(Op::Getattr),
            open: get(Op::Open),
            read: get(Op::Read),
            readdir: get(Op::Readdir),
        }
    }
}

/// One operation in the `ops` section of the stats document.
#[derive(Debug, Clone, Serialize)]
pub struct OpSnapshot {
    /// Requests handled.
    pub count: u64,
    /// Of those, answered with an error.
    pub errors: u64,
    /// Mean latency in microseconds (exact).
    pub mean_us: f64,
    /// Median and 99th percentile in microseconds: the upper bound of the histogram bucket the
    /// quantile falls in, so at most 25 % above the true value.
    pub p50_us: f64,
    pub p99_us: f64,
}

/// `ops` section of the stats document.
#[derive(Debug, Clone, Serialize)]
pub struct OpsSnapshot {
    pub lookup: OpSnapshot,
    pub getattr: OpSnapshot,
    pub open: OpSnapshot,
    pub read: OpSnapshot,
    pub readdir: OpSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_counts_and_errors() {
        let stats = OpStats::default();
        for us in 1..=100u64 {
            stats.record(Op::Read, Duration::from_micros(us), false);
        }
        let _ = stats.time(Op::Lookup, || Err::<(), _>("nope"));
        let _ = stats.time(Op::Lookup, || Ok::<_, ()>(1));
        let s = stats.snapshot();
        assert_eq!((s.read.count, s.read.errors), (100, 0));
        assert!((s.read.mean_us - 50.5).abs() < 1e-9);
        // True p50 is 50 µs, p99 99 µs: reported as bucket upper bounds, within 25 % above.
        assert!(
            s.read.p50_us >= 50.0 && s.read.p50_us <= 50.0 * 1.25,
            "{s:?}"
        );
        assert!(
            s.read.p99_us >= 99.0 && s.read.p99_us <= 99.0 * 1.25,
            "{s:?}"
        );
        assert_eq!((s.lookup.count, s.lookup.errors), (2, 1));
        assert_eq!((s.open.count, s.open.p50_us, s.open.p99_us), (0, 0.0, 0.0));
    }

    #[test]
    fn coarse_histogram_counts_each_latency_below_its_bound() {
        let stats = OpStats::default();
        // 1023 ns and 1024 ns straddle the first bound; 20 s is past the last one.
        for ns in [500, 1023, 1024, 4095, 4096, 20_000_000_000] {
            stats.record(Op::Read, Duration::from_nanos(ns), false);
        }
        let histograms = stats.histograms();
        let Some((_, read)) = histograms.iter().find(|(op, _)| *op == Op::Read) else {
            panic!("no read histogram");
        };
        assert_eq!(read.count, 6);
        let counts: Vec<u64> = read.buckets.iter().map(|b| b.1).collect();
        assert_eq!(&counts[..3], &[2, 2, 1]);
        assert_eq!(counts.iter().sum::<u64>(), 5, "20 s is in +Inf only");
        assert!((read.sum_seconds - 20.000_010_738).abs() < 1e-9, "{read:?}");
        assert!((read.buckets[0].0 - 1.024e-6).abs() < 1e-15);
    }

    #[test]
    fn recording_from_many_threads_loses_nothing() {
        let stats = OpStats::default();
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let stats = &stats;
                scope.spawn(move || {
                    for i in 0..10_000u64 {
                        stats.record(Op::Getattr, Duration::from_nanos(i * t), i % 10 == 0);
                    }
                });
            }
        });
        let s = stats.snapshot().getattr;
        assert_eq!((s.count, s.errors), (40_000, 4_000));
    }
}
