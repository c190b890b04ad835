//! The byte-bounded chunk cache shared by every file of a mount.
//!
//! Design:
//! - **One budget** for the mount, in bytes of chunk memory (page-aligned footprints, so the
//!   figure matches what the daemon's RSS pays). `used` counts resident chunks *and* chunks being
//!   read, which reserve their bytes before the read starts, so the cache never holds more than
//!   the budget, not even transiently.
//! - **Eviction is order-aware**: the victim is the chunk whose block is needed furthest in the
//!   future by its file's reader ([`ReaderTracker::distance`]: blocks just behind the reader come
//!   last in cyclic order), ties and chunks of unknown files going least-recently-used first
//!   ([`resident`] keeps the chunks grouped by block, so finding the victim is one step per
//!   resident block, not per chunk). For a reader making repeated passes over a file larger
//!   than the budget, this is Belady's rule for a cyclic pattern: each pass reads about
//!   (file − budget) from disk instead of the whole file, which is what LRU would do. What
//!   stays is not a fixed head of the order: the block just passed is needed a whole pass
//!   later, so it goes before the last blocks of the current pass, and each pass gives up a
//!   little of what the previous one kept near its start for its own last blocks. The kept set
//!   moves backwards through the order (about two blocks of 33 per pass in
//!   `models::tests::repeated_passes_read_only_what_does_not_fit_and_keep_most_of_one_set`,
//!   1.05–1.11 × (file − budget) read every pass), so a residency strip shows partly kept
//!   blocks where a fixed head would show whole ones. Pinning a head would at best read the
//!   same bytes per pass, and it would evict what the current pass still needs for what only
//!   the next one does. A prefetch may only evict chunks needed later than the one it brings
//!   in, so read-ahead never pushes out what the reader needs sooner.
//! - **Across files, by turns** ([`Turn`]): distances are counted in each file's own blocks, so
//!   they say nothing of which of two files is needed first. The file a reader asked for last
//!   is *active*; a file nobody has read since the active reader's session began (its open,
//!   its new pass) *waits* for its turn, which comes once the active pass ends. So the chunks
//!   the active reader has passed (behind its block, or consumed in it) go first, then those
//!   of the waiting files (the one read last first: in a cycle of models it comes back last),
//!   and only then the active file's chunks still to come. Files read at the same time (two
//!   readers) wait for nothing: each is ranked by its own reader, as within one file. Ranked
//!   by distance alone, models that take turns evicted each other's kept blocks (the waiting
//!   model's last blocks looked as far off as the active one's passed blocks) and a workflow
//!   read 1.10–1.26 × (models − budget) per cycle; by turns 1.01–1.09 × in all 24 cases
//!   (`tests/bench/workflow-results.md`; other runs up to 1.12 in single cases, once 1.16).
//!   A prefetch may take a waiting file's room: sparing the files that took their turn since
//!   the reader's previous one (read-ahead taking only the reader's passed chunks) cut the
//!   text encoder + DiT case from 1.11–1.12 to 1.05–1.08 on the 1 GB/s source (the text
//!   encoder no longer grows into the cache one lead a cycle, each move read twice) but took
//!   three models read with `safe_open` from 1.03 to 1.12–1.14 on both sources
//!   (`tests/bench/workflow-results-prefetch-spares-turns.md`). What a reader's request
//!   records for it (the active file, when it was served) costs nothing measurable: warm 1 MiB
//!   reads ran 1.006× (one reader) and 1.031× (four) the speed of a build without it
//!   (`tests/bench/ops_overhead.py --baseline`).
//! - **Single flight**: a miss registers the chunk as loading; every other thread asking for it
//!   waits for that one read instead of issuing its own, so a chunk is read from disk once no
//!   matter how many readers (or the prefetcher) want it.
//! - **Reads in flight are bounded by the budget**: they may reserve at most half of it
//!   (`READ_IN_FLIGHT_SHARE`), prefetches at most a quarter (`PREFETCH_IN_FLIGHT_SHARE`).
//!   Past that, a reader's miss waits for a read in flight to finish, and a prefetch is skipped.
//!   Without the bound, many readers missing at once on a small budget (the stress test: 32
//!   readers, 8 request threads and 4 prefetch workers on 64 MiB, resized down to 32 MiB)
//!   reserve the whole budget with loads, so every new chunk is read *uncached*, the next
//!   request for the rest of it reads the same 4 MiB again, and an `mmap` reader faulting page
//!   by page reads the disk a thousand times per chunk: throughput collapsed and single reads
//!   took over 20 s. Waiting cannot deadlock: a read in flight depends on nothing but the disk.
//! - A chunk bigger than the whole budget (or one that cannot get room because everything else
//!   is reserved by reads in flight) is read and handed to the caller without being cached.
//! - Failed reads cache nothing: the error goes to the readers waiting on that read, and the
//!   next request retries the disk. A read that *panics* is treated the same way (the
//!   [`InFlight`] guard): its single-flight entry is removed, its reservation returned and every
//!   waiter woken with [`CacheError::LoadPanicked`], so no reader of that chunk waits forever.
//! - **Memory is unmapped outside the lock.** Evicting a chunk removes it from the cache under
//!   the lock; the chunk's mapping is dropped (unmapped, or kept as a spare) only after the lock
//!   is released, so `drop`, a budget shrink or a miss that evicts never makes other readers
//!   wait for `munmap` of gigabytes (`cache_lock_bench` measures the lock hold of a 16 GiB drop).
//!
//! **Locks**, all through [`crate::sync`] (model-checked with loom: `loom_tests.rs`), in the
//! order they may be taken:
//! 1. `ChunkCache::state`: budget, `used`/`in_flight` accounting, the resident set and the
//!    single-flight table. Held only for bookkeeping: never during a disk read, a wait for a
//!    read, or an unmap. `ChunkCache::room` waits on it.
//! 2. Under it, read locks of [`ReaderTracker`] (its block positions, for eviction distance).
//!
//! `Loading::result` (one per read in flight) is never taken with `state` held: a waiter takes
//! it after releasing `state`, and the loader publishes its result after releasing `state`. The
//! spare-buffer lock in [`crate::source`] is a leaf taken outside all of these.
//!
//! The cache knows chunks by [`ChunkKey`] only; which bytes a chunk holds is the caller's
//! business ([`crate::models`]), which keeps this module testable without files.

