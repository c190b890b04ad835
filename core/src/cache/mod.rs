//! The byte-bounded chunk cache shared by every file of a mount.
//!
//! **Contract.** [`ChunkCache::get_or_load`] returns a chunk's bytes, from memory or by running
//! the caller's `load` once (single flight: every other thread asking for a chunk being read
//! waits for that read). The cache promises:
//! - **One budget**, in bytes of chunk memory (page-aligned footprints, what the daemon's RSS
//!   pays). `used` counts resident chunks *and* reads in flight, which reserve their bytes
//!   before they start: the cache never holds more than the budget, not even transiently. A
//!   chunk that cannot get room (bigger than the budget, or everything else reserved by reads
//!   in flight) is read and handed to the caller uncached.
//! - **Eviction by need**: the victim is the chunk needed furthest in the future, across files
//!   by turns; a prefetch evicts only what is needed later than what it brings in. The whole
//!   rule is in `evict.rs`.
//! - **Bounded reads in flight**: readers' loads may reserve a share of the budget, prefetches
//!   a smaller one ([`CacheConfig`]); past it a reader's miss waits and a prefetch is skipped.
//!   Single flight, the bound and what happens when a read fails or panics are in `inflight.rs`.
//! - **Failed reads cache nothing**: the error goes to every reader waiting on that read, and
//!   the next request reads the disk again; a read that panics is an error
//!   ([`CacheError::LoadPanicked`]) to its waiters, never a reader waiting forever.
//! - **Compressed chunks, invisible to readers** (`tier.rs`): with [`CompressMode`] on, resident
//!   chunks may be held as lossless frames of the codec ([`crate::compress`]); a reader always
//!   gets the raw bytes (decoded first), a frame that does not decode is a miss, and the budget
//!   counts raw chunks, frames and decoded windows alike.
//! - **Memory is unmapped outside the lock**: evicted chunks are taken out under the lock and
//!   dropped (unmapped, or kept as spare buffers) after it is released, so `drop`, a budget
//!   shrink or a miss that evicts never makes other readers wait for `munmap`
//!   (`cache_lock_bench` measures the lock hold of a 16 GiB drop).
//!
//! **Locks**, all through [`crate::sync`] (model-checked with loom: `loom_tests.rs`), in the
//! order they may be taken:
//! 1. `ChunkCache::state`: budget, `used`/`in_flight` accounting, the resident set and the
//!    single-flight table. Held only for bookkeeping: never during a disk read, a wait for a
//!    read, or an unmap. `ChunkCache::room` waits on it.
//! 2. Under it, read locks of [`ReaderTracker`] (its block positions, for eviction distance),
//!    and the leaf locks of the tier below RAM ([`lower::LowerTier::holds`]).
//!
//! `Loading::result` (one per read in flight) is never taken with `state` held: a waiter takes
//! it after releasing `state`, and the loader publishes its result after releasing `state`. The
//! spare-buffer lock in [`crate::source`] is a leaf taken outside all of these.
//!
//! The compressed tier (`tier.rs`, `compressor.rs`) takes no lock of its own: it changes a
//! chunk's form under `state` only (a swap of the resident entry), and encodes, decodes and
//! unmaps with no lock held; its decoder is thread-local.
//!
//! The cache knows chunks by [`ChunkKey`] only; which bytes a chunk holds is the caller's
//! business ([`crate::models`]), which keeps this module testable without files. It reads how
//! each file is being read from [`crate::reader`] and knows nothing of prefetch.
//!
//! Files: `evict.rs` (which chunk goes), [`lower`] (what the tier below RAM holds),
//! `inflight.rs` (reads in flight), [`run`] (one read for several adjacent chunks), `resident` (the
//! resident chunks grouped by block), `served` (which bytes of a chunk readers were served),
//! [`marks`] (chunk states for the stats), [`plan`] (how a file is cut into chunks).

mod body;
mod compressor;
mod evict;
mod inflight;
pub mod lower;
pub mod marks;
pub mod plan;
mod resident;
pub mod run;
mod served;
mod tier;

