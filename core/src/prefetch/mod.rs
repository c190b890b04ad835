//! Reading ahead of readers, in the background.
//!
//! **Contract.** The read path tells the [`Prefetcher`] where readers are; it queues chunks
//! likely to be read soon on worker pools, which read them into the [`ChunkCache`] as
//! prefetches ([`crate::cache::Want::Prefetch`]: they evict only what is needed later). The
//! prefetcher never makes a reader wait: a reader's own misses are read on its own thread
//! (waiting, at most, for a worker's read of the same chunk), and work an [`Executor`] refuses
//! (its queue is full) is dropped, since a reader that outruns the disk fetches those chunks
//! itself. Two policies feed the pools:
//! - **Block order** ([`Prefetcher::queue_after_block_entry`]): when a reader enters a block,
//!   the rest of the block is queued and, if the reader arrived where its file's order
//!   predicted ([`crate::reader::ReaderTracker`]), the next `depth` blocks in that order, up to
//!   a lead bounded by a share of the budget ([`PrefetchConfig`]). A jump (an unpredicted
//!   block) bumps the file's epoch, and workers drop block prefetches queued under an older
//!   one. For a reader that computes between blocks ([`crate::reader::pace`]) the lead may be
//!   one whole block, read by a lower-priority pool once the reader pauses.
//! - **Sequential** ([`Prefetcher::after_read`]): after each read, the next chunks in *file*
//!   order (up to [`PrefetchConfig::readahead_bytes`], at most a quarter of the budget) while
//!   they belong to the block being read or to the block the order predicts next: a plain
//!   sequential reader (`cp`, `cat`, a loader reading front to back) reads at disk speed.
//!
//! **An object store** read by the mount's own client ([`PrefetchTarget::is_remote`]): its
//! files' prefetches go to a pool of their own with more workers
//! ([`PrefetchConfig::remote_workers`]) and a sequential reader is read further ahead
//! ([`PrefetchConfig::remote_readahead_bytes`]): every request waits a round trip before its
//! first byte, so it is the bytes in flight that reach the store's bandwidth.
//!
//! A queued prefetch is dropped when it went stale before a worker got to it: the reader left
//! its block, or (a block prefetch) jumped since it was queued.
//!
//! **Pacing** ([`pacing`]): where a file's source charges per request (a network or FUSE file
//! system, or a source measured slower than local flash: a hard disk, a throttled volume), its
//! prefetches go to the [`OrderedLane`] instead of the pools: started in the order queued,
//! adjacent queued chunks read as one request ([`PrefetchTarget::prefetch_run`]), as many
//! requests in flight as the source's bandwidth-delay product needs; and sequential read-ahead
//! is queued half a window of two requests at a time ([`Prefetcher::after_read`]), so that
//! those requests are large. Those requests and readers' misses on such a source share the
//! [`SourceGate`]: no more in flight than that depth, a reader's miss first.
//!
//! **Interfaces.** The prefetcher knows files only through [`PrefetchTarget`] (their chunk
//! plan, reader tracker, and how to fetch one chunk), which `models::ModelFile` implements, so
//! this module does not depend on [`crate::models`]; it uses [`crate::cache`] and
//! [`crate::reader`]. Where the work runs is injected ([`Prefetcher::with_executor`]): tests
//! use a [`ManualExecutor`] and run queued prefetches at the step they choose.
//!
//! **Locks.** The set of queued chunks (through [`crate::sync`]), a leaf: held only to
//! insert or remove one key, never while submitting work or reading; and the gate's own, a
//! leaf too, held to count passes, never while reading.

pub mod executor;
pub mod gate;
pub mod lane;
pub mod pacing;
pub mod saved;

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::cache::plan::ChunkPlan;
use crate::cache::{CacheError, ChunkCache, ChunkKey};
use crate::reader::ReaderTracker;
#[cfg(test)]
use crate::reader::Step;
use crate::sync::{lock, Mutex};
pub use executor::{Executor, ManualExecutor, Task, WorkerPool};
pub use gate::{Asker, Pass, SourceGate};
pub use lane::OrderedLane;
pub use pacing::{Pacing, PacingConfig, PacingMode, SourceSpeed};

