//! The eviction rule: which resident chunk goes when room is needed.
//!
//! **Contract.** [`ChunkCache::evict_until_fits`] evicts, one at a time, the chunk ranked
//! highest by [`Chunk::rank`], which compares, in this order:
//! 1. **Idle before busy** (the recency guard, [`Chunk::may_be_in_use`]): a chunk of the block
//!    a reader just left that a reader got within [`super::CacheConfig::recently_read`], or that was
//!    prefetched and nobody got yet, goes only when nothing else can: a multi-threaded reader
//!    that moved on may still have threads finishing that block. A chunk whose every byte was
//!    served in that visit is idle.
//! 2. **By turns across files** ([`Turn`]): distances are counted in each file's own blocks,
//!    so they do not compare two files. The file a reader asked for last is *active*
//!    ([`ChunkCache::note_active`]; or the one a client's plan says comes next,
//!    [`ChunkCache::hand_turn_to`]); a file nobody has read since the active reader's session
//!    began (its open, its new pass) *waits* for its turn. The chunks the active reader has
//!    passed go first ([`Turn::Passed`]), then those of waiting files ([`Turn::Waiting`], the
//!    one read last going last: in a cycle of models it comes back last), then the active
//!    file's chunks still to come ([`Turn::Coming`]). Files read at the same time wait for
//!    nothing: each is ranked by its own reader.
//! 3. **Held by the tier below RAM** ([`super::lower`]): of one turn, a chunk the disk tier
//!    holds goes before one it does not, since bringing it back costs a local read, not one
//!    from the source; so RAM keeps what the tier below lacks.
//! 4. **Needed furthest in the future** ([`Chunk::distance`]): how many blocks ahead of its
//!    file's reader the chunk's block comes in cyclic order
//!    ([`crate::reader::ReaderTracker::distance`]); the block just left comes last. A chunk of
//!    the reader's current block that it has *consumed* (got in this visit, not recently, or
//!    was served every byte of) is needed only at the next visit: it goes first of all.
//! 5. **Least recently used** among equals.
//!
//! For a reader making repeated passes over a file larger than the budget, 2–3 are Belady's
//! rule for a cyclic pattern: each pass reads about (file − budget) from disk, where LRU would
//! read the whole file; with 3, about (file − budget − disk tier) from the source ([how the kept set moves](../../../docs/PERFORMANCE.md#eviction-in-repeated-passes)).
//!
//! **What a prefetch may evict** ([`ChunkCache::may_evict_for`]): a reader's miss may evict
//! anything; a prefetch only chunks needed later (by turn, then distance) than the one it
//! brings in, and only idle ones, so read-ahead never pushes out what a reader needs sooner. A
//! prefetch of a chunk evicted as consumed in its reader's current visit is skipped
//! ([`ConsumedEvictions`]). A prefetch may take a waiting file's room
//! ([measured](../../../docs/PERFORMANCE.md#eviction-by-turns)).
//!
//! **Cost.** Ranking is one step per resident block, then `log(blocks)` per victim: the
//! resident set keeps chunks grouped by block (`resident.rs`, [`VictimQueue`]). All of it runs
//! under the cache's `state` lock, reading [`crate::reader::ReaderTracker`]s (their read locks
//! nest under it); evicted chunks are dropped after the lock is released.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::stats::Counters;

use super::resident::{self, Resident, VictimQueue};
use super::{Chunk, ChunkCache, ChunkKey, ChunkOwner, Evicted, State, Want};

impl ChunkOwner {
    fn distance(&self) -> usize {
        self.tracker.distance(self.block)
    }

    /// Whether the tier below RAM holds the chunk (rule 3 of the module docs).
    pub(super) fn held_below(&self) -> bool {
        self.lower.as_ref().is_some_and(|lower| lower.held())
    }
}

/// Where a chunk stands to the reader the cache served last, the *active* reader, for
/// eviction across files (highest goes first; rule 2 of the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Turn {
    /// Of the active reader's file, still to come in its pass (or of no known file).
    Coming,
    /// Of another file: needed once the active reader is done with its pass.
    Waiting,
    /// Of the active reader's file, behind its block in the order (or consumed in it): needed
    /// in its next pass only, after the other files.
    Passed,
}

/// When a chunk is needed, as eviction compares it: its [`Turn`], for a waiting file when it
/// was last read (the one read last is needed last), whether the tier below holds it, and its
/// distance in its file's order.
pub(super) type Needed = (Turn, u64, bool, usize);

/// What one batch of evictions ranks chunks by: the recency guard's instant and the active
/// reader's file (its [`crate::reader::ReaderTracker`] by address; 0: none yet).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ranking {
    pub(super) recent: u64,
    active: usize,
    /// When the active reader's session began: files not read since wait for their turn.
    active_since: u64,
}

impl Ranking {
    /// Whether `owner`'s file waits for its turn: not the active file, and not read since the
    /// active reader's session began.
    fn waits(&self, owner: &ChunkOwner) -> bool {
        Arc::as_ptr(&owner.tracker) as usize != self.active
            && owner.tracker.last_served() < self.active_since
    }
}

