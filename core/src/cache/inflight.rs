//! Reads in flight: single flight, and the bound on what reads in flight may reserve.
//!
//! **Contract.** [`ChunkCache::lookup`] decides, under the cache's lock, how a request is
//! answered ([`Lookup`]): from memory, by waiting for the read of that chunk already in flight
//! (*single flight*: a chunk is read from disk once however many readers, or the prefetcher,
//! want it), by a new read, or (a prefetch) not at all.
//! - A new read is registered in the single-flight table ([`Loading`]) and *reserves* its
//!   footprint of the budget before it starts (evicting by the rule of `evict.rs`); it is read
//!   uncached when no room can be had.
//! - Reads in flight may reserve at most `budget / read_in_flight_share` (readers) and
//!   `budget / prefetch_in_flight_share` (prefetches) of [`super::CacheConfig`]: past it, a
//!   reader's miss waits on `ChunkCache::room` for a read to finish, and a prefetch is skipped.
//!   A read always goes ahead when nothing else is in flight. Waiting cannot deadlock: a read
//!   in flight depends on nothing but the disk
//!   ([why the bound](../../../docs/PERFORMANCE.md#reads-in-flight)).
//! - However a read ends, [`InFlight`] settles it once ([`ChunkCache::complete`]): its entry is
//!   removed, its reservation returned or turned into the resident chunk, every waiter woken
//!   with the result. A read that panics is settled by `InFlight`'s `Drop` with
//!   [`CacheError::LoadPanicked`]; a failed read caches nothing.
//!
//! **Locks.** `Loading::result` is never taken with the cache's `state` held: waiters take it
//! after releasing `state`, the loader publishes after releasing it. `load` runs with no lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::served::Served;
use super::{
    CacheError, Chunk, ChunkCache, ChunkKey, ChunkMarks, ChunkMeta, ChunkOwner, Evicted, Loaded,
    Want,
};
use crate::source::SourceError;
use crate::stats::Counters;
use crate::sync::{lock, wait, Condvar, Mutex};

/// A chunk being read (single flight): its waiters wait on `done`.
pub(super) struct Loading {
    result: Mutex<Option<Result<Arc<Chunk>, CacheError>>>,
    done: Condvar,
    /// Whether a reader waits for it (set and read under the cache's lock). The chunk is then
    /// marked read the moment it is resident, not when that reader wakes: by then the other
    /// threads of its reader may have gone blocks on, and the chunk, evicted in between as the
    /// block needed last, would count as wasted prefetch although it served its waiters
    /// (`models::tests::concurrent_sequential_readers_account_prefetch_exactly`).
    pub(super) awaited: AtomicBool,
}

impl Loading {
    pub(super) fn wait(&self) -> Result<Arc<Chunk>, CacheError> {
        let mut result = lock(&self.result);
        loop {
            if let Some(result) = result.as_ref() {
                return result.clone();
            }
            result = wait(&self.done, result);
        }
    }

    /// A read (or a decode, `tier.rs`) no one has finished yet.
    pub(super) fn new() -> Loading {
        Loading {
            result: Mutex::new(None),
            done: Condvar::new(),
            awaited: AtomicBool::new(false),
        }
    }

    pub(super) fn finish(&self, outcome: Result<Arc<Chunk>, CacheError>) {
        *lock(&self.result) = Some(outcome);
        self.done.notify_all();
    }
}

/// How a request is answered ([`ChunkCache::lookup`]).
pub(super) enum Lookup {
    /// Resident: here it is.
    Hit(Arc<Chunk>),
    /// A prefetch with no room (or of a chunk consumed this visit): nothing to read.
    Skip,
    /// Being read: wait for that read.
    Wait(Arc<Loading>),
    /// Read it, registered as `loading`; kept in the cache afterwards if `cached`.
    Load { loading: Arc<Loading>, cached: bool },
}

/// One read in flight, registered in the single-flight table with its reservation. However the
/// read ends, [`InFlight::finish`] or, if the read panicked, `Drop` removes the entry, returns
/// the reservation and wakes every waiter.
pub(super) struct InFlight<'a> {
    cache: &'a ChunkCache,
    key: ChunkKey,
    footprint: u64,
    cached: bool,
    marks: Option<&'a ChunkMarks>,
    loading: Arc<Loading>,
    finished: bool,
}