/// What the prefetcher needs of a file (implemented by `models::ModelFile`).
pub trait PrefetchTarget: Send + Sync + 'static {
    /// How readers walk the file's blocks (well-formed files only).
    fn tracker(&self) -> Option<&Arc<ReaderTracker>>;
    /// The file's chunks (well-formed files only).
    fn plan(&self) -> Option<&ChunkPlan>;
    /// The cache key of chunk `chunk`.
    fn chunk_key(&self, chunk: usize) -> ChunkKey;
    /// Reads chunk `chunk` into `cache` as a prefetch.
    fn prefetch_chunk(&self, cache: &ChunkCache, chunk: usize) -> Result<(), CacheError>;
    /// For logs.
    fn display_path(&self) -> &Path;

    /// Whether chunk `chunk` is cached or being read.
    fn chunk_present(&self, cache: &ChunkCache, chunk: usize) -> bool {
        cache.is_present(self.chunk_key(chunk))
    }

    /// Whether the file's source is an object store read by the mount's own client, whose
    /// reads ahead go to the [`PrefetchConfig::remote_workers`] pool; by default not.
    fn is_remote(&self) -> bool {
        false
    }

    /// How reads ahead go to this file's source ([`pacing`]); by default in parallel.
    fn pacing(&self, config: &PacingConfig) -> Pacing {
        let _ = config;
        Pacing::Parallel
    }

    /// Reads chunk `chunk` into `cache` as a prefetch, with the chunks after it for which
    /// `more(c)` is true (asked in file order, until it is false), up to `max_bytes` in all,
    /// as one source request ([`ChunkCache::load_run`]), giving `pass` back once the source
    /// has answered ([`gate`]). By default the chunk alone.
    fn prefetch_run(
        &self,
        cache: &ChunkCache,
        chunk: usize,
        max_bytes: u64,
        more: &mut dyn FnMut(usize) -> bool,
        pass: Option<Pass<'_>>,
    ) -> Result<(), CacheError> {
        let _ = (max_bytes, more, pass);
        self.prefetch_chunk(cache, chunk)
    }
}

/// Sequential read-ahead still to queue ([`Prefetcher::read_ahead`]): the reader's block, the
/// block the order predicts after it, and the bytes left.
#[derive(Debug, Clone, Copy)]
pub struct ReadAhead {
    pub block: usize,
    pub next_block: Option<usize>,
    pub bytes: u64,
}

/// The prefetcher's tuning; [`Default`] is what the daemon runs with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefetchConfig {
    /// Bytes read ahead of a sequential reader: 16 MiB is four chunks, about 16 ms of disk time
    /// at 1 GB/s, enough to cover the gap between two requests with the FUSE round trips.
    pub readahead_bytes: u64,
    /// Bytes read ahead of a sequential reader of an object store: 64 MiB, so that the
    /// [`Self::remote_workers`] each have a chunk to read (at most a sixteenth of the budget,
    /// [`REMOTE_READAHEAD_SHARE`])
    /// ([measured](../../../docs/PERFORMANCE.md#models-in-an-object-store)).
    pub remote_readahead_bytes: u64,
    /// Blocks held ahead of a reader normally take at most `budget / lead_share` (an eighth):
    /// each byte held ahead is a byte less of what repeated passes keep resident
    /// ([measured](../../../docs/PERFORMANCE.md#prefetch-lead)).
    pub lead_share: u64,
    /// One whole next block larger than the normal lead may take up to this fraction of the
    /// budget (numerator, denominator): three eighths hold one 200 MB block ahead on a 512 MiB
    /// budget ([measured](../../../docs/PERFORMANCE.md#prefetch-lead)).
    pub block_lead_share: (u64, u64),
    /// Worker threads per pool, one read in flight each: four keep an NVMe or virtual disk
    /// queue busy (`O_DIRECT` reads cost no CPU copying) without flooding it.
    pub workers: usize,
    /// Worker threads of the pool that reads ahead from an object store: each read waits a
    /// round trip before its first byte, so the store's bandwidth needs many in flight; 16,
    /// with the read-ahead below, took a model that fits from 0.85 to 0.96 of a 1 Gbit/s
    /// store's limit ([measured](../../../docs/PERFORMANCE.md#models-in-an-object-store)).
    pub remote_workers: usize,
    /// Pending requests per pool beyond which new ones are dropped: 1024 chunks is 4 GiB,
    /// several blocks of the largest models, and a job is a few words of memory.
    pub queue_depth: usize,
    /// Nice value of the background pool, which reads the blocks ahead of a reader that
    /// computes between blocks: below the threads serving requests, so on a small machine the
    /// reader's requests get the CPU first. Only that pool
    /// ([measured](../../../docs/PERFORMANCE.md#reader-pace-and-the-background-pool)).
    pub background_nice: i32,
    /// How reads ahead go to sources that charge per request ([`pacing`]).
    pub pacing: PacingConfig,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            readahead_bytes: 16 << 20,
            remote_readahead_bytes: 64 << 20,
            lead_share: 8,
            block_lead_share: (3, 8),
            workers: 4,
            remote_workers: 16,
            queue_depth: 1024,
            background_nice: 10,
            pacing: PacingConfig::default(),
        }
    }
}

