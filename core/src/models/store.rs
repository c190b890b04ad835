//! The model store of a mount ([`ModelStore`]): every known model file version, with the chunk
//! cache, the passthrough tier and the prefetcher that serve them; its construction, tuning
//! ([`ModelsConfig`]), budget, warming, and the opening of file versions.
//!
//! **Contract.** [`ModelStore::open`] returns the current version of a file: the known one if
//! its source is unchanged, else a freshly indexed one with a new generation, whose old
//! version's chunks are dropped. Several readers opening a file at once share the first version
//! indexed. The mount's budget is shared by the chunk cache and the passthrough tier: the
//! cache gets what the tier does not hold, never less than the floor
//! ([`ModelStore::rebalance`]).
//!
//! **Locks.** `files` (the [`ModelTable`]) is held only to look up, insert or remove a
//! version: never across I/O (a header read happens outside it) nor while the chunk cache is
//! called (dropped chunks are forgotten after it is released); `sequence` only to record a
//! stream or a close.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::mode::ServeMode;
use super::table::ModelTable;
use super::{plan, sequence, shards, Layout, ModelFile, ModelsConfig, OpenError, RawReason};
use crate::cache::{ChunkCache, CompressMode};
use crate::disk_tier::DiskTier;
use crate::passthrough::PassthroughTier;
use crate::prefetch::saved::SavedOrders;
use crate::prefetch::{Executor, PacingMode, Prefetcher};
use crate::source::deadline::{SourceIo, SourceIoConfig};
use crate::source::meter::SourceMeters;
use crate::source::{PathAccess, PlainPaths, ReadWrapper, SourceError, SourceFile, SourceIdentity};
use crate::stats::Counters;
use crate::sync::{lock, Mutex, MutexGuard};

/// `auto` compression trusts a source device's measured throughput once it delivered this
/// much: 64 MiB, sixteen 4 MiB chunks, past the header reads and the first read's latency.
pub const COMPRESS_SOURCE_SAMPLE_BYTES: u64 = 64 << 20;

/// Whether a known version serves a new open: its sharded model (if any) is current, and it
/// was not left unindexed for want of room under the index cap (each open tries again, at the
/// cost of one header read, so that it is indexed as soon as open files make room).
pub(super) fn is_reusable(known: &ModelFile) -> bool {
    shards::is_current(known)
        && !matches!(
            known.layout,
            Layout::Raw {
                why: RawReason::IndexCapFull { .. }
            }
        )
}

/// Every model file version of a mount, with the cache and prefetcher that serve them.
pub struct ModelStore {
    pub(super) cache: Arc<ChunkCache>,
    /// The mount's budget, shared by the chunk cache and the passthrough tier: the cache gets
    /// what the tier does not hold ([`Self::rebalance`]).
    pub(super) budget: AtomicU64,
    pub(super) passthrough: PassthroughTier,
    pub(super) prefetcher: Prefetcher,
    pub(super) files: Mutex<ModelTable>,
    pub(super) next_generation: AtomicU64,
    pub(super) saved: SavedOrders,
    /// Fault injection for tests ([`ModelStore::with_read_wrapper`]); `None` in the daemon.
    pub(super) read_wrapper: Option<ReadWrapper>,
    /// The sharded models formed so far.
    pub(super) shards: shards::Registry,
    /// How source files are reached by path ([`ModelStore::reach_source_through`]).
    pub(super) paths: std::sync::OnceLock<Arc<dyn PathAccess>>,
    /// Which model follows which ([`sequence`]).
    pub(super) sequence: Mutex<sequence::Sequence>,
    /// The files a client said it will load next ([`plan`]).
    pub(super) plan: Mutex<plan::Plan>,
    /// The chunk cache's share never goes below this (the governor's floor,
    /// [`Self::set_chunk_floor`]), whatever passthrough files hold.
    pub(super) chunk_floor: AtomicU64,
    /// Tuning ([`ModelsConfig`]).
    pub(super) config: ModelsConfig,
    /// The measured speed of each source device the mount reads from.
    pub(super) meters: Arc<SourceMeters>,
    /// Source reads: deadline, retries and their I/O threads ([`Self::with_source_io`]).
    pub(super) source_io: Arc<SourceIo>,
    /// The local disk tier below the chunk cache ([`Self::with_disk_tier`]).
    pub(super) disk_tier: Option<Arc<DiskTier>>,
}

