//! Sharded checkpoints as one model: `NAME-00001-of-00003.safetensors` … plus, usually,
//! `NAME.safetensors.index.json` (the `weight_map` of diffusers' and transformers'
//! `save_pretrained`). This module is the registry of the models formed ([`Registry`],
//! [`ShardedModel`]) and each file's place in one ([`ShardOf`], [`Membership`]); which files
//! are one model, and whose rights that is found with, is [`discovery`].
//!
//! **What one model means.** The model's blocks are grouped over the tensors of all its shards
//! (shards in name order, tensors in offset order: the order a reader following the index goes;
//! [`crate::index::blocks::group`]), so a transformer block split over two shards is one block.
//! Every shard's chunk plan is renumbered into these model blocks
//! ([`crate::cache::plan::ChunkPlan::renumbered`]) and every shard shares the model's one
//! [`ReaderTracker`]. From that single change follow:
//! - one learned order over the shards, saved under the model's key, not a shard's;
//! - prefetch that crosses shards: the next block in the model's order may live in another
//!   shard, and [`ModelStore::prefetch_on_block_entry`] hands the prefetcher that shard's file,
//!   opening it (header read and index, as a reader's open would) when no reader has opened it
//!   yet;
//!   sequential read-ahead that reaches the end of a shard goes on into the next shard's first
//!   chunks (same rule as within a file: they belong to the reader's block or the next one);
//! - eviction ranked over the whole model: a chunk's distance is its block's distance from the
//!   reader's block in the model's order, whichever shard either is in.
//!
//! **Versions.** A model records each shard's identity when it is formed. When a shard is
//! opened with another identity (it was replaced), the model is formed again with a fresh
//! reader tracker, and the old one is marked superseded, so the other shards' files, which
//! still point at it, are indexed again at their next open ([`ShardOf::is_current`]).
//!
//! **Limits.** Discovery runs once per file version: a file found standing alone (say, a
//! shard opened while the next one was still downloading) stays alone until it changes or the
//! mount restarts; a shard opened under another path (a symlink elsewhere) finds no siblings
//! and stands alone. Cached bytes are served only to a reader whose own open of that version
//! succeeded.
//!
//! **Locks.** See [`Registry`]: a directory's gate, then `models`; neither is held across
//! another lock of the store.

mod discovery;
mod index_names;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use self::discovery::form;
pub use self::discovery::{discover, Found, FoundBy};
pub use self::index_names::IndexNames;
pub use super::snapshot::{ModelSnapshot, ShardSnapshot};
#[cfg(doc)]
use super::ModelStore;
use super::{Layout, ModelFile};
use crate::prefetch::saved::SavedOrders;
use crate::reader::ReaderTracker;
use crate::source::{PathAccess, SourceIdentity};
use crate::stats::FileSnapshot;
use crate::sync::{lock, Gates, Mutex};

/// One shard of a [`ShardedModel`].
#[derive(Debug)]
pub struct Shard {
    /// Path relative to the mount root, and the source path.
    pub rel: PathBuf,
    pub abs: PathBuf,
    pub(super) identity: SourceIdentity,
    /// `to_model[b]`: the model block of the shard's own block `b`.
    pub(super) to_model: Vec<usize>,
    /// The model block of the shard's first tensor (by offset).
    pub(super) first_block: Option<usize>,
}

/// The shards of one model, sharing one reader tracker.
#[derive(Debug)]
pub struct ShardedModel {
    /// Display name relative to the mount root (see [`Found::name`]).
    pub(super) name: String,
    pub(super) by: FoundBy,
    pub(super) shards: Vec<Shard>,
    /// `holders[b]`: the shards holding tensors of model block `b`.
    pub(super) holders: Vec<Vec<usize>>,
    pub(super) tracker: Arc<ReaderTracker>,
    pub(super) order_key: String,
    pub(super) size: u64,
    pub(super) superseded: AtomicBool,
}

impl ShardedModel {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Bytes of all shards together.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The model's blocks.
    pub fn blocks(&self) -> usize {
        self.holders.len()
    }

    /// The shards holding tensors of model block `block`.
    pub fn holders(&self, block: usize) -> &[usize] {
        self.holders.get(block).map_or(&[], Vec::as_slice)
    }

    pub fn tracker(&self) -> &Arc<ReaderTracker> {
        &self.tracker
    }
}

/// A model file's place in a sharded model.
#[derive(Debug, Clone)]
pub struct ShardOf {
    pub model: Arc<ShardedModel>,
    pub shard: usize,
}

impl ShardOf {
    /// Whether the model was not formed again since (see "Versions").
    pub fn is_current(&self) -> bool {
        !self.model.superseded.load(Ordering::Relaxed)
    }

    /// How the shard's own blocks map to the model's.
    pub(super) fn to_model(&self) -> &[usize] {
        self.model
            .shards
            .get(self.shard)
            .map_or(&[], |s| s.to_model.as_slice())
    }

    pub(super) fn identity(&self) -> Option<SourceIdentity> {
        self.model.shards.get(self.shard).map(|s| s.identity)
    }
}

/// What a model file is, for its open.
#[derive(Debug, Clone)]
pub enum Membership {
    /// A shard of a model.
    Shard(ShardOf),
    /// A file on its own; `reason` says why when it looks like a shard but is not one.
    Alone { reason: Option<String> },
}