impl Chunk {
    /// How soon the chunk is needed again (larger: later; 0 when unknown).
    ///
    /// A chunk of the block the reader is in, which the reader already got during this visit
    /// of the block and not within the last [`super::CacheConfig::recently_read`], is *consumed*: it
    /// is needed again only when the reader comes back to the block, so it goes first, before
    /// chunks of blocks still ahead (else a block larger than the budget's spare room pushes
    /// out the blocks prefetched ahead of the reader:
    /// [measured](../../../docs/PERFORMANCE.md#eviction-in-repeated-passes)).
    ///
    /// A chunk of the current block whose every byte readers were served in this visit is
    /// consumed at once, recent or not (`served.rs`).
    fn distance(&self, recent: u64) -> usize {
        let Some(owner) = &self.owner else { return 0 };
        let last_read = self.last_read.load(Ordering::Relaxed);
        let consumed = last_read != 0
            && owner.tracker.is_current(owner.block)
            && self.read_visit.load(Ordering::Relaxed) == owner.tracker.visit()
            && (last_read < recent || self.finished(owner));
        if consumed {
            return usize::MAX;
        }
        owner.distance()
    }

    /// Whether the reader has consumed it in its current visit of the chunk's block.
    fn is_consumed(&self, recent: u64) -> bool {
        self.distance(recent) == usize::MAX
    }

    /// Whether a reader is in this chunk's block now (its chunks are ranked one by one for
    /// eviction, see [`resident`]).
    pub(super) fn in_current_block(&self) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|o| o.tracker.is_current(o.block))
    }

    /// The chunk's eviction rank given its recency `stamp` (highest goes first).
    pub(super) fn rank(&self, ranking: &Ranking, stamp: u64) -> resident::Rank {
        let (turn, read_at) = self.turn(ranking);
        (
            !self.may_be_in_use(ranking.recent),
            turn,
            read_at,
            self.held_below(),
            self.distance(ranking.recent),
            std::cmp::Reverse(stamp),
        )
    }

    /// Whether the tier below RAM holds the chunk (rule 3 of the module docs).
    pub(super) fn held_below(&self) -> bool {
        self.owner.as_ref().is_some_and(ChunkOwner::held_below)
    }

    /// Where the chunk stands to the active reader ([`Turn`]), with, for a file waiting for
    /// its turn, when a reader last asked for it (0 otherwise). Of the block the active reader
    /// is in, only chunks it has consumed have passed: the others are being read.
    pub(super) fn turn(&self, ranking: &Ranking) -> (Turn, u64) {
        let Some(owner) = &self.owner else {
            return (Turn::Coming, 0);
        };
        let tracker = &owner.tracker;
        if ranking.waits(owner) {
            return (Turn::Waiting, tracker.last_served());
        }
        // Behind the reader's block in the order, or consumed in it: within one file exactly
        // the chunks whose distance is larger than any chunk still to come in the pass, so the
        // order within a file is the distance's.
        let passed = if tracker.is_current(owner.block) {
            self.is_consumed(ranking.recent)
        } else {
            tracker.is_behind(owner.block)
        };
        if passed {
            (Turn::Passed, 0)
        } else {
            (Turn::Coming, 0)
        }
    }

    /// Whether threads of a reader that just moved on may still be reading this chunk: it is in
    /// the block the reader left, and a reader got it since `recent` or it was prefetched and
    /// nobody got it yet (a thread behind the others has yet to read it: evicted as the block
    /// needed last, it would be read again by that thread and count as wasted prefetch;
    /// `models::tests::concurrent_sequential_readers_account_prefetch_exactly` under load).
    ///
    /// A chunk whose every byte was served in the visit a reader last got it in is not in use:
    /// a straggling thread has nothing left to read of it.
    pub(super) fn may_be_in_use(&self, recent: u64) -> bool {
        (self.last_read.load(Ordering::Relaxed) >= recent
            || self.unread_prefetch.load(Ordering::Relaxed))
            && self
                .owner
                .as_ref()
                .is_some_and(|o| o.tracker.is_previous(o.block))
            && !self
                .served
                .finished(self.read_visit.load(Ordering::Relaxed), self.len())
    }
}

/// Chunks evicted because the reader had consumed them in its current visit of their block: a
/// prefetch of one of them for that visit is skipped. A block prefetch the reader outran would
/// otherwise read such a chunk again, only for it to be evicted unread as needed last
/// ([measured](../../../docs/PERFORMANCE.md#eviction-in-repeated-passes)).
#[derive(Default)]
pub(super) struct ConsumedEvictions(HashMap<ChunkKey, u64>);

impl ConsumedEvictions {
    /// More than a few blocks' worth of chunks: the list is dropped and starts again (a
    /// forgotten entry costs at most one redundant prefetch).
    const MAX: usize = 4096;

    fn insert(&mut self, key: ChunkKey, owner: &ChunkOwner) {
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert(key, owner.tracker.visit());
    }