/// Chunks of an ordered source chosen to be queued together, with their files, in order.
type Batch<F> = Vec<(Arc<F>, usize)>;

/// An object store's sequential read-ahead takes at most this share of the budget (a
/// sixteenth): what it holds ahead is what a pass over a model larger than the budget cannot
/// keep of the model, so a disk tier sized to the rest misses it on every pass (a quarter:
/// 5 % of the model over the network at the third pass, an eighth 2 %, a sixteenth none)
/// ([measured](../../../docs/PERFORMANCE.md#models-in-an-object-store)).
const REMOTE_READAHEAD_SHARE: u64 = 16;

/// Blocks after the reader's that ordered read-ahead may reach into: 16 blocks of 2 MiB fill
/// two 16 MiB requests, and the blocks of real checkpoints are larger.
const READ_AHEAD_BLOCKS: usize = 16;

/// Chunks queued and not yet picked up by a worker: a reader issues many small reads per chunk,
/// and each would otherwise queue the same chunks again.
type Queued = Arc<Mutex<HashSet<ChunkKey>>>;

/// The prefetch worker pools of a mount.
pub struct Prefetcher {
    cache: Arc<ChunkCache>,
    executor: Arc<dyn Executor>,
    /// Blocks ahead of a reader that computes between blocks
    /// ([`PrefetchConfig::background_nice`]).
    background: Arc<dyn Executor>,
    /// Prefetches of files in an object store ([`PrefetchConfig::remote_workers`]), started
    /// at the first: a mount of a folder never has its threads.
    remote: OnceLock<Arc<dyn Executor>>,
    /// Prefetches of files whose source charges per request ([`pacing`]); `None` with an
    /// injected executor, which then runs those too.
    lane: Option<Arc<OrderedLane>>,
    /// Reads of sources read in order in flight, readers first ([`gate`]).
    gate: Arc<SourceGate>,
    queued: Queued,
    config: PrefetchConfig,
}

impl Prefetcher {
    /// A prefetcher with the daemon's pools and the default tuning.
    pub fn new(cache: Arc<ChunkCache>) -> Prefetcher {
        Prefetcher::with_config(cache, PrefetchConfig::default())
    }

    /// A prefetcher with the daemon's pools, tuned by `config`.
    pub fn with_config(cache: Arc<ChunkCache>, config: PrefetchConfig) -> Prefetcher {
        let pool = WorkerPool::new("tierfs-prefetch", config.workers, config.queue_depth);
        let background = WorkerPool::with_nice(
            "tierfs-ahead",
            config.workers,
            config.queue_depth,
            config.background_nice,
        );
        let lane = OrderedLane::new(
            "tierfs-ordered",
            config.pacing.max_depth,
            config.queue_depth,
        );
        Prefetcher {
            background: Arc::new(background),
            remote: OnceLock::new(),
            lane: Some(Arc::new(lane)),
            ..Prefetcher::with_executor_config(cache, Arc::new(pool), config)
        }
    }

