//! One version of one model file ([`ModelFile`]): the source version it is (device, inode,
//! size, times at open), its generation number, its layout ([`Layout`]: indexed with a chunk
//! plan, or served raw with the reason), its in-memory header and its per-version state.
//!
//! **Contract.** A `ModelFile` never changes its source version: a file changed in SOURCE is a
//! new `ModelFile` with a new generation ([`super::ModelStore::open`]), and every cached chunk is
//! keyed by generation ([`ModelFile::key`]), so the bytes of one version are never served for
//! another. It holds no descriptor of its own ([`SourceSlot`]): a read or a prefetch of a
//! version nobody holds opens its descriptors again, checked to be the same version. Once
//! pruned ([`super::open`]), no chunk of it stays cached ([`ModelFile::fetch_chunk`]).
//! Its per-version atomics (mode, runs, stream block) are read and written without a lock.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use thiserror::Error;

use super::header::{read_header, HeaderError};
use super::mode::{ModeReason, ServeMode};
use super::{runs, shards, ModelsConfig};
use crate::cache::lower::{LowerCopy, LowerTier};
use crate::cache::plan::{ChunkPlan, ChunkSpan};
use crate::cache::run::RunChunk;
use crate::cache::{
    CacheError, Chunk, ChunkCache, ChunkKey, ChunkMarks, ChunkOwner, Loaded, Outcome, Want,
};
use crate::disk_tier::{DiskTier, TierVersion, VersionInTier};
use crate::index::{Format, TensorIndex};
use crate::prefetch::saved::SavedOrders;
use crate::prefetch::{Pacing, PacingConfig, Pass, PrefetchTarget, SourceSpeed};
use crate::reader::ReaderTracker;
use crate::source::deadline::SourceIo;
use crate::source::meter::SourceMeters;
use crate::source::slot::SourceSlot;
use crate::source::{aligned_footprint, PathAccess, ReadWrapper, SourceError, SourceFile};

/// How long a source device's pacing is kept before the meter's figures decide it again: a
/// read asks for it every time, and on the sources it changes for, 100 ms is a few requests.
const PACING_MAX_AGE: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether tierfs caches a file with this name: `.safetensors`, `.sft` and `.gguf`, any letter
/// case.
pub fn is_model_path(path: &Path) -> bool {
    Format::of_path(path).is_some()
}

/// A model file could not be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    #[error(transparent)]
    Source(#[from] SourceError),
}

impl OpenError {
    /// Whether the path names something other than a regular file (a directory, a device).
    pub fn is_not_a_file(&self) -> bool {
        matches!(self, OpenError::Source(SourceError::NotAFile { .. }))
    }
}

/// How a file's bytes are laid out for serving.
#[derive(Debug)]
pub enum Layout {
    Indexed {
        index: TensorIndex,
        plan: ChunkPlan,
    },
    /// Served as plain bytes, uncached, with no header or index held.
    Raw {
        why: RawReason,
    },
}

/// Why a model file is served as plain bytes ([`Layout::Raw`]).
#[derive(Debug, Clone)]
pub enum RawReason {
    /// Its header does not parse.
    Malformed(String),
    /// Its header and index would not fit the index cap beside those of open files, which
    /// cannot be evicted ([`super::table`]).
    IndexCapFull { needed: u64, cap: u64 },
}

impl std::fmt::Display for RawReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RawReason::Malformed(reason) => f.write_str(reason),
            RawReason::IndexCapFull { needed, cap } => write!(
                f,
                "its header and index ({}) do not fit the index cap ({}, --index-cache) beside \
                 those of the files open now",
                crate::size::format_size(*needed),
                crate::size::format_size(*cap)
            ),
        }
    }
}