/// Who opens a file version ([`ModelStore::open_version`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpenedBy {
    /// A reader: a new load starts ([`ModelFile::opened`]), and a sharded model may be formed
    /// (discovery reads the files beside this one with the reader's rights).
    Reader,
    /// The store itself: prefetch crossing into a shard ([`shards`]) or the warm of the next
    /// model. It must not reset the runs of a reader that may be streaming that file, and forms
    /// no sharded model.
    Store,
}

/// Bytes of the model that followed the one just closed to warm: a share of the budget
/// ([`ModelsConfig::next_model_head_share`]; a share of 0 warms nothing).
fn next_model_head(budget: u64, config: &ModelsConfig) -> u64 {
    budget
        .checked_div(config.next_model_head_share)
        .unwrap_or(0)
}

impl ModelStore {
    /// A store with `budget` bytes of cache, keeping learned orders in `saved`.
    pub fn new(budget: u64, saved: SavedOrders) -> ModelStore {
        let cache = Arc::new(ChunkCache::new(budget, Arc::new(Counters::default())));
        let prefetcher = Prefetcher::new(Arc::clone(&cache));
        ModelStore::with_prefetcher(cache, prefetcher, saved)
    }

    /// [`Self::new`] with prefetches run by `executor` (tests: a
    /// [`crate::prefetch::ManualExecutor`]).
    pub fn with_executor(
        budget: u64,
        saved: SavedOrders,
        executor: Arc<dyn Executor>,
    ) -> ModelStore {
        let cache = Arc::new(ChunkCache::new(budget, Arc::new(Counters::default())));
        let prefetcher = Prefetcher::with_executor(Arc::clone(&cache), executor);
        ModelStore::with_prefetcher(cache, prefetcher, saved)
    }

    fn with_prefetcher(
        cache: Arc<ChunkCache>,
        prefetcher: Prefetcher,
        saved: SavedOrders,
    ) -> ModelStore {
        ModelStore {
            prefetcher: prefetcher.with_pacing_mode(PacingMode::Parallel),
            budget: AtomicU64::new(cache.budget()),
            cache,
            passthrough: PassthroughTier::default(),
            files: Mutex::new(ModelTable::new(ModelsConfig::default().index_cap)),
            next_generation: AtomicU64::new(1),
            saved,
            read_wrapper: None,
            shards: shards::Registry::default(),
            paths: std::sync::OnceLock::new(),
            sequence: Mutex::new(sequence::Sequence::default()),
            plan: Mutex::new(plan::Plan::default()),
            chunk_floor: AtomicU64::new(0),
            config: ModelsConfig::default(),
            meters: Arc::new(SourceMeters::default()),
            source_io: Arc::new(SourceIo::default()),
            disk_tier: None,
        }
    }

    /// The meters of the source devices the mount reads from ([`crate::source::meter`]).
    pub fn source_meters(&self) -> &Arc<SourceMeters> {
        &self.meters
    }

    /// Measures the source reads of files opened from now on on `meters` (tests: meters on a
    /// manual clock).
    pub fn with_source_meters(mut self, meters: Arc<SourceMeters>) -> ModelStore {
        self.meters = meters;
        self
    }

    /// Makes every by-path access to SOURCE go through `paths` (a mount's resolver, which
    /// never follows a path through `/proc` or into the mount: [`PathAccess`]). Set once,
    /// before the first open; until then, and if never set, plain paths.
    pub fn reach_source_through(&self, paths: Arc<dyn PathAccess>) {
        if self.paths.set(paths).is_err() {
            tracing::debug!("the source's path tracker was set already");
        }
    }

    pub(crate) fn paths(&self) -> Arc<dyn PathAccess> {
        Arc::clone(self.paths.get_or_init(|| Arc::new(PlainPaths)))
    }

    /// Makes every source file opened from now on read through `wrap`: how the fault-injection
    /// tests put short reads, `EINTR` and `EIO` under the whole read path.
    pub fn with_read_wrapper(mut self, wrap: ReadWrapper) -> ModelStore {
        self.read_wrapper = Some(wrap);
        self
    }

    /// Warms `file` into the cache in its learned (or default) block order, in the background,
    /// up to the budget. The warm ends the reader's pass in progress, which may learn it: the
    /// order is saved then, as when a new pass ends one.
    pub fn warm(&self, file: &Arc<ModelFile>) {
        self.prefetcher.warm(file);
        if let Some(tracker) = file.tracker().filter(|a| a.learned().0) {
            self.saved
                .put(file.order_key.clone(), tracker.saved_order());
        }
    }