    /// A prefetcher running all its reads on `executor`, with the default tuning.
    pub fn with_executor(cache: Arc<ChunkCache>, executor: Arc<dyn Executor>) -> Prefetcher {
        Prefetcher::with_executor_config(cache, executor, PrefetchConfig::default())
    }

    /// A prefetcher running all its reads on `executor`, tuned by `config` (its pool sizes
    /// and nice value are the executor's business).
    pub fn with_executor_config(
        cache: Arc<ChunkCache>,
        executor: Arc<dyn Executor>,
        config: PrefetchConfig,
    ) -> Prefetcher {
        Prefetcher {
            cache,
            background: Arc::clone(&executor),
            remote: OnceLock::from(Arc::clone(&executor)),
            executor,
            lane: None,
            gate: Arc::new(SourceGate::default()),
            queued: Queued::default(),
            config,
        }
    }

    /// The tuning this prefetcher runs with.
    pub fn config(&self) -> &PrefetchConfig {
        &self.config
    }

    /// This prefetcher with its pacing decided by `mode` (`--source-pacing`).
    pub fn with_pacing_mode(mut self, mode: PacingMode) -> Prefetcher {
        self.config.pacing.mode = mode;
        self
    }

    /// This prefetcher with source reads bounded by `deadline` (`--source-timeout`), which
    /// bounds the size of an ordered source's requests ([`PacingConfig::deadline_share`]).
    pub fn with_source_deadline(mut self, deadline: Option<std::time::Duration>) -> Prefetcher {
        self.config.pacing.deadline = deadline;
        self
    }

    /// Runs `task` on the object store's pool ([`PrefetchConfig::remote_workers`]): a read of
    /// an object store that is no chunk (a load's next touches); false when its queue is full.
    pub fn submit_remote(&self, task: Task) -> bool {
        self.remote_pool().submit(task).is_ok()
    }

    /// The object store's pool, started at its first use.
    fn remote_pool(&self) -> &dyn Executor {
        &**self.remote.get_or_init(|| {
            Arc::new(WorkerPool::new(
                "tierfs-remote",
                self.config.remote_workers,
                self.config.queue_depth,
            ))
        })
    }

    /// Returns once every prefetch queued so far has run (tests).
    pub fn wait_idle(&self) {
        self.executor.wait_idle();
        self.background.wait_idle();
        if let Some(remote) = self.remote.get() {
            remote.wait_idle();
        }
        if let Some(lane) = &self.lane {
            lane.wait_idle();
        }
    }

    /// A reader entered `block` of `file`: queues the rest of it and, if the reader follows the
    /// order (`predicted`), the next blocks.
    pub fn queue_after_block_entry<F: PrefetchTarget>(
        &self,
        file: &Arc<F>,
        block: usize,
        predicted: bool,
    ) {
        self.queue_after_block_entry_in(file, block, predicted, |_| vec![Arc::clone(file)]);
    }

