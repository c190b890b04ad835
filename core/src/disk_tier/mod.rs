//! The local disk tier: chunks read from a slow source kept on a local disk, below the RAM
//! cache, across restarts.
//!
//! **Contract.** With `--disk-cache DIR --disk-cache-size SIZE`, every chunk the RAM cache
//! loads from the source is also written to DIR (in the background, never delaying the reader
//! who asked for it), and a chunk the RAM cache misses is read from DIR instead of the source
//! when DIR holds it. DIR never holds more than SIZE bytes of chunks; room is made by the rule
//! in [`index`] (the chunks needed soonest stay). A chunk comes back from DIR only if its bytes
//! match the checksum recorded when it was written: a damaged, truncated or missing cache file
//! is detected, dropped and read from the source again, never served. A crash or power loss
//! loses at most the chunks being written ([`log`]). DIR belongs to one mount at a time: a
//! second mount naming it is refused with the process holding it. Writing never makes a read
//! fail: a full disk shrinks the tier to what it holds, other write errors skip the chunk, and
//! both are counted. A version held whole may be handed to the kernel for passthrough
//! ([`copy`]: checked first, kept while in use, then given way whole, never punched).
//!
//! **Layout.** `DIR/tierfs-disk-tier-v1/` holds a lock file and, per source version, a sparse
//! data file at the source's own offsets (`NAME.data`) and its chunk log (`NAME.log`). NAME is
//! a hash of what identifies the version ([`TierVersion`]): a replaced file is a new version,
//! whose chunks never mix with the old one's. Writes go through the page cache and are
//! written back and dropped from it at once; reads use `O_DIRECT` where DIR's file system takes
//! it: the tier's bytes are never a second copy in RAM (a whole copy handed to the kernel is
//! read through the page cache, as the one copy the kernel serves).
//!
//! **What it costs.** Chunks waiting to be written are copies, bounded by
//! [`DiskTierConfig::max_pending_bytes`] (outside the RAM budget); a chunk offered while that
//! is full is not written (`skipped_busy`).

mod copy;
mod index;
mod io;
mod log;
mod recover;
mod version;
mod writer;

pub use copy::WholeCopy;
pub use version::{TierVersion, VersionInTier};

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::source::AlignedBytes;
use crate::sync::{lock, Mutex};
use index::TierIndex;
use log::{chunk_hash, Record};
use writer::Job;

/// Name of the tier's folder inside DIR (the format's version is in it: a later format starts
/// a folder of its own rather than misread this one).
const TIER_FOLDER: &str = "tierfs-disk-tier-v1";

/// How long a stopping mount waits for the chunks waiting to be written: at most
/// [`DiskTierConfig::max_pending_bytes`] (64 MiB by default), which a disk writing 10 MB/s, the
/// slowest worth a tier, writes in this time.
const DRAIN_AT_STOP: Duration = Duration::from_secs(7);

/// Tuning of the disk tier.
#[derive(Debug, Clone)]
pub struct DiskTierConfig {
    /// The folder the tier lives in (created if missing).
    pub dir: PathBuf,
    /// Bytes of chunks the tier may hold.
    pub capacity: u64,
    /// Bytes of chunks waiting to be written at most: the copies' RAM, outside the budget.
    /// 64 MiB holds a few chunks of the largest blocks while a local disk writes at hundreds
    /// of MB/s, far faster than the slow sources the tier is for.
    pub max_pending_bytes: u64,
}

impl DiskTierConfig {
    /// A tier in `dir` of `capacity` bytes, tuned by default.
    pub fn new(dir: PathBuf, capacity: u64) -> DiskTierConfig {
        DiskTierConfig {
            dir,
            capacity,
            max_pending_bytes: 64 << 20,
        }
    }
}