impl<'a> InFlight<'a> {
    /// The read of `key` registered by [`Lookup::Load`], reserving `footprint` (of the budget
    /// if `cached`).
    pub(super) fn new(
        cache: &'a ChunkCache,
        key: ChunkKey,
        footprint: u64,
        cached: bool,
        marks: Option<&'a ChunkMarks>,
        loading: Arc<Loading>,
    ) -> InFlight<'a> {
        InFlight {
            cache,
            key,
            footprint,
            cached,
            marks,
            loading,
            finished: false,
        }
    }

    fn finish(mut self, result: Result<Arc<Chunk>, CacheError>) -> Result<Arc<Chunk>, CacheError> {
        self.finished = true;
        self.cache.complete(&self, result)
    }

    /// Ends the read with `error` (the read of a run it was part of failed), caching nothing.
    pub(super) fn fail(self, error: CacheError) -> Result<Arc<Chunk>, CacheError> {
        self.finish(Err(error))
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
    /// Decides, under the lock, how a request is answered; a reader's miss may first wait for
    /// room among the reads in flight.
    pub(super) fn lookup(
        &self,
        key: ChunkKey,
        footprint: u64,
        want: Want,
        owner: Option<&ChunkOwner>,
    ) -> (Lookup, Evicted) {
        let mut evicted = Evicted::new();
        if let Some(owner) = owner.filter(|_| want == Want::Read) {
            self.note_active(owner);
        }
        let mut state = self.lock();
        loop {
            if let Some(chunk) = state.resident.get(&key) {
                Self::touch_window(&mut state, key, &chunk);
                if want == Want::Read {
                    Counters::add(&self.counters.hits, 1);
                    self.note_read(&chunk);
                }
                return (Lookup::Hit(chunk), evicted);
            }
            if let Some(loading) = state.loading.get(&key) {
                if want == Want::Read {
                    loading.awaited.store(true, Ordering::Relaxed);
                    if let Some(owner) = owner {
                        owner.marks.awaited(key.index());
                    }
                }
                return (Lookup::Wait(Arc::clone(loading)), evicted);
            }
            let share = match want {
                Want::Read => self.config.read_in_flight_share,
                Want::Prefetch => self.config.prefetch_in_flight_share,
            };
            // A read always goes ahead when nothing else is in flight, whatever its size.
            let crowded = state.in_flight > 0 && state.in_flight + footprint > state.budget / share;
            if !crowded {
                break;
            }
            if want == Want::Prefetch {
                return (Lookup::Skip, evicted);
            }
            state = wait(&self.room, state);
        }
        if want == Want::Prefetch && owner.is_some_and(|o| state.consumed.contains(key, o)) {
            return (Lookup::Skip, evicted);
        }
        let needed_in = self.may_evict_for(want, owner);
        let cached = self.evict_until_fits(&mut state, footprint, needed_in, &mut evicted);
        if !cached && want == Want::Prefetch {
            return (Lookup::Skip, evicted);
        }
        if cached {
            state.used += footprint;
        }
        state.in_flight += footprint;
        let loading = Arc::new(Loading::new());
        state.loading.insert(key, Arc::clone(&loading));
        if let Some(owner) = owner {
            owner.marks.loading(key.index(), want);
        }
        (Lookup::Load { loading, cached }, evicted)
    }

    /// Runs `load` for the read registered as `in_flight` (no lock held) and publishes the
    /// result; if `load` panics, `in_flight`'s drop publishes an error instead.
    pub(super) fn load<B: Into<Loaded>>(
        &self,
        in_flight: InFlight<'_>,
        (want, owner): (Want, Option<&ChunkOwner>),
        load: impl FnOnce() -> Result<B, SourceError>,
    ) -> Result<Arc<Chunk>, CacheError> {
        let result = load()
            .map(|loaded| {
                let Loaded {
                    bytes,
                    from_disk_tier,
                } = loaded.into();
                let file = owner.map(|owner| &owner.tracker.counters);
                if !from_disk_tier {
                    Counters::add(&self.counters.disk_reads, 1);
                    Counters::add_with_file(
                        &self.counters.disk_read_bytes,
                        file.map(|file| &file.disk_read_bytes),
                        bytes.as_slice().len() as u64,
                    );
                }
                if want == Want::Prefetch {
                    Counters::add_with_file(
                        &self.counters.prefetch_issued_bytes,
                        file.map(|file| &file.prefetch_issued_bytes),
                        bytes.footprint(),
                    );
                }
                let len = bytes.as_slice().len() as u64;
                let loaded_footprint = bytes.footprint();
                Arc::new(Chunk::raw(
                    bytes,
                    ChunkMeta {
                        len,
                        loaded_footprint,
                        unread_prefetch: AtomicBool::new(want == Want::Prefetch),
                        owner: owner.cloned(),
                        last_read: AtomicU64::new(if want == Want::Read { self.now() } else { 0 }),
                        read_visit: AtomicU64::new(owner.map_or(0, |o| o.tracker.visit())),
                        served: Served::default(),
                        kept_raw: AtomicBool::new(false),
                    },
                ))
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
}
