//! What tierfs knows about how one file version is being read: its learned block order, the
//! block the reader is in, and per-file prefetch figures.
//!
//! [`FileAccess`] is shared by the read path (which reports every block a reader touches), the
//! prefetcher (which asks which blocks come next, and drops queued work after a jump) and the
//! cache (which asks how soon a chunk's block is needed again, to evict the one needed furthest
//! in the future).
//!
//! **Trust.** Prefetching whole blocks ahead only pays when the reader really follows the order.
//! A block entered right after the block the order predicts is a *predicted* transition; only
//! then are the next blocks fetched. Any other transition is a *jump*: it bumps the file's
//! epoch, and queued block prefetches of the old epoch are dropped by the workers instead of
//! occupying the disk.
//!
//! **Depth** starts at one block ahead and grows by one (up to [`MAX_DEPTH`]) each time the
//! reader enters a predicted block that is not fully in memory yet, i.e. the disk could not
//! keep up with one block of lead; a reader that computes longer than the disk needs never
//! grows it.
//!
//! **Distance** (for eviction) is how many blocks ahead of the reader's current block a block
//! comes in cyclic order: the block the reader just left is needed last. (Its chunks that
//! straggling threads are still reading are protected by the cache's recency guard, which asks
//! [`FileAccess::is_previous`].)

use crate::sync::{lock, read, write, Mutex, MutexGuard, RwLock};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::prefetch::order::{AccessOrder, Touch};
use crate::prefetch::pace::ReaderPace;

/// Most blocks fetched ahead of the reader. Every block held ahead is a block less of the
/// resident set that repeated passes keep (and so one more block read per pass), so depth only
/// grows when the reader outruns one block of lead; a transformer block is 100–700 MiB in the
/// models this is for, and two of them are a second or more of disk time.
pub const MAX_DEPTH: usize = 2;

/// No block entered yet.
const NONE: usize = usize::MAX;

/// What a touch means for prefetching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Still in a block of the current pass.
    Stay,
    /// Entered a block for the first time in this pass; `predicted` if the order said so;
    /// `new_pass` if this touch started a new pass (the order may just have been learned).
    Entered { predicted: bool, new_pass: bool },
}

/// Access state of one file version.
#[derive(Debug)]
pub struct FileAccess {
    order: Mutex<AccessOrder>,
    /// `position[block]` in the order, readable without the order's lock (eviction scans it).
    position: RwLock<Vec<usize>>,
    current: AtomicUsize,
    /// The block the reader was in before `current`.
    previous: AtomicUsize,
    epoch: AtomicU64,
    /// Bumped each time the reader enters a block: chunks read in the current visit of the
    /// current block are consumed (see `cache::Chunk::distance`).
    visit: AtomicU64,
    depth: AtomicUsize,
    /// Whether the reader computes between blocks (see [`ReaderPace`]).
    pub pace: ReaderPace,
    pub counters: FileCounters,
}

/// Per-file figures for the stats.
#[derive(Debug, Default)]
pub struct FileCounters {
    pub prefetch_issued_bytes: AtomicU64,
    pub prefetch_used_bytes: AtomicU64,
    pub prefetch_wasted_bytes: AtomicU64,
    pub stall_ns: AtomicU64,
}

impl FileAccess {
    /// Access state for a file of `blocks` blocks, starting from a saved order when one fits.
    pub fn new(blocks: usize, saved: Option<AccessOrder>) -> FileAccess {
        let order = saved
            .filter(|o| o.blocks() == blocks)
            .unwrap_or_else(|| AccessOrder::new(blocks));
        let position = positions(&order);
        FileAccess {
            order: Mutex::new(order),
            position: RwLock::new(position),
            current: AtomicUsize::new(NONE),
            previous: AtomicUsize::new(NONE),
            epoch: AtomicU64::new(0),
            visit: AtomicU64::new(0),
            depth: AtomicUsize::new(1),
            pace: ReaderPace::default(),
            counters: FileCounters::default(),
        }
    }