/// Why the disk tier cannot be opened.
#[derive(Debug, Error)]
pub enum DiskTierError {
    #[error("cannot create the disk cache folder {dir}: {source}")]
    Create {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot lock the disk cache {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the disk cache {dir} is in use by another tierfs mount ({holder}); give each mount \
         a folder of its own"
    )]
    InUse { dir: PathBuf, holder: String },
    #[error("cannot read the disk cache folder {dir}: {source}")]
    List {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// The tier's counters, since the mount started.
#[derive(Debug, Default)]
struct TierCounters {
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    written: AtomicU64,
    written_bytes: AtomicU64,
    evicted: AtomicU64,
    evicted_bytes: AtomicU64,
    damaged: AtomicU64,
    write_errors: AtomicU64,
    skipped_busy: AtomicU64,
    not_kept: AtomicU64,
    whole_copies: AtomicU64,
}

/// What `.tierfs/stats` shows of the tier.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskTierStats {
    /// The folder given.
    pub dir: String,
    /// Bytes of chunks the tier may hold now (less than asked after a full disk).
    pub capacity_bytes: u64,
    /// Bytes of chunks held or being written.
    pub used_bytes: u64,
    /// Source versions with chunks held.
    pub versions: u64,
    /// Chunks (and their bytes) read back instead of from the source.
    pub hits: u64,
    pub hit_bytes: u64,
    /// Chunks (and bytes) written.
    pub written: u64,
    pub written_bytes: u64,
    /// Chunks (and bytes) dropped to make room.
    pub evicted: u64,
    pub evicted_bytes: u64,
    /// Chunks whose bytes did not match their checksum, or could not be read back: dropped
    /// and read from the source.
    pub damaged: u64,
    /// Chunks not written because of a write error (a full disk included).
    pub write_errors: u64,
    /// Chunks not written because [`DiskTierConfig::max_pending_bytes`] were waiting.
    pub skipped_busy: u64,
    /// Chunks not written because only chunks needed sooner were held.
    pub not_kept: u64,
    /// Opens of a model file handed to the kernel by passthrough from its whole copy in the
    /// tier ([`WholeCopy`]).
    pub whole_copies: u64,
}

/// The open files of one cached version.
struct VersionFiles {
    data_path: PathBuf,
    data: File,
    direct: Option<File>,
    direct_works: AtomicBool,
    log: Mutex<File>,
}

/// What the writer thread and the readers share.
struct Shared {
    dir: PathBuf,
    given_dir: PathBuf,
    index: Mutex<TierIndex>,
    files: Mutex<HashMap<String, Arc<VersionFiles>>>,
    counters: TierCounters,
    /// Bytes of chunks offered and not yet written or refused.
    pending: AtomicU64,
    max_pending: u64,
    /// Whether a full disk was already reported.
    full_reported: AtomicBool,
    /// The tier is being dropped: queued chunks are not written.
    stopping: AtomicBool,
    /// Held locked for the tier's life: DIR is this mount's.
    _lock: File,
}

/// The local disk tier of a mount ([module docs](self)).
pub struct DiskTier {
    shared: Arc<Shared>,
    /// `None` once dropped (which ends the writer).
    jobs: Option<crossbeam::channel::Sender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.shared.dir)
            .finish()
    }
}

impl DiskTier {
    /// Opens (or creates) the tier in `config.dir`: locks it, takes in what an earlier mount
    /// left (dropping what its logs do not vouch for), trims it to the capacity, and starts
    /// its writer.
    pub fn open(config: &DiskTierConfig) -> Result<Arc<DiskTier>, DiskTierError> {
        let dir = config.dir.join(TIER_FOLDER);
        std::fs::create_dir_all(&dir).map_err(|source| DiskTierError::Create {
            dir: dir.clone(),
            source,
        })?;
        let lock_file = recover::take_lock(&config.dir, &dir.join("lock"))?;
        let mut index = TierIndex::new(config.capacity);
        let files = recover::take_in(&dir, &mut index)?;
        let (jobs, queue) = crossbeam::channel::unbounded();
        let shared = Arc::new(Shared {
            dir,
            given_dir: config.dir.clone(),
            index: Mutex::new(index),
            files: Mutex::new(files),
            counters: TierCounters::default(),
            pending: AtomicU64::new(0),
            max_pending: config.max_pending_bytes,
            full_reported: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            _lock: lock_file,
        });
        let victims = lock(&shared.index).trim();
        for victim in victims {
            shared.drop_victim(&victim);
        }
        let writer =
            writer::start(Arc::clone(&shared), queue).map_err(|source| DiskTierError::Create {
                dir: shared.dir.clone(),
                source,
            })?;
        tracing::info!(dir = %shared.dir.display(), capacity = config.capacity, held = lock(&shared.index).used, "disk tier open");
        Ok(Arc::new(DiskTier {
            shared,
            jobs: Some(jobs),
            writer: Some(writer),
        }))
    }

    /// Whether the tier holds `[start, end)` of `version` (as one chunk).
    pub fn holds(&self, version: &TierVersion, start: u64, end: u64) -> bool {
        lock(&self.shared.index)
            .get(&version.name, start, end)
            .is_some()
    }

