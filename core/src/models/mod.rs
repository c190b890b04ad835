//! The model files of a mount: one [`ModelFile`] per version of each `.safetensors`/`.sft`/`.gguf`
//! file opened, and the read path that serves their bytes. Both formats are served alike: only
//! the header parser differs ([`Format`]).
//!
//! A file's bytes fall in three regions, each served its own way:
//! - the header (`[0, header_bytes)`): parsed once at first open and kept in memory, so header
//!   reads (ComfyUI's discovery, `safe_open`) never touch the disk again; the 64 KiB after it
//!   are kept too, from the same probe read, because buffered header readers read a little past
//!   the header, and that must not fetch a data chunk or start prefetch;
//! - the data region (`[header_bytes, data_end)`): cut into tensor-aligned chunks
//!   ([`crate::cache::plan`]) served through the mount-wide [`ChunkCache`];
//! - anything after the last tensor: read from the source uncached (rare; some writers pad).
//!
//! A file whose header does not parse is *malformed*: it is served byte-exact, uncached, with
//! the reason logged once and shown in the stats.
//!
//! **Versions.** A file is identified by (device, inode, size, mtime, ctime) at open. When any of
//! those differ from the version already known, the file is re-indexed as a new version with a
//! new generation number; the old version's chunks are dropped from the cache. Handles opened
//! before the change keep reading the version (and the descriptor) they opened, so a reader
//! that opens a file after it changed can never be served cached bytes of the old one. (Except
//! where the bytes land in the mounted file's page cache, which all handles share: there a
//! file rewritten in place is served as it is now; see `crate::fs`'s read path.)
//!
//! **Descriptors.** A known version holds no descriptor of its own: an open handle
//! ([`OpenModel`], from [`ModelStore::open_handle`]) holds its source descriptors, a read or a
//! prefetch of a version nobody holds opens them again for one chunk, checked to be the same
//! version ([`crate::source::slot`]). When the last handle of a version closes and SOURCE no
//! longer holds it (deleted, replaced), the version is forgotten with its cached bytes
//! ([`open`]), so its disk space and its share of the budget are given back at once.
//!
//! **Memory.** Headers and indexes of known files are held to their own cap ([`table`]).

mod runs;
pub mod shards;

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;

use crate::cache::plan::ChunkPlan;
use crate::cache::{
    CacheError, Chunk, ChunkCache, ChunkKey, ChunkMarks, ChunkOwner, Outcome, Want,
};
use crate::index::{Format, IndexError, TensorIndex};
use crate::passthrough::{PassthroughSnapshot, PassthroughTier};
use crate::prefetch::saved::SavedOrders;
use crate::prefetch::{Executor, PrefetchTarget, Prefetcher};
use crate::reader::FileCounters;
use crate::reader::{ReaderTracker, Step};
use crate::source::slot::SourceSlot;
use crate::source::{
    aligned_footprint, AlignedBytes, PathAccess, PlainPaths, ReadWrapper, SourceError, SourceFile,
    SourceIdentity,
};
use crate::stats::residency::{self, Residency};
use crate::stats::{Counters, FileSnapshot, IndexSnapshot, PrefetchSnapshot};
use crate::sync::{lock, Mutex, MutexGuard};

mod open;
mod sequence;
pub mod table;
pub use open::OpenModel;
use table::ModelTable;
pub use table::DEFAULT_INDEX_CAP;

/// The smallest `O_DIRECT` request served exactly when its file is larger than the chunk cache
/// ([`ModelStore::read_direct`]). The kernel hands large `O_DIRECT` reads to FUSE in pieces of
/// `max_pages` (1 MiB here); runai-model-streamer's pieces of 256 KiB or more carried 99.9 % of
/// its bytes (1.63 GB in 1 796 requests, 229 of them smaller, mostly under 64 KiB).
const DIRECT_EXACT_MIN: u64 = 256 << 10;
/// Bytes read at first open in the hope that they hold the whole header. Most checkpoint headers
/// are 10–200 KiB; when one is larger, exactly what it needs is read in a second request.
const HEADER_PROBE_BYTES: u64 = 256 << 10;

/// Bytes just past the header kept in memory with it (from the same probe read), so that a
/// buffered header reader, which reads a little past the header, is served without a chunk
/// fetch and without starting prefetch.
const HEADER_TAIL_BYTES: usize = 64 << 10;

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

/// Bytes of one read, copied as little as possible: borrowed from a cached chunk when the read
/// falls inside one (the kernel's 128 KiB–1 MiB requests inside 4 MiB chunks, nearly always),
/// the buffer a source read filled for this request alone (a probe or `O_DIRECT` read of bytes
/// not resident), else assembled in a buffer (a read across chunks, the header).
///
/// The assembled case is not rare: the kernel cuts a reader's `pread` into requests by pages of
/// the reader's buffer, so a buffer that does not start on a page (Python's `bytearray`: 16
/// bytes in) gives requests of 1 MiB − 16 B, and about one in four crosses a 4 MiB chunk
/// boundary. Serving 8 threads × 2 MiB `pread`s from RAM, those copies took 14–15 % of the
/// daemon's CPU (perf, 2026-12-02; 8.2 GB/s through the mount against 15 GB/s from the page
/// cache). fuser 0.18 replies to a read with one slice only; a vectored reply (header + two
/// chunk slices in one `writev`) would remove the copy.
pub enum ReadBytes {
    Chunk {
        bytes: Arc<Chunk>,
        range: Range<usize>,
    },
    Source(AlignedBytes),
    Owned(Vec<u8>),
}

impl std::ops::Deref for ReadBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            ReadBytes::Chunk { bytes, range } => &bytes.as_slice()[range.clone()],
            ReadBytes::Source(bytes) => bytes.as_slice(),
            ReadBytes::Owned(bytes) => bytes,
        }
    }
}

