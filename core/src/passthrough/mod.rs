//! The passthrough tier: model files that fit the budget, handed to the kernel whole.
//!
//! A model file no larger than what is left of the budget is best served by not serving it:
//! the FUSE adapter opens it with FUSE passthrough (`FOPEN_PASSTHROUGH`, Linux ≥ 6.9, root), so
//! the reader's `read()` and `mmap` go straight to the source file's page cache, and cold reads
//! get the source's own readahead. Measured with the acceptance benchmark
//! (`tests/bench/acceptance-results.md`, 1.5 GiB DiT, nine loaders): cold 1.00–1.08× the plain
//! file's speed on a 1 GB/s source and 0.90–3.09× on a 4 GB/s one, warm 0.79–1.09×; the chunk
//! path served the same loaders warm at 0.09–0.54× from its own RAM
//! (`tests/bench/loader-results.md`), held back by the FUSE page cache's 4 KiB folios.
//!
//! What this module adds is the *budget* for that page cache, which the kernel would otherwise
//! grow without bound:
//! - **Open files reserve their size** when admitted ([`PassthroughTier::admit`]): a reader may
//!   touch every byte, and the page cache it fills is tierfs's doing. A file is admitted only if
//!   its size fits in the budget minus what other tiers hold.
//! - **Closed files are parked**, their page cache left in place so that a reload is a page-cache
//!   hit (ComfyUI reloads a model it evicted from VRAM). A parked file is known by path and
//!   identity only (no descriptor is kept), and counts its resident bytes as measured by
//!   `cachestat(2)` when it was parked.
//! - **Room is made by dropping parked files**, least recently parked first, with
//!   `POSIX_FADV_DONTNEED` ([`residency::drop_page_cache`]), when a new admission or the chunk
//!   cache needs the bytes ([`PassthroughTier::make_room`]).
//! - **A file dropped to make room competes**: it is remembered, and is not admitted again
//!   (the chunk cache serves it). So do files still open when another model that would fit
//!   the budget alone is refused for the room they reserve. Models that take turns and do not fit the budget together (a
//!   workflow's two experts, a text encoder and a diffusion model) would otherwise each drop
//!   the other whole at every switch and read all of themselves from disk each time: the tier
//!   can only keep or drop a closed file's page cache, it never sees the reads of an open one.
//!   The chunk cache shares one budget between them by the rule it uses within one model (the
//!   chunk needed soonest stays), so each switch reads about what the budget cannot hold. Measured with
//!   `tests/bench/workflow.py` (`workflow-results.md`): two and three models taking turns
//!   read all of every model per cycle when every model was admitted here, and 1.1–1.3 × (sum
//!   of the models − budget) through the chunk cache. A first switch is still served by
//!   passthrough: a user who moves from one model to the next for good keeps passthrough's
//!   speed for the new one.
//!
//! The tier reports what it holds ([`PassthroughTier::held_bytes`]); the owner (the model store)
//! gives the chunk cache the rest of the budget. A page of a parked file may also be reclaimed by
//! the kernel under memory pressure, which only makes the figure an over-estimate.
//!
//! One inode of the mount is served in one mode while it has open handles (the kernel cannot mix
//! cached and passthrough opens of one inode); that stickiness is the adapter's, which knows the
//! inodes.
//!
//! **`O_DIRECT` readers** (runai-model-streamer 0.17.1 opens `O_RDONLY | O_DIRECT` and reads with
//! io_uring) are passed through like any other open, and so keep what they asked for: the kernel
//! hands their reads to the backing file as direct reads, which go to the source device and leave
//! nothing in its page cache. Such an open reserves the file's size while it is open; closed, it
//! parks nothing (`cachestat` finds no page resident). Measured on the acceptance benchmark's fast source (ext4
//! on zram, 1.5 GiB DiT, one runai process for every pass; `tests/bench/odirect.py`, results in
//! `tests/bench/odirect-results.md` and, with `FUSE_ASYNC_DIO`, `odirect-results-async-dio.md`,
//! 2026-12-02):
//! - the plain file pinned in the page cache: 1558 MiB read from the device on every pass
//!   (`O_DIRECT` ignores the page cache, so a "warm" plain file is a disk read), 0.77 s median
//!   of 8;
//! - through passthrough, passes alternating with the plain file's: 1558 MiB from the device
//!   too, 0.66 s (plain / mount 1.17; 0.96 and 1.02 in two other runs of 8 pairs). Single
//!   passes range over 0.5–1.7 s on both sides, and the loader's CPU time equals its wall time
//!   in each (the daemon's: 0.00–0.02 s): the spread is the loader's own CPU on a shared 2-core
//!   VM. `dd bs=1M iflag=direct`: 0.265 s both ways, device read in full;
//! - the chunk cache (`--no-model-passthrough`), loaded before: 0 bytes from the device,
//!   0.44–0.81 s (0.72–1.21 s before the adapter asked for `FUSE_ASYNC_DIO`, when the requests
//!   came one at a time). Faster than the plain file, but its cold pass is the chunk cache's
//!   (0.92 s cold), and serving every first `O_DIRECT` open from the chunk cache, tried on the
//!   acceptance benchmark's runai rows (`tests/bench/acceptance-results-runai-trial.md`), took warm to 1.17–1.20
//!   but cold fast to 0.64–1.33 and cold slow to 0.91–1.07, rows passthrough passes (2.02–2.23,
//!   1.06–1.59): the rule was dropped;
//! - a RAM-backed passthrough backing would not help: the model on tmpfs takes runai 0.30–0.32 s
//!   plain but 0.56–1.03 s through a passthrough mount of that tmpfs folder (the loader's CPU
//!   equals its wall time through passthrough, about twice it on tmpfs: the asynchronous direct
//!   path of passthrough runs on one core here).
//!
//! So `O_DIRECT` opens are not treated apart, and tierfs keeps no RAM copy for them; where the
//! chunk cache serves them (a model larger than the room, or already cached), `FUSE_ASYNC_DIO`
//! lets their reads run in parallel.