    /// `[start, end)` of `version`, if the tier holds it as one chunk and its bytes match their
    /// checksum; a chunk that does not is dropped (and counted) and `None` returned.
    pub fn read(&self, version: &TierVersion, start: u64, end: u64) -> Option<AlignedBytes> {
        let held = {
            let mut index = lock(&self.shared.index);
            let held = index.get(&version.name, start, end)?;
            index.touch(&version.name);
            held
        };
        let shared = &self.shared;
        let got = shared
            .files_of(&version.name, None)
            .and_then(|files| {
                io::read_chunk(
                    (&files.data, files.direct.as_ref(), &files.direct_works),
                    &files.data_path,
                    start,
                    end,
                )
            })
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                if chunk_hash(bytes.as_slice()) == held.hash {
                    Ok(bytes)
                } else {
                    Err("its bytes do not match their checksum".to_owned())
                }
            });
        match got {
            Ok(bytes) => {
                lock(&shared.index).verified(&version.name, start);
                add(&shared.counters.hits, 1);
                add(&shared.counters.hit_bytes, end - start);
                Some(bytes)
            }
            Err(why) => {
                self.damaged(&version.name, start, end, held.hash, &why);
                None
            }
        }
    }

    /// Drops `[start, end)` of version `name`, found damaged (`why`), if it is still held as
    /// checked (checksum `hash`): an eviction meanwhile is no damage.
    fn damaged(&self, name: &str, start: u64, end: u64, hash: u64, why: &str) {
        let shared = &self.shared;
        let sealed = {
            let mut index = lock(&shared.index);
            index.sealed(name).then(|| index.drop_sealed(name))
        };
        if let Some(victim) = sealed {
            // No hole is punched in a file the kernel may map: the version goes whole, or,
            // while the kernel reads it, stays (its bytes were checked when it was handed over).
            add(&shared.counters.damaged, 1);
            tracing::warn!(dir = %shared.dir.display(), start, end, %why, "a chunk of the disk tier is damaged: its version is dropped whole, read from the source");
            if let Some(victim) = victim {
                self.send(Job::DropVersion { name: victim.name });
            }
            return;
        }
        if lock(&shared.index).forget(name, start, hash).is_some() {
            add(&shared.counters.damaged, 1);
            tracing::warn!(dir = %shared.dir.display(), start, end, %why, "a chunk of the disk tier is damaged: dropped, read from the source");
            self.send(Job::Drop {
                name: name.to_owned(),
                start,
                end,
            });
        }
    }

    /// Offers `[start, end)` of `version`, just read from the source, to be written in the
    /// background (a copy is queued; nothing is written when too much waits already).
    pub fn offer(&self, version: &TierVersion, start: u64, end: u64, bytes: &[u8]) {
        let Some(len) = end.checked_sub(start).filter(|&len| len > 0) else {
            return; // nothing to keep (a log records no empty range)
        };
        if bytes.len() as u64 != len || end > version.size || self.holds(version, start, end) {
            return;
        }
        let shared = &self.shared;
        if shared
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p + len <= shared.max_pending).then_some(p + len)
            })
            .is_err()
        {
            add(&shared.counters.skipped_busy, 1);
            return;
        }
        match AlignedBytes::copy_of(bytes) {
            Ok(copy) => self.send(Job::Put {
                version: version.clone(),
                start,
                bytes: copy,
            }),
            Err(e) => {
                shared.pending.fetch_sub(len, Ordering::AcqRel);
                tracing::debug!(error = %e, "no memory to queue a chunk for the disk tier");
                add(&shared.counters.skipped_busy, 1);
            }
        }
    }

    /// Waits up to `timeout` for the chunks offered so far to be written (or refused); whether
    /// they were.
    pub fn settle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.shared.pending.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// The tier's figures now.
    pub fn stats(&self) -> DiskTierStats {
        let (capacity, used, versions) = {
            let index = lock(&self.shared.index);
            let versions = index
                .entries
                .values()
                .filter(|e| !e.held.is_empty())
                .count() as u64;
            (index.capacity, index.used, versions)
        };
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskTierStats {
            dir: self.shared.given_dir.display().to_string(),
            capacity_bytes: capacity,
            used_bytes: used,
            versions,
            hits: get(&c.hits),
            hit_bytes: get(&c.hit_bytes),
            written: get(&c.written),
            written_bytes: get(&c.written_bytes),
            evicted: get(&c.evicted),
            evicted_bytes: get(&c.evicted_bytes),
            damaged: get(&c.damaged),
            write_errors: get(&c.write_errors),
            skipped_busy: get(&c.skipped_busy),
            not_kept: get(&c.not_kept),
            whole_copies: get(&c.whole_copies),
        }
    }

    /// Bytes of `version` the tier holds.
    pub fn held_bytes(&self, version: &TierVersion) -> u64 {
        lock(&self.shared.index).held_bytes(&version.name)
    }

    fn send(&self, job: Job) {
        let Some(jobs) = self.jobs.as_ref() else {
            return;
        };
        if let Err(e) = jobs.send(job) {
            // The writer is gone (it only ends with the tier): nothing is written any more.
            if let Job::Put { bytes, .. } = e.into_inner() {
                self.shared
                    .pending
                    .fetch_sub(bytes.as_slice().len() as u64, Ordering::AcqRel);
            }
        }
    }
}