pub mod marks;
pub mod plan;
mod resident;
mod served;

#[cfg(all(test, loom))]
mod loom_tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;

pub use marks::ChunkMarks;
use resident::{Resident, VictimQueue};
use served::Served;

use crate::reader::ReaderTracker;
use crate::source::{self, AlignedBytes, SourceError};
use crate::stats::{CacheSnapshot, Counters};
use crate::sync::{lock, wait, Condvar, Mutex, MutexGuard};

/// How long after a reader got a chunk it is spared from eviction while other candidates exist
/// (see [`ChunkCache::victim`]). The eight 2 MiB reads a loader issues at a block boundary finish
/// within milliseconds of each other; 50 ms covers that with margin and is far shorter than the
/// time between two passes over a block.
const RECENTLY_READ: std::time::Duration = std::time::Duration::from_millis(50);

/// Share of the budget that reads in flight may reserve before a reader's miss waits for one of
/// them (see the module docs). Half leaves the other half to chunks that readers are still
/// using, which is what keeps a chunk resident between two requests for its pages.
const READ_IN_FLIGHT_SHARE: u64 = 2;

/// Share of the budget that reads in flight may reserve before a prefetch is skipped: a quarter,
/// so read-ahead never takes the room a reader's miss needs.
const PREFETCH_IN_FLIGHT_SHARE: u64 = 4;

/// A chunk of one version of one file: `file` is the version's generation number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey {
    pub file: u64,
    pub chunk: u32,
}

impl ChunkKey {
    /// The chunk's index in its file's plan.
    fn index(self) -> usize {
        self.chunk as usize
    }
}

/// Why a chunk is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A reader is waiting for it.
    Read,
    /// Reading ahead of a reader.
    Prefetch,
}

/// A chunk could not be had.
#[derive(Debug, Error, Clone)]
pub enum CacheError {
    /// Reading it failed (shared by every reader that waited for that read).
    #[error(transparent)]
    Source(Arc<SourceError>),
    /// A prefetch found no room that is not needed sooner: nothing was read.
    #[error("no room for a prefetched chunk")]
    NoRoom,
    /// The read of this chunk panicked (a bug); readers that waited for it get this error and
    /// the next request reads the disk again.
    #[error("internal error: the read of this chunk panicked")]
    LoadPanicked,
}

/// Where one chunk is, for the stats' residency strips ([`ChunkMarks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// Never read from the disk.
    NeverRead,
    /// Read from the disk before, not in memory now (evicted, dropped, or read uncached).
    Evicted,
    /// Being read from the disk by a prefetch no reader waits for.
    Prefetching,
    /// Being read from the disk, a reader waiting for it.
    Reading,
    /// In memory.
    Resident,
}