/// One version of one model file.
#[derive(Debug)]
pub struct ModelFile {
    pub(super) path: PathBuf,
    pub(super) generation: u64,
    /// The source version, with its descriptors open only while someone reads
    /// ([`crate::source::slot`]).
    pub(super) source: SourceSlot,
    /// The first `header_bytes` of the file and up to
    /// [`ModelsConfig::header_tail_bytes`] after them (empty when malformed).
    pub(super) header: Vec<u8>,
    pub(super) layout: Layout,
    /// Where each chunk of the plan is, kept by the cache (none for a raw file).
    pub(super) marks: Arc<ChunkMarks>,
    /// How readers walk the file's blocks (well-formed files only).
    pub(super) tracker: Option<Arc<ReaderTracker>>,
    /// Key of the file's learned order in [`SavedOrders`] (a shard's is its model's).
    pub(super) order_key: String,
    /// The file's own key (its path and version), under which the model file that follows it
    /// is saved ([`super::sequence`]).
    pub(super) file_key: String,
    /// How the last open of this version is served ([`ServeMode`]), and why ([`ModeReason`]).
    pub(super) mode: AtomicU8,
    pub(super) mode_reason: AtomicU8,
    /// Recent request runs, telling probes from streams ([`runs`]).
    pub(super) runs: runs::Runs,
    /// Probes served since the version was last opened ([`ModelStore::read_probe`]).
    pub(super) touches_since_open: std::sync::atomic::AtomicU64,
    /// The touches of a load warmed the whole version into the cache since it was last opened.
    pub(super) warmed_by_touches: std::sync::atomic::AtomicBool,
    /// Ranges read ahead for a load's next touches ([`super::touch_ahead`]).
    pub(super) touch_ahead: super::touch_ahead::TouchAhead,
    /// An `O_DIRECT` reader of this version sent a request of at least
    /// [`ModelsConfig::direct_exact_min`] since it was last opened: it schedules its own I/O in
    /// large pieces, so its small ones are served exactly too ([`ModelStore::read_direct`]).
    pub(super) direct_reader_schedules: std::sync::atomic::AtomicBool,
    /// The block the last stream of this file was in (`usize::MAX`: none since the last open;
    /// see [`ModelFile::opened`]).
    pub(super) stream_block: std::sync::atomic::AtomicUsize,
    /// Whether a reader streamed the file since its last open (not only probed it: a header
    /// scan is no step of a workflow, [`super::sequence`]).
    pub(super) streamed: std::sync::atomic::AtomicBool,
    /// A client's plan warmed it into the chunk cache ([`super::plan`]): its opens are served
    /// from there, not by passthrough (which would read it from the source a second time).
    pub(super) warmed_by_plan: std::sync::atomic::AtomicBool,
    /// Open handles of this version ([`super::OpenModel`]).
    pub(super) handles: std::sync::atomic::AtomicUsize,
    /// Set once the version was pruned ([`super::open`]): no chunk of it may stay cached.
    pub(super) pruned: std::sync::atomic::AtomicBool,
    /// The sharded model this file is a shard of ([`shards`]): its blocks are the model's.
    pub(super) shard_of: Option<shards::ShardOf>,
    /// Why a file that looks like a shard is served on its own.
    pub(super) standalone_reason: Option<String>,
    /// The source lives on a file system held in RAM ([`SourceFile::is_in_ram`]).
    pub(super) in_ram: bool,
    /// The source is remote ([`SourceFile::is_remote`]): no local file to pass through.
    pub(super) remote: bool,
    /// This version in the mount's local disk tier, if it has one ([`crate::disk_tier`]):
    /// chunks are read from there before the source, and written there after it.
    pub(super) disk_tier: Option<Arc<VersionInTier>>,
    /// The whole copy in the disk tier its passthrough handles read (`tier_copy.rs`).
    pub(super) tier_copy: crate::sync::Mutex<Option<super::tier_copy::CopyInUse>>,
}

