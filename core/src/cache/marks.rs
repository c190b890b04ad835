//! Where each chunk of one file version is, readable without the cache's lock: what the stats'
//! residency strips ([`crate::stats::residency`]) are drawn from.
//!
//! **Contract.** [`ChunkMarks::state`] says whether a chunk is resident, being read for a
//! reader, being prefetched, was read once and is no longer held, or was never read. The cache
//! sets the marks at each of these transitions, under the lock it holds for the transition
//! anyway; the stats read them with plain atomic loads and take no lock, so drawing strips,
//! however often and however large the model, never makes a reader wait
//! ([measured](../../../docs/PERFORMANCE.md#residency-marks-without-the-cache-lock)).
//!
//! One byte per chunk: a 45 GB model in 4 MiB chunks takes 11 KiB. A strip read while the
//! cache works may mix states from just before and just after a transition; each chunk's own
//! state is always one the chunk was in.

use std::sync::atomic::{AtomicU8, Ordering};

use super::{ChunkState, Want};

/// In memory.
const RESIDENT: u8 = 1;
/// Being read from the disk, a reader waiting for it.
const READING: u8 = 2;
/// Being read from the disk by a prefetch nobody waits for yet.
const PREFETCHING: u8 = 4;
/// Read from the disk at least once.
const READ_ONCE: u8 = 8;

/// The marks of one file version's chunks.
#[derive(Debug)]
pub struct ChunkMarks(Box<[AtomicU8]>);

impl ChunkMarks {
    /// Marks for `chunks` chunks, none read yet.
    pub fn new(chunks: usize) -> ChunkMarks {
        ChunkMarks((0..chunks).map(|_| AtomicU8::new(0)).collect())
    }

    pub fn state(&self, chunk: usize) -> ChunkState {
        let Some(mark) = self.0.get(chunk) else {
            return ChunkState::NeverRead;
        };
        let mark = mark.load(Ordering::Relaxed);
        if mark & RESIDENT != 0 {
            ChunkState::Resident
        } else if mark & READING != 0 {
            ChunkState::Reading
        } else if mark & PREFETCHING != 0 {
            ChunkState::Prefetching
        } else if mark & READ_ONCE != 0 {
            ChunkState::Evicted
        } else {
            ChunkState::NeverRead
        }
    }

    /// Every chunk's state, in chunk order.
    pub fn states(&self) -> Vec<ChunkState> {
        (0..self.0.len()).map(|chunk| self.state(chunk)).collect()
    }

    /// A read of `chunk` started, for a reader or a prefetch.
    pub(super) fn loading(&self, chunk: usize, want: Want) {
        let bit = match want {
            Want::Read => READING,
            Want::Prefetch => PREFETCHING,
        };
        self.update(chunk, |mark| mark | bit);
    }

    /// A reader waits for the read of `chunk` in flight.
    pub(super) fn awaited(&self, chunk: usize) {
        self.update(chunk, |mark| (mark & !PREFETCHING) | READING);
    }

    /// The read of `chunk` ended: read (and `resident` if it was kept), or failed.
    pub(super) fn loaded(&self, chunk: usize, read: bool, resident: bool) {
        self.update(chunk, |mark| {
            let mut mark = mark & !(READING | PREFETCHING);
            if read {
                mark |= READ_ONCE;
            }
            if resident {
                mark |= RESIDENT;
            }
            mark
        });
    }

    /// `chunk` left memory.
    pub(super) fn released(&self, chunk: usize) {
        self.update(chunk, |mark| mark & !RESIDENT);
    }

    /// Every change is made under the cache's lock, so a load and a store cannot lose one; the
    /// stats' loads need no more than `Relaxed` (each byte is one state, nothing else hangs on it).
    fn update(&self, chunk: usize, change: impl FnOnce(u8) -> u8) {
        if let Some(mark) = self.0.get(chunk) {
            mark.store(change(mark.load(Ordering::Relaxed)), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_goes_through_every_state() {
        let marks = ChunkMarks::new(2);
        assert_eq!(marks.state(0), ChunkState::NeverRead);
        marks.loading(0, Want::Prefetch);
        assert_eq!(marks.state(0), ChunkState::Prefetching);
        marks.awaited(0);
        assert_eq!(marks.state(0), ChunkState::Reading);
        marks.loaded(0, true, true);
        assert_eq!(marks.state(0), ChunkState::Resident);
        marks.released(0);
        assert_eq!(marks.state(0), ChunkState::Evicted);
        marks.loading(0, Want::Read);
        assert_eq!(marks.state(0), ChunkState::Reading);
        marks.loaded(0, false, false);
        assert_eq!(
            marks.state(0),
            ChunkState::Evicted,
            "read once before the failure"
        );
        marks.loading(1, Want::Read);
        marks.loaded(1, false, false);
        assert_eq!(
            marks.state(1),
            ChunkState::NeverRead,
            "a failed read reads nothing"
        );
        marks.loading(1, Want::Read);
        marks.loaded(1, true, false);
        assert_eq!(marks.state(1), ChunkState::Evicted, "read, not kept");
        assert_eq!(marks.state(7), ChunkState::NeverRead, "out of range");
        assert_eq!(
            marks.states(),
            vec![ChunkState::Evicted, ChunkState::Evicted]
        );
    }
}