impl Drop for DiskTier {
    /// Ends the writer once the chunks waiting are written, or after [`DRAIN_AT_STOP`] (then
    /// the rest is not written, the one being written is finished); then the folder's lock is
    /// released.
    fn drop(&mut self) {
        if !self.settle(DRAIN_AT_STOP) {
            tracing::info!(dir = %self.shared.dir.display(), "the mount stops: chunks still waiting are not written to the disk tier");
        }
        self.shared.stopping.store(true, Ordering::Release);
        self.jobs = None;
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::warn!(dir = %self.shared.dir.display(), "the disk tier's writer panicked");
            }
        }
    }
}

impl Shared {
    /// The open files of version `name`; created (sized `create`) when missing and `create`
    /// is given.
    fn files_of(&self, name: &str, create: Option<u64>) -> std::io::Result<Arc<VersionFiles>> {
        if let Some(files) = lock(&self.files).get(name) {
            return Ok(Arc::clone(files));
        }
        let data_path = version_file(&self.dir, name, DATA);
        let log_path = version_file(&self.dir, name, LOG);
        let files = match create {
            Some(size) if !data_path.exists() => {
                let data = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&data_path)?;
                data.set_len(size)?;
                let mut log = OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .open(&log_path)?;
                log.write_all(&Record::Header { size }.encode())?;
                VersionFiles::new(data_path, data, log)
            }
            _ => {
                let data = OpenOptions::new().read(true).write(true).open(&data_path)?;
                let log = OpenOptions::new().append(true).open(&log_path)?;
                VersionFiles::new(data_path, data, log)
            }
        };
        let files = Arc::new(files);
        lock(&self.files).insert(name.to_owned(), Arc::clone(&files));
        Ok(files)
    }

    /// Frees what `victim` names on disk: its range, or its whole version.
    fn drop_victim(&self, victim: &index::Victim) {
        if victim.whole {
            self.drop_version(&victim.name);
        } else {
            self.drop_range(&victim.name, victim.start, victim.end);
        }
    }

    /// Deletes version `name`'s files: descriptors still open on its data file (a whole copy
    /// the kernel may still map) keep reading its bytes, and its space is freed when they
    /// close.
    fn drop_version(&self, name: &str) {
        lock(&self.files).remove(name);
        for ext in [LOG, DATA] {
            recover::remove(&version_file(&self.dir, name, ext));
        }
    }

    /// Frees `[start, end)` of version `name` on disk and records that it is gone.
    fn drop_range(&self, name: &str, start: u64, end: u64) {
        match self.files_of(name, None) {
            Ok(files) => {
                io::punch(&files.data, start, end);
                if let Err(e) = lock(&files.log).write_all(&Record::Drop { start, end }.encode()) {
                    tracing::debug!(error = %e, "cannot record a dropped chunk; its checksum will catch it");
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, name, "cannot open a cached version to drop a chunk")
            }
        }
    }
}

impl VersionFiles {
    fn new(data_path: PathBuf, data: File, log: File) -> VersionFiles {
        VersionFiles {
            direct: io::open_direct(&data_path),
            data_path,
            data,
            direct_works: AtomicBool::new(true),
            log: Mutex::new(log),
        }
    }
}

/// Extensions of a version's data file and its log.
const DATA: &str = "data";
const LOG: &str = "log";

/// The path of version `name`'s file with extension `ext` in the tier's folder `dir`.
fn version_file(dir: &std::path::Path, name: &str, ext: &str) -> PathBuf {
    dir.join(format!("{name}.{ext}"))
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