impl ModelFile {
    /// Indexes the version of `abs` there now; returns it with the descriptors it was read
    /// through, open for as long as the caller holds them.
    /// `opened`: a descriptor of the file the caller opened already (a requester's), which is
    /// what gets indexed; else `abs` is opened through `paths`. Its reads are measured on
    /// `meters`.
    pub(super) fn open(
        (path, abs, opened): (&Path, &Path, Option<&File>),
        generation: u64,
        (saved, wrap, paths, meters, io): (
            &SavedOrders,
            Option<&ReadWrapper>,
            &Arc<dyn PathAccess>,
            &SourceMeters,
            &Arc<SourceIo>,
        ),
        membership: shards::Membership,
        (index_cap, config): (u64, &ModelsConfig),
        tier: Option<&Arc<DiskTier>>,
    ) -> Result<(ModelFile, Arc<SourceFile>), OpenError> {
        let source = Arc::new(match opened {
            Some(file) => {
                let dup = file.try_clone().map_err(|source| SourceError::Open {
                    path: abs.to_owned(),
                    source,
                })?;
                SourceFile::adopt(abs, dup, wrap)?.metered(meters)
            }
            None => SourceFile::open_with(paths.as_ref(), abs, wrap)?.metered(meters),
        });
        let file_key = SavedOrders::key(&source.canonical_path(), &source.identity());
        let mut order_key = file_key.clone();
        let format = Format::of_path(path).unwrap_or_default();
        let disk_tier = tier.map(|t| {
            Arc::new(VersionInTier::new(
                t,
                TierVersion::of_file(&source.identity()),
            ))
        });
        let from_tier = disk_tier
            .as_ref()
            .and_then(|t| head_from_tier(t, format, source.identity().size, index_cap));
        let got = match from_tier {
            Some(head) => Ok(head),
            None => read_header(&source, format, index_cap, config).inspect(|(header, index)| {
                // Kept in the tier without the tail after it, which is the first chunk's.
                let end = index.header_bytes;
                if let (Some(tier), Some(bytes)) = (&disk_tier, header.get(..end as usize)) {
                    tier.offer(0, end, bytes);
                }
            }),
        };
        let (header, layout) = match got {
            Ok((header, index)) => {
                let plan = ChunkPlan::for_index(&index);
                (header, Layout::Indexed { index, plan })
            }
            Err(HeaderError::Malformed(e)) => {
                tracing::warn!(file = %abs.display(), ?format, reason = %e, "malformed header: serving the file as plain bytes, uncached");
                let why = RawReason::Malformed(e.to_string());
                (Vec::new(), Layout::Raw { why })
            }
            Err(HeaderError::OverCap { needed }) => {
                let why = RawReason::IndexCapFull {
                    needed,
                    cap: index_cap,
                };
                tracing::warn!(file = %abs.display(), reason = %why, "serving the file as plain bytes, uncached");
                (Vec::new(), Layout::Raw { why })
            }
            Err(HeaderError::Source(e)) => return Err(e.into()),
        };
        let (shard_of, standalone_reason, layout) = match layout {
            // Not a shard of anything: no index to take part in a model with.
            layout @ Layout::Raw {
                why: RawReason::IndexCapFull { .. },
            } => (None, None, layout),
            layout => shards::join(membership, &source.identity(), layout),
        };
        let tracker = match (&layout, &shard_of) {
            (Layout::Indexed { .. }, Some(of)) => {
                order_key = of.model.order_key().to_owned();
                Some(Arc::clone(of.model.tracker()))
            }
            (Layout::Indexed { index, .. }, None) => Some(Arc::new(ReaderTracker::new(
                index.blocks.len(),
                saved.get(&order_key),
            ))),
            (Layout::Raw { .. }, _) => None,
        };
        let chunks = match &layout {
            Layout::Indexed { plan, .. } => plan.len(),
            Layout::Raw { .. } => 0,
        };
        let file = ModelFile {
            path: path.to_owned(),
            generation,
            source: SourceSlot::new(&source, wrap.cloned(), Arc::clone(paths), Arc::clone(io)),
            header,
            layout,
            marks: Arc::new(ChunkMarks::new(chunks)),
            tracker,
            order_key,
            file_key,
            mode: AtomicU8::new(ServeMode::Cache as u8),
            mode_reason: AtomicU8::new(ModeReason::NotOpened as u8),
            runs: runs::Runs::default(),
            touches_since_open: std::sync::atomic::AtomicU64::new(0),
            warmed_by_touches: std::sync::atomic::AtomicBool::new(false),
            touch_ahead: super::touch_ahead::TouchAhead::default(),
            direct_reader_schedules: std::sync::atomic::AtomicBool::new(false),
            stream_block: std::sync::atomic::AtomicUsize::new(usize::MAX),
            streamed: std::sync::atomic::AtomicBool::new(false),
            warmed_by_plan: std::sync::atomic::AtomicBool::new(false),
            handles: std::sync::atomic::AtomicUsize::new(0),
            pruned: std::sync::atomic::AtomicBool::new(false),
            shard_of,
            standalone_reason,
            in_ram: source.is_in_ram(),
            remote: source.is_remote(),
            disk_tier,
            tier_copy: crate::sync::Mutex::new(None),
        };
        Ok((file, source))
    }