    /// `file` is streamed for the first time since it was opened: it follows the model streamed
    /// and closed before it ([`sequence`]).
    pub(super) fn first_stream(&self, file: &Arc<ModelFile>) {
        file.touch_ahead.clear();
        lock(&self.plan).streamed(file);
        let learned = lock(&self.sequence).streamed(file);
        if let Some((key, next)) = learned {
            self.saved.put_next_model(&key, next);
        }
    }

    /// Replaces the mount's plan with `files`, in the order a client will load them, and
    /// warms what the plan says to warm now ([`plan`]).
    pub fn set_plan(&self, files: Vec<Arc<ModelFile>>) {
        let warm = lock(&self.plan).set(files);
        if let Some(file) = warm {
            self.warm_planned(&file);
        }
    }

    /// The plan's files and the index of the current one (the stats' `plan` section).
    pub fn plan_snapshot(&self) -> (Vec<String>, usize) {
        lock(&self.plan).snapshot()
    }

    /// The plan's next file after `file`, whose last handle a reader that streamed it closed,
    /// if `file` is in the plan.
    pub(super) fn planned_after(&self, file: &ModelFile) -> Option<Arc<ModelFile>> {
        lock(&self.plan).closed(file)
    }

    /// Warms `file`, the plan's next, up to the budget: the chunk cache gets its room back from
    /// parked passthrough files first, as for a model it serves (the file is then served from
    /// the chunk cache, which holds it: `ModeReason::AlreadyCached`). The file gets the cache's
    /// turn ([`ChunkCache::hand_turn_to`]): the files read before it are done, as far as the
    /// plan knows, and its warm may take their room. Nothing is warmed for a file passthrough
    /// serves (open, or parked: its next open is passthrough's too).
    pub(super) fn warm_planned(&self, file: &Arc<ModelFile>) {
        let open_by_passthrough =
            file.mode() == ServeMode::Passthrough && file.handles.load(Ordering::Acquire) > 0;
        // Parked: its last open was served by passthrough, and so will its next be. A loader
        // that maps a file and closes it at once (safetensors' `safe_open`) may be reading it
        // through the mapping right now, unseen by the mount: a warm would read it twice.
        let parked = self.passthrough.is_parked(&file.source.identity());
        if file.is_raw() || file.in_ram || open_by_passthrough || parked {
            return;
        }
        tracing::debug!(file = %file.path.display(), "warming the plan's next file");
        self.passthrough
            .make_room_for_model(self.budget(), file.size());
        self.rebalance();
        if let Some(tracker) = file.tracker() {
            self.cache.hand_turn_to(tracker);
        }
        file.warmed_by_plan.store(true, Ordering::Release);
        self.warm(file);
    }

    /// Queues the first blocks of `next`, the model that followed the one just closed
    /// ([`sequence`]), if the chunk cache will serve it.
    pub(super) fn warm_next(&self, next: &Arc<ModelFile>) {
        let identity = next.source.identity();
        let cache_served =
            next.mode() == ServeMode::Cache || self.passthrough.is_competing(&identity);
        if next.is_raw() || !cache_served {
            return;
        }
        tracing::debug!(file = %next.path.display(), "warming the first blocks of the next model");
        self.prefetcher
            .warm_head(next, next_model_head(self.budget(), &self.config));
    }

