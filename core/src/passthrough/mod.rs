//! The passthrough tier: model files that fit the budget, handed to the kernel whole, and the
//! budget for the page cache they fill.
//!
//! Contract:
//! - **Admission** ([`PassthroughTier::admit`]): an open is served by passthrough only if the
//!   file fits in the room it is given (the budget minus what the chunk cache uses) next to the
//!   other open passthrough files; an open file reserves its whole size (its reader may touch
//!   every byte, and the page cache it fills is tierfs's doing) and is counted once whatever
//!   its number of handles.
//! - **Parking**: at the last close, the file's page cache is left in place (a reload is a
//!   page-cache hit) and counted as measured by `cachestat(2)`. A parked file is known by
//!   path and identity only (no descriptor is kept); at most [`PassthroughConfig::max_parked`] are remembered.
//! - **Re-measuring**: before the tier decides with the parked figures (an admission, making
//!   room), it measures the most recently parked files again ([`PassthroughConfig::remeasured_parked`]). A loader
//!   may close the file and go on reading through a mapping it made while the file was open:
//!   the kernel maps the source file itself, so the mount sees the close and none of the reads
//!   after it ([measured](../../../docs/PERFORMANCE.md#passthrough-tier)).
//! - **What a drop leaves**: `POSIX_FADV_DONTNEED` skips pages a process still maps. A dropped
//!   file is measured after the drop, and what is left stays parked and counted, to be dropped
//!   at the next room-making once the mapping is gone.
//! - **Making room** ([`PassthroughTier::make_room`], [`PassthroughTier::make_room_for_model`]):
//!   parked files are dropped, least recently parked first, with `POSIX_FADV_DONTNEED`
//!   ([`residency::drop_page_cache`]), outside the tier's lock.
//! - **Competition**: a file dropped to make room for another model, or open when another model
//!   that would fit alone is refused for the room it holds, *competes*: its opens are refused
//!   before admission ([`PassthroughTier::refuses_competing`]; the chunk cache serves them) until
//!   a new version of it appears ([`PassthroughTier::forget`]). An inode already served by
//!   passthrough still admits further handles of its file, competing or not.
//! - [`PassthroughTier::held_bytes`] is what the tier holds (reservations plus parked page
//!   cache); the owner (the model store) gives the chunk cache the rest of the budget. The kernel
//!   may reclaim parked pages under memory pressure, which only makes the figure an
//!   over-estimate.
//!
//! Files on a file system held in RAM (tmpfs, ramfs) never enter the tier: their pages are the
//! files themselves, always resident, and `DONTNEED` gives none back, so once parked they would
//! hold the budget for good ([measured](../../../docs/PERFORMANCE.md#passthrough-tier)). The
//! model store passes
//! them through outside the budget (`ModelStore::choose_mode`).
//!
//! One inode of the mount is served in one mode while it has open handles (the kernel cannot mix
//! cached and passthrough opens of one inode); that stickiness is the adapter's, which knows the
//! inodes.
//!
//! Why passthrough: the reader's `read()` and `mmap` go straight to the source file's page
//! cache with the source's own readahead (FUSE passthrough, `FOPEN_PASSTHROUGH`, Linux ≥ 6.9,
//! root): cold loads at about the plain file's speed, where the chunk cache's FUSE path serves
//! them several times slower ([measured](../../../docs/PERFORMANCE.md#passthrough-tier)).
//!
//! Why competition: models that take turns and do not fit the budget together (a workflow's
//! two experts, a text encoder and a diffusion model) would otherwise drop each other whole at
//! every switch and be read whole each time, since the tier can only keep or drop a closed
//! file's page cache and never sees an open one's reads. The chunk cache shares the budget
//! between them by the rule it uses within one model (the chunk needed soonest stays): about
//! (models − budget) read per cycle, where models dropping each other whole read more than
//! twice that ([measured](../../../docs/PERFORMANCE.md#passthrough-tier)). The first
//! switch is still passthrough's: a user who moves on to another model for good keeps
//! passthrough's speed for it.
//!
//! **`O_DIRECT` readers** (runai-model-streamer) are passed through like any other open and
//! keep what they asked for: their reads go to the source device and leave no page cache, so
//! such an open reserves the file's size while open and parks nothing. Serving them from the
//! chunk cache instead made reloads faster but cold loads slower than the plain file
//! ([measured](../../../docs/PERFORMANCE.md#o_direct-loaders)); where the chunk cache serves them (a
//! model larger than the room, or already cached), `FUSE_ASYNC_DIO` lets their reads run in
//! parallel.