/// The file and block a chunk belongs to, for order-aware eviction, per-file figures and the
/// file's chunk marks.
#[derive(Debug, Clone)]
pub struct ChunkOwner {
    pub access: Arc<ReaderTracker>,
    pub block: usize,
    /// The marks of the chunk's file version, which the cache keeps up to date.
    pub marks: Arc<ChunkMarks>,
}

impl ChunkOwner {
    fn distance(&self) -> usize {
        self.access.distance(self.block)
    }
}

/// Where a chunk stands to the reader the cache served last, the *active* reader, for
/// eviction across files (highest goes first; see "Across files, by turns" in the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Turn {
    /// Of the active reader's file, still to come in its pass (or of no known file).
    Coming,
    /// Of another file: needed once the active reader is done with its pass.
    Waiting,
    /// Of the active reader's file, behind its block in the order (or consumed in it): needed
    /// in its next pass only, after the other files.
    Passed,
}

/// When a chunk is needed, as eviction compares it: its [`Turn`], for a waiting file when it
/// was last read (the one read last is needed last), and its distance in its file's order.
type Needed = (Turn, u64, usize);

/// What one batch of evictions ranks chunks by: the recency guard's instant and the active
/// reader's file (its [`ReaderTracker`] by address; 0: none yet).
#[derive(Debug, Clone, Copy)]
struct Ranking {
    recent: u64,
    active: usize,
    /// When the active reader's session began: files not read since wait for their turn.
    active_since: u64,
}

impl Ranking {
    /// Whether `owner`'s file waits for its turn: not the active file, and not read since the
    /// active reader's session began.
    fn waits(&self, owner: &ChunkOwner) -> bool {
        Arc::as_ptr(&owner.access) as usize != self.active
            && owner.access.last_served() < self.active_since
    }
}

/// Bytes of a chunk in memory.
#[derive(Debug)]
pub struct Chunk {
    bytes: AlignedBytes,
    /// Loaded by the prefetcher and not yet read by anyone.
    unread_prefetch: AtomicBool,
    owner: Option<ChunkOwner>,
    /// When a reader last got it ([`ChunkCache::now`]), for the recency guard.
    last_read: AtomicU64,
    /// The owner's visit ([`ReaderTracker::visit`]) in which a reader last got it: a chunk of the
    /// current block read in the current visit has been consumed (see [`Chunk::distance`]).
    read_visit: AtomicU64,
    /// Which of its bytes readers were served in the owner's latest visit ([`served`]).
    served: Served,
}

