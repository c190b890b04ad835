//! Log-linear latency buckets: the one histogram of the core, shared by the per-operation stats
//! (`stats::ops`) and the source meter (`source::meter`).
//!
//! **Contract.** [`bucket`] puts every `u64` of nanoseconds in one of [`BUCKETS`] fixed buckets,
//! four per power of two (the scheme of HdrHistogram with two significant bits), so a bucket
//! spans at most 25 % of its lower bound and a quantile read from it ([`quantile_ns`]) is at most
//! 25 % above the true value: the bucket's upper bound, never an underestimate. 4 × 64 buckets
//! cover every `u64` in 2 KiB of counters. [`coarse`] sums them into the buckets of
//! [`HISTOGRAM_BOUNDS_NS`] that monitoring systems get, exactly (each coarse bound is the lower
//! bound of a fine bucket). The counters are the caller's (atomics, or plain integers under a
//! lock); this module holds no state.

/// Sub-buckets per power of two: 2 bits, so a bucket is 25 % of its lower bound wide.
const SUB_BITS: u32 = 2;
const SUB: usize = 1 << SUB_BITS;
/// Buckets covering every `u64` of nanoseconds.
pub const BUCKETS: usize = SUB * 64;

/// The bucket of a latency of `ns` nanoseconds.
pub fn bucket(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros(); // >= SUB_BITS
    let sub = (ns >> (exp - SUB_BITS)) as usize & (SUB - 1);
    SUB + (exp - SUB_BITS) as usize * SUB + sub
}

/// The largest latency, in nanoseconds, that falls into `index`.
pub fn bucket_upper(index: usize) -> u64 {
    if index < SUB {
        return index as u64;
    }
    let exp = (index - SUB) / SUB + SUB_BITS as usize;
    let sub = ((index - SUB) % SUB) as u64;
    let width = 1u64 << (exp - SUB_BITS as usize);
    (SUB as u64 + sub)
        .saturating_mul(width)
        .saturating_add(width - 1)
}

/// The `q` quantile (0 < q ≤ 1) of the latencies counted in `counts` (one count per bucket),
/// as the upper bound of the smallest bucket holding at least `ceil(q × total)` of them;
/// `None` when `counts` holds none.
pub fn quantile_ns(counts: &[u64], q: f64) -> Option<u64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (index, n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(bucket_upper(index));
        }
    }
    None
}

/// Upper bounds (exclusive, in nanoseconds) of the coarse buckets given to monitoring systems:
/// powers of four from 1 µs (1 024 ns) to 17 s, each the lower bound of a fine bucket, so a
/// coarse count is the exact sum of fine ones. Latencies of 17 s or more are counted in the
/// total only (the `+Inf` bucket).
pub const HISTOGRAM_BOUNDS_NS: [u64; 13] = [
    1 << 10,
    1 << 12,
    1 << 14,
    1 << 16,
    1 << 18,
    1 << 20,
    1 << 22,
    1 << 24,
    1 << 26,
    1 << 28,
    1 << 30,
    1 << 32,
    1 << 34,
];

/// A latency histogram in the coarse buckets of [`HISTOGRAM_BOUNDS_NS`], for monitoring
/// systems.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CoarseHistogram {
    pub count: u64,
    pub sum_seconds: f64,
    /// `(upper bound in seconds, latencies below it and at or above the previous bound)`.
    pub buckets: Vec<(f64, u64)>,
}

/// The fine `counts` (one per bucket, [`BUCKETS`] of them) and their sum of nanoseconds in
/// the coarse buckets of [`HISTOGRAM_BOUNDS_NS`].
pub fn coarse(counts: impl IntoIterator<Item = u64>, sum_ns: u64) -> CoarseHistogram {
    let mut buckets: Vec<(f64, u64)> = HISTOGRAM_BOUNDS_NS
        .iter()
        .map(|&bound| (bound as f64 / 1e9, 0))
        .collect();
    let mut count = 0;
    for (index, n) in counts.into_iter().enumerate() {
        count += n;
        // Every latency of a fine bucket is at most its upper bound, below the first coarse
        // bound above it: the coarse counts are exact.
        let upper = bucket_upper(index);
        if let Some(slot) = HISTOGRAM_BOUNDS_NS.iter().position(|&b| upper < b) {
            buckets[slot].1 += n;
        }
    }
    CoarseHistogram {
        count,
        sum_seconds: sum_ns as f64 / 1e9,
        buckets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_lands_in_a_bucket_whose_bounds_hold_it() {
        let mut values = vec![0, 1, 2, 3, 4, 5, 7, 8, 9, 1000, 1023, 1024, 1025, u64::MAX];
        values.extend((0..64).map(|shift| 1u64 << shift));
        values.extend((1..64).map(|shift| (1u64 << shift) - 1));
        for v in values {
            let index = bucket(v);
            assert!(index < BUCKETS, "{v}");
            assert!(v <= bucket_upper(index), "{v} above its bucket {index}");
            if index > 0 {
                assert!(v > bucket_upper(index - 1), "{v} below its bucket {index}");
            }
            // The bucket is at most 25 % wider than its lower bound.
            let lower = if index == 0 {
                0
            } else {
                bucket_upper(index - 1) + 1
            };
            assert!(bucket_upper(index) - lower <= lower / 4, "{v}");
        }
    }

    #[test]
    fn quantiles_are_bucket_upper_bounds_at_or_above_the_true_value() {
        let mut counts = [0u64; BUCKETS];
        assert_eq!(quantile_ns(&counts, 0.5), None);
        for us in 1..=100u64 {
            counts[bucket(us * 1000)] += 1;
        }
        let p50 = quantile_ns(&counts, 0.5).unwrap();
        let p99 = quantile_ns(&counts, 0.99).unwrap();
        assert!((50_000..=62_500).contains(&p50), "{p50}");
        assert!((99_000..=123_750).contains(&p99), "{p99}");
        assert!(quantile_ns(&counts, 1e-9).unwrap() >= 1000);
    }
}
