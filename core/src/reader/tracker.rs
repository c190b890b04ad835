//! What tierfs knows about how one file version is being read: its learned block order, the
//! block the reader is in, and per-file prefetch figures.
//!
//! [`ReaderTracker`] is shared by the read path (which reports every block a reader touches), the
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
//! **Depth** starts at one block ahead and grows by one (up to [`ReaderConfig::max_depth`])
//! each time the reader enters a predicted block that is not fully in memory yet, i.e. the disk
//! could not keep up with one block of lead; a reader that computes longer than the disk needs
//! never grows it.
//!
//! **Restarts.** The order takes a touch of a block far behind the reader's newest one (more
//! than [`TOLERANCE`] first touches) as the start of a new pass; so does a straggling thread of
//! a multi-threaded reader that was descheduled. So a touch far behind opens a *candidate*
//! reader, kept beside the front, with its own position: its touches move only it, and it
//! becomes the reader (a new pass, its blocks replayed into the order) once it has gone on by
//! enough blocks. Any touch near the front drops it (the front is alive: the candidate was
//! stragglers); a touch further behind replaces it. At the end of a pass (the front has touched
//! all but [`TOLERANCE`] of the blocks a pass touches) the candidate's second block confirms
//! it; in the middle of a pass it must go on by more than [`TOLERANCE`] blocks, since resumed
//! stragglers can cover several consecutive blocks
//! ([traced](../../../docs/PERFORMANCE.md#stragglers-and-restarts)).
//!
//! **Distance** (for eviction) is how many blocks ahead of the reader's current block a block
//! comes in cyclic order: the block the reader just left is needed last. (Its chunks that
//! straggling threads are still reading are protected by the cache's recency guard, which asks
//! [`ReaderTracker::is_previous`].)
//!
//! **Locks** (through [`crate::sync`]): the order's mutex, then under it the candidate's; the
//! block positions are a read-write lock the cache reads under its own lock (positions are
//! written only with the order's lock held, never with the cache's). Everything else is atomic.

use crate::sync::{lock, read, write, Mutex, MutexGuard, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::reader::order::{BlockOrder, Touch, TOLERANCE};
use crate::reader::pace::{PaceConfig, ReaderPace};

/// How a reader is tracked; [`Default`] is what the daemon runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaderConfig {
    /// How long a reader's pauses must be to count as compute ([`PaceConfig`]).
    pub pace: PaceConfig,
    /// Most blocks fetched ahead of the reader: 2. Every block held ahead is a block less of
    /// the resident set that repeated passes keep (one more block read per pass), so depth only
    /// grows when the reader outruns one block of lead; a transformer block is 100–700 MiB in
    /// the models this is for, and two of them are a second or more of disk time.
    pub max_depth: usize,
}

impl Default for ReaderConfig {
    fn default() -> Self {
        ReaderConfig {
            pace: PaceConfig::default(),
            max_depth: 2,
        }
    }
}

/// No block entered yet.
const NONE: usize = usize::MAX;

/// What a touch far behind the reader means ([`ReaderTracker::touch`]).
enum Restart {
    /// Not far behind.
    No,
    /// Not (yet) a new pass: a straggling thread, or an early touch of a new pass.
    Straggler,
    /// A new pass, which entered these blocks (in order) before this touch.
    Confirmed(Vec<usize>),
}

/// What a touch means for prefetching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Still in a block of the current pass.
    Stay,
    /// Entered a block for the first time in this pass; `predicted` if the order said so;
    /// `new_pass` if this touch started a new pass (the order may just have been learned).
    Entered { predicted: bool, new_pass: bool },
}

/// Reader tracker of one file version.
#[derive(Debug)]
pub struct ReaderTracker {
    order: Mutex<BlockOrder>,
    /// `position[block]` in the order, readable without the order's lock (eviction scans it).
    position: RwLock<Vec<usize>>,
    current: AtomicUsize,
    /// The block the reader was in before `current`.
    previous: AtomicUsize,
    epoch: AtomicU64,
    /// Bumped each time the reader enters a block: chunks read in the current visit of the
    /// current block are consumed (see `cache::Chunk::distance`).
    visit: AtomicU64,
    /// When a reader last asked the cache for a chunk of this file, on the cache's clock: of
    /// the files waiting for their turn, the one read last is needed last (`cache::Turn`).
    last_served: AtomicU64,
    /// When the reader's current session began (the cache's clock): its first request since
    /// the file was opened by a reader, a new pass began, or a rewind. Files not read since
    /// then wait for their turn (`cache::Turn`).
    session_from: AtomicU64,
    /// A session began and its first request is still to come.
    session_pending: AtomicBool,
    depth: AtomicUsize,
    /// A reader far behind the front, not yet confirmed as the start of a new pass: the
    /// blocks it entered, in order, the first of which opened it; empty when there is none
    /// (taken under `order`'s lock).
    candidate: Mutex<Vec<usize>>,
    /// The block furthest ahead of the reader that prefetch read into (`NONE`: none yet), for
    /// the stats ([`ReaderTracker::prefetch_front`]).
    prefetch_front: AtomicUsize,
    /// Whether the reader computes between blocks (see [`ReaderPace`]).
    pub pace: ReaderPace,
    pub counters: FileCounters,
    config: ReaderConfig,
}