    /// [`Self::queue_after_block_entry`] for a file whose blocks may have chunks in other files
    /// too (the shards of one model share one block numbering and reader tracker):
    /// `holders(b)` are the files holding chunks of block `b`. This is how prefetch crosses
    /// from the end of one shard into the next one, opened for it if no reader has opened it
    /// yet.
    pub fn queue_after_block_entry_in<F, H>(
        &self,
        file: &Arc<F>,
        block: usize,
        predicted: bool,
        holders: H,
    ) where
        F: PrefetchTarget,
        H: Fn(usize) -> Vec<Arc<F>>,
    {
        let Some(tracker) = file.tracker() else {
            return;
        };
        let block_chunks = |f: &Arc<F>, b: usize| -> Vec<usize> {
            f.plan()
                .map_or_else(Vec::new, |p| p.block_chunks(b).to_vec())
        };
        let block_bytes = |files: &[Arc<F>], b: usize| -> u64 {
            files
                .iter()
                .filter_map(|f| f.plan().map(|p| p.block_bytes(b)))
                .sum()
        };
        let here = holders(block);
        let all_present = here.iter().all(|f| {
            block_chunks(f, block)
                .iter()
                .all(|&c| f.chunk_present(&self.cache, c))
        });
        if predicted && !all_present {
            tracker.deepen(); // the reader caught up with prefetch: fetch further ahead
        }
        let epoch = Some(tracker.epoch());
        let mut blocks = vec![(block, here)];
        if predicted {
            for b in tracker.next_blocks(block, tracker.depth()) {
                blocks.push((b, holders(b)));
            }
        }
        // The lead is capped: `budget / lead_share`, or one whole next block where that is
        // larger, up to `block_lead_share` of the budget. Consumed chunks of the current block
        // are evicted first (`cache/evict.rs`), so the lead mostly replaces bytes the reader is
        // done with. The block the reader is in counts towards the lead, except when the next
        // block is over the normal lead and the reader computes between blocks: then the
        // whole next block is held ahead
        // ([measured](../../../docs/PERFORMANCE.md#prefetch-lead)).
        let budget = self.cache.budget();
        let next_block = blocks.get(1).map_or(0, |(b, files)| block_bytes(files, *b));
        let computing = tracker.pace.computing();
        let lead_share = self.config.lead_share;
        let (most, of) = self.config.block_lead_share;
        let whole_block_lead = next_block > budget / lead_share && computing;
        let limit = (budget / lead_share)
            .max(next_block)
            .min(budget / of * most);
        let mut ahead = 0;
        // An ordered source's chunks are queued together, in this order, once all are chosen.
        let mut batch: Batch<F> = Vec::new();
        for (b, files) in blocks {
            if b != block || !whole_block_lead {
                ahead += block_bytes(&files, b);
            }
            if ahead > limit && b != block {
                break;
            }
            // The block the reader is in is queued whole.
            let cap = if b == block { u64::MAX } else { limit };
            let mut queued = 0;
            let background = b != block && computing;
            for f in &files {
                let collect = f
                    .pacing(&self.config.pacing)
                    .is_ordered()
                    .then_some(&mut batch);
                if !self.queue_block(f, b, cap, (&mut queued, collect), epoch, background) {
                    return;
                }
            }
        }
        // Runs of the same file stay together: one batch per file, in order.
        while let Some((f, _)) = batch.first() {
            let f = Arc::clone(f);
            let (mine, rest): (Vec<_>, Vec<_>) =
                batch.into_iter().partition(|(g, _)| Arc::ptr_eq(g, &f));
            batch = rest;
            if !self.queue_batch(&f, mine.into_iter().map(|(_, c)| c).collect(), epoch) {
                return;
            }
        }
    }

    /// Queues the chunks of `block` in `file` that are not in memory, while `queued` (bytes
    /// queued for this block so far, in all its files) stays within `limit`, or adds them to
    /// `collect` when given (an ordered source's batch). Returns false when the executor is
    /// full. `background`: on the background pool.
    fn queue_block<F: PrefetchTarget>(
        &self,
        file: &Arc<F>,
        block: usize,
        limit: u64,
        (queued, collect): (&mut u64, Option<&mut Batch<F>>),
        epoch: Option<u64>,
        background: bool,
    ) -> bool {
        let mut collect = collect;
        let Some(plan) = file.plan() else {
            return true;
        };
        for &chunk in plan.block_chunks(block) {
            if file.chunk_present(&self.cache, chunk) {
                continue;
            }
            *queued += plan.get(chunk).map_or(0, |c| c.len());
            if *queued > limit {
                return true;
            }
            if let Some(batch) = collect.as_deref_mut() {
                batch.push((Arc::clone(file), chunk));
            } else if !self.queue_on(file, chunk, epoch, background) {
                return false;
            }
        }
        true
    }