    /// Whether `key` was evicted as consumed in `owner`'s current visit, the reader still in
    /// its block. (A warm rewinds the reader without a new visit: its prefetches must not be
    /// skipped, or the chunks the last pass consumed were missing from the warmed set.)
    pub(super) fn contains(&self, key: ChunkKey, owner: &ChunkOwner) -> bool {
        owner.tracker.is_current(owner.block) && self.0.get(&key) == Some(&owner.tracker.visit())
    }
}

impl ChunkCache {
    /// A reader asked for a chunk of `owner`'s file: that file is now the active one
    /// ([`Turn`]), and its reader's session is the one other files wait for.
    pub(super) fn note_active(&self, owner: &ChunkOwner) {
        self.active
            .store(Arc::as_ptr(&owner.tracker) as usize, Ordering::Relaxed);
        owner.tracker.note_served(self.now());
        self.active_since
            .store(owner.tracker.session_from(), Ordering::Relaxed);
    }

    /// The next reader will read the file of `tracker` (a client's plan says so): it becomes
    /// the active file, and every other file waits for its turn from now ([`Turn`]), so that
    /// its warm may take the room of files read before it.
    pub fn hand_turn_to(&self, tracker: &Arc<crate::reader::ReaderTracker>) {
        self.active
            .store(Arc::as_ptr(tracker) as usize, Ordering::Relaxed);
        self.active_since.store(self.now(), Ordering::Relaxed);
    }

    /// What a load may evict to make room: a reader's chunk is needed now and may evict
    /// anything (`None`); a prefetched one only what is needed later than itself.
    pub(super) fn may_evict_for(&self, want: Want, owner: Option<&ChunkOwner>) -> Option<Needed> {
        match want {
            Want::Read => None,
            Want::Prefetch => Some(owner.map_or((Turn::Coming, 0, false, 0), |o| {
                if self.ranking().waits(o) {
                    let read_at = o.tracker.last_served();
                    (Turn::Waiting, read_at, o.held_below(), o.distance())
                } else {
                    (Turn::Coming, 0, o.held_below(), o.distance())
                }
            })),
        }
    }

    /// Evicts chunks until `extra` more bytes fit, victims chosen by [`Self::victim`]. Returns
    /// false (evicting nothing more) when they cannot fit: over the budget, room held by reads
    /// in flight, or (for a chunk needed at `needed_in`) only sooner-needed chunks left.
    /// The victims go to `evicted`, to be dropped once the lock is released.
    pub(super) fn evict_until_fits(
        &self,
        state: &mut State,
        extra: u64,
        needed_in: Option<Needed>,
        evicted: &mut Evicted,
    ) -> bool {
        if extra > state.budget {
            return false;
        }
        let mut victims = None;
        let ranking = self.ranking();
        let recent = ranking.recent;
        while state.used + extra > state.budget {
            let victims = victims.get_or_insert_with(|| state.resident.victims(ranking));
            let Some(key) = Self::victim(victims, &state.resident, needed_in) else {
                return false;
            };
            let Some(chunk) = state.resident.pop(&key) else {
                return false;
            };
            tracing::trace!(target: "tierfs::cache", file = key.file, chunk = key.chunk,
                turn = ?chunk.turn(&ranking).0, idle = !chunk.may_be_in_use(recent),
                for_prefetch = needed_in.is_some(), "evict");
            if let Some(owner) = chunk.owner.as_ref().filter(|_| chunk.is_consumed(recent)) {
                state.consumed.insert(key, owner);
            }
            Counters::add(&self.counters.evicted_bytes, chunk.footprint());
            self.release(state, key, &chunk);
            evicted.push(chunk);
        }
        true
    }

    /// The resident chunk needed furthest in the future (by [`Turn`], then held below, then
    /// distance), least
    /// recently used among equals; `None` if it is not needed later than `needed_in`. Chunks of
    /// the block a reader just left that it got in the last [`super::CacheConfig::recently_read`] are passed over
    /// while there is any other candidate: a multi-threaded reader that moved on to the next
    /// block may still have threads finishing the last pieces of the one it left, which is
    /// otherwise exactly the block needed furthest ahead. Ranking is one step per resident
    /// block, then `log(blocks)` per victim ([`resident`]).
    fn victim(
        victims: &mut VictimQueue,
        resident: &Resident,
        needed_in: Option<Needed>,
    ) -> Option<ChunkKey> {
        let (key, idle, needed) = victims.next(resident)?;
        match needed_in {
            Some(incoming) if needed <= incoming || !idle => None,
            _ => Some(key),
        }
    }

    /// Reads since this instant count as recent for the recency guard.
    fn recent(&self) -> u64 {
        self.now()
            .saturating_sub(self.config.recently_read.as_nanos() as u64)
    }

    /// The ranking of evictions decided now.
    pub(super) fn ranking(&self) -> Ranking {
        Ranking {
            recent: self.recent(),
            active: self.active.load(Ordering::Relaxed),
            active_since: self.active_since.load(Ordering::Relaxed),
        }
    }
}
