//! Which parts of a chunk readers have been served during one visit of its block, so the cache
//! can tell a chunk the reader has *finished* (needed again only at its next visit: evicted
//! first) from one it is still reading.
//!
//! Contract: a chunk is finished when every one of its [`GRANULES`] granules (128 KiB of a
//! 4 MiB chunk, the kernel's usual FUSE read size) was marked in the current visit; a granule is
//! marked when a read covers its *last* byte. Marks and the visit they belong to share one
//! atomic word: a read of a new visit starts the marks afresh without a lock, and marks are
//! idempotent (the same bytes read twice never finish a chunk early).
//!
//! Why a per-byte record and not a time window: a reader going through resident blocks at RAM
//! speed reads a whole block within any window short enough to be safe, so nothing behind it
//! would look consumed at its first miss. Marking by a granule's last byte lets reads that do
//! not start on a granule boundary finish a chunk (a sequential reader has served every byte
//! before the last one it got). The price: a read *starting* inside a granule marks it although
//! another thread may not have read its head yet; that chunk may be evicted and read again
//! (never wrong bytes), which needs reads smaller than a granule arriving out of order
//! ([measured](../../../docs/PERFORMANCE.md#eviction-in-repeated-passes)). It works together
//! with `ConsumedEvictions` (`evict.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Granules per chunk: the low 32 bits of the word are the marks, the high 32 the visit.
const GRANULES: u64 = 32;

/// The served granules of one chunk and the visit they belong to.
#[derive(Debug, Default)]
pub(super) struct Served(AtomicU64);

impl Served {
    /// Bytes `[start, end)` of a chunk of `len` bytes were served during `visit`.
    pub(super) fn mark(&self, visit: u64, start: u64, end: u64, len: u64) {
        let bits = granules(start, end.min(len), len);
        let visit = visit_tag(visit);
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                let marks = if word >> 32 == visit { word & MARKS } else { 0 };
                Some(visit << 32 | marks | bits)
            });
    }

    /// Whether every byte of a chunk of `len` bytes was served during `visit`.
    pub(super) fn finished(&self, visit: u64, len: u64) -> bool {
        let word = self.0.load(Ordering::Relaxed);
        len > 0 && word >> 32 == visit_tag(visit) && word & MARKS == all(len)
    }
}

const MARKS: u64 = (1 << GRANULES) - 1;

fn visit_tag(visit: u64) -> u64 {
    visit & 0xffff_ffff
}

/// Bytes per granule of a chunk of `len` bytes.
fn granule(len: u64) -> u64 {
    len.div_ceil(GRANULES).max(1)
}

/// The marks of every granule of a chunk of `len` bytes.
fn all(len: u64) -> u64 {
    let count = len.div_ceil(granule(len));
    (1u64 << count) - 1
}

/// The granules whose last byte lies in `[start, end)`.
fn granules(start: u64, end: u64, len: u64) -> u64 {
    if start >= end {
        return 0;
    }
    let size = granule(len);
    let first = start / size;
    // The last granule may be short: it ends at `len`.
    let stop = if end == len {
        len.div_ceil(size)
    } else {
        end / size
    };
    if stop <= first {
        return 0;
    }
    ((1u64 << (stop - first)) - 1) << first
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: u64 = 4 << 20;

    #[test]
    fn sequential_pieces_finish_the_chunk_at_the_last_byte() {
        let served = Served::default();
        let piece = 2 << 20;
        served.mark(7, 0, piece, LEN);
        assert!(!served.finished(7, LEN), "half a chunk is not finished");
        served.mark(7, piece, LEN, LEN);
        assert!(served.finished(7, LEN));
        assert!(!served.finished(8, LEN), "finished in visit 7, not in 8");
    }

    #[test]
    fn unaligned_sequential_reads_finish_the_chunk() {
        let served = Served::default();
        let mut at = 0;
        while at < LEN {
            let end = (at + 100_003).min(LEN);
            assert!(!served.finished(1, LEN));
            served.mark(1, at, end, LEN);
            at = end;
        }
        assert!(served.finished(1, LEN));
    }

    #[test]
    fn rereading_the_same_bytes_never_finishes_it() {
        let served = Served::default();
        for _ in 0..100 {
            served.mark(3, 0, LEN - 1, LEN);
        }
        assert!(!served.finished(3, LEN), "the last byte was never served");
    }

    #[test]
    fn a_new_visit_starts_afresh() {
        let served = Served::default();
        served.mark(1, 0, LEN, LEN);
        assert!(served.finished(1, LEN));
        served.mark(2, 0, LEN / 2, LEN);
        assert!(!served.finished(2, LEN));
        assert!(!served.finished(1, LEN));
    }

    #[test]
    fn short_and_odd_chunks() {
        for len in [1, 31, 32, 33, 4095, 3 * 4096 + 17] {
            let served = Served::default();
            served.mark(0, 0, len - 1, len);
            assert!(!served.finished(0, len), "len {len}: last byte unserved");
            served.mark(0, len - 1, len, len);
            assert!(served.finished(0, len), "len {len}");
        }
        assert!(!Served::default().finished(0, 0));
    }
}