/// A read could not be served (becomes EIO for that read only).
#[derive(Debug, Error)]
pub enum ReadError {
    #[error("internal error: chunk plan and offset disagree")]
    NoChunk,
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Cache(#[from] CacheError),
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
    /// cannot be evicted ([`table`]).
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

/// How far into a block kernel readahead past the end of the previous one reaches, at most
/// ([`ModelFile::is_spill`]): an `mmap` fault's read-around plus the async window ahead of it
/// are one or two readahead sizes (128 KiB by default); 512 KiB leaves room for both with
/// margin, and is all a reader that does go on into the block reads twice.
const SPILL_BYTES: u64 = 512 << 10;

/// One version of one model file.
#[derive(Debug)]
pub struct ModelFile {
    path: PathBuf,
    generation: u64,
    /// The source version, with its descriptors open only while someone reads
    /// ([`crate::source::slot`]).
    source: SourceSlot,
    /// The first `header_bytes` of the file and up to [`HEADER_TAIL_BYTES`] after them (empty
    /// when malformed).
    header: Vec<u8>,
    layout: Layout,
    /// Where each chunk of the plan is, kept by the cache (none for a raw file).
    marks: Arc<ChunkMarks>,
    /// How readers walk the file's blocks (well-formed files only).
    access: Option<Arc<ReaderTracker>>,
    /// Key of the file's learned order in [`SavedOrders`] (a shard's is its model's).
    order_key: String,
    /// The file's own key (its path and version), under which the model file that follows it
    /// is saved ([`sequence`]).
    file_key: String,
    /// How the last open of this version is served ([`ServeMode`]), and why ([`ModeReason`]).
    mode: AtomicU8,
    mode_reason: AtomicU8,
    /// Recent request runs, telling probes from streams ([`runs`]).
    runs: runs::Runs,
    /// The block the last stream of this file was in (`usize::MAX`: none since the last open;
    /// see [`ModelFile::opened`]).
    stream_block: std::sync::atomic::AtomicUsize,
    /// Whether a reader streamed the file since its last open (not only probed it: a header
    /// scan is no step of a workflow, [`sequence`]).
    streamed: std::sync::atomic::AtomicBool,
    /// Open handles of this version ([`OpenModel`]).
    handles: std::sync::atomic::AtomicUsize,
    /// Set once the version was pruned ([`open`]): no chunk of it may stay cached.
    pruned: std::sync::atomic::AtomicBool,
    /// The sharded model this file is a shard of ([`shards`]): its blocks are the model's.
    shard_of: Option<shards::ShardOf>,
    /// Why a file that looks like a shard is served on its own.
    standalone_reason: Option<String>,
    /// The source lives on a file system held in RAM ([`SourceFile::is_in_ram`]).
    in_ram: bool,
}

/// How an open model file is served, as the stats show it (`files[].mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServeMode {
    /// Through the chunk cache (reads reach the daemon).
    Cache = 0,
    /// Handed to the kernel with FUSE passthrough ([`crate::passthrough`]).
    Passthrough = 1,
}

impl ServeMode {
    pub fn name(self) -> &'static str {
        match self {
            ServeMode::Cache => "cache",
            ServeMode::Passthrough => "passthrough",
        }
    }
}

/// Why a model file is served in its mode, as the stats show it (`files[].mode_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum ModeReason {
    NotOpened = 0,
    FitsBudget,
    InodeInPassthrough,
    PassthroughOff,
    Malformed,
    AlreadyCached,
    ModelLargerThanBudget,
    LargerThanRoom,
    Competes,
    IndexCapFull,
    InRam,
}

impl ModeReason {
    const ALL: [ModeReason; 11] = [
        ModeReason::NotOpened,
        ModeReason::FitsBudget,
        ModeReason::InodeInPassthrough,
        ModeReason::PassthroughOff,
        ModeReason::Malformed,
        ModeReason::AlreadyCached,
        ModeReason::ModelLargerThanBudget,
        ModeReason::LargerThanRoom,
        ModeReason::Competes,
        ModeReason::IndexCapFull,
        ModeReason::InRam,
    ];

    fn text(self) -> Option<&'static str> {
        Some(match self {
            ModeReason::NotOpened => return None,
            ModeReason::FitsBudget => "fits what the budget has left",
            ModeReason::InodeInPassthrough => "other handles of the file are passthrough",
            ModeReason::PassthroughOff => "passthrough is off or unavailable",
            ModeReason::Malformed => "the header does not parse",
            ModeReason::AlreadyCached => "the chunk cache holds part of it",
            ModeReason::ModelLargerThanBudget => "its model is larger than the budget",
            ModeReason::LargerThanRoom => "larger than what the budget had left",
            ModeReason::Competes => "competes with other models for the budget",
            ModeReason::IndexCapFull => "the index cap is full of open files' headers",
            ModeReason::InRam => "its source is held in RAM (tmpfs)",
        })
    }

    fn load(cell: &AtomicU8) -> ModeReason {
        let index = cell.load(Ordering::Relaxed) as usize;
        ModeReason::ALL
            .get(index)
            .copied()
            .unwrap_or(ModeReason::NotOpened)
    }
}