#[cfg(all(test, loom))]
mod loom_tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use body::Body;
pub use compressor::{calibrate_decode, SourceSpeed, DECODE_SAMPLE_BYTES};
use evict::ConsumedEvictions;
use inflight::{InFlight, Loading, Lookup};
pub use marks::ChunkMarks;
pub use plan::ChunkCodec;
use resident::Resident;
use served::Served;
use tier::TierState;
pub use tier::{CompressMode, TierConfig, TierSnapshot};

use crate::reader::ReaderTracker;
use crate::source::{self, AlignedBytes, SourceError};
use crate::stats::{CacheSnapshot, CompressSnapshot, CompressedFigures, Counters};
use crate::sync::{lock, Condvar, Mutex, MutexGuard};

/// The cache's tuning; [`Default`] is what the daemon runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// How long after a reader got a chunk of the block it just left the chunk is spared from
    /// eviction while other candidates exist (the recency guard, `evict.rs`): the eight 2 MiB
    /// reads a loader issues at a block boundary end within milliseconds of each other, and
    /// 50 ms is far shorter than the time between two passes over a block.
    pub recently_read: Duration,
    /// Reads in flight may reserve `budget / read_in_flight_share` before a reader's miss
    /// waits for one of them: half, leaving the other half to the chunks readers are still
    /// using ([measured](../../../docs/PERFORMANCE.md#reads-in-flight)).
    pub read_in_flight_share: u64,
    /// Reads in flight may reserve `budget / prefetch_in_flight_share` before a prefetch is
    /// skipped: a quarter, so read-ahead never takes the room a reader's miss needs.
    pub prefetch_in_flight_share: u64,
    /// The compressed RAM tier (`tier.rs`): whether and how resident chunks are compressed.
    pub tier: TierConfig,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            recently_read: Duration::from_millis(50),
            read_in_flight_share: 2,
            prefetch_in_flight_share: 4,
            tier: TierConfig::default(),
        }
    }
}

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

/// A chunk's bytes as a load returns them, and whether they came from the source or from the
/// local disk tier ([`crate::disk_tier`]), which the counters of source reads leave out.
#[derive(Debug)]
pub struct Loaded {
    pub bytes: AlignedBytes,
    pub from_disk_tier: bool,
}

impl From<AlignedBytes> for Loaded {
    fn from(bytes: AlignedBytes) -> Loaded {
        Loaded {
            bytes,
            from_disk_tier: false,
        }
    }
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
    pub tracker: Arc<ReaderTracker>,
    pub block: usize,
    /// The marks of the chunk's file version, which the cache keeps up to date.
    pub marks: Arc<ChunkMarks>,
    /// How the compressed tier splits the chunk's bytes (its dtype and phase).
    pub codec: ChunkCodec,
    /// Where the tier below RAM may hold the chunk (`lower.rs`); `None`: no tier below.
    pub lower: Option<lower::LowerCopy>,
}

/// A chunk in memory: its bytes (raw, or a compressed frame of them: `body.rs`) and its
/// bookkeeping, which every form of the chunk shares ([`ChunkMeta`]). Chunks handed to readers
/// always hold the raw bytes ([`Chunk::as_slice`]).
#[derive(Debug)]
pub struct Chunk {
    body: Body,
    meta: Arc<ChunkMeta>,
}

/// What the cache knows of a chunk, whatever form its bytes are in.
#[derive(Debug)]
pub struct ChunkMeta {
    /// The chunk's length in file bytes.
    len: u64,
    /// The memory its read took (what prefetch figures count, whatever form it is in now).
    loaded_footprint: u64,
    /// Loaded by the prefetcher and not yet read by anyone.
    unread_prefetch: AtomicBool,
    owner: Option<ChunkOwner>,
    /// When a reader last got it ([`ChunkCache::now`]), for the recency guard.
    last_read: AtomicU64,
    /// The owner's visit ([`ReaderTracker::visit`]) in which a reader last got it: a chunk of the
    /// current block read in the current visit has been consumed (see [`Chunk::distance`]).
    read_visit: AtomicU64,
    /// Which of its bytes readers were served in the owner's latest visit (`served.rs`).
    served: Served,
    /// The compressed tier found it does not gain enough: it stays raw (`tier.rs`).
    kept_raw: AtomicBool,
}