    /// [`Self::warm_next`] of the successor saved for the file of sequence key `key` (after a
    /// remount), opened by its path, if it is still the version that followed. Returns whether
    /// a successor was saved (warmed or not).
    pub(super) fn warm_saved_next(&self, key: &str) -> bool {
        let Some(saved) = self.saved.next_model(key) else {
            return false;
        };
        // Not as a reader: nothing is discovered beside it (no shard set is formed for a file
        // nobody opened), and it does not count as an open.
        let opened = self.open_version(
            (&saved.next_path, &saved.next_source, None),
            OpenedBy::Store,
        );
        match opened.map(|(file, _)| file) {
            Ok(next) if sequence::key_of(&next) == saved.next_key => {
                if next.handles.load(Ordering::Acquire) == 0 {
                    self.warm_next(&next);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(file = %saved.next_path.display(), error = %e, "the saved next model is gone")
            }
        }
        true
    }

    /// Holds headers and indexes of known files to `cap` bytes (`--index-cache`).
    pub fn with_index_cap(mut self, cap: u64) -> ModelStore {
        self.lock().set_cap(cap);
        self.config.index_cap = cap;
        self
    }

    /// Tunes the store with `config` (its index cap included): for files opened from now on,
    /// and for every read.
    /// Keeps the chunks of files opened from now on in `tier` too ([`crate::disk_tier`]).
    pub fn with_disk_tier(mut self, tier: Arc<DiskTier>) -> ModelStore {
        self.disk_tier = Some(tier);
        self
    }

    /// The mount's local disk tier, if it has one.
    pub fn disk_tier(&self) -> Option<&Arc<DiskTier>> {
        self.disk_tier.as_ref()
    }

    pub fn with_config(mut self, config: ModelsConfig) -> ModelStore {
        let mut files = self.lock();
        files.set_cap(config.index_cap);
        files.set_trim_after(config.trim_after_evicted_bytes);
        drop(files);
        self.config = config;
        self
    }

    /// Bounds the time of source reads and retries them by `config` (`--source-timeout`), for
    /// files opened from now on ([`crate::source::deadline`]).
    /// Reads ahead of sources as `mode` says (`--source-pacing`; [`crate::prefetch::pacing`]).
    /// Until this is called a store reads ahead in parallel whatever its sources: the decision
    /// from a source's measured speed depends on the machine, so a store is given it by the
    /// daemon, which passes `auto` by default.
    pub fn with_source_pacing(mut self, mode: PacingMode) -> ModelStore {
        self.prefetcher = self.prefetcher.with_pacing_mode(mode);
        self
    }

    /// The compressed RAM tier in `mode` (`--compress`), its thread started
    /// ([`crate::cache::CompressMode`]; `auto` compares the decoder's speed with the slowest
    /// source device's, once it delivered [`COMPRESS_SOURCE_SAMPLE_BYTES`]). Until this is
    /// called a store compresses nothing.
    pub fn with_compress(self, mode: CompressMode) -> ModelStore {
        self.cache.set_compress_mode(mode);
        if mode != CompressMode::Off {
            let meters = Arc::clone(&self.meters);
            let speed = Arc::new(move || meters.slowest_throughput(COMPRESS_SOURCE_SAMPLE_BYTES));
            if let Err(e) = self.cache.start_compressor(speed) {
                tracing::warn!(error = %e, "cannot start the compressor thread: nothing is compressed");
            }
        }
        self
    }

    /// Source reads run and bounded as `config` says (`--source-timeout`).
    pub fn with_source_io(mut self, config: SourceIoConfig) -> ModelStore {
        self.prefetcher = self.prefetcher.with_source_deadline(config.timeout);
        self.source_io = Arc::new(SourceIo::new(config));
        self
    }

    /// The mount's source reads, with their failure counters.
    pub fn source_io(&self) -> &SourceIo {
        &self.source_io
    }

    /// The store's tuning.
    pub fn config(&self) -> &ModelsConfig {
        &self.config
    }

    pub fn cache(&self) -> &ChunkCache {
        &self.cache
    }

    /// The mount's budget (chunk cache and passthrough tier together).
    pub fn budget(&self) -> u64 {
        self.budget.load(Ordering::Relaxed)
    }

    /// Changes the mount's budget; the chunk cache shrinks at once if it must.
    pub fn set_budget(&self, bytes: u64) {
        self.budget.store(bytes, Ordering::Relaxed);
        self.passthrough.make_room(bytes, 0);
        self.rebalance();
    }

    /// Drops every cached chunk and the page cache of every parked passthrough file (files
    /// still open keep theirs: their readers are using it).
    pub fn drop_cached(&self) {
        self.cache.clear();
        self.passthrough.make_room(self.budget(), self.budget());
        self.rebalance();
    }

    /// Gives the chunk cache whatever part of the budget the passthrough tier does not hold.
    /// Called on every model open and close: a budget that did not change is left alone
    /// (`set_budget` takes the cache lock and wakes every waiting reader).
    ///
    /// The chunk cache keeps at least the floor ([`Self::set_chunk_floor`]), whatever
    /// passthrough files hold: together they may then exceed the budget by at most the floor
    /// (parked files still give their page cache back when an open or a smaller budget needs
    /// the room). Without it, a text encoder open by passthrough under memory pressure left the
    /// chunk cache nothing: every request read a whole chunk and threw it away.
    pub(super) fn rebalance(&self) {
        let budget = self.budget();
        let floor = self.chunk_floor.load(Ordering::Relaxed).min(budget);
        let chunk_budget = budget
            .saturating_sub(self.passthrough.held_bytes())
            .max(floor);
        if chunk_budget != self.cache.budget() {
            self.cache.set_budget(chunk_budget);
        }
    }

    /// The least the chunk cache keeps of the budget (the governor's `--ram-cache-min`).
    pub fn set_chunk_floor(&self, bytes: u64) {
        self.chunk_floor.store(bytes, Ordering::Relaxed);
    }

    /// Bytes the passthrough tier holds (open files' reservations and parked page cache).
    pub fn passthrough_held_bytes(&self) -> u64 {
        self.passthrough.held_bytes()
    }

    /// Returns once every prefetch queued so far has run (tests, instead of sleeping).
    pub fn wait_prefetch_idle(&self) {
        self.prefetcher.wait_idle();
    }

    pub fn counters(&self) -> &Counters {
        self.cache.counters()
    }

    /// The current version of the model file at `path` (relative to the mount root), whose
    /// source is `abs`: the known one if the source is unchanged, else a freshly indexed one.
    pub fn open(&self, path: &Path, abs: &Path) -> Result<Arc<ModelFile>, OpenError> {
        self.open_version((path, abs, None), OpenedBy::Reader)
            .map(|(file, _)| file)
    }

    /// [`Self::open`], with the descriptors the file was indexed through when it was indexed
    /// just now (`None` for a known version: its descriptors are opened on demand).
    /// `by`: who opens it ([`OpenedBy`]).
    /// `opened`: the requester's descriptor of `abs`, whose version is the one opened.
    pub(super) fn open_version(
        &self,
        (path, abs, opened): (&Path, &Path, Option<&File>),
        by: OpenedBy,
    ) -> Result<(Arc<ModelFile>, Option<Arc<SourceFile>>), OpenError> {
        let paths = self.paths();
        let current = match opened {
            Some(file) => SourceIdentity::of_file(file),
            None => paths.identity(abs),
        }
        .map_err(|source| SourceError::Open {
            path: abs.to_owned(),
            source,
        })?;
        if let Some(known) = self.lock().get(path) {
            if known.source.identity() == current && is_reusable(known) {
                if by == OpenedBy::Reader {
                    known.opened();
                }
                return Ok((Arc::clone(known), None));
            }
        }
        let discovery = (by == OpenedBy::Reader).then_some(paths.as_ref());
        let membership = self
            .shards
            .membership((path, abs), &current, &self.saved, discovery);
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let index_cap = self.lock().cap();
        let (file, source) = ModelFile::open(
            (path, abs, opened),
            generation,
            (
                &self.saved,
                self.read_wrapper.as_ref(),
                &paths,
                &self.meters,
                &self.source_io,
            ),
            membership,
            (index_cap, &self.config),
            self.disk_tier.as_ref(),
        )?;
        let mut files = self.lock();
        // Several readers may open a file at once: the first version indexed wins, the others
        // use it (same identity) rather than replace it and drop its cached bytes.
        if let Some(known) = files.get(path) {
            if known.source.identity() == file.source.identity() && is_reusable(known) {
                if by == OpenedBy::Reader {
                    known.opened();
                }
                return Ok((Arc::clone(known), None));
            }
        }
        let (file, replaced, evicted) = files.insert_within_cap(path, file);
        drop(files);
        if let Some(old) = replaced {
            // (The same version again: one served as plain bytes, indexed once room was made.)
            if old.source.identity() != file.source.identity() {
                tracing::info!(file = %abs.display(), "source changed: dropping cached bytes of the old version");
            }
            self.cache.forget_file(old.generation);
        }
        for old in &evicted {
            tracing::debug!(file = %old.path.display(), "index cap reached: forgetting the file");
            self.cache.forget_file(old.generation);
        }
        drop(evicted);
        self.trim_after_evictions();
        Ok((file, Some(source)))
    }

    /// Gives the memory of forgotten headers back to the OS once enough was forgotten (see
    /// [`ModelsConfig::trim_after_evicted_bytes`]).
    fn trim_after_evictions(&self) {
        if self.lock().take_trim_due() {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only returns free heap pages to the OS.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ModelTable> {
        lock(&self.files)
    }
}
