//! The order of the requests one set of source descriptors has sent, as the source's client
//! sees it.
//!
//! **Contract.** [`ReadPattern::note`] is told every read of the descriptors (its first byte,
//! its length, and whether it is a read of an ordered stream) and counts the reads outside a
//! stream that did not start where the one before ended: [`ReadPattern::scattered`]. A stream's
//! own jumps (a loader that reads tensors out of file order, and the read-ahead that follows
//! it) are not counted: a fresh handle would see them too. It is advisory (readers racing on the descriptors may each see
//! the other's read as the one before), never a correctness input: it only decides when tierfs
//! gives a store's client a fresh handle for an ordered stream ([`super::slot`]).
//!
//! Why it matters: the clients of distributed stores judge a reader's pattern per open handle
//! and change how they fetch once it looks scattered. SeaweedFS's `weed mount` switches a
//! handle to small ranged fetches without read-ahead after out-of-order reads, and keeps it
//! there while any descriptor of the file is open (its handles are per inode); mountpoint-s3
//! and rclone restart their read window at each seek. The probes of a load (one read at each
//! tensor's start) are such a pattern; the copy that follows is one ordered stream, and from a
//! fresh handle it is served at the store's sequential speed
//! ([measured](../../../docs/PERFORMANCE.md#a-fresh-handle-for-an-ordered-stream)).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts the reads of one set of descriptors that did not continue the read before.
#[derive(Debug, Default)]
pub struct ReadPattern {
    /// Where the latest read ended (0 before any: a first read at 0 continues nothing and is
    /// not counted, as a client sees a read from the start of a fresh handle).
    next: AtomicU64,
    scattered: AtomicU64,
}

impl ReadPattern {
    /// A read of `len` bytes at `offset` was sent; `in_stream`: by an ordered stream.
    pub fn note(&self, offset: u64, len: u64, in_stream: bool) {
        let before = self
            .next
            .swap(offset.saturating_add(len), Ordering::Relaxed);
        if before != offset && !in_stream {
            self.scattered.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads outside an ordered stream that did not start where the one before ended.
    pub fn scattered(&self) -> u64 {
        self.scattered.load(Ordering::Relaxed)
    }

    /// Where the latest read ended.
    pub fn next(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_outside_a_stream_that_do_not_continue_the_one_before_are_scattered() {
        let p = ReadPattern::default();
        p.note(0, 100, false);
        p.note(100, 50, false);
        assert_eq!(
            p.scattered(),
            0,
            "reads from the start in order are not scattered"
        );
        p.note(4096, 10, false);
        p.note(0, 10, false);
        p.note(10, 10, false);
        assert_eq!(p.scattered(), 2);
        p.note(8192, 10, true);
        p.note(0, 10, true);
        assert_eq!(p.scattered(), 2, "a stream's own jumps are not counted");
        assert_eq!(p.next(), 10);
    }
}