/// Per-file figures for the stats.
#[derive(Debug, Default)]
pub struct FileCounters {
    pub prefetch_issued_bytes: AtomicU64,
    pub prefetch_used_bytes: AtomicU64,
    pub prefetch_wasted_bytes: AtomicU64,
    pub stall_ns: AtomicU64,
    /// The part of `stall_ns` spent in the first block of the order: what a reader starting
    /// the model waits before its first tensors (the stall at a switch between models).
    pub start_stall_ns: AtomicU64,
    /// Bytes served to readers through the chunk cache from chunks already resident / that
    /// they waited for, and bytes of the file's chunks read from the source.
    pub hit_bytes: AtomicU64,
    pub miss_bytes: AtomicU64,
    pub disk_read_bytes: AtomicU64,
    /// Of the file's resident chunks, the file bytes of those held compressed, and the memory
    /// of their frames (the compressed RAM tier: `crate::cache`).
    pub frame_raw_bytes: AtomicU64,
    pub frame_bytes: AtomicU64,
}

impl ReaderTracker {
    /// Reader tracker for a file of `blocks` blocks, starting from a saved order when one fits.
    pub fn new(blocks: usize, saved: Option<BlockOrder>) -> ReaderTracker {
        ReaderTracker::with_config(blocks, saved, ReaderConfig::default())
    }

    /// [`Self::new`] tuned by `config`.
    pub fn with_config(
        blocks: usize,
        saved: Option<BlockOrder>,
        config: ReaderConfig,
    ) -> ReaderTracker {
        let order = saved
            .filter(|o| o.blocks() == blocks)
            .unwrap_or_else(|| BlockOrder::new(blocks));
        let position = positions(&order);
        ReaderTracker {
            order: Mutex::new(order),
            position: RwLock::new(position),
            current: AtomicUsize::new(NONE),
            previous: AtomicUsize::new(NONE),
            epoch: AtomicU64::new(0),
            visit: AtomicU64::new(0),
            last_served: AtomicU64::new(0),
            session_from: AtomicU64::new(0),
            session_pending: AtomicBool::new(true),
            depth: AtomicUsize::new(1),
            candidate: Mutex::new(Vec::new()),
            prefetch_front: AtomicUsize::new(NONE),
            pace: ReaderPace::with_config(config.pace),
            counters: FileCounters::default(),
            config,
        }
    }

    /// A reader touched `block`.
    pub fn touch(&self, block: usize) -> Step {
        let mut order = self.lock();
        let replayed = match self.restart(&order, block) {
            Restart::Straggler => return Step::Stay,
            Restart::Confirmed(entered) => {
                // A new pass, opened by the candidate's first block.
                for &earlier in &entered {
                    let _ = order.touch(earlier);
                }
                entered.last().copied()
            }
            Restart::No => None,
        };
        let touch = order.touch(block);
        let new_pass = replayed.is_some() || touch == Touch::NewPass;
        if touch == Touch::Again && !new_pass {
            return Step::Stay;
        }
        if new_pass {
            *write(&self.position) = positions(&order);
            self.begin_session();
        }
        self.visit.fetch_add(1, Ordering::Relaxed);
        self.pace.note_block_start();
        let left = self.current.swap(block, Ordering::Relaxed);
        self.previous.store(left, Ordering::Relaxed);
        let from = replayed.unwrap_or(left);
        let predicted = from != NONE && order.next_after(from, 1).first() == Some(&block);
        if !predicted {
            self.epoch.fetch_add(1, Ordering::Relaxed);
        }
        Step::Entered {
            predicted,
            new_pass,
        }
    }