pub mod residency;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lru::LruCache;
use serde::Serialize;

use crate::source::SourceIdentity;
use crate::sync::{lock, Mutex, MutexGuard};

/// The tier's bounds; [`Default`] is today's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassthroughConfig {
    /// Parked files remembered at most. Each is a path and a few numbers; 1024 is more model
    /// files than any workflow keeps warm, and bounds the state a hostile folder can grow.
    pub max_parked: usize,
    /// Parked files measured again before each admission or room-making, most recently parked
    /// first. A mapping outlives its file's close only while its loader runs, which is long
    /// done for files parked before the last few models; 64 bounds what an admission costs
    /// (one `open`, `fstat` and `cachestat` each) however many files are parked.
    pub remeasured_parked: usize,
}

impl Default for PassthroughConfig {
    fn default() -> Self {
        PassthroughConfig {
            max_parked: 1024,
            remeasured_parked: 64,
        }
    }
}

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
    /// [`PassthroughConfig::max_parked`].
    max_parked: usize,
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
            .get_or_insert_with(|| LruCache::new(lru_capacity(self.max_parked)))
    }

    fn competing(&mut self) -> &mut LruCache<FileKey, ()> {
        self.competing
            .get_or_insert_with(|| LruCache::new(lru_capacity(self.max_parked)))
    }
}

fn lru_capacity(max_parked: usize) -> std::num::NonZeroUsize {
    std::num::NonZeroUsize::new(max_parked).unwrap_or(std::num::NonZeroUsize::MIN)
}

/// `cache.passthrough` section of the stats.
#[derive(Debug, Clone, Serialize)]
pub struct PassthroughSnapshot {
    /// Files open in passthrough mode, and the bytes they reserve.
    pub open_files: usize,
    pub open_bytes: u64,
    /// Closed files whose page cache is kept, and its size as last measured (at the close,
    /// and again before each admission or room-making).
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
pub struct PassthroughTier {
    config: PassthroughConfig,
    state: Mutex<State>,
}

impl Default for PassthroughTier {
    fn default() -> Self {
        PassthroughTier::with_config(PassthroughConfig::default())
    }
}

impl PassthroughTier {
    /// An empty tier bounded by `config`.
    pub fn with_config(config: PassthroughConfig) -> PassthroughTier {
        PassthroughTier {
            config,
            state: Mutex::new(State {
                max_parked: config.max_parked,
                ..State::default()
            }),
        }
    }