impl Chunk {
    pub fn as_slice(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    fn footprint(&self) -> u64 {
        self.bytes.footprint()
    }

    fn len(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// A reader was served `range` of the chunk's bytes (not a probe: see [`served`]).
    pub fn served(&self, range: &std::ops::Range<usize>) {
        let visit = self.owner.as_ref().map_or(0, |o| o.access.visit());
        self.served
            .mark(visit, range.start as u64, range.end as u64, self.len());
    }

    /// Whether readers were served every byte of it in the owner's current visit.
    fn finished(&self, owner: &ChunkOwner) -> bool {
        self.served.finished(owner.access.visit(), self.len())
    }

    /// How soon the chunk is needed again (larger: later; 0 when unknown).
    ///
    /// A chunk of the block the reader is in, which the reader already got during this visit
    /// of the block and not within the last [`RECENTLY_READ`], is *consumed*: it is needed
    /// again only when the reader comes back to the block, so it goes first, before chunks of
    /// blocks still ahead. Without this rule a block larger than the budget's spare room pushes
    /// out the blocks prefetched ahead of the reader (or, with repeated passes, the resident
    /// set) to keep bytes the reader has finished with: `cat` of a 2.1 GB file of ~210 MB
    /// blocks through a 512 MiB budget read 1.17× the file from disk, 1.3 GB of prefetch
    /// wasted (acceptance benchmark).
    ///
    /// A chunk of the current block whose every byte readers were served in this visit is
    /// consumed at once, recent or not ([`served`] tells why a time window alone let later
    /// passes creep).
    fn distance(&self, recent: u64) -> usize {
        let Some(owner) = &self.owner else { return 0 };
        let last_read = self.last_read.load(Ordering::Relaxed);
        let consumed = last_read != 0
            && owner.access.is_current(owner.block)
            && self.read_visit.load(Ordering::Relaxed) == owner.access.visit()
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
    fn in_current_block(&self) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|o| o.access.is_current(o.block))
    }

    /// The chunk's eviction rank given its recency `stamp` (highest goes first).
    fn rank(&self, ranking: &Ranking, stamp: u64) -> resident::Rank {
        let (turn, read_at) = self.turn(ranking);
        (
            !self.may_be_in_use(ranking.recent),
            turn,
            read_at,
            self.distance(ranking.recent),
            std::cmp::Reverse(stamp),
        )
    }

    /// Where the chunk stands to the active reader ([`Turn`]), with, for a file waiting for
    /// its turn, when a reader last asked for it (0 otherwise). Of the block the active reader
    /// is in, only chunks it has consumed have passed: the others are being read.
    fn turn(&self, ranking: &Ranking) -> (Turn, u64) {
        let Some(owner) = &self.owner else {
            return (Turn::Coming, 0);
        };
        let access = &owner.access;
        if ranking.waits(owner) {
            return (Turn::Waiting, access.last_served());
        }
        // Behind the reader's block in the order, or consumed in it: within one file exactly
        // the chunks whose distance is larger than any chunk still to come in the pass, so the
        // order within a file is the distance's.
        let passed = if access.is_current(owner.block) {
            self.is_consumed(ranking.recent)
        } else {
            access.is_behind(owner.block)
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
    /// needed last, it was read again by that thread and counted as wasted prefetch, as
    /// `models::tests::concurrent_sequential_readers_account_prefetch_exactly` saw under load).
    ///
    /// A chunk whose every byte was served in the visit a reader last got it in is not in use:
    /// a straggling thread has nothing left to read of it.
    fn may_be_in_use(&self, recent: u64) -> bool {
        (self.last_read.load(Ordering::Relaxed) >= recent
            || self.unread_prefetch.load(Ordering::Relaxed))
            && self
                .owner
                .as_ref()
                .is_some_and(|o| o.access.is_previous(o.block))
            && !self
                .served
                .finished(self.read_visit.load(Ordering::Relaxed), self.len())
    }

    fn file_counters(&self) -> Option<&crate::reader::FileCounters> {
        self.owner.as_ref().map(|o| &o.access.counters)
    }
}

/// How a lookup was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Hit,
    Miss,
}

/// A chunk being read (single flight): its waiters wait on `done`.
struct Loading {
    result: Mutex<Option<Result<Arc<Chunk>, CacheError>>>,
    done: Condvar,
    /// Whether a reader waits for it (set and read under the cache's lock). The chunk is then
    /// read the moment it is resident, not when that reader wakes: a prefetched chunk the
    /// reader had already left by then (eight threads, two of them waiting for it while the
    /// others went two blocks on) was evicted in between, as the block needed last, and
    /// counted wasted although it served both (traced in
    /// `models::tests::concurrent_sequential_readers_account_prefetch_exactly`).
    awaited: AtomicBool,
}

impl Loading {
    fn wait(&self) -> Result<Arc<Chunk>, CacheError> {
        let mut result = lock(&self.result);
        loop {
            if let Some(result) = result.as_ref() {
                return result.clone();
            }
            result = wait(&self.done, result);
        }
    }

    fn finish(&self, outcome: Result<Arc<Chunk>, CacheError>) {
        *lock(&self.result) = Some(outcome);
        self.done.notify_all();
    }
}

struct State {
    budget: u64,
    /// Resident footprints plus reservations of reads in flight.
    used: u64,
    /// Footprints of reads in flight, cached or not.
    in_flight: u64,
    resident: Resident,
    loading: HashMap<ChunkKey, Arc<Loading>>,
    /// Resident file bytes per file generation (without alignment slack), for the stats.
    per_file: HashMap<u64, u64>,
    /// Chunks evicted as consumed, with their owner's visit then ([`ConsumedEvictions`]).
    consumed: ConsumedEvictions,
}

/// Chunks evicted because the reader had consumed them in its current visit of their block.
///
/// A block prefetch still working through the block the reader is in (the reader outran it)
/// found such a chunk absent and read it again: it was needed only in the next pass, so it was
/// evicted unread, wasted. Once chunks the reader was served in full were consumed at once
/// ([`served`]), this was 260 chunks read twice in the first 3 passes of acceptance benchmark part 5
/// (traced per chunk: every one evicted as consumed, reloaded by the block's prefetch 1–100 ms
/// later). A prefetch of a chunk listed here for its owner's current visit is skipped.
#[derive(Default)]
struct ConsumedEvictions(HashMap<ChunkKey, u64>);

impl ConsumedEvictions {
    /// More than a few blocks' worth of chunks: the list is dropped and starts again (a
    /// forgotten entry costs at most one redundant prefetch).
    const MAX: usize = 4096;

    fn insert(&mut self, key: ChunkKey, owner: &ChunkOwner) {
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert(key, owner.access.visit());
    }

    /// Whether `key` was evicted as consumed in `owner`'s current visit, the reader still in
    /// its block. (A warm rewinds the reader without a new visit: its prefetches must not be
    /// skipped, or the chunks the last pass consumed were missing from the warmed set.)
    fn contains(&self, key: ChunkKey, owner: &ChunkOwner) -> bool {
        owner.access.is_current(owner.block) && self.0.get(&key) == Some(&owner.access.visit())
    }
}

/// The mount-wide chunk cache.
pub struct ChunkCache {
    state: Mutex<State>,
    /// Signalled when a read in flight finishes or the budget changes.
    room: Condvar,
    counters: Arc<Counters>,
    /// Origin of the cache's clock ([`Self::now`]).
    started: Instant,
    /// The [`ReaderTracker`] (by address) of the file a reader asked for last, and when its
    /// reader's session began ([`Ranking`]).
    active: AtomicUsize,
    active_since: AtomicU64,
}

enum Plan {
    Hit(Arc<Chunk>),
    Skip,
    Wait(Arc<Loading>),
    Load { loading: Arc<Loading>, cached: bool },
}

/// Chunks taken out of the cache under the lock, dropped (unmapped) after it is released.
type Evicted = Vec<Arc<Chunk>>;

/// One read in flight, registered in the single-flight table with its reservation. However the
/// read ends, [`InFlight::finish`] or, if the read panicked, `Drop` removes the entry, returns
/// the reservation and wakes every waiter.
struct InFlight<'a> {
    cache: &'a ChunkCache,
    key: ChunkKey,
    footprint: u64,
    cached: bool,
    marks: Option<&'a ChunkMarks>,
    loading: Arc<Loading>,
    finished: bool,
}

impl InFlight<'_> {
    fn finish(mut self, result: Result<Arc<Chunk>, CacheError>) -> Result<Arc<Chunk>, CacheError> {
        self.finished = true;
        self.cache.complete(&self, result)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            tracing::error!(chunk = ?self.key, "a chunk read panicked; its readers get an error");
            let _ = self.cache.complete(self, Err(CacheError::LoadPanicked));
        }
    }
}