pub mod residency;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use lru::LruCache;
use serde::Serialize;

use crate::source::SourceIdentity;

/// Parked files remembered at most. Each is a path and a few numbers; 1024 is more model files
/// than any workflow keeps warm, and bounds the state a hostile folder can grow.
const MAX_PARKED: usize = 1024;

/// The source object a passthrough file is (device and inode, plus the version fields, so a
/// rewritten file is another key).
type FileKey = (u64, u64, u64, i128);

fn key_of(identity: &SourceIdentity) -> FileKey {
    (identity.dev, identity.ino, identity.size, identity.mtime_ns)
}

struct OpenFile {
    size: u64,
    handles: usize,
    path: PathBuf,
}

struct Parked {
    path: PathBuf,
    identity: SourceIdentity,
    resident: u64,
}

#[derive(Default)]
struct State {
    open: HashMap<FileKey, OpenFile>,
    open_bytes: u64,
    parked: Option<LruCache<FileKey, Parked>>,
    parked_bytes: u64,
    /// Files whose parked page cache was dropped to make room (see the module docs).
    competing: Option<LruCache<FileKey, ()>>,
    admitted: u64,
    refused: u64,
    refused_competing: u64,
    dropped_bytes: u64,
}

impl State {
    fn parked(&mut self) -> &mut LruCache<FileKey, Parked> {
        self.parked
            .get_or_insert_with(|| LruCache::new(lru_capacity()))
    }

    fn competing(&mut self) -> &mut LruCache<FileKey, ()> {
        self.competing
            .get_or_insert_with(|| LruCache::new(lru_capacity()))
    }
}

fn lru_capacity() -> std::num::NonZeroUsize {
    std::num::NonZeroUsize::new(MAX_PARKED).unwrap_or(std::num::NonZeroUsize::MIN)
}