/// The sharded models of a mount.
///
/// **Locks.** `models` is held only to look a model up or add one, never across I/O.
/// Discovery and formation (a directory listing, the index.json, every shard's header) run
/// under the gate of the file's directory ([`Gates`]), so two shards of one model opened at once
/// form it once, and a directory whose files stall stalls only the first opens in that
/// directory. Order: a directory's gate, then `models`.
#[derive(Debug, Default)]
pub struct Registry {
    models: Mutex<Vec<Arc<ShardedModel>>>,
    forming: Gates<PathBuf>,
    index_names: IndexNames,
}

impl Registry {
    /// What the file at `rel` (source `abs`, version `identity`) is: a shard of a model formed
    /// before, of one formed now through `discovery` (with the rights of the thread calling),
    /// or a file on its own (always, when a model would have to be formed and `discovery` is
    /// `None`).
    pub fn membership(
        &self,
        (rel, abs): (&Path, &Path),
        identity: &SourceIdentity,
        saved: &SavedOrders,
        discovery: Option<&dyn PathAccess>,
    ) -> Membership {
        if let Some(known) = self.known(rel, identity) {
            return known;
        }
        let Some(paths) = discovery else {
            return Membership::Alone { reason: None };
        };
        let dir_rel = rel.parent().unwrap_or(Path::new(""));
        let dir_abs = abs.parent().unwrap_or(Path::new(""));
        let gate = self.forming.gate(&dir_abs.to_owned());
        let _one_discovery_per_directory = lock(&gate);
        // Another open in this directory may have formed the model while this one waited.
        if let Some(known) = self.known(rel, identity) {
            return known;
        }
        let found = match discover(paths, &self.index_names, abs) {
            Ok(Some(found)) => found,
            Ok(None) => return Membership::Alone { reason: None },
            Err(reason) => {
                tracing::warn!(file = %abs.display(), %reason, "not served as a shard of a model");
                return Membership::Alone {
                    reason: Some(reason),
                };
            }
        };
        match form(paths, &found, (dir_rel, dir_abs), saved) {
            Ok(model) => {
                let model = Arc::new(model);
                lock(&self.models).push(Arc::clone(&model));
                tracing::info!(model = %model.name, shards = model.shards.len(), blocks = model.blocks(), "sharded model formed");
                let shard = model.shards.iter().position(|s| s.rel == rel).unwrap_or(0);
                Membership::Shard(ShardOf { model, shard })
            }
            Err(reason) => {
                tracing::warn!(file = %abs.display(), %reason, "not served as a shard of a model");
                Membership::Alone {
                    reason: Some(reason),
                }
            }
        }
    }

    /// The model formed before that has version `identity` of `rel` as a shard. A model that
    /// has another version of it is superseded and forgotten (`None`: form it again).
    fn known(&self, rel: &Path, identity: &SourceIdentity) -> Option<Membership> {
        let mut models = lock(&self.models);
        let at = models
            .iter()
            .position(|m| m.shards.iter().any(|s| s.rel == rel))?;
        let model = &models[at];
        let shard = model.shards.iter().position(|s| s.rel == rel);
        if let Some(shard) = shard.filter(|&s| model.shards[s].identity == *identity) {
            return Some(Membership::Shard(ShardOf {
                model: Arc::clone(model),
                shard,
            }));
        }
        tracing::info!(model = %model.name, "a shard changed: forming the model again");
        model.superseded.store(true, Ordering::Relaxed);
        models.remove(at);
        None
    }

    /// The current models, by name.
    pub fn models(&self) -> Vec<Arc<ShardedModel>> {
        let mut models = lock(&self.models).clone();
        models.sort_by(|a, b| a.name.cmp(&b.name));
        models
    }
}

impl ShardedModel {
    pub(super) fn order_key(&self) -> &str {
        &self.order_key
    }
}

/// The stats fields a file gets from its model (`files[].model`, `files[].standalone_reason`).
pub(super) fn annotate(snapshot: &mut FileSnapshot, file: &ModelFile) {
    snapshot.model = file.shard_of.as_ref().map(|of| of.model.name.clone());
    snapshot.standalone_reason = file.standalone_reason.clone();
}

/// A file's shard place, checked against what its open found: the version the model was
/// formed from, and well-formed. The plan of a shard is renumbered into the model's blocks.
pub(super) fn join(
    membership: Membership,
    identity: &SourceIdentity,
    layout: Layout,
) -> (Option<ShardOf>, Option<String>, Layout) {
    let of = match membership {
        Membership::Alone { reason } => return (None, reason, layout),
        Membership::Shard(of) => of,
    };
    match layout {
        Layout::Indexed { index, plan }
            if of.identity() == Some(*identity) && index.blocks.len() == of.to_model().len() =>
        {
            let plan = plan.renumbered(of.to_model(), of.model.blocks());
            (Some(of), None, Layout::Indexed { index, plan })
        }
        layout => {
            let reason = format!(
                "changed while its model {} was formed; reopen it",
                of.model.name
            );
            (None, Some(reason), layout)
        }
    }
}

/// Whether `file`'s model (if any) is still current (see "Versions").
pub(super) fn is_current(file: &ModelFile) -> bool {
    file.shard_of.as_ref().is_none_or(ShardOf::is_current)
}