    /// A pass of the gate for a reader's miss on a source read in order ([`gate`]); hold it
    /// from before the chunk is looked up until the source has answered. `None` when none came
    /// within [`PacingConfig::deadline_share`] of the source's deadline: the reader then reads
    /// without one, so that a request stuck until its deadline does not add that deadline to
    /// the reader's.
    pub fn reader_pass(&self) -> Option<Pass<'_>> {
        let pacing = &self.config.pacing;
        let limit = pacing.deadline.map(|d| d.mul_f64(pacing.deadline_share));
        self.gate.pass_within(Asker::Reader, limit)
    }

    /// Takes chunk `key` off the queue of reads ahead (true if it was queued): a reader that
    /// missed the chunk before it on an ordered source reads it with its own, as one request,
    /// and the queued task then finds it present.
    pub fn take_queued(&self, key: ChunkKey) -> bool {
        lock(&self.queued).remove(&key)
    }

    /// Whether chunk `key` waits in the queue of reads ahead (not started yet).
    pub fn is_queued(&self, key: ChunkKey) -> bool {
        lock(&self.queued).contains(&key)
    }

    /// A reader just read chunk `chunk` of `file`: queue what follows it in the file. Returns
    /// the read-ahead left when it ran to the end of the file (a sharded model continues in its
    /// next shard: [`Self::read_ahead`]).
    pub fn after_read<F: PrefetchTarget>(&self, file: &Arc<F>, chunk: usize) -> Option<ReadAhead> {
        let span = file.plan().and_then(|p| p.get(chunk))?;
        if let Pacing::Ordered { request_bytes, .. } = file.pacing(&self.config.pacing) {
            self.read_ahead_in_requests(file, chunk + 1, span.block, request_bytes);
            return None;
        }
        let ahead = ReadAhead {
            block: span.block,
            next_block: file
                .tracker()
                .and_then(|a| a.next_blocks(span.block, 1).first().copied()),
            bytes: if file.is_remote() {
                self.config
                    .remote_readahead_bytes
                    .min(self.cache.budget() / REMOTE_READAHEAD_SHARE)
            } else {
                self.config.readahead_bytes.min(self.cache.budget() / 4)
            },
        };
        self.read_ahead(file, chunk + 1, ahead)
    }

    /// Queues the chunks of `file` from `first` on while they belong to `ahead.block` or
    /// `ahead.next_block`, up to `ahead.bytes`; returns what is left if it reached the end.
    pub fn read_ahead<F: PrefetchTarget>(
        &self,
        file: &Arc<F>,
        first: usize,
        mut ahead: ReadAhead,
    ) -> Option<ReadAhead> {
        let plan = file.plan()?;
        for next in first..plan.len() {
            let next_span = plan.get(next)?;
            let follows =
                next_span.block == ahead.block || Some(next_span.block) == ahead.next_block;
            if next_span.len() > ahead.bytes || !follows || !self.queue(file, next, None) {
                return None;
            }
            ahead.bytes -= next_span.len();
        }
        Some(ahead)
    }

    /// Sequential read-ahead of a file whose source charges per request, in a window of two
    /// requests' worth (`request_bytes`; at most a quarter of the budget) from chunk `first`:
    /// nothing while half the window is cached or being read; once less is, the rest of the
    /// window, while it belongs to
    /// `block` or one of the [`READ_AHEAD_BLOCKS`] blocks the order predicts after it (in file
    /// order, blocks of a few MiB would otherwise end every request). So the lane gets half a
    /// window or more at a time, which it reads as one request, where one chunk queued per
    /// chunk read would make every request one chunk.
    fn read_ahead_in_requests<F: PrefetchTarget>(
        &self,
        file: &Arc<F>,
        first: usize,
        block: usize,
        request_bytes: u64,
    ) {
        let Some(plan) = file.plan() else {
            return;
        };
        // The blocks the order predicts next, as many as a window of small blocks may hold.
        let next_blocks = file
            .tracker()
            .map(|a| a.next_blocks(block, READ_AHEAD_BLOCKS))
            .unwrap_or_default();
        let window = (2 * request_bytes).min(self.cache.budget() / 4);
        let (mut present, mut seen) = (0u64, 0u64);
        let mut to_queue = Vec::new();
        for next in first..plan.len() {
            let Some(span) = plan.get(next) else {
                break;
            };
            let follows = span.block == block || next_blocks.contains(&span.block);
            if !follows || seen + span.len() > window {
                break;
            }
            seen += span.len();
            if to_queue.is_empty() && file.chunk_present(&self.cache, next) {
                present += span.len();
                if present >= window / 2 {
                    return; // half the window is there: the lead is enough
                }
            } else {
                to_queue.push(next);
            }
        }
        self.queue_batch(file, to_queue, None);
    }

    /// Queues `chunks` (in order) unless cached, loading or queued, every one marked queued
    /// before the first task is submitted: a lane thread that starts the first at once finds
    /// the others queued, and joins them into its request. Returns false when the executor is
    /// full.
    fn queue_batch<F: PrefetchTarget>(
        &self,
        file: &Arc<F>,
        chunks: Vec<usize>,
        epoch: Option<u64>,
    ) -> bool {
        let fresh: Vec<usize> = {
            let mut queued = lock(&self.queued);
            chunks
                .into_iter()
                .filter(|&c| {
                    !file.chunk_present(&self.cache, c) && queued.insert(file.chunk_key(c))
                })
                .collect()
        };
        for (i, &next) in fresh.iter().enumerate() {
            if !self.submit(file, next, epoch, false) {
                let mut queued = lock(&self.queued);
                for &c in &fresh[i..] {
                    queued.remove(&file.chunk_key(c));
                }
                return false;
            }
        }
        true
    }

    /// Queues every block of `file`, in its order, until the budget's worth is queued. The
    /// next reader is expected at the start of the order ([`ReaderTracker::rewind`]).
    pub fn warm<F: PrefetchTarget>(&self, file: &Arc<F>) {
        self.warm_head(file, self.cache.budget());
    }

    /// Queues the chunks of `file` in file order until the budget's worth is queued: for a
    /// load that touches every tensor in name order (which writers use as file order) before
    /// it reads them, on a source read in order, where a block order that jumps through the
    /// file would be requests at other offsets.
    pub fn warm_in_file_order<F: PrefetchTarget>(&self, file: &Arc<F>) {
        let Some(plan) = file.plan() else {
            return;
        };
        let budget = self.cache.budget();
        let (mut bytes, mut chunks) = (0, Vec::new());
        for chunk in 0..plan.len() {
            let len = plan.get(chunk).map_or(0, |c| c.len());
            if !chunks.is_empty() && bytes + len > budget {
                break;
            }
            bytes += len;
            chunks.push(chunk);
        }
        // All marked queued before the first runs: the lane joins them into its requests.
        self.queue_batch(file, chunks, None);
    }

    /// [`Self::warm`] of the first `bytes` of the order only (the first chunk whatever its
    /// size).
    pub fn warm_head<F: PrefetchTarget>(&self, file: &Arc<F>, bytes: u64) {
        let (Some(tracker), Some(plan)) = (file.tracker(), file.plan()) else {
            return;
        };
        tracker.rewind();
        let mut queued = 0;
        for block in tracker.order() {
            for &chunk in plan.block_chunks(block) {
                let len = plan.get(chunk).map_or(0, |c| c.len());
                if (queued > 0 && queued + len > bytes) || !self.queue(file, chunk, None) {
                    return;
                }
                queued += len;
            }
        }
    }

    /// Queues one chunk unless it is cached, loading or queued. Returns false when the
    /// executor is full (the caller stops queueing).
    pub(crate) fn queue<F: PrefetchTarget>(
        &self,
        file: &Arc<F>,
        chunk: usize,
        epoch: Option<u64>,
    ) -> bool {
        self.queue_on(file, chunk, epoch, false)
    }

    /// [`Self::queue`] on the background pool if `background`.
    fn queue_on<F: PrefetchTarget>(
        &self,
        file: &Arc<F>,
        chunk: usize,
        epoch: Option<u64>,
        background: bool,
    ) -> bool {
        let key = file.chunk_key(chunk);
        if file.chunk_present(&self.cache, chunk) || !lock(&self.queued).insert(key) {
            return true;
        }
        if self.submit(file, chunk, epoch, background) {
            return true;
        }
        lock(&self.queued).remove(&key);
        false
    }

    /// Submits the prefetch of `chunk`, already marked queued, to the executor its pacing
    /// chooses; false when that executor is full.
    fn submit<F: PrefetchTarget>(
        &self,
        file: &Arc<F>,
        chunk: usize,
        epoch: Option<u64>,
        background: bool,
    ) -> bool {
        let pacing = file.pacing(&self.config.pacing);
        let task = {
            let (file, cache, queued, gate) = (
                Arc::clone(file),
                Arc::clone(&self.cache),
                Arc::clone(&self.queued),
                Arc::clone(&self.gate),
            );
            Box::new(move || run(&*file, (&cache, &gate), &queued, (chunk, epoch), pacing))
        };
        if let Pacing::Ordered { depth, .. } = pacing {
            self.gate.set_depth(depth);
        }
        let executor: &dyn Executor = match (pacing, &self.lane) {
            (Pacing::Ordered { depth, .. }, Some(lane)) => {
                lane.set_depth(depth);
                &**lane
            }
            _ if file.is_remote() => self.remote_pool(),
            _ if background => &*self.background,
            _ => &*self.executor,
        };
        executor.submit(task).is_ok()
    }
}