/// `cache.passthrough` section of the stats.
#[derive(Debug, Clone, Serialize)]
pub struct PassthroughSnapshot {
    /// Files open in passthrough mode, and the bytes they reserve.
    pub open_files: usize,
    pub open_bytes: u64,
    /// Closed files whose page cache is kept, and its size when they were closed.
    pub parked_files: usize,
    pub parked_bytes: u64,
    /// Opens admitted to the tier, and opens refused because the file did not fit.
    pub admitted: u64,
    pub refused: u64,
    /// Files dropped to make room for another model, served from the chunk cache since, and
    /// the opens refused for that reason (see the module docs).
    pub competing_files: usize,
    pub refused_competing: u64,
    /// Page cache of parked files given back to make room.
    pub dropped_bytes: u64,
}

/// Budget bookkeeping for files served by passthrough (see the module docs).
#[derive(Default)]
pub struct PassthroughTier {
    state: Mutex<State>,
}

impl PassthroughTier {
    /// Admits one more open of the file `abs` (version `identity`) if it fits in `room` bytes
    /// (the budget minus what other tiers hold, passthrough excluded). An already open file is
    /// always admitted: its reservation is counted once. Returns whether the open may use
    /// passthrough; if so, [`Self::release`] must follow when the handle closes.
    pub fn admit(&self, abs: &Path, identity: &SourceIdentity, room: u64) -> bool {
        let key = key_of(identity);
        let mut state = self.lock();
        if let Some(open) = state.open.get_mut(&key) {
            open.handles += 1;
            state.admitted += 1;
            return true;
        }
        if state.competing().contains(&key) {
            state.refused_competing += 1;
            return false;
        }
        let parked = state.parked().pop(&key);
        if let Some(parked) = &parked {
            state.parked_bytes -= parked.resident;
        }
        if state.open_bytes + identity.size > room {
            if let Some(parked) = parked {
                state.parked_bytes += parked.resident;
                state.parked().put(key, parked);
            }
            // Files open now take the room this one would need (a loader that keeps a model
            // mapped until it is collected holds it past the next model's open): they compete
            // with it, and their next opens go to the chunk cache.
            if identity.size <= room {
                let open: Vec<FileKey> = state.open.keys().copied().collect();
                for key in open {
                    state.competing().put(key, ());
                }
            }
            state.refused += 1;
            return false;
        }
        let need = (state.open_bytes + identity.size + state.parked_bytes).saturating_sub(room);
        let dropped = Self::drop_parked(&mut state, need, true);
        state.open_bytes += identity.size;
        state.open.insert(
            key,
            OpenFile {
                size: identity.size,
                handles: 1,
                path: abs.to_owned(),
            },
        );
        state.admitted += 1;
        drop(state);
        drop_all(dropped);
        true
    }

    /// One passthrough handle of `identity` closed. The last one parks the file with its page
    /// cache as measured now.
    pub fn release(&self, identity: &SourceIdentity) {
        let key = key_of(identity);
        let mut state = self.lock();
        let Some(open) = state.open.get_mut(&key) else {
            return;
        };
        open.handles -= 1;
        if open.handles > 0 {
            return;
        }
        let Some(open) = state.open.remove(&key) else {
            return;
        };
        state.open_bytes -= open.size;
        let resident = residency::resident_bytes(&open.path, identity).unwrap_or(open.size);
        if resident == 0 {
            return;
        }
        state.parked_bytes += resident;
        let evicted = state.parked().push(
            key,
            Parked {
                path: open.path,
                identity: *identity,
                resident,
            },
        );
        let mut dropped = Vec::new();
        if let Some((_, old)) = evicted {
            if old.identity != *identity {
                state.parked_bytes -= old.resident;
                state.dropped_bytes += old.resident;
                dropped.push(old);
            }
        }
        drop(state);
        drop_all(dropped);
    }