impl ChunkCache {
    pub fn new(budget: u64, counters: Arc<Counters>) -> ChunkCache {
        ChunkCache {
            state: Mutex::new(State {
                budget,
                used: 0,
                in_flight: 0,
                resident: Resident::default(),
                loading: HashMap::new(),
                per_file: HashMap::new(),
                consumed: ConsumedEvictions::default(),
            }),
            room: Condvar::new(),
            counters,
            started: Instant::now(),
            active: AtomicUsize::new(0),
            active_since: AtomicU64::new(0),
        }
    }

    /// Nanoseconds since the cache was made; 0 means "never".
    fn now(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64 + 1
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Returns the chunk `key`, reading it with `load` on a miss (reserving `footprint` bytes
    /// of budget for it first). `load` runs without any cache lock held.
    pub fn get_or_load(
        &self,
        key: ChunkKey,
        footprint: u64,
        want: Want,
        owner: Option<&ChunkOwner>,
        load: impl FnOnce() -> Result<AlignedBytes, SourceError>,
    ) -> Result<(Arc<Chunk>, Outcome), CacheError> {
        let started = Instant::now();
        let (plan, evicted) = self.plan(key, footprint, want, owner);
        // Unmapped (or kept as spares for this very load) with no lock held.
        drop(evicted);
        let result = match plan {
            Plan::Hit(chunk) => return Ok((chunk, Outcome::Hit)),
            Plan::Skip => return Err(CacheError::NoRoom),
            Plan::Wait(loading) => loading.wait(),
            Plan::Load { loading, cached } => {
                let in_flight = InFlight {
                    cache: self,
                    key,
                    footprint,
                    cached,
                    marks: owner.map(|o| o.marks.as_ref()),
                    loading,
                    finished: false,
                };
                self.load(in_flight, (want, owner), load)
            }
        };
        if want == Want::Read {
            Counters::add(&self.counters.misses, 1);
            Counters::add(&self.counters.stall_ns, started.elapsed().as_nanos() as u64);
            if let Ok(chunk) = &result {
                self.note_read(chunk);
            }
        }
        result.map(|chunk| (chunk, Outcome::Miss))
    }

    /// The chunk `key` if it is resident, for a probe ([`crate::models`]): counted as a hit,
    /// but neither made recent nor marked read, so a loader touching one page of each tensor
    /// neither keeps chunks resident nor makes them look consumed (which evicts them first).
    pub fn peek(&self, key: ChunkKey) -> Option<Arc<Chunk>> {
        let chunk = self.lock().resident.peek(&key)?;
        Counters::add(&self.counters.hits, 1);
        Some(chunk)
    }

    /// Whether `key` is resident or being read (a prefetch of it would be redundant).
    pub fn is_present(&self, key: ChunkKey) -> bool {
        let state = self.lock();
        state.resident.contains(&key) || state.loading.contains_key(&key)
    }

    /// Drops every resident chunk of file generation `file` (a file that changed on disk).
    pub fn forget_file(&self, file: u64) {
        let mut state = self.lock();
        let mut evicted = Evicted::new();
        for key in state.resident.keys_of_file(file) {
            if let Some(chunk) = state.resident.pop(&key) {
                self.release(&mut state, key, &chunk);
                evicted.push(chunk);
            }
        }
        state.per_file.remove(&file);
        drop(state);
        drop(evicted);
    }

    /// Changes the budget; shrinking evicts at once.
    pub fn set_budget(&self, budget: u64) {
        let mut state = self.lock();
        let shrinking = budget < state.budget;
        state.budget = budget;
        let mut evicted = Evicted::new();
        self.evict_until_fits(&mut state, 0, None, &mut evicted);
        self.room.notify_all();
        drop(state);
        drop(evicted);
        if shrinking {
            source::release_spare_buffers();
        }
    }

    /// Drops every resident chunk.
    pub fn clear(&self) {
        let mut state = self.lock();
        state.consumed = ConsumedEvictions::default();
        let evicted = state.resident.drain();
        for (key, chunk) in &evicted {
            self.release(&mut state, *key, chunk);
        }
        drop(state);
        drop(evicted);
        source::release_spare_buffers();
    }

    /// The current budget.
    pub fn budget(&self) -> u64 {
        self.lock().budget
    }

    /// Resident file bytes of file generation `file`.
    pub fn cached_bytes(&self, file: u64) -> u64 {
        self.lock().per_file.get(&file).copied().unwrap_or(0)
    }

    pub fn snapshot(&self) -> CacheSnapshot {
        let (budget_bytes, used_bytes, chunks) = {
            let state = self.lock();
            (state.budget, state.used, state.resident.len() as u64)
        };
        let c = &self.counters;
        CacheSnapshot {
            budget_bytes,
            chunk_budget_bytes: budget_bytes,
            used_bytes,
            chunks,
            hits: Counters::get(&c.hits),
            misses: Counters::get(&c.misses),
            hit_bytes: Counters::get(&c.hit_bytes),
            miss_bytes: Counters::get(&c.miss_bytes),
            evicted_bytes: Counters::get(&c.evicted_bytes),
            uncached_bytes: Counters::get(&c.uncached_bytes),
            stall_seconds: Counters::get(&c.stall_ns) as f64 / 1e9,
            index: Default::default(), // the model store's (`ModelStore::index_snapshot`)
        }
    }

    /// A reader got `chunk`: if a prefetch brought it in, that prefetch was useful.
    fn note_read(&self, chunk: &Chunk) {
        chunk.last_read.store(self.now(), Ordering::Relaxed);
        if let Some(owner) = &chunk.owner {
            chunk
                .read_visit
                .store(owner.access.visit(), Ordering::Relaxed);
        }
        if chunk.unread_prefetch.swap(false, Ordering::Relaxed) {
            Counters::add(&self.counters.prefetch_used_bytes, chunk.footprint());
            if let Some(file) = chunk.file_counters() {
                Counters::add(&file.prefetch_used_bytes, chunk.footprint());
            }
        }
    }

    /// Decides, under the lock, how a request is answered; a reader's miss may first wait for
    /// room among the reads in flight.
    fn plan(
        &self,
        key: ChunkKey,
        footprint: u64,
        want: Want,
        owner: Option<&ChunkOwner>,
    ) -> (Plan, Evicted) {
        let mut evicted = Evicted::new();
        if let Some(owner) = owner.filter(|_| want == Want::Read) {
            self.active
                .store(Arc::as_ptr(&owner.access) as usize, Ordering::Relaxed);
            owner.access.note_served(self.now());
            self.active_since
                .store(owner.access.session_from(), Ordering::Relaxed);
        }
        let mut state = self.lock();
        loop {
            if let Some(chunk) = state.resident.get(&key) {
                if want == Want::Read {
                    Counters::add(&self.counters.hits, 1);
                    self.note_read(&chunk);
                }
                return (Plan::Hit(chunk), evicted);
            }
            if let Some(loading) = state.loading.get(&key) {
                if want == Want::Read {
                    loading.awaited.store(true, Ordering::Relaxed);
                    if let Some(owner) = owner {
                        owner.marks.awaited(key.index());
                    }
                }
                return (Plan::Wait(Arc::clone(loading)), evicted);
            }
            let share = match want {
                Want::Read => READ_IN_FLIGHT_SHARE,
                Want::Prefetch => PREFETCH_IN_FLIGHT_SHARE,
            };
            // A read always goes ahead when nothing else is in flight, whatever its size.
            let crowded = state.in_flight > 0 && state.in_flight + footprint > state.budget / share;
            if !crowded {
                break;
            }
            if want == Want::Prefetch {
                return (Plan::Skip, evicted);
            }
            state = wait(&self.room, state);
        }
        if want == Want::Prefetch && owner.is_some_and(|o| state.consumed.contains(key, o)) {
            return (Plan::Skip, evicted);
        }
        // A reader's chunk is needed now and may evict anything; a prefetched one only what is
        // needed later than itself.
        let needed_in = match want {
            Want::Read => None,
            Want::Prefetch => Some(owner.map_or((Turn::Coming, 0, 0), |o| {
                if self.ranking().waits(o) {
                    (Turn::Waiting, o.access.last_served(), o.distance())
                } else {
                    (Turn::Coming, 0, o.distance())
                }
            })),
        };
        let cached = self.evict_until_fits(&mut state, footprint, needed_in, &mut evicted);
        if !cached && want == Want::Prefetch {
            return (Plan::Skip, evicted);
        }
        if cached {
            state.used += footprint;
        }
        state.in_flight += footprint;
        let loading = Arc::new(Loading {
            result: Mutex::new(None),
            done: Condvar::new(),
            awaited: AtomicBool::new(false),
        });
        state.loading.insert(key, Arc::clone(&loading));
        if let Some(owner) = owner {
            owner.marks.loading(key.index(), want);
        }
        (Plan::Load { loading, cached }, evicted)
    }

    /// Runs `load` for the read registered as `in_flight` (no lock held) and publishes the
    /// result; if `load` panics, `in_flight`'s drop publishes an error instead.
    fn load(
        &self,
        in_flight: InFlight<'_>,
        (want, owner): (Want, Option<&ChunkOwner>),
        load: impl FnOnce() -> Result<AlignedBytes, SourceError>,
    ) -> Result<Arc<Chunk>, CacheError> {
        let result = load()
            .map(|bytes| {
                Counters::add(&self.counters.disk_reads, 1);
                Counters::add(
                    &self.counters.disk_read_bytes,
                    bytes.as_slice().len() as u64,
                );
                if let Some(owner) = owner {
                    Counters::add(
                        &owner.access.counters.disk_read_bytes,
                        bytes.as_slice().len() as u64,
                    );
                }
                if want == Want::Prefetch {
                    Counters::add(&self.counters.prefetch_issued_bytes, bytes.footprint());
                    if let Some(owner) = owner {
                        Counters::add(
                            &owner.access.counters.prefetch_issued_bytes,
                            bytes.footprint(),
                        );
                    }
                }
                Arc::new(Chunk {
                    bytes,
                    unread_prefetch: AtomicBool::new(want == Want::Prefetch),
                    owner: owner.cloned(),
                    last_read: AtomicU64::new(if want == Want::Read { self.now() } else { 0 }),
                    read_visit: AtomicU64::new(owner.map_or(0, |o| o.access.visit())),
                    served: Served::default(),
                })
            })
            .map_err(|e| {
                Counters::add(&self.counters.disk_errors, 1);
                CacheError::Source(Arc::new(e))
            });
        in_flight.finish(result)
    }

    /// Ends the read `read`: removes its single-flight entry, settles its reservation (the
    /// chunk becomes resident if it was to be cached and was read), wakes its waiters.
    fn complete(
        &self,
        read: &InFlight<'_>,
        result: Result<Arc<Chunk>, CacheError>,
    ) -> Result<Arc<Chunk>, CacheError> {
        let (key, footprint) = (read.key, read.footprint);
        let mut evicted = Evicted::new();
        let mut state = self.lock();
        state.loading.remove(&key);
        state.in_flight -= footprint;
        self.room.notify_all();
        match &result {
            Ok(chunk) if read.cached => {
                if read.loading.awaited.load(Ordering::Relaxed) {
                    self.note_read(chunk);
                }
                // The reservation was `footprint`; the buffer may differ by alignment slack.
                state.used = state.used - footprint + chunk.footprint();
                *state.per_file.entry(key.file).or_default() += chunk.len();
                if let Some(old) = state.resident.put(key, Arc::clone(chunk)) {
                    self.release(&mut state, key, &old);
                    evicted.push(old);
                }
                // After the release of any chunk it replaced, which unmarks the same chunk.
                if let Some(marks) = read.marks {
                    marks.loaded(key.index(), true, true);
                }
                // The budget may have shrunk while the read was in flight: restore the bound
                // (this may evict the chunk just read; the caller still gets it).
                self.evict_until_fits(&mut state, 0, None, &mut evicted);
            }
            Ok(_) => Counters::add(&self.counters.uncached_bytes, footprint),
            Err(_) if read.cached => state.used -= footprint,
            Err(_) => {}
        }
        // A chunk kept was marked above; one read uncached, or not read, is not resident.
        if let Some(marks) = read.marks.filter(|_| !(read.cached && result.is_ok())) {
            marks.loaded(key.index(), result.is_ok(), false);
        }
        drop(state);
        drop(evicted);
        read.loading.finish(result.clone());
        result
    }

    /// Evicts chunks until `extra` more bytes fit, victims chosen by [`Self::victim`]. Returns
    /// false (evicting nothing more) when they cannot fit: over the budget, room held by reads
    /// in flight, or (for a chunk needed at `needed_in`) only sooner-needed chunks left.
    /// The victims go to `evicted`, to be dropped once the lock is released.
    fn evict_until_fits(
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
            if let Some(owner) = chunk.owner.as_ref().filter(|_| chunk.is_consumed(recent)) {
                state.consumed.insert(key, owner);
            }
            Counters::add(&self.counters.evicted_bytes, chunk.footprint());
            self.release(state, key, &chunk);
            evicted.push(chunk);
        }
        true
    }

    /// The resident chunk needed furthest in the future (by [`Turn`], then distance), least
    /// recently used among equals; `None` if it is not needed later than `needed_in`. Chunks of
    /// the block a reader just left that it got in the last [`RECENTLY_READ`] are passed over
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
        self.now().saturating_sub(RECENTLY_READ.as_nanos() as u64)
    }