    /// Whether a touch of `block` far behind the reader's newest block (which the order would
    /// take as the start of a new pass) is one: see "Restarts" in the module docs.
    fn restart(&self, order: &BlockOrder, block: usize) -> Restart {
        let mut entered = lock(&self.candidate);
        let Some(lag) = order.lag(block).filter(|&lag| lag > TOLERANCE) else {
            entered.clear();
            return Restart::No;
        };
        // While a candidate is pending no touch reached the front, so the pass, and with it
        // every lag, is as it was when the candidate opened.
        let lag_of = |b: usize| order.lag(b).unwrap_or(0);
        match (entered.first(), entered.last()) {
            // Further on: the candidate goes on from there.
            (_, Some(&last)) if lag < lag_of(last) => {
                if entered.len() >= confirming_advances(order) {
                    return Restart::Confirmed(std::mem::take(&mut *entered));
                }
                entered.push(block);
            }
            // Between its first block and its newest: a straggler of the candidate.
            (Some(&first), _) if lag <= lag_of(first) => {}
            // The first such touch, or one further behind than the candidate: it may be the
            // new pass.
            _ => {
                entered.clear();
                entered.push(block);
            }
        }
        Restart::Straggler
    }

    /// Forgets where the reader is: the pass in progress ends (learned if it is long enough) and
    /// the next touch opens a new one, not a predicted step. Until then every block is needed
    /// equally soon ([`Self::distance`] 0), so a warm, which calls this first, evicts none of
    /// the chunks it loads for one it loads later. With the reader's old position kept, the
    /// order's first block was often the block the reader had just left, "needed last", and
    /// the warm evicted it for its own last chunks.
    pub fn rewind(&self) {
        let mut order = self.lock();
        order.rewind();
        lock(&self.candidate).clear();
        *write(&self.position) = positions(&order);
        self.current.store(NONE, Ordering::Relaxed);
        self.previous.store(NONE, Ordering::Relaxed);
        self.epoch.fetch_add(1, Ordering::Relaxed);
        self.begin_session();
    }

    /// A reader's session of this file begins (opened by a reader, a new pass, a rewind): its
    /// next request to the cache starts it.
    pub fn begin_session(&self) {
        self.session_pending.store(true, Ordering::Relaxed);
    }