impl std::ops::Deref for Chunk {
    type Target = ChunkMeta;

    fn deref(&self) -> &ChunkMeta {
        &self.meta
    }
}

impl Chunk {
    /// A chunk of raw bytes read from the source.
    fn raw(bytes: AlignedBytes, meta: ChunkMeta) -> Chunk {
        Chunk {
            body: Body::Raw(bytes),
            meta: Arc::new(meta),
        }
    }

    /// The same chunk (same bookkeeping) with another body.
    fn with_body(&self, body: Body) -> Chunk {
        Chunk {
            body,
            meta: Arc::clone(&self.meta),
        }
    }

    /// The chunk's bytes. The cache hands readers only chunks that hold them (a compressed
    /// chunk is decoded first, `tier.rs`); a chunk that does not is empty here, never other
    /// bytes.
    pub fn as_slice(&self) -> &[u8] {
        debug_assert!(
            self.body.raw().is_some(),
            "a compressed chunk escaped the cache"
        );
        self.body.raw().unwrap_or(&[])
    }

    fn footprint(&self) -> u64 {
        self.body.footprint()
    }

    fn len(&self) -> u64 {
        self.meta.len
    }

    /// A reader was served `range` of the chunk's bytes (not a probe: see `served.rs`).
    pub fn served(&self, range: &std::ops::Range<usize>) {
        let visit = self.owner.as_ref().map_or(0, |o| o.tracker.visit());
        self.served
            .mark(visit, range.start as u64, range.end as u64, self.len());
    }

    /// Whether readers were served every byte of it in the owner's current visit.
    fn finished(&self, owner: &ChunkOwner) -> bool {
        self.served.finished(owner.tracker.visit(), self.len())
    }

    fn file_counters(&self) -> Option<&crate::reader::FileCounters> {
        self.owner.as_ref().map(|o| &o.tracker.counters)
    }
}

/// How a lookup was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Hit,
    Miss,
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
    /// The compressed tier's windows and figures (`tier.rs`).
    tier: TierState,
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
    /// reader's session began ([`evict::Turn`]).
    active: AtomicUsize,
    active_since: AtomicU64,
    config: CacheConfig,
    /// The compressed tier's [`CompressMode`] (`compressor.rs`), changeable at run time.
    compress_mode: std::sync::atomic::AtomicU8,
}

/// Chunks taken out of the cache under the lock, dropped (unmapped) after it is released.
type Evicted = Vec<Arc<Chunk>>;

impl ChunkCache {
    /// A cache of `budget` bytes with the default tuning.
    pub fn new(budget: u64, counters: Arc<Counters>) -> ChunkCache {
        ChunkCache::with_config(budget, counters, CacheConfig::default())
    }