    /// Admits one more open of the file `abs` (version `identity`) if it fits in `room` bytes
    /// (the budget minus what other tiers hold, passthrough excluded). An already open file is
    /// always admitted: its reservation is counted once. Returns whether the open may use
    /// passthrough; if so, [`Self::release`] must follow when the handle closes.
    pub fn admit(&self, abs: &Path, identity: &SourceIdentity, room: u64) -> bool {
        let key = key_of(identity);
        if !self.lock().open.contains_key(&key) {
            self.remeasure_parked();
        }
        let mut state = self.lock();
        if let Some(open) = state.open.get_mut(&key) {
            open.handles += 1;
            state.admitted += 1;
            return true;
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
        self.give_back(dropped);
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
        // Measured without the lock: it opens the file by path, on a source that may stall.
        drop(state);
        let resident = residency::resident_bytes(&open.path, identity).unwrap_or(open.size);
        let mut state = self.lock();
        if state.open.contains_key(&key) {
            return; // opened again meanwhile: it reserves its size again
        }
        // Parked even with nothing resident: a mapping may still be reading it (see the module
        // docs), which the next re-measure counts.
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
            // The file itself, parked by another close while this one measured (without the
            // lock): replaced by this measurement, so that its old figure does not stay in
            // `parked_bytes` for good (see docs/PERFORMANCE.md#passthrough-tier).
            state.parked_bytes -= old.resident;
            if old.identity != *identity {
                state.dropped_bytes += old.resident;
                dropped.push(old);
            }
        }
        drop(state);
        self.give_back(dropped);
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

    /// [`Self::is_competing`] for an open that would otherwise ask for admission: a competing
    /// file is refused before [`Self::admit`] (which a file whose inode is already served by
    /// passthrough must still pass, competing or not), and the refusal is counted.
    pub fn refuses_competing(&self, identity: &SourceIdentity) -> bool {
        let mut state = self.lock();
        let competes = state.competing().contains(&key_of(identity));
        state.refused_competing += u64::from(competes);
        competes
    }

    /// Whether the tier keeps `identity` parked: its last open was served by passthrough, and
    /// its next one will be if it fits.
    pub fn is_parked(&self, identity: &SourceIdentity) -> bool {
        self.lock().parked().contains(&key_of(identity))
    }

    /// The page cache of `identity` the tier keeps parked (as last measured).
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
        self.remeasure_parked();
        let mut state = self.lock();
        let held = state.open_bytes + state.parked_bytes;
        let need = (held + wanted.min(budget)).saturating_sub(budget);
        let dropped = Self::drop_parked(&mut state, need, competing);
        drop(state);
        self.give_back(dropped)
    }

    /// Measures the [`PassthroughConfig::remeasured_parked`] most recently parked files again (see the module
    /// docs), without the lock: it opens them by path, on a source that may stall. A file that
    /// cannot be measured keeps its figure.
    fn remeasure_parked(&self) {
        let recent: Vec<(FileKey, PathBuf, SourceIdentity)> = self
            .lock()
            .parked()
            .iter()
            .take(self.config.remeasured_parked)
            .map(|(key, p)| (*key, p.path.clone(), p.identity))
            .collect();
        let measured: Vec<(FileKey, SourceIdentity, u64)> = recent
            .into_iter()
            .filter_map(|(key, path, identity)| {
                let resident = residency::resident_bytes(&path, &identity).ok()?;
                Some((key, identity, resident))
            })
            .collect();
        let mut state = self.lock();
        for (key, identity, resident) in measured {
            let Some(parked) = state.parked().peek_mut(&key) else {
                continue; // taken off the list meanwhile
            };
            if parked.identity != identity {
                continue;
            }
            let before = std::mem::replace(&mut parked.resident, resident);
            state.parked_bytes = state.parked_bytes - before + resident;
        }
    }

    /// Gives back the page cache of files taken off the parked list (outside the tier's lock:
    /// `fadvise` walks the file's pages) and returns the bytes given back. What a mapping
    /// still holds stays: such a file is parked again with what is left (see the module docs).
    fn give_back(&self, dropped: Vec<Parked>) -> u64 {
        let mut given = 0;
        for mut p in dropped {
            let left = residency::drop_page_cache(&p.path, &p.identity).unwrap_or_else(|e| {
                tracing::debug!(file = %p.path.display(), error = %e, "cannot drop a parked file's page cache");
                0
            });
            given += p.resident.saturating_sub(left);
            if left == 0 {
                continue;
            }
            tracing::debug!(file = %p.path.display(), left, "a dropped file is still mapped; kept parked");
            let key = key_of(&p.identity);
            let mut state = self.lock();
            state.dropped_bytes = state.dropped_bytes.saturating_sub(left);
            if state.open.contains_key(&key) || state.parked().contains(&key) {
                continue; // opened or parked again meanwhile: counted there
            }
            p.resident = left;
            state.parked_bytes += left;
            state.parked().push(key, p);
            // Least recently parked: the first to go when room is needed again.
            state.parked().demote(&key);
        }
        given
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
            parked_files: state
                .parked()
                .iter()
                .filter(|(_, p)| p.resident > 0)
                .count(),
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
            if parked.resident == 0 {
                continue; // nothing to give back (just measured): it does not compete
            }
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
        lock(&self.state)
    }
}

// The tests measure and drop real page cache, which only Linux reports (cachestat).
#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests;