    /// The file's reader tracker (learned order, reader position), for a well-formed file.
    pub fn tracker(&self) -> Option<&Arc<ReaderTracker>> {
        self.tracker.as_ref()
    }

    /// Path relative to the mount root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The source version (path and identity) this file is, and its descriptors on demand.
    pub fn source(&self) -> &SourceSlot {
        &self.source
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn size(&self) -> u64 {
        self.source.identity().size
    }

    /// The size of the model this file is: the file's, or all of a sharded model's shards'.
    pub fn model_size(&self) -> u64 {
        self.shard_of
            .as_ref()
            .map_or(self.size(), |of| of.model.size)
    }

    /// Whether the file is served as plain bytes ([`Layout::Raw`]).
    pub fn is_raw(&self) -> bool {
        matches!(self.layout, Layout::Raw { .. })
    }

    /// This version without its header, index and reader tracker, served as plain bytes (its
    /// index did not fit the cap: [`RawReason::IndexCapFull`]).
    pub(super) fn into_raw(self, why: RawReason) -> ModelFile {
        tracing::warn!(file = %self.path.display(), reason = %why, "serving the file as plain bytes, uncached");
        ModelFile {
            header: Vec::new(),
            layout: Layout::Raw { why },
            tracker: None,
            shard_of: None,
            ..self
        }
    }

    pub fn plan(&self) -> Option<&ChunkPlan> {
        match &self.layout {
            Layout::Indexed { plan, .. } => Some(plan),
            Layout::Raw { .. } => None,
        }
    }

    /// End of the in-memory header, for a well-formed file.
    pub(super) fn header_end(&self) -> Option<u64> {
        match &self.layout {
            Layout::Indexed { index, .. } => Some(index.header_bytes),
            Layout::Raw { .. } => None,
        }
    }

    pub(crate) fn key(&self, chunk: usize) -> ChunkKey {
        ChunkKey {
            file: self.generation,
            chunk: chunk as u32,
        }
    }

    /// Returns chunk `chunk`, from the cache or from disk.
    pub fn fetch_chunk(
        &self,
        cache: &ChunkCache,
        chunk: usize,
        want: Want,
    ) -> Result<Option<(Arc<Chunk>, Outcome)>, CacheError> {
        let Some(span) = self.plan().and_then(|plan| plan.get(chunk)).copied() else {
            return Ok(None);
        };
        let footprint = aligned_footprint(span.start, span.end);
        let owner = self.owner(&span);
        let got = cache.get_or_load(self.key(chunk), footprint, want, owner.as_ref(), || {
            let tier = self.disk_tier.as_ref();
            if let Some(bytes) = tier.and_then(|t| t.read(span.start, span.end)) {
                return Ok(Loaded {
                    bytes,
                    from_disk_tier: true,
                });
            }
            tracing::trace!(
                chunk,
                block = span.block,
                start = span.start,
                len = span.len(),
                ?want,
                "source read of one chunk"
            );
            let bytes = self.source.read_aligned(span.start, span.end)?;
            if let Some(tier) = tier {
                tier.offer(span.start, span.end, bytes.as_slice());
            }
            Ok(Loaded::from(bytes))
        });
        // A load that was under way when the version was pruned must not leave its chunk in the
        // budget. The flag is set before the pruning forgets the file's chunks, and read after
        // this chunk was inserted: one of the two forgets it (see `open`).
        if self.pruned.load(Ordering::SeqCst) {
            cache.forget_file(self.generation);
        }
        got.map(Some)
    }

    /// Chunk `chunk` as [`Self::fetch_chunk`] gives it, read from the source (when it is not
    /// resident or being read) with the chunks after it for which `more(c)` is true (asked in
    /// file order, until it is false), up to `max_bytes` in all, as one source request
    /// ([`ChunkCache::load_run`]); those are cached as prefetches. `pass`, the gate's pass the
    /// caller holds for this read ([`crate::prefetch::gate`]), is given back as soon as the
    /// source has answered: the source may serve the next request while this one's chunks are
    /// settled (cut into their own buffers).
    pub fn fetch_run(
        &self,
        cache: &ChunkCache,
        (chunk, want): (usize, Want),
        max_bytes: u64,
        more: &mut dyn FnMut(usize) -> bool,
        pass: Option<Pass<'_>>,
    ) -> Result<Option<(Arc<Chunk>, Outcome)>, CacheError> {
        let Some(plan) = self.plan().filter(|_| !self.pruned.load(Ordering::Relaxed)) else {
            return Ok(None); // raw, or nobody can read it any more
        };
        // Chunks the disk tier holds are read from there one by one; a source read stops
        // before the first of them.
        let in_tier = |c: usize| {
            let tier = self.disk_tier.as_ref();
            plan.get(c)
                .is_some_and(|span| tier.is_some_and(|t| t.holds(span.start, span.end)))
        };
        if in_tier(chunk) {
            drop(pass);
            return self.fetch_chunk(cache, chunk, want);
        }
        let mut run: Vec<RunChunk> = Vec::new();
        let mut bytes = 0;
        for next in chunk..plan.len() {
            let Some(span) = plan.get(next) else {
                break;
            };
            if !run.is_empty() && (bytes + span.len() > max_bytes || in_tier(next) || !more(next)) {
                break;
            }
            bytes += span.len();
            run.push(RunChunk {
                key: self.key(next),
                start: span.start,
                end: span.end,
                owner: self.owner(span),
            });
        }
        let got = cache.load_run(&run, want, |start, end| {
            tracing::trace!(start, len = end - start, ?want, "source read of a run");
            let read = self.source.read_stream(start, end);
            drop(pass);
            if let (Ok(bytes), Some(tier)) = (&read, self.disk_tier.as_ref()) {
                tier.offer_run(
                    start,
                    bytes.as_slice(),
                    run.iter().map(|c| (c.start, c.end)),
                );
            }
            read
        });
        // As in `fetch_chunk`: a run read while the version was pruned leaves nothing cached.
        if self.pruned.load(Ordering::SeqCst) {
            cache.forget_file(self.generation);
        }
        if let (Ok(_), Some(tracker)) = (&got, self.tracker.as_ref()) {
            // A reader's own block is not a prefetch's, though chunks after its own are.
            let readers = run
                .first()
                .and_then(|c| c.owner.as_ref())
                .map(|o| o.block)
                .filter(|_| want == Want::Read);
            let mut blocks: Vec<usize> = run
                .iter()
                .filter_map(|c| c.owner.as_ref().map(|o| o.block))
                .filter(|&b| Some(b) != readers)
                .collect();
            blocks.dedup();
            for block in blocks {
                tracker.note_prefetch(block);
            }
        }
        got.map(Some)
    }

    /// The pacing of this version's source from the meter's figures now (uncached, unlike
    /// [`PrefetchTarget::pacing`]).
    pub(super) fn pacing_now(&self, config: &PacingConfig) -> Pacing {
        match self.source.meter() {
            Some(meter) => Pacing::for_source(meter.storage(), self.source_speed(config), config),
            None => Pacing::Parallel,
        }
    }

    /// What the mount measured of this version's source device so far.
    pub(super) fn source_speed(&self, config: &PacingConfig) -> SourceSpeed {
        self.source
            .meter()
            .map_or_else(SourceSpeed::default, |meter| SourceSpeed {
                estimate: meter.estimate(),
                throughput: meter.throughput_since_mount(config.measured_after_bytes),
            })
    }

    /// Who a chunk of block `block` belongs to, for the cache.
    fn owner(&self, span: &ChunkSpan) -> Option<ChunkOwner> {
        self.tracker.as_ref().map(|tracker| ChunkOwner {
            tracker: Arc::clone(tracker),
            block: span.block,
            marks: Arc::clone(&self.marks),
            codec: span.codec,
            lower: self.disk_tier.as_ref().map(|tier| LowerCopy {
                tier: Arc::clone(tier) as Arc<dyn LowerTier>,
                start: span.start,
                end: span.end,
            }),
        })
    }

    /// Whether chunk `chunk` is already cached or being read.
    pub fn chunk_present(&self, cache: &ChunkCache, chunk: usize) -> bool {
        cache.is_present(self.key(chunk))
    }
}

/// The header of a version from the disk tier, parsed, when the tier holds it whole (a
/// header larger than the index cap, or one that does not parse alone, is read from the
/// source as at a first open).
fn head_from_tier(
    tier: &VersionInTier,
    format: Format,
    size: u64,
    index_cap: u64,
) -> Option<(Vec<u8>, TensorIndex)> {
    let head = tier.read_head()?;
    let index = format.parse(head.as_slice(), size).ok()?;
    let header = head
        .as_slice()
        .get(..usize::try_from(index.header_bytes).ok()?)?;
    (index.header_bytes <= index_cap).then(|| (header.to_vec(), index))
}

impl PrefetchTarget for ModelFile {
    fn tracker(&self) -> Option<&Arc<ReaderTracker>> {
        self.tracker.as_ref()
    }