    /// A reader touched `block`.
    pub fn touch(&self, block: usize) -> Step {
        let mut order = self.lock();
        let touch = order.touch(block);
        if touch == Touch::Again {
            return Step::Stay;
        }
        if touch == Touch::NewPass {
            *write(&self.position) = positions(&order);
        }
        self.visit.fetch_add(1, Ordering::Relaxed);
        self.pace.entered_block();
        let left = self.current.swap(block, Ordering::Relaxed);
        self.previous.store(left, Ordering::Relaxed);
        let predicted = left != NONE && order.next_after(left, 1).first() == Some(&block);
        if !predicted {
            self.epoch.fetch_add(1, Ordering::Relaxed);
        }
        Step::Entered {
            predicted,
            new_pass: touch == Touch::NewPass,
        }
    }

    /// Up to `count` blocks after `block` in the order.
    pub fn next_blocks(&self, block: usize, count: usize) -> Vec<usize> {
        self.lock().next_after(block, count)
    }

    /// The whole order (learned, else default), for warming a file.
    pub fn order(&self) -> Vec<usize> {
        self.lock().order().to_vec()
    }

    /// Bumped on every jump; block prefetches queued under an older epoch are stale.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// The reader entered a predicted block that prefetch had not finished: fetch further ahead.
    pub fn deepen(&self) {
        let _ = self
            .depth
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                (d < MAX_DEPTH).then_some(d + 1)
            });
    }

    /// How many blocks ahead of the reader `block` is needed (0: in use now; larger: later).
    pub fn distance(&self, block: usize) -> usize {
        let current = self.current.load(Ordering::Relaxed);
        if current == NONE {
            return 0;
        }
        let position = read(&self.position);
        let (Some(&to), Some(&from)) = (position.get(block), position.get(current)) else {
            return 0;
        };
        (to + position.len() - from) % position.len()
    }

    /// The current visit: bumped each time the reader enters a block.
    pub fn visit(&self) -> u64 {
        self.visit.load(Ordering::Relaxed)
    }

    /// Whether the reader is in `block`.
    pub fn is_current(&self, block: usize) -> bool {
        self.current.load(Ordering::Relaxed) == block
    }

    /// Whether the reader is in `block` or, following the order, goes there next.
    pub fn is_expected(&self, block: usize) -> bool {
        let current = self.current.load(Ordering::Relaxed);
        current == block
            || (current != NONE && self.lock().next_after(current, 1).first() == Some(&block))
    }

    /// Whether `block` is the one the reader left for its current block (threads of a
    /// multi-threaded reader may still be finishing it).
    pub fn is_previous(&self, block: usize) -> bool {
        self.previous.load(Ordering::Relaxed) == block
    }

    /// Whether a pass was learned, and how many blocks it touched.
    pub fn learned(&self) -> (bool, usize) {
        let order = self.lock();
        (order.is_learned(), order.learned_len())
    }

    /// A copy of the order, for saving across remounts.
    pub fn saved_order(&self) -> AccessOrder {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, AccessOrder> {
        lock(&self.order)
    }
}

fn positions(order: &AccessOrder) -> Vec<usize> {
    let mut position = vec![0; order.blocks()];
    for (at, &block) in order.order().iter().enumerate() {
        if let Some(slot) = position.get_mut(block) {
            *slot = at;
        }
    }
    position
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_reader_is_predicted_and_a_jump_bumps_the_epoch() {
        let access = FileAccess::new(10, None);
        let entered = |predicted| Step::Entered {
            predicted,
            new_pass: false,
        };
        assert_eq!(access.touch(0), entered(false));
        let epoch = access.epoch();
        assert_eq!(access.touch(1), entered(true));
        assert_eq!(access.touch(1), Step::Stay);
        assert_eq!(access.touch(2), entered(true));
        assert_eq!(access.epoch(), epoch);
        assert_eq!(access.touch(7), entered(false));
        assert_eq!(access.epoch(), epoch + 1);
    }

    #[test]
    fn distance_is_cyclic_from_the_current_block() {
        let access = FileAccess::new(10, None);
        assert_eq!(
            access.distance(7),
            0,
            "nothing is known before the first touch"
        );
        for block in 0..=4 {
            access.touch(block);
        }
        assert_eq!(access.distance(4), 0);
        assert_eq!(access.distance(5), 1);
        assert_eq!(access.distance(0), 6);
        assert_eq!(access.distance(3), 9, "the block just left is needed last");
        assert!(access.is_previous(3) && !access.is_previous(2));
    }

    #[test]
    fn depth_grows_to_a_bound() {
        let access = FileAccess::new(4, None);
        for _ in 0..10 {
            access.deepen();
        }
        assert_eq!(access.depth(), MAX_DEPTH);
    }
}
