//! What the stats show of the model files: one [`FileSnapshot`] per known file
//! ([`ModelStore::files_snapshot`]), one [`ModelSnapshot`] per sharded model
//! ([`ModelStore::models_snapshot`]), and the store's cache, index and passthrough figures.
//!
//! **Contract.** Snapshots are read without holding the chunk cache's lock while a strip is
//! built (residency strips come from each file's chunk marks); the known files are copied out
//! of the table's lock first. The `prefetch` section of a file or model is built in one place
//! ([`prefetch_of`], from [`PrefetchSnapshot::from_counters`], as the mount-wide one). Field names are the stats' JSON keys.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use serde::Serialize;

use super::mode::ModeReason;
use super::shards::{self, FoundBy, ShardedModel};
use super::{Layout, ModelFile, ModelStore, RawReason};
use crate::cache::ChunkCache;
use crate::passthrough::PassthroughSnapshot;
use crate::reader::FileCounters;
use crate::stats::residency::{self, Residency};
use crate::stats::{CompressedFigures, Counters, FileSnapshot, IndexSnapshot, PrefetchSnapshot};

/// The `prefetch` section of a file or a model from its counters (none: all zero).
fn prefetch_of(counters: Option<&FileCounters>) -> PrefetchSnapshot {
    match counters {
        Some(c) => PrefetchSnapshot::from_counters(
            &c.prefetch_issued_bytes,
            &c.prefetch_used_bytes,
            &c.prefetch_wasted_bytes,
        ),
        None => PrefetchSnapshot {
            issued_bytes: 0,
            used_bytes: 0,
            wasted_bytes: 0,
        },
    }
}

/// One entry of the stats' `models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSnapshot {
    pub name: String,
    /// `index_json` or `pattern`.
    pub found_by: FoundBy,
    pub size: u64,
    pub blocks: usize,
    pub cached_bytes: u64,
    /// What the compressed RAM tier holds of the model (all shards).
    pub compressed: CompressedFigures,
    /// A pass over the model's blocks (across shards) was seen.
    pub order_learned: bool,
    pub learned_blocks: usize,
    /// The model's prefetch figures (all shards; `files[]` of a shard show the same).
    pub prefetch: PrefetchSnapshot,
    pub stall_seconds: f64,
    /// Every block of the model, over all its shards, as one strip ([`residency`]).
    pub residency: String,
    /// Index in `residency` of the block the reader is in, or was in last.
    pub residency_current: Option<usize>,
    /// Index in `residency` of the block furthest ahead of the reader that prefetch read into.
    pub residency_prefetch_front: Option<usize>,
    pub shards: Vec<ShardSnapshot>,
}

/// One shard in [`ModelSnapshot`].
#[derive(Debug, Clone, Serialize)]
pub struct ShardSnapshot {
    pub path: String,
    pub size: u64,
    /// Whether the shard is indexed (opened by a reader, or by prefetch crossing into it).
    pub indexed: bool,
    pub cached_bytes: u64,
}

impl ModelFile {
    /// The file's residency strip ([`residency`]), read from its chunk marks without the
    /// cache's lock; `None` for a file without an index.
    fn residency(&self) -> Option<Residency> {
        let tracker = self.tracker.as_ref()?;
        let part = self.residency_part()?;
        Some(residency::strip(
            &tracker.order(),
            &[part],
            (tracker.current(), tracker.prefetch_front()),
            residency::Blocks::Held,
        ))
    }

    /// The file's part of a strip: its plan and where its chunks are.
    fn residency_part(&self) -> Option<residency::Part<'_>> {
        Some(residency::Part {
            plan: self.plan()?,
            states: self.marks.states(),
        })
    }

    pub(super) fn snapshot(&self, cache: &ChunkCache) -> FileSnapshot {
        let (order_learned, learned_blocks) =
            self.tracker.as_ref().map_or((false, 0), |a| a.learned());
        let counters = self.tracker.as_ref().map(|a| &a.counters);
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
            prefetch: prefetch_of(counters),
            hit_bytes: get(|c| &c.hit_bytes),
            miss_bytes: get(|c| &c.miss_bytes),
            disk_read_bytes: get(|c| &c.disk_read_bytes),
            compressed: counters
                .map_or_else(CompressedFigures::default, CompressedFigures::of_file),
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

impl ModelStore {
    /// The `cache.index_*` figures.
    pub fn index_snapshot(&self) -> IndexSnapshot {
        self.lock().snapshot()
    }

    /// The cache's figures, with `budget_bytes` the mount's budget and `chunk_budget_bytes`
    /// the chunk cache's share of it.
    pub fn cache_snapshot(&self) -> crate::stats::CacheSnapshot {
        let mut snapshot = self.cache.snapshot();
        snapshot.budget_bytes = self.budget();
        snapshot.index = self.index_snapshot();
        snapshot
    }

    pub fn passthrough_snapshot(&self) -> PassthroughSnapshot {
        self.passthrough.snapshot()
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

    /// The stats' `models`: every sharded model formed, its shards and what is cached of them.
    pub fn models_snapshot(&self) -> Vec<ModelSnapshot> {
        let files: Vec<Arc<ModelFile>> = self.lock().files().cloned().collect();
        self.shards
            .models()
            .iter()
            .map(|model| self.model_snapshot(model, &files))
            .collect()
    }

    fn model_snapshot(&self, model: &Arc<ShardedModel>, files: &[Arc<ModelFile>]) -> ModelSnapshot {
        let shard_files: Vec<Option<&Arc<ModelFile>>> = model
            .shards
            .iter()
            .map(|s| {
                files.iter().find(|f| {
                    f.path == s.rel
                        && f.shard_of
                            .as_ref()
                            .is_some_and(|of| Arc::ptr_eq(&of.model, model))
                })
            })
            .collect();
        let shards: Vec<ShardSnapshot> = model
            .shards
            .iter()
            .zip(&shard_files)
            .map(|(s, file)| ShardSnapshot {
                path: s.rel.to_string_lossy().into_owned(),
                size: s.identity.size,
                indexed: file.is_some(),
                cached_bytes: file.map_or(0, |f| self.cache.cached_bytes(f.generation)),
            })
            .collect();
        let parts: Vec<residency::Part<'_>> = shard_files
            .iter()
            .flatten()
            .filter_map(|f| f.residency_part())
            .collect();
        let strip = residency::strip(
            &model.tracker.order(),
            &parts,
            (model.tracker.current(), model.tracker.prefetch_front()),
            residency::Blocks::All,
        );
        let (order_learned, learned_blocks) = model.tracker.learned();
        let c = &model.tracker.counters;
        ModelSnapshot {
            name: model.name.clone(),
            found_by: model.by,
            size: model.size,
            blocks: model.blocks(),
            cached_bytes: shards.iter().map(|s| s.cached_bytes).sum(),
            compressed: CompressedFigures::of_file(c),
            order_learned,
            learned_blocks,
            prefetch: prefetch_of(Some(c)),
            stall_seconds: Counters::get(&c.stall_ns) as f64 / 1e9,
            residency: strip.strip,
            residency_current: strip.current,
            residency_prefetch_front: strip.prefetch_front,
            shards,
        }
    }
}