/// One queued prefetch: reads chunk `chunk` unless someone read it meanwhile or, for a block
/// prefetch (`epoch`), it went stale: a jump since, or the reader already left its block. On
/// an ordered source, the queued chunks that follow it are read with it, as one request; their
/// own tasks then find them present.
fn run(
    file: &dyn PrefetchTarget,
    (cache, gate): (&ChunkCache, &SourceGate),
    queued: &Mutex<HashSet<ChunkKey>>,
    (chunk, epoch): (usize, Option<u64>),
    pacing: Pacing,
) {
    lock(queued).remove(&file.chunk_key(chunk));
    // The lane runs in order: holding one task back for a reader's pause would hold back all.
    if epoch.is_some() && !pacing.is_ordered() {
        defer_lead_while_reading(file, chunk);
    }
    if stale(file, chunk, epoch) || file.chunk_present(cache, chunk) {
        return;
    }
    let read = match pacing {
        Pacing::Ordered { request_bytes, .. } => {
            let pass = gate.pass(Asker::ReadAhead);
            if file.chunk_present(cache, chunk) {
                return; // a reader read it while this waited for its pass
            }
            let mut more = |next: usize| lock(queued).remove(&file.chunk_key(next));
            file.prefetch_run(cache, chunk, request_bytes, &mut more, Some(pass))
        }
        Pacing::Parallel => file.prefetch_chunk(cache, chunk),
    };
    if let Err(e) = read {
        tracing::trace!(file = %file.display_path().display(), chunk, error = %e, "prefetch not done; the reader will fetch it if needed");
    }
}