    /// The ranking of evictions decided now.
    fn ranking(&self) -> Ranking {
        Ranking {
            recent: self.recent(),
            active: self.active.load(Ordering::Relaxed),
            active_since: self.active_since.load(Ordering::Relaxed),
        }
    }

    fn release(&self, state: &mut State, key: ChunkKey, chunk: &Chunk) {
        state.used -= chunk.footprint();
        if let Some(owner) = &chunk.owner {
            owner.marks.released(key.index());
        }
        if let Some(bytes) = state.per_file.get_mut(&key.file) {
            *bytes = bytes.saturating_sub(chunk.len());
        }
        if chunk.unread_prefetch.swap(false, Ordering::Relaxed) {
            self.count_wasted(chunk);
        }
    }

    fn count_wasted(&self, chunk: &Chunk) {
        Counters::add(&self.counters.prefetch_wasted_bytes, chunk.footprint());
        if let Some(file) = chunk.file_counters() {
            Counters::add(&file.prefetch_wasted_bytes, chunk.footprint());
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Checks the accounting against the resident set (tests): `used` is the resident
    /// footprints plus the reservations of cached reads in flight, and with nothing in flight,
    /// never more than the budget.
    #[cfg(test)]
    pub(crate) fn check_accounting(&self) {
        let state = self.lock();
        let resident = state.resident.footprint();
        assert!(
            state.used >= resident,
            "used {} < resident {resident}",
            state.used
        );
        if state.loading.is_empty() {
            assert_eq!(state.in_flight, 0, "in-flight bytes with nothing loading");
            assert_eq!(
                state.used, resident,
                "reservations left with nothing loading"
            );
            assert!(
                state.used <= state.budget,
                "{} over budget {}",
                state.used,
                state.budget
            );
        }
    }
}

#[cfg(test)]
mod tests;