    /// Forgets the parked file `identity`, a version no longer in SOURCE: its page cache went
    /// with it (deleted), or belongs to the file's new version (rewritten in place).
    pub fn forget(&self, identity: &SourceIdentity) {
        let mut state = self.lock();
        let key = key_of(identity);
        if let Some(parked) = state.parked().pop(&key) {
            state.parked_bytes -= parked.resident;
        }
        state.competing().pop(&key);
    }

    /// Why the tier does not serve `identity`, if it was refused because it competes with
    /// other models for the budget (the stats' `mode_reason`).
    pub fn is_competing(&self, identity: &SourceIdentity) -> bool {
        self.lock().competing().contains(&key_of(identity))
    }

    /// The page cache of `identity` the tier keeps parked (as measured when it closed).
    pub fn parked_bytes_of(&self, identity: &SourceIdentity) -> u64 {
        self.lock()
            .parked()
            .peek(&key_of(identity))
            .map_or(0, |p| p.resident)
    }

    /// Drops parked files until what the tier holds leaves `wanted` bytes of `budget` free, for
    /// a budget change or a `drop`. Returns the bytes given back.
    pub fn make_room(&self, budget: u64, wanted: u64) -> u64 {
        self.make_room_as(budget, wanted, false)
    }

    /// [`Self::make_room`] for a model the chunk cache serves: the files dropped compete with it
    /// (see the module docs).
    pub fn make_room_for_model(&self, budget: u64, wanted: u64) -> u64 {
        self.make_room_as(budget, wanted, true)
    }

    fn make_room_as(&self, budget: u64, wanted: u64, competing: bool) -> u64 {
        let mut state = self.lock();
        let held = state.open_bytes + state.parked_bytes;
        let need = (held + wanted.min(budget)).saturating_sub(budget);
        let dropped = Self::drop_parked(&mut state, need, competing);
        drop(state);
        let bytes = dropped.iter().map(|p| p.resident).sum();
        drop_all(dropped);
        bytes
    }

    /// Bytes the tier holds: reservations of open files plus parked page cache.
    pub fn held_bytes(&self) -> u64 {
        let state = self.lock();
        state.open_bytes + state.parked_bytes
    }

    pub fn snapshot(&self) -> PassthroughSnapshot {
        let mut state = self.lock();
        PassthroughSnapshot {
            open_files: state.open.len(),
            open_bytes: state.open_bytes,
            parked_files: state.parked().len(),
            parked_bytes: state.parked_bytes,
            admitted: state.admitted,
            refused: state.refused,
            competing_files: state.competing().len(),
            refused_competing: state.refused_competing,
            dropped_bytes: state.dropped_bytes,
        }
    }

    /// Takes parked files off the list, least recently parked first, until `need` bytes are
    /// freed; the caller drops their page cache once the lock is released. `competing`: the
    /// room is for another model, so the files dropped are remembered as competing with it.
    fn drop_parked(state: &mut State, mut need: u64, competing: bool) -> Vec<Parked> {
        let mut dropped = Vec::new();
        while need > 0 {
            let Some((key, parked)) = state.parked().pop_lru() else {
                break;
            };
            if competing {
                state.competing().put(key, ());
            }
            need = need.saturating_sub(parked.resident);
            state.parked_bytes -= parked.resident;
            state.dropped_bytes += parked.resident;
            dropped.push(parked);
        }
        dropped
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Gives back the page cache of files taken off the parked list (outside the tier's lock:
/// `fadvise` walks the file's pages).
fn drop_all(parked: Vec<Parked>) {
    for p in parked {
        if let Err(e) = residency::drop_page_cache(&p.path, &p.identity) {
            tracing::debug!(file = %p.path.display(), error = %e, "cannot drop a parked file's page cache");
        }
    }
}

// The tests measure and drop real page cache, which only Linux reports (cachestat).
#[cfg(all(test, target_os = "linux"))]
mod tests;