    /// An object store read by the mount's own client: each request waits a round trip,
    /// whatever the store's throughput.
    fn is_remote(&self) -> bool {
        self.remote
    }

    fn plan(&self) -> Option<&ChunkPlan> {
        ModelFile::plan(self)
    }

    fn chunk_key(&self, chunk: usize) -> ChunkKey {
        self.key(chunk)
    }

    fn prefetch_chunk(&self, cache: &ChunkCache, chunk: usize) -> Result<(), CacheError> {
        if self.pruned.load(Ordering::Relaxed) {
            return Ok(()); // nobody can read it any more
        }
        let fetched = self.fetch_chunk(cache, chunk, Want::Prefetch)?;
        if let (Some(_), Some(tracker), Some(span)) = (
            fetched,
            self.tracker.as_ref(),
            self.plan().and_then(|plan| plan.get(chunk)),
        ) {
            tracker.note_prefetch(span.block);
        }
        Ok(())
    }

    fn display_path(&self) -> &Path {
        &self.path
    }

    fn pacing(&self, config: &PacingConfig) -> Pacing {
        let Some(meter) = self.source.meter() else {
            return Pacing::Parallel;
        };
        let code = meter.derived(PACING_MAX_AGE, || self.pacing_now(config).code());
        Pacing::from_code(code)
    }

    fn prefetch_run(
        &self,
        cache: &ChunkCache,
        chunk: usize,
        max_bytes: u64,
        more: &mut dyn FnMut(usize) -> bool,
        pass: Option<Pass<'_>>,
    ) -> Result<(), CacheError> {
        self.fetch_run(cache, (chunk, Want::Prefetch), max_bytes, more, pass)
            .map(|_| ())
    }
}