    /// A cache of `budget` bytes tuned by `config`.
    pub fn with_config(budget: u64, counters: Arc<Counters>, config: CacheConfig) -> ChunkCache {
        let cache = ChunkCache {
            state: Mutex::new(State {
                budget,
                used: 0,
                in_flight: 0,
                resident: Resident::default(),
                loading: HashMap::new(),
                per_file: HashMap::new(),
                consumed: ConsumedEvictions::default(),
                tier: TierState::default(),
            }),
            room: Condvar::new(),
            counters,
            started: Instant::now(),
            active: AtomicUsize::new(0),
            active_since: AtomicU64::new(0),
            config,
            compress_mode: std::sync::atomic::AtomicU8::new(0),
        };
        cache.set_compress_mode(config.tier.mode);
        cache
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
    pub fn get_or_load<B: Into<Loaded>>(
        &self,
        key: ChunkKey,
        footprint: u64,
        want: Want,
        owner: Option<&ChunkOwner>,
        load: impl FnOnce() -> Result<B, SourceError>,
    ) -> Result<(Arc<Chunk>, Outcome), CacheError> {
        let started = Instant::now();
        let (lookup, evicted) = self.lookup(key, footprint, want, owner);
        // Unmapped (or kept as spares for this very load) with no lock held.
        drop(evicted);
        let result = match lookup {
            Lookup::Hit(chunk) => match self.readable(key, chunk) {
                Some(chunk) => return Ok((chunk, Outcome::Hit)),
                // A damaged frame, dropped: read the source as on a miss.
                None => return self.get_or_load(key, footprint, want, owner, load),
            },
            Lookup::Skip => return Err(CacheError::NoRoom),
            Lookup::Wait(loading) => loading.wait(),
            Lookup::Load { loading, cached } => {
                let marks = owner.map(|o| o.marks.as_ref());
                let in_flight = InFlight::new(self, key, footprint, cached, marks, loading);
                self.load(in_flight, (want, owner), load)
            }
        };
        self.missed(want, started, result)
    }

    /// A request that was not a hit ends with `result`: a reader's miss is counted, with the
    /// time it waited, and the chunk marked read.
    fn missed(
        &self,
        want: Want,
        started: Instant,
        result: Result<Arc<Chunk>, CacheError>,
    ) -> Result<(Arc<Chunk>, Outcome), CacheError> {
        if want == Want::Read {
            Counters::add(&self.counters.misses, 1);
            Counters::add(&self.counters.stall_ns, started.elapsed().as_nanos() as u64);
            if let Ok(chunk) = &result {
                self.note_read(chunk);
            }
        }
        result.map(|chunk| (chunk, Outcome::Miss))
    }

    /// The chunk `key` if it is resident with its raw bytes, for a probe ([`crate::models`]):
    /// counted as a hit, but neither made recent nor marked read, so a loader touching one page
    /// of each tensor neither keeps chunks resident nor makes them look consumed (which evicts
    /// them first). A chunk held compressed is not decoded for a probe (a whole chunk for a
    /// page): `None`, and the probe reads its bytes from the source.
    pub fn peek(&self, key: ChunkKey) -> Option<Arc<Chunk>> {
        let chunk = self
            .lock()
            .resident
            .peek(&key)
            .filter(|c| c.body.raw().is_some())?;
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
        let (budget_bytes, used_bytes, chunks, tier) = {
            let state = self.lock();
            let tier = (
                state.tier.frame_raw_bytes,
                state.tier.frame_bytes,
                state.tier.window_bytes,
            );
            (state.budget, state.used, state.resident.len() as u64, tier)
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
            compress: CompressSnapshot {
                mode: match self.compress_mode() {
                    CompressMode::Auto => "auto",
                    CompressMode::On => "on",
                    CompressMode::Off => "off",
                },
                held: CompressedFigures::new(tier.0, tier.1),
                window_bytes: tier.2,
                decoded_bytes: Counters::get(&c.decoded_bytes),
                decode_seconds: Counters::get(&c.decode_ns) as f64 / 1e9,
                decode_errors: Counters::get(&c.decode_errors),
                encoded_bytes: Counters::get(&c.encoded_bytes),
                kept_raw_bytes: Counters::get(&c.kept_raw_bytes),
            },
            index: Default::default(), // the model store's (`ModelStore::index_snapshot`)
        }
    }

    /// A reader got `chunk`: if a prefetch brought it in, that prefetch was useful.
    fn note_read(&self, chunk: &Chunk) {
        chunk.last_read.store(self.now(), Ordering::Relaxed);
        if let Some(owner) = &chunk.owner {
            chunk
                .read_visit
                .store(owner.tracker.visit(), Ordering::Relaxed);
        }
        if chunk.unread_prefetch.swap(false, Ordering::Relaxed) {
            Counters::add_with_file(
                &self.counters.prefetch_used_bytes,
                chunk.file_counters().map(|file| &file.prefetch_used_bytes),
                chunk.loaded_footprint,
            );
        }
    }

    fn release(&self, state: &mut State, key: ChunkKey, chunk: &Chunk) {
        state.used -= chunk.footprint();
        self.body_out(state, key, chunk);
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
        Counters::add_with_file(
            &self.counters.prefetch_wasted_bytes,
            chunk
                .file_counters()
                .map(|file| &file.prefetch_wasted_bytes),
            chunk.loaded_footprint,
        );
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

#[cfg(test)]
#[path = "tier_tests.rs"]
mod tier_tests;