impl ModelFile {
    /// Indexes the version of `abs` there now; returns it with the descriptors it was read
    /// through, open for as long as the caller holds them.
    /// `opened`: a descriptor of the file the caller opened already (a requester's), which is
    /// what gets indexed; else `abs` is opened through `paths`.
    fn open(
        (path, abs, opened): (&Path, &Path, Option<&File>),
        generation: u64,
        (saved, wrap, paths): (&SavedOrders, Option<&ReadWrapper>, &Arc<dyn PathAccess>),
        membership: shards::Membership,
        index_cap: u64,
    ) -> Result<(ModelFile, Arc<SourceFile>), OpenError> {
        let source = Arc::new(match opened {
            Some(file) => {
                let dup = file.try_clone().map_err(|source| SourceError::Open {
                    path: abs.to_owned(),
                    source,
                })?;
                SourceFile::adopt(abs, dup, wrap)?
            }
            None => SourceFile::open_with(paths.as_ref(), abs, wrap)?,
        });
        let file_key = SavedOrders::key(&source.canonical_path(), &source.identity());
        let mut order_key = file_key.clone();
        let format = Format::of_path(path).unwrap_or_default();
        let (header, layout) = match read_header(&source, format, index_cap) {
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
        let access = match (&layout, &shard_of) {
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
            source: SourceSlot::new(&source, wrap.cloned(), Arc::clone(paths)),
            header,
            layout,
            marks: Arc::new(ChunkMarks::new(chunks)),
            access,
            order_key,
            file_key,
            mode: AtomicU8::new(ServeMode::Cache as u8),
            mode_reason: AtomicU8::new(ModeReason::NotOpened as u8),
            runs: runs::Runs::default(),
            stream_block: std::sync::atomic::AtomicUsize::new(usize::MAX),
            streamed: std::sync::atomic::AtomicBool::new(false),
            handles: std::sync::atomic::AtomicUsize::new(0),
            pruned: std::sync::atomic::AtomicBool::new(false),
            shard_of,
            standalone_reason,
            in_ram: source.is_in_ram(),
        };
        Ok((file, source))
    }

    /// How the last open of this version was served.
    fn set_mode(&self, mode: ServeMode, reason: ModeReason) {
        self.mode.store(mode as u8, Ordering::Relaxed);
        self.mode_reason.store(reason as u8, Ordering::Relaxed);
    }

    pub fn mode(&self) -> ServeMode {
        match self.mode.load(Ordering::Relaxed) {
            1 => ServeMode::Passthrough,
            _ => ServeMode::Cache,
        }
    }

    /// The file's access state (learned order, reader position), for a well-formed file.
    pub fn tracker(&self) -> Option<&Arc<ReaderTracker>> {
        self.access.as_ref()
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

    /// Whether the file is served as plain bytes ([`Layout::Raw`]).
    pub fn is_raw(&self) -> bool {
        matches!(self.layout, Layout::Raw { .. })
    }

    /// This version without its header, index and access state, served as plain bytes (its
    /// index did not fit the cap: [`RawReason::IndexCapFull`]).
    fn into_raw(self, why: RawReason) -> ModelFile {
        tracing::warn!(file = %self.path.display(), reason = %why, "serving the file as plain bytes, uncached");
        ModelFile {
            header: Vec::new(),
            layout: Layout::Raw { why },
            access: None,
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
    fn header_end(&self) -> Option<u64> {
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
        let owner = self.access.as_ref().map(|access| ChunkOwner {
            access: Arc::clone(access),
            block: span.block,
            marks: Arc::clone(&self.marks),
        });
        let got = cache.get_or_load(self.key(chunk), footprint, want, owner.as_ref(), || {
            self.source.get()?.read_aligned(span.start, span.end)
        });
        // A load that was under way when the version was pruned must not leave its chunk in the
        // budget. The flag is set before the pruning forgets the file's chunks, and read after
        // this chunk was inserted: one of the two forgets it (see `open`).
        if self.pruned.load(Ordering::SeqCst) {
            cache.forget_file(self.generation);
        }
        got.map(Some)
    }

    /// A process opened this version: its recent runs and stream are over as far as new
    /// readers go.
    ///
    /// Without this, a loader opening the file again (ComfyUI loading the same checkpoint in a
    /// second process, or again after unloading it) inherited the exemption of the previous
    /// load's last stream: its first tensor touches fell in the block after the one that stream
    /// ended in, were served as stream reads, and each touch entered the next block as
    /// predicted, so prefetch swept the whole file ahead of touches that read one page per
    /// tensor — and evicted it again before the copies came. Its touches also landed inside
    /// the previous load's runs, which made them look like continued streams. The reload read
    /// 1.72× the file through a quarter budget, 650 MB of it prefetched for nothing (acceptance
    /// benchmark, part 2). A stream still running in another process pays one
    /// [`runs::STREAM_AFTER`] of probes to become a stream again.
    fn opened(&self) {
        self.runs.clear();
        self.stream_block.store(usize::MAX, Ordering::Relaxed);
        self.streamed.store(false, Ordering::Relaxed);
        if let Some(access) = self.tracker() {
            access.begin_session();
        }
    }

    /// Whether the request `[offset, end)`, whose data starts in chunk `chunk`, is a probe
    /// ([`runs`]): it does not continue a run of [`runs::STREAM_AFTER`] bytes, and its block is
    /// neither the one a stream of this file is in nor the next one in the order (other threads
    /// of a reader streaming that block, or a reader following a learned order, are no probes).
    fn is_probe(&self, chunk: usize, offset: u64, end: u64, readahead: bool) -> bool {
        let run_before = self.runs.record(offset, end);
        let (Some(access), Some(span)) = (self.tracker(), self.plan().and_then(|p| p.get(chunk)))
        else {
            return false;
        };
        if run_before >= runs::STREAM_AFTER {
            if readahead && self.is_spill(chunk, offset) {
                return true;
            }
            self.stream_block.store(span.block, Ordering::Relaxed);
            return false;
        }
        let streaming = self.stream_block.load(Ordering::Relaxed);
        if streaming == usize::MAX {
            return true;
        }
        span.block != streaming && !access.follows(streaming, span.block)
    }

    /// Whether byte `offset`, in chunk `chunk`, is where a stream runs on in *file* order past
    /// the end of its block into one the reader is not heading for: within the first
    /// [`SPILL_BYTES`] of a stretch of another block that is neither the stream's nor the next
    /// one in the order.
    ///
    /// Kernel readahead does that at the end of every tensor an `mmap` reader copies (its window
    /// runs up to two readahead sizes ahead of the reader), and a checkpoint whose file order
    /// is not its loading order (an all-in-one checkpoint, stored in name order, read UNet
    /// first; `input_blocks.1` followed in the file by `input_blocks.10`) has a block boundary
    /// of that kind at nearly every block. Loading the chunk there read a whole chunk of a block
    /// needed only later, evicted before its turn through a small budget: ComfyUI's load of an
    /// SD1.5-shaped checkpoint read 1.11–1.20× the file through a quarter to an eighth of it
    /// (acceptance benchmark, `comfy_checkpoint`). Such bytes are served like probes, exactly
    /// and uncached; a reader that really goes on into that block becomes its stream once past
    /// the first [`SPILL_BYTES`]. Only readahead is judged so ([`ModelStore::read_readahead`]):
    /// a `read()` past a block's end is the reader's own and goes on into that block.
    fn is_spill(&self, chunk: usize, offset: u64) -> bool {
        let (Some(access), Some(plan)) = (self.tracker(), self.plan()) else {
            return false;
        };
        let Some(span) = plan.get(chunk) else {
            return false;
        };
        let streaming = self.stream_block.load(Ordering::Relaxed);
        if streaming == usize::MAX
            || span.block == streaming
            || access.follows(streaming, span.block)
        {
            return false;
        }
        // Where this stretch of the block starts: back over the chunks of the same block that
        // touch each other, no further than SPILL_BYTES.
        let mut start = span.start;
        let mut before = chunk;
        while offset.saturating_sub(start) < SPILL_BYTES && before > 0 {
            match plan.get(before - 1) {
                Some(prev) if prev.block == span.block && prev.end == start => {
                    start = prev.start;
                    before -= 1;
                }
                _ => break,
            }
        }
        offset.saturating_sub(start) < SPILL_BYTES
    }

    /// Whether chunk `chunk` is already cached or being read.
    pub fn chunk_present(&self, cache: &ChunkCache, chunk: usize) -> bool {
        cache.is_present(self.key(chunk))
    }

    /// The file's residency strip ([`residency`]), read from its chunk marks without the
    /// cache's lock; `None` for a file without an index.
    fn residency(&self) -> Option<Residency> {
        let access = self.access.as_ref()?;
        let part = self.residency_part()?;
        Some(residency::strip(
            &access.order(),
            &[part],
            (access.current(), access.prefetch_front()),
            residency::Blocks::Held,
        ))
    }

    /// The file's part of a strip: its plan and where its chunks are.
    pub(super) fn residency_part(&self) -> Option<residency::Part<'_>> {
        Some(residency::Part {
            plan: self.plan()?,
            states: self.marks.states(),
        })
    }

    fn snapshot(&self, cache: &ChunkCache) -> FileSnapshot {
        let (order_learned, learned_blocks) =
            self.access.as_ref().map_or((false, 0), |a| a.learned());
        let counters = self.access.as_ref().map(|a| &a.counters);
        let get = |f: fn(&FileCounters) -> &AtomicU64| counters.map_or(0, |c| Counters::get(f(c)));
        let (tensors, blocks, malformed_reason) = match &self.layout {
            Layout::Indexed { index, .. } => (index.tensors.len(), index.blocks.len(), None),
            Layout::Raw {
                why: RawReason::Malformed(reason),
            } => (0, 0, Some(reason.clone())),
            Layout::Raw { .. } => (0, 0, None),
        };
        let mode = match &self.layout {
            Layout::Raw { .. } => "uncached",
            Layout::Indexed { .. } => self.mode().name(),
        };
        let mut snapshot = FileSnapshot {
            path: self.path.to_string_lossy().into_owned(),
            mode,
            size: self.size(),
            tensors,
            blocks,
            cached_bytes: cache.cached_bytes(self.generation),
            malformed: malformed_reason.is_some(),
            malformed_reason,
            direct_io: self.source.uses_direct_io(),
            order_learned,
            learned_blocks,
            prefetch: PrefetchSnapshot {
                issued_bytes: get(|c| &c.prefetch_issued_bytes),
                used_bytes: get(|c| &c.prefetch_used_bytes),
                wasted_bytes: get(|c| &c.prefetch_wasted_bytes),
            },
            hit_bytes: get(|c| &c.hit_bytes),
            miss_bytes: get(|c| &c.miss_bytes),
            disk_read_bytes: get(|c| &c.disk_read_bytes),
            stall_seconds: get(|c| &c.stall_ns) as f64 / 1e9,
            start_stall_seconds: get(|c| &c.start_stall_ns) as f64 / 1e9,
            model: None,
            standalone_reason: None,
            mode_reason: None,
            page_cache_kept_bytes: 0,
            residency: String::new(),
            residency_current: None,
            residency_prefetch_front: None,
            recency: 0,
        };
        if let Some(residency) = self.residency() {
            snapshot.residency = residency.strip;
            snapshot.residency_current = residency.current;
            snapshot.residency_prefetch_front = residency.prefetch_front;
        }
        shards::annotate(&mut snapshot, self);
        snapshot
    }
}

impl PrefetchTarget for ModelFile {
    fn tracker(&self) -> Option<&Arc<ReaderTracker>> {
        self.access.as_ref()
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
        if let (Some(_), Some(access), Some(span)) = (
            fetched,
            self.access.as_ref(),
            self.plan().and_then(|plan| plan.get(chunk)),
        ) {
            access.note_prefetch(span.block);
        }
        Ok(())
    }

    fn display_path(&self) -> &Path {
        &self.path
    }
}

/// Whether a known version serves a new open: its sharded model (if any) is current, and it
/// was not left unindexed for want of room under the index cap (each open tries again, at the
/// cost of one header read, so that it is indexed as soon as open files make room).
fn is_reusable(known: &ModelFile) -> bool {
    shards::is_current(known)
        && !matches!(
            known.layout,
            Layout::Raw {
                why: RawReason::IndexCapFull { .. }
            }
        )
}

enum HeaderError {
    Malformed(IndexError),
    /// The header alone is larger than the index cap (`needed` bytes).
    OverCap {
        needed: u64,
    },
    Source(SourceError),
}

/// Reads and parses the header: one probe read, and a second exact read if the header is larger
/// (unless it is larger than `cap`: no allocation of a header that could not be kept).
fn read_header(
    source: &SourceFile,
    format: Format,
    cap: u64,
) -> Result<(Vec<u8>, TensorIndex), HeaderError> {
    let size = source.identity().size;
    let mut wanted = size.min(HEADER_PROBE_BYTES);
    loop {
        let mut buf = vec![0u8; wanted as usize];
        let got = source.read_at(&mut buf, 0).map_err(HeaderError::Source)?;
        buf.truncate(got);
        match format.parse(&buf, size) {
            Ok(index) => {
                buf.truncate(index.header_bytes as usize + HEADER_TAIL_BYTES);
                return Ok((buf, index));
            }
            Err(IndexError::NeedMore { header_bytes })
                if header_bytes > wanted && header_bytes <= size =>
            {
                if header_bytes > cap {
                    return Err(HeaderError::OverCap {
                        needed: header_bytes,
                    });
                }
                wanted = header_bytes;
            }
            Err(e) => return Err(HeaderError::Malformed(e)),
        }
    }
}

/// Every model file version of a mount, with the cache and prefetcher that serve them.
pub struct ModelStore {
    cache: Arc<ChunkCache>,
    /// The mount's budget, shared by the chunk cache and the passthrough tier: the cache gets
    /// what the tier does not hold ([`Self::rebalance`]).
    budget: AtomicU64,
    passthrough: PassthroughTier,
    prefetcher: Prefetcher,
    files: Mutex<ModelTable>,
    next_generation: AtomicU64,
    saved: SavedOrders,
    /// Fault injection for tests ([`ModelStore::with_read_wrapper`]); `None` in the daemon.
    read_wrapper: Option<ReadWrapper>,
    /// The sharded models formed so far.
    shards: shards::Registry,
    /// How source files are reached by path ([`ModelStore::reach_source_through`]).
    paths: std::sync::OnceLock<Arc<dyn PathAccess>>,
    /// Which model follows which ([`sequence`]).
    sequence: Mutex<sequence::Sequence>,
    /// The chunk cache's share never goes below this (the governor's floor,
    /// [`Self::set_chunk_floor`]), whatever passthrough files hold.
    chunk_floor: AtomicU64,
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
            prefetcher,
            budget: AtomicU64::new(cache.budget()),
            cache,
            passthrough: PassthroughTier::default(),
            files: Mutex::new(ModelTable::new(DEFAULT_INDEX_CAP)),
            next_generation: AtomicU64::new(1),
            saved,
            read_wrapper: None,
            shards: shards::Registry::default(),
            paths: std::sync::OnceLock::new(),
            sequence: Mutex::new(sequence::Sequence::default()),
            chunk_floor: AtomicU64::new(0),
        }
    }

    /// Makes every by-path access to SOURCE go through `paths` (a mount's resolver, which
    /// never follows a path through `/proc` or into the mount: [`PathAccess`]). Set once,
    /// before the first open; until then, and if never set, plain paths.
    pub fn reach_source_through(&self, paths: Arc<dyn PathAccess>) {
        if self.paths.set(paths).is_err() {
            tracing::debug!("the source's path access was set already");
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
        if let Some(access) = file.tracker().filter(|a| a.learned().0) {
            self.saved.put(file.order_key.clone(), access.saved_order());
        }
    }

    /// `file` is streamed for the first time since it was opened: it follows the model streamed
    /// and closed before it ([`sequence`]).
    fn first_stream(&self, file: &Arc<ModelFile>) {
        let learned = lock(&self.sequence).streamed(file);
        if let Some((key, next)) = learned {
            self.saved.put_next_model(&key, next);
        }
    }

    /// Queues the first blocks of `next`, the model that followed the one just closed
    /// ([`sequence`]), if the chunk cache will serve it.
    fn warm_next(&self, next: &Arc<ModelFile>) {
        let identity = next.source.identity();
        let cache_served =
            next.mode() == ServeMode::Cache || self.passthrough.is_competing(&identity);
        if next.is_raw() || !cache_served {
            return;
        }
        tracing::debug!(file = %next.path.display(), "warming the first blocks of the next model");
        self.prefetcher
            .warm_head(next, self.budget() / sequence::HEAD_SHARE);
    }

    /// [`Self::warm_next`] of the successor saved for the file of sequence key `key` (after a
    /// remount), opened by its path, if it is still the version that followed.
    fn warm_saved_next(&self, key: &str) {
        let Some(saved) = self.saved.next_model(key) else {
            return;
        };
        // Not as a reader: nothing is discovered beside it (no shard set is formed for a file
        // nobody opened), and it does not count as an open.
        let opened = self.open_version((&saved.next_path, &saved.next_source, None), false);
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
    }

    /// Holds headers and indexes of known files to `cap` bytes (`--index-cache`).
    pub fn with_index_cap(self, cap: u64) -> ModelStore {
        self.lock().set_cap(cap);
        self
    }

    /// The `cache.index_*` figures.
    pub fn index_snapshot(&self) -> IndexSnapshot {
        self.lock().snapshot()
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
    fn rebalance(&self) {
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

    /// Decides how a new open of `file` is served: passthrough if the caller can offer it and
    /// the whole file fits in the budget next to the other passthrough files, else the chunk
    /// cache. A passthrough open must be closed with [`Self::close_passthrough`]. A file held in
    /// RAM (tmpfs) is passed through whenever the caller can, outside the budget: its pages
    /// are not the mount's to hold or give back.
    ///
    /// Admission never evicts the chunk cache: the file must fit in what the cache does not use
    /// (`room`). A scan that opens every model file to read its header (ComfyUI's discovery)
    /// must not push out the model being served from the cache, and a file that already has
    /// bytes in the cache (warmed by `prefetch`, or read before) keeps being served from there.
    pub fn choose_mode(&self, file: &ModelFile, passthrough_possible: bool) -> ServeMode {
        if file.in_ram && passthrough_possible && !file.is_raw() {
            // Its bytes are in RAM already and always resident: the kernel serves them by
            // passthrough at memory speed, and the passthrough tier neither reserves nor parks
            // them (it could never give them back: they would hold the budget for good).
            file.set_mode(ServeMode::Passthrough, ModeReason::InRam);
            return ServeMode::Passthrough;
        }
        let room = self
            .budget()
            .saturating_sub(self.cache.snapshot().used_bytes);
        // A shard of a model larger than the budget is read through the cache: passthrough
        // would keep it out of the model's order, prefetch and eviction.
        let room = if shards::too_large(file, self.budget()) {
            0
        } else {
            room
        };
        let identity = file.source.identity();
        let refused = if let Layout::Raw { why } = &file.layout {
            Some(match why {
                RawReason::Malformed(_) => ModeReason::Malformed,
                RawReason::IndexCapFull { .. } => ModeReason::IndexCapFull,
            })
        } else if !passthrough_possible {
            Some(ModeReason::PassthroughOff)
        } else if self.passthrough.refuses_competing(&identity) {
            Some(ModeReason::Competes)
        } else if self.cache.cached_bytes(file.generation) > 0 {
            Some(ModeReason::AlreadyCached)
        } else if self.passthrough.admit(file.source.path(), &identity, room) {
            None
        } else if room == 0 && shards::too_large(file, self.budget()) {
            Some(ModeReason::ModelLargerThanBudget)
        } else {
            Some(ModeReason::LargerThanRoom)
        };
        let (mode, reason) = match refused {
            None => (ServeMode::Passthrough, ModeReason::FitsBudget),
            Some(reason) => {
                // The chunk cache gets its room back from parked passthrough files.
                self.passthrough
                    .make_room_for_model(self.budget(), file.size());
                (ServeMode::Cache, reason)
            }
        };
        file.set_mode(mode, reason);
        self.rebalance();
        mode
    }

    /// Admits one more passthrough open of `file` whatever its size: for an inode the kernel
    /// already serves by passthrough, which cannot take a cached open next to it.
    pub fn force_passthrough(&self, file: &ModelFile) {
        if file.in_ram {
            file.set_mode(ServeMode::Passthrough, ModeReason::InRam);
            return;
        }
        self.passthrough
            .admit(file.source.path(), &file.source.identity(), u64::MAX);
        if file.mode() != ServeMode::Passthrough {
            file.set_mode(ServeMode::Passthrough, ModeReason::InodeInPassthrough);
        }
        self.rebalance();
    }

    /// A passthrough handle of `file` closed.
    pub fn close_passthrough(&self, file: &ModelFile) {
        self.passthrough.release(&file.source.identity());
        self.rebalance();
    }

    /// The cache's figures, with `budget_bytes` the mount's budget and `chunk_budget_bytes`
    /// the chunk cache's share of it.
    pub fn cache_snapshot(&self) -> crate::stats::CacheSnapshot {
        let mut snapshot = self.cache.snapshot();
        snapshot.budget_bytes = self.budget();
        snapshot.index = self.index_snapshot();
        snapshot
    }

    /// Bytes the passthrough tier holds (open files' reservations and parked page cache).
    pub fn passthrough_held_bytes(&self) -> u64 {
        self.passthrough.held_bytes()
    }

    pub fn passthrough_snapshot(&self) -> PassthroughSnapshot {
        self.passthrough.snapshot()
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
        self.open_version((path, abs, None), true)
            .map(|(file, _)| file)
    }

    /// [`Self::open`], with the descriptors the file was indexed through when it was indexed
    /// just now (`None` for a known version: its descriptors are opened on demand).
    /// `by_reader`: a reader's open (a new load starts, see [`ModelFile::opened`]); false for
    /// prefetch crossing into a shard ([`shards`]), which must not reset the runs of a reader
    /// that may be streaming that shard, and which forms no sharded model: discovery reads
    /// the files beside this one, which only a reader's open does, with its rights.
    /// `opened`: the requester's descriptor of `abs`, whose version is the one opened.
    fn open_version(
        &self,
        (path, abs, opened): (&Path, &Path, Option<&File>),
        by_reader: bool,
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
                if by_reader {
                    known.opened();
                }
                return Ok((Arc::clone(known), None));
            }
        }
        let discovery = by_reader.then_some(paths.as_ref());
        let membership = self
            .shards
            .membership((path, abs), &current, &self.saved, discovery);
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let index_cap = self.lock().cap();
        let (file, source) = ModelFile::open(
            (path, abs, opened),
            generation,
            (&self.saved, self.read_wrapper.as_ref(), &paths),
            membership,
            index_cap,
        )?;
        let mut files = self.lock();
        // Several readers may open a file at once: the first version indexed wins, the others
        // use it (same identity) rather than replace it and drop its cached bytes.
        if let Some(known) = files.get(path) {
            if known.source.identity() == file.source.identity() && is_reusable(known) {
                if by_reader {
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
    /// [`table::TRIM_AFTER_EVICTED_BYTES`]).
    fn trim_after_evictions(&self) {
        if self.lock().take_trim_due() {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only returns free heap pages to the OS.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }

    /// Reads up to `len` bytes at `offset` (fewer only at end of file).
    pub fn read(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        len: u32,
    ) -> Result<ReadBytes, ReadError> {
        self.read_as(file, offset, len, false)
    }

    /// [`Self::read`] for the kernel's readahead into the mounted file's page cache (an `mmap`
    /// reader's fault): the part past the end of a block, in a block the reader is not heading
    /// for, is served exactly and uncached ([`ModelFile::is_spill`]).
    pub fn read_readahead(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        len: u32,
    ) -> Result<ReadBytes, ReadError> {
        self.read_as(file, offset, len, true)
    }

    fn read_as(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        len: u32,
        readahead: bool,
    ) -> Result<ReadBytes, ReadError> {
        let end = file.size().min(offset.saturating_add(u64::from(len)));
        if file.header_end().is_some_and(|h| offset < h) && end <= file.header.len() as u64 {
            // A header read, perhaps running a little into the data: all from memory.
            return Ok(ReadBytes::Owned(
                file.header[offset as usize..end as usize].to_vec(),
            ));
        }
        let in_data = file.header_end().is_some_and(|h| offset >= h);
        // The first chunk the request reads data from (a request may start in the header).
        let first_data_chunk = file.header_end().and_then(|h| {
            let plan = file.plan()?;
            (end > h).then(|| plan.chunk_at(offset.max(h))).flatten()
        });
        if let Some(first) = first_data_chunk {
            if file.is_probe(first, offset, end, readahead) {
                return self.read_probe(file, offset, end);
            }
            // A load first: the swap writes, and every stream request of the file comes here.
            if !file.streamed.load(Ordering::Relaxed)
                && !file.streamed.swap(true, Ordering::Relaxed)
            {
                self.first_stream(file);
            }
        }
        let chunk = file
            .plan()
            .filter(|_| in_data)
            .and_then(|plan| plan.chunk_at(offset));
        if let Some(chunk) = chunk {
            // The common case, a kernel request inside one chunk: no copy here at all.
            let (bytes, range, stop) = self.chunk_slice(file, chunk, offset, end)?;
            if stop == end {
                self.after_read(file, chunk);
                return Ok(ReadBytes::Chunk { bytes, range });
            }
        }
        self.read_assembled(file, offset, end, readahead)
            .map(ReadBytes::Owned)
    }

    /// A read that spans regions or chunks, copied together into one buffer.
    fn read_assembled(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        end: u64,
        readahead: bool,
    ) -> Result<Vec<u8>, ReadError> {
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut pos = offset;
        let mut last_chunk = None;
        while pos < end {
            pos = if let Some(header_end) = file.header_end().filter(|&h| pos < h) {
                let stop = end.min(header_end);
                out.extend_from_slice(&file.header[pos as usize..stop as usize]);
                stop
            } else if let Some(chunk) = file.plan().and_then(|plan| plan.chunk_at(pos)) {
                if readahead && pos > offset && file.is_spill(chunk, pos) {
                    // The request runs past its block into one the reader is not heading for.
                    let stop = file
                        .plan()
                        .and_then(|p| p.get(chunk))
                        .map_or(end, |s| s.end.min(end));
                    out.extend_from_slice(&self.read_probe(file, pos, stop)?);
                    stop
                } else {
                    last_chunk = Some(chunk);
                    let (bytes, range, stop) = self.chunk_slice(file, chunk, pos, end)?;
                    out.extend_from_slice(&bytes.as_slice()[range]);
                    stop
                }
            } else {
                self.copy_uncached(file, pos, end, &mut out)?
            };
        }
        if let Some(chunk) = last_chunk {
            self.after_read(file, chunk);
        }
        Ok(out)
    }

    /// The part of chunk `chunk` that serves `[pos, end)`: the chunk, the byte range within it,
    /// and the file offset where that part stops.
    fn chunk_slice(
        &self,
        file: &Arc<ModelFile>,
        chunk: usize,
        pos: u64,
        end: u64,
    ) -> Result<(Arc<Chunk>, Range<usize>, u64), ReadError> {
        let span = file
            .plan()
            .and_then(|p| p.get(chunk))
            .copied()
            .ok_or(ReadError::NoChunk)?;
        self.touch(file, span.block);
        let started = Instant::now();
        let (bytes, outcome) = file
            .fetch_chunk(&self.cache, chunk, Want::Read)?
            .ok_or(ReadError::NoChunk)?;
        let stop = end.min(span.end);
        if let Some(access) = file.tracker() {
            access.pace.read_done();
            let served = match outcome {
                Outcome::Hit => &access.counters.hit_bytes,
                Outcome::Miss => &access.counters.miss_bytes,
            };
            Counters::add(served, stop - pos);
            if outcome == Outcome::Miss {
                let waited = started.elapsed().as_nanos() as u64;
                Counters::add(&access.counters.stall_ns, waited);
                if access.is_first(span.block) {
                    Counters::add(&access.counters.start_stall_ns, waited);
                }
            }
        }
        let counter = match outcome {
            Outcome::Hit => &self.counters().hit_bytes,
            Outcome::Miss => &self.counters().miss_bytes,
        };
        Counters::add(counter, stop - pos);
        let range = (pos - span.start) as usize..(stop - span.start) as usize;
        bytes.served(&range);
        Ok((bytes, range, stop))
    }

    /// Serves a probe ([`runs`]): exactly `[offset, end)`, with no chunk cached, no prefetch
    /// and no visit of the block recorded. From resident chunks when they hold all of it
    /// ([`ChunkCache::peek`]), else read from the source bypassing the page cache.
    ///
    /// A probe never enters a block, even one whose chunks are resident: when ComfyUI loads a
    /// checkpoint again, the previous load's prefetch left the first blocks resident, and
    /// touches of its tensor views entering the next block as predicted would sweep prefetch
    /// through the whole file ahead of the copies (1.72× the file read through a quarter
    /// budget, 650 MB of prefetch wasted: acceptance benchmark, part 2, reload).
    fn read_probe(&self, file: &ModelFile, offset: u64, end: u64) -> Result<ReadBytes, ReadError> {
        self.read_exact_uncached(file, offset, end, &self.counters().probe_bytes)
    }

    /// Exactly `[offset, end)`, from resident chunks when they hold all of it, else from the
    /// source (bypassing the page cache) with its bytes also counted in `kind`.
    fn read_exact_uncached(
        &self,
        file: &ModelFile,
        offset: u64,
        end: u64,
        kind: &AtomicU64,
    ) -> Result<ReadBytes, ReadError> {
        if let Some(bytes) = self.probe_from_cache(file, offset, end) {
            Counters::add(&self.counters().hit_bytes, end - offset);
            return Ok(bytes);
        }
        let bytes = file.source.get()?.read_aligned(offset, end)?;
        let counters = self.counters();
        Counters::add(&counters.disk_reads, 1);
        Counters::add(&counters.disk_read_bytes, end - offset);
        Counters::add(&counters.uncached_bytes, end - offset);
        Counters::add(kind, end - offset);
        Ok(ReadBytes::Source(bytes))
    }

    /// Reads for an `O_DIRECT` open (the front end tells them from the request's flags). Such a
    /// reader asks to bypass caches and schedules its own I/O: runai-model-streamer 0.17.1 reads
    /// 8 MiB-aligned pieces of each worker's range with io_uring, and the unaligned head of
    /// each range only after the rest. Through the chunk cache with a budget a quarter of the
    /// file, those heads' chunks were loaded whole, evicted while the loader read elsewhere,
    /// and loaded again: 1769–1812 MiB read for a 1558 MiB file (acceptance benchmark, part 1, 0.86–0.93 of
    /// the plain file's speed on the 1 GB/s source). So when the file is larger than the chunk
    /// cache, which could not keep it for a next pass anyway, its `O_DIRECT` reads are served
    /// like probes: exactly the bytes asked for (from resident chunks when they hold them, else
    /// from the source), no chunk loaded, no prefetch, no visit recorded (`disk.direct_bytes`).
    /// A file the cache can hold goes through it as usual, so its next load comes from RAM.
    ///
    /// Only requests of at least [`DIRECT_EXACT_MIN`]: a reader of small `O_DIRECT` pieces gains
    /// from whole chunks and prefetch (`dd bs=4k iflag=direct`, 205 MB of a 425 MB model
    /// through a 100 MiB budget: 1.96 s through the chunk cache, 5.31 s served exactly, 3.7–4.4
    /// s from the plain file).
    pub fn read_direct(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        len: u32,
    ) -> Result<ReadBytes, ReadError> {
        let end = file.size().min(offset.saturating_add(u64::from(len)));
        let exact = file.plan().is_some()
            && file.size() > self.cache.budget()
            && u64::from(len) >= DIRECT_EXACT_MIN
            && offset < end;
        if !exact {
            return self.read(file, offset, len);
        }
        self.read_exact_uncached(file, offset, end, &self.counters().direct_bytes)
    }

    /// `[offset, end)` from the header and resident chunks, or `None` if part of it is in
    /// neither (a chunk not resident, or bytes outside every chunk). Inside one chunk, the
    /// common case, it is borrowed, not copied: a probe is a whole kernel request (up to 1 MiB),
    /// and a multi-threaded reader's requests start new runs often (8 threads × 2 MiB `pread`s:
    /// each thread's first request after a jump).
    fn probe_from_cache(&self, file: &ModelFile, offset: u64, end: u64) -> Option<ReadBytes> {
        let plan = file.plan()?;
        let header_end = file.header_end()?;
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < end {
            if pos < header_end {
                let stop = end.min(header_end);
                out.extend_from_slice(file.header.get(pos as usize..stop as usize)?);
                pos = stop;
                continue;
            }
            let chunk = plan.chunk_at(pos)?;
            let span = plan.get(chunk)?;
            let bytes = self.cache.peek(file.key(chunk))?;
            let stop = end.min(span.end);
            let range = (pos - span.start) as usize..(stop - span.start) as usize;
            let piece = bytes.as_slice().get(range.clone())?;
            if pos == offset && stop == end {
                return Some(ReadBytes::Chunk { bytes, range });
            }
            out.extend_from_slice(piece);
            pos = stop;
        }
        Some(ReadBytes::Owned(out))
    }

    /// Serves `[pos, stop)` straight from the source, where `stop` is `end` or the start of the
    /// next chunk (only the tail after the last tensor, or a malformed file, gets here).
    fn copy_uncached(
        &self,
        file: &ModelFile,
        pos: u64,
        end: u64,
        out: &mut Vec<u8>,
    ) -> Result<u64, ReadError> {
        let stop = match file.plan() {
            Some(plan) => plan
                .chunks()
                .iter()
                .find(|c| c.start > pos)
                .map_or(end, |c| end.min(c.start)),
            None => end,
        };
        let start = out.len();
        out.resize(start + (stop - pos) as usize, 0);
        let got = file.source.get()?.read_at(&mut out[start..], pos)?;
        let counters = self.counters();
        Counters::add(&counters.disk_reads, 1);
        Counters::add(&counters.disk_read_bytes, got as u64);
        Counters::add(&counters.uncached_bytes, got as u64);
        if (got as u64) < stop - pos {
            // The source is shorter than when it was opened: serve what it has, like a plain
            // file would, and end this read there.
            out.truncate(start + got);
            return Ok(end);
        }
        Ok(stop)
    }

    /// Records that a reader touched `block`, and prefetches what follows when it entered it.
    fn touch(&self, file: &Arc<ModelFile>, block: usize) {
        let Some(access) = file.tracker() else { return };
        if let Step::Entered {
            predicted,
            new_pass,
        } = access.touch(block)
        {
            if new_pass {
                let (learned, _) = access.learned();
                if learned {
                    self.saved.put(file.order_key.clone(), access.saved_order());
                }
            }
            self.entered_block(file, block, predicted);
        }
    }

    /// One entry per known model file (its current version), sorted by path.
    pub fn files_snapshot(&self) -> Vec<FileSnapshot> {
        // Most recently used first.
        let files: Vec<Arc<ModelFile>> = self.lock().files().cloned().collect();
        let mut snapshots: Vec<FileSnapshot> = files
            .iter()
            .enumerate()
            .map(|(recency, f)| {
                let mut snapshot = f.snapshot(&self.cache);
                snapshot.recency = recency;
                self.explain_mode(f, &mut snapshot);
                snapshot
            })
            .collect();
        snapshots.sort_by(|a, b| a.path.cmp(&b.path));
        snapshots
    }

    /// Fills in what the passthrough tier keeps of `file` and why the file is served as it is.
    fn explain_mode(&self, file: &ModelFile, snapshot: &mut FileSnapshot) {
        snapshot.page_cache_kept_bytes = self.passthrough.parked_bytes_of(&file.source.identity());
        snapshot.mode_reason = ModeReason::load(&file.mode_reason).text();
    }

    fn lock(&self) -> MutexGuard<'_, ModelTable> {
        lock(&self.files)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fault_tests;

#[cfg(test)]
mod gguf_tests;

#[cfg(all(test, target_os = "linux"))]
mod lifecycle_tests;

#[cfg(test)]
mod shard_tests;