    /// Up to `count` blocks after `block` in the order. Until an order is learned, not past
    /// its end: the default order's first block is the next pass's start only for a reader
    /// that makes passes, and for a reader in file order it is usually elsewhere in the file.
    /// Prefetched at the end of the default order, `(other)` (first in the default order, the
    /// last tensors of a name-sorted file) was evicted unread before that reader got there, in
    /// every run of `models::tests::concurrent_sequential_readers_account_prefetch_exactly`.
    pub fn next_blocks(&self, block: usize, count: usize) -> Vec<usize> {
        let order = self.lock();
        let mut next = order.next_after(block, count);
        if !order.is_learned() {
            let Some(from) = order.order().iter().position(|&b| b == block) else {
                return next;
            };
            next.truncate(order.blocks() - 1 - from);
        }
        next
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
                (d < self.config.max_depth).then_some(d + 1)
            });
    }

    /// Whether `block` is the first of the order.
    pub fn is_first(&self, block: usize) -> bool {
        read(&self.position).get(block) == Some(&0)
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

    /// Prefetch read a chunk of `block`: it becomes the front if it is further ahead of the
    /// reader than the front, or the front is no longer ahead.
    pub fn note_prefetch(&self, block: usize) {
        let _ = self
            .prefetch_front
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |front| {
                match self.ahead(front) {
                    Some(front) if front >= self.distance(block) => None,
                    _ => Some(block),
                }
            });
    }

    /// The block furthest ahead of the reader that prefetch read into, if it is still ahead
    /// (or the reader is in it).
    pub fn prefetch_front(&self) -> Option<usize> {
        let front = self.prefetch_front.load(Ordering::Relaxed);
        self.ahead(front).map(|_| front)
    }

    /// How far ahead of the reader `block` is, if it is in the half of the order ahead of it
    /// (the other half is behind it: needed again only in the next pass).
    fn ahead(&self, block: usize) -> Option<usize> {
        if block == NONE {
            return None;
        }
        let distance = self.distance(block);
        let half = read(&self.position).len() / 2;
        (distance <= half).then_some(distance)
    }

    /// A reader asked the cache for a chunk of this file at `at` (the cache's clock).
    pub fn note_served(&self, at: u64) {
        if self.session_pending.swap(false, Ordering::Relaxed) {
            self.session_from.store(at, Ordering::Relaxed);
        }
        self.last_served.store(at, Ordering::Relaxed);
    }

    /// When the reader's current session began (the cache's clock; 0: none yet).
    pub fn session_from(&self) -> u64 {
        self.session_from.load(Ordering::Relaxed)
    }

    /// When a reader last asked the cache for a chunk of this file (0: never).
    pub fn last_served(&self) -> u64 {
        self.last_served.load(Ordering::Relaxed)
    }

    /// The current visit: bumped each time the reader enters a block.
    pub fn visit(&self) -> u64 {
        self.visit.load(Ordering::Relaxed)
    }

    /// The block the reader is in (`None` before its first touch, or after a rewind).
    pub fn current(&self) -> Option<usize> {
        let current = self.current.load(Ordering::Relaxed);
        (current != NONE).then_some(current)
    }

    /// Whether `block` comes before the reader's block in the order (false before its first
    /// touch).
    pub fn is_behind(&self, block: usize) -> bool {
        let current = self.current.load(Ordering::Relaxed);
        let position = read(&self.position);
        match (position.get(block), position.get(current)) {
            (Some(to), Some(from)) => to < from,
            _ => false,
        }
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

    /// Whether `to` comes right after `from` in the order (wrapping around to its start).
    pub fn follows(&self, from: usize, to: usize) -> bool {
        self.lock().next_after(from, 1).first() == Some(&to)
    }

    /// Whether the reader left `block` at most [`TOLERANCE`] blocks ago, in the order: threads
    /// of a multi-threaded reader that fell behind may still be reading it. Never a block
    /// within [`ReaderConfig::max_depth`] ahead of the reader (in a file of few blocks, "behind" and "ahead"
    /// overlap; prefetch works there).
    pub fn is_just_behind(&self, block: usize) -> bool {
        let distance = self.distance(block);
        distance > self.config.max_depth && distance + TOLERANCE >= read(&self.position).len()
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
    pub fn saved_order(&self) -> BlockOrder {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, BlockOrder> {
        lock(&self.order)
    }
}

/// How many blocks a candidate must go on past its first before it is taken as a new pass:
/// one at the end of a pass, more than [`TOLERANCE`] in its middle (see "Restarts").
fn confirming_advances(order: &BlockOrder) -> usize {
    let pass_blocks = if order.is_learned() {
        order.learned_len()
    } else {
        order.blocks()
    };
    if order.pass_len() + TOLERANCE >= pass_blocks {
        1
    } else {
        TOLERANCE + 1
    }
}

fn positions(order: &BlockOrder) -> Vec<usize> {
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
        let tracker = ReaderTracker::new(10, None);
        let entered = |predicted| Step::Entered {
            predicted,
            new_pass: false,
        };
        assert_eq!(tracker.touch(0), entered(false));
        let epoch = tracker.epoch();
        assert_eq!(tracker.touch(1), entered(true));
        assert_eq!(tracker.touch(1), Step::Stay);
        assert_eq!(tracker.touch(2), entered(true));
        assert_eq!(tracker.epoch(), epoch);
        assert_eq!(tracker.touch(7), entered(false));
        assert_eq!(tracker.epoch(), epoch + 1);
    }

    #[test]
    fn the_prefetch_front_is_the_furthest_block_ahead_and_goes_once_the_reader_passes_it() {
        let tracker = ReaderTracker::new(10, None);
        tracker.touch(0);
        tracker.touch(1);
        assert_eq!(tracker.prefetch_front(), None);
        tracker.note_prefetch(3);
        tracker.note_prefetch(2); // a straggler of a nearer block does not pull it back
        assert_eq!(tracker.prefetch_front(), Some(3));
        tracker.touch(2);
        tracker.touch(3);
        assert_eq!(tracker.prefetch_front(), Some(3), "the reader is in it");
        tracker.touch(4);
        assert_eq!(tracker.prefetch_front(), None, "behind the reader");
        tracker.note_prefetch(5);
        assert_eq!(tracker.prefetch_front(), Some(5), "a stale front gives way");
    }

    #[test]
    fn distance_is_cyclic_from_the_current_block() {
        let tracker = ReaderTracker::new(10, None);
        assert_eq!(
            tracker.distance(7),
            0,
            "nothing is known before the first touch"
        );
        for block in 0..=4 {
            tracker.touch(block);
        }
        assert_eq!(tracker.distance(4), 0);
        assert_eq!(tracker.distance(5), 1);
        assert_eq!(tracker.distance(0), 6);
        assert_eq!(tracker.distance(3), 9, "the block just left is needed last");
        assert!(tracker.is_previous(3) && !tracker.is_previous(2));
    }

    #[test]
    fn a_rewind_ends_the_pass_and_forgets_the_reader() {
        let tracker = ReaderTracker::new(10, None);
        for block in [0, 9, 8, 7, 6, 5, 4, 3, 2, 1] {
            tracker.touch(block);
        }
        tracker.rewind();
        assert_eq!(tracker.learned(), (true, 10), "the full pass is learned");
        assert_eq!(tracker.distance(1), 0, "no block is needed before another");
        assert!(!tracker.is_previous(2) && !tracker.is_current(1));
        // The last blocks of the ended pass are no stragglers: the reader starts over there.
        assert_eq!(
            tracker.touch(1),
            Step::Entered {
                predicted: false,
                new_pass: false
            }
        );
        assert_eq!(tracker.distance(0), 1);
    }

    /// Touches every block of `0..blocks` once, in order: a full pass.
    fn pass(tracker: &ReaderTracker, blocks: usize) {
        for block in 0..blocks {
            tracker.touch(block);
        }
    }

    #[test]
    fn stragglers_mid_pass_do_not_move_the_reader() {
        let tracker = ReaderTracker::new(20, None);
        pass(&tracker, 20);
        for block in 0..12 {
            tracker.touch(block); // the second pass, at block 11
        }
        let epoch = tracker.epoch();
        // A group of descheduled threads resumes: three consecutive blocks far behind, no
        // front touch among them.
        for block in [2, 3, 4] {
            assert_eq!(tracker.touch(block), Step::Stay, "straggler in {block}");
        }
        assert_eq!(tracker.current(), Some(11));
        assert_eq!(tracker.epoch(), epoch, "no jump");
        assert_eq!(
            tracker.touch(12),
            Step::Entered {
                predicted: true,
                new_pass: false
            },
            "the front goes on as predicted"
        );
    }

    #[test]
    fn a_restart_at_the_end_of_a_pass_is_taken_at_its_second_block() {
        let tracker = ReaderTracker::new(20, None);
        pass(&tracker, 20);
        assert_eq!(tracker.touch(0), Step::Stay, "not yet: maybe a straggler");
        assert_eq!(
            tracker.touch(1),
            Step::Entered {
                predicted: true,
                new_pass: true
            }
        );
        assert_eq!(tracker.distance(2), 1);
    }

    #[test]
    fn a_restart_mid_pass_is_taken_once_it_went_on_past_the_tolerance() {
        let tracker = ReaderTracker::new(20, None);
        for block in 0..12 {
            tracker.touch(block); // a first pass that stops at block 11
        }
        for block in 0..=TOLERANCE {
            assert_eq!(tracker.touch(block), Step::Stay, "candidate in {block}");
        }
        assert_eq!(
            tracker.touch(TOLERANCE + 1),
            Step::Entered {
                predicted: true,
                new_pass: true
            }
        );
        // The candidate's blocks were replayed into the new pass: a touch of one of them is no
        // jump back.
        assert_eq!(tracker.touch(1), Step::Stay);
        assert_eq!(tracker.current(), Some(TOLERANCE + 1));
    }

    #[test]
    fn a_touch_near_the_front_drops_the_candidate() {
        let tracker = ReaderTracker::new(20, None);
        pass(&tracker, 20);
        for block in 0..12 {
            tracker.touch(block);
        }
        assert_eq!(tracker.touch(2), Step::Stay);
        assert_eq!(tracker.touch(11), Step::Stay, "the front is alive");
        // The candidate is gone: going on from 2 starts over, one touch at a time.
        for block in [3, 4, 5, 6] {
            assert_eq!(tracker.touch(block), Step::Stay);
        }
        assert_eq!(tracker.current(), Some(11));
    }

    #[test]
    fn depth_grows_to_a_bound() {
        let tracker = ReaderTracker::new(4, None);
        for _ in 0..10 {
            tracker.deepen();
        }
        assert_eq!(tracker.depth(), ReaderConfig::default().max_depth);
    }

    /// [`ReaderConfig::max_depth`] bounds how far ahead prefetch goes.
    #[test]
    fn the_depth_bound_is_configurable() {
        let config = ReaderConfig {
            max_depth: 4,
            ..ReaderConfig::default()
        };
        let tracker = ReaderTracker::with_config(8, None, config);
        for _ in 0..10 {
            tracker.deepen();
        }
        assert_eq!(tracker.depth(), 4);
    }
}