/// Whether a prefetch of `chunk` is no longer worth reading: the reader has just left the
/// chunk's block, which is then needed only in its next pass ([`ReaderTracker::is_just_behind`]),
/// or, for a block prefetch queued under `epoch`, the reader jumped since. Read anyway, such a
/// chunk comes in as the block needed last and is evicted unread; that holds for a read-ahead
/// ([`Prefetcher::after_read`], no epoch) queued by a straggling thread too
/// ([traced](../../../docs/PERFORMANCE.md#stragglers-and-restarts)).
fn stale(file: &dyn PrefetchTarget, chunk: usize, epoch: Option<u64>) -> bool {
    let Some(tracker) = file.tracker() else {
        return false;
    };
    let passed = file
        .plan()
        .and_then(|p| p.get(chunk))
        .is_some_and(|span| tracker.is_just_behind(span.block));
    passed || epoch.is_some_and(|epoch| tracker.epoch() != epoch)
}

/// For a reader that computes between blocks, waits (a bounded time) until it pauses before
/// reading a chunk of a block *ahead* of it: that read then overlaps the reader's compute, not its
/// reading (see [`crate::reader::pace::ReaderPace::wait_until_paused`]). Chunks of the block the reader is in
/// are never held back.
fn defer_lead_while_reading(file: &dyn PrefetchTarget, chunk: usize) {
    let (Some(tracker), Some(span)) = (file.tracker(), file.plan().and_then(|p| p.get(chunk)))
    else {
        return;
    };
    if tracker.pace.computing() && !tracker.is_current(span.block) {
        tracker.pace.wait_until_paused();
    }
}

#[cfg(test)]
mod tests;
