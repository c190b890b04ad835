//! Sharded checkpoints as one model: `NAME-00001-of-00003.safetensors` … plus, usually,
//! `NAME.safetensors.index.json` (the `weight_map` of diffusers' and transformers'
//! `save_pretrained`).
//!
//! **Discovery**, when a model file's version is first opened ([`discover`]):
//! 1. an `*.index.json` in the file's directory whose `weight_map` names the file: the model is
//!    every shard that map names. An index whose name prefix matches the file
//!    (`NAME.safetensors.index.json` for `NAME-…`) but which is not valid JSON, has no
//!    `weight_map`, names a shard with a path, or names a shard that is missing, makes the file
//!    stand alone, with the reason in the stats (`files[].standalone_reason`);
//! 2. otherwise the name pattern `STEM-NNNNN-of-NNNNN.EXT` (both numbers the same width): the
//!    model is shards `1..=N`, and every one of them must exist, else the file stands alone
//!    with the reason (a download still in progress must not be half a model).
//!
//! **What one model means.** The model's blocks are grouped over the tensors of all its shards
//! (shards in name order, tensors in offset order: the order a reader following the index goes;
//! [`crate::index::blocks::group`]), so a transformer block split over two shards is one block.
//! Every shard's chunk plan is renumbered into these model blocks
//! ([`crate::cache::plan::ChunkPlan::renumbered`]) and every shard shares the model's one
//! [`ReaderTracker`]. From that single change follow:
//! - one learned order over the shards, saved under the model's key, not a shard's;
//! - prefetch that crosses shards: the next block in the model's order may live in another
//!   shard, and [`ModelStore::entered_block`] hands the prefetcher that shard's file, opening
//!   it (header read and index, as a reader's open would) when no reader has opened it yet;
//!   sequential read-ahead that reaches the end of a shard goes on into the next shard's first
//!   chunks (same rule as within a file: they belong to the reader's block or the next one);
//! - eviction ranked over the whole model: a chunk's distance is its block's distance from the
//!   reader's block in the model's order, whichever shard either is in.
//!
//! **Versions.** A model records each shard's identity when it is formed. When a shard is
//! opened with another identity (it was replaced), the model is formed again with a fresh
//! access state, and the old one is marked superseded, so the other shards' files, which
//! still point at it, are indexed again at their next open ([`ShardOf::is_current`]).
//!
//! **Whose rights.** Discovery runs on the thread of the reader whose open finds the file, while
//! it acts for that reader ([`crate::access`]), through the mount's [`PathAccess`]: the
//! directory listing, the index.json and every shard are opened with the reader's rights, and
//! never through `/proc` or the mount itself. A shard the reader cannot open leaves the file on
//! its own. A model is formed only of shards that *anyone* who can open one of them can open
//! too, so that the model is the same for every user: the shards' entries are all files of the
//! directory, or all links whose targets lie in one directory (by the target's text: the
//! Hugging Face cache links every shard into `blobs/`) and are not links themselves, and the
//! files have the same owner, group, mode and POSIX ACL. Otherwise each file stands alone, with
//! the reason. Prefetch crossing into a shard then opens it with the daemon's rights, checked
//! to be the version formed (device, inode, size, times): a file its reader could open; and it
//! never forms a model itself.
//!
//! **Limits.** Discovery runs once per file version: a file found standing alone (say, a
//! shard opened while the next one was still downloading) stays alone until it changes or the
//! mount restarts; a shard opened under another path (a symlink elsewhere) finds no siblings
//! and stands alone. Cached bytes are served only to a reader whose own open of that version
//! succeeded.
//!
//! **Cost.** Forming a model reads every shard's header once (one 256 KiB read each for real
//! checkpoints) besides the read the shard's own open does; it happens once per model version,
//! under its directory's gate so two shards opened at once do not form it twice (see
//! [`Registry`] for the locks).

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;

use super::{Layout, ModelFile, ModelStore};
use crate::index::blocks;
use crate::index::{Format, TensorIndex};
use crate::prefetch::saved::SavedOrders;
use crate::reader::ReaderTracker;
use crate::source::{PathAccess, SourceIdentity};
use crate::stats::residency;
use crate::stats::{Counters, FileSnapshot, PrefetchSnapshot};
use crate::sync::{lock, Gates, Mutex};

/// Largest index.json read: real ones are 20 KB–2 MB (a 70B model's weight map is ~90 KB);
/// a larger file is not a weight map, and is not read into memory.
const MAX_INDEX_JSON_BYTES: u64 = 64 << 20;

/// How a model's shards were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FoundBy {
    IndexJson,
    Pattern,
}

/// The shard files of one model, as discovery found them (names in the same directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Display name: the index.json's name, or `STEM-*-of-NNNNN.EXT`.
    pub name: String,
    pub by: FoundBy,
    /// Shard file names, sorted (index order).
    pub shards: Vec<String>,
}

/// One shard of a [`ShardedModel`].
#[derive(Debug)]
pub struct Shard {
    /// Path relative to the mount root, and the source path.
    pub rel: PathBuf,
    pub abs: PathBuf,
    identity: SourceIdentity,
    /// `to_model[b]`: the model block of the shard's own block `b`.
    to_model: Vec<usize>,
    /// The model block of the shard's first tensor (by offset).
    first_block: Option<usize>,
}

/// The shards of one model, sharing one access state.
#[derive(Debug)]
pub struct ShardedModel {
    /// Display name relative to the mount root (see [`Found::name`]).
    name: String,
    by: FoundBy,
    shards: Vec<Shard>,
    /// `holders[b]`: the shards holding tensors of model block `b`.
    holders: Vec<Vec<usize>>,
    access: Arc<ReaderTracker>,
    order_key: String,
    size: u64,
    superseded: AtomicBool,
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
        &self.access
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
        let found = match discover(paths, abs) {
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

/// The sharded model `abs` belongs to, if any (see the module docs). `Err` is the reason a file
/// that looks like a shard stands alone.
pub fn discover(paths: &dyn PathAccess, abs: &Path) -> Result<Option<Found>, String> {
    let dir = abs.parent().unwrap_or(Path::new("."));
    let Some(name) = abs.file_name().and_then(|n| n.to_str()) else {
        return Ok(None);
    };
    let mut indexes: Vec<String> = paths
        .list_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .into_iter()
        .filter_map(|n: OsString| n.into_string().ok())
        .filter(|n| n.contains(".index.") && n.ends_with(".json"))
        .collect();
    indexes.sort();
    let mut broken = None;
    for index in &indexes {
        match from_index(paths, dir, index, name) {
            Ok(Some(found)) => return Ok(Some(found)),
            Ok(None) => {}
            Err(reason) => broken = broken.or(Some(reason)),
        }
    }
    match broken {
        Some(reason) => Err(reason),
        None => from_pattern(paths, dir, name),
    }
}

/// Opens shard `name` of `dir` (a regular file) through `paths`.
fn open_shard_file(paths: &dyn PathAccess, dir: &Path, name: &str) -> Result<File, String> {
    let file = paths.open(&dir.join(name)).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "is missing".to_string(),
        _ => format!("cannot be opened ({e})"),
    })?;
    match file.metadata() {
        Ok(meta) if meta.is_file() => Ok(file),
        Ok(_) => Err("is not a regular file".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The model of index.json `index` if it names `name`; an error if it names `name` but is
/// incomplete, or is broken (or leaves `name` out) while its name says it is `name`'s index.
fn from_index(
    paths: &dyn PathAccess,
    dir: &Path,
    index: &str,
    name: &str,
) -> Result<Option<Found>, String> {
    // `NAME.safetensors.index.json` (or `NAME.safetensors.index.fp16.json`) is the index of
    // shards named `NAME-…` or `NAME.fp16-…`.
    let stem = index.split('.').next().unwrap_or(index);
    let claims = is_shard_like(name)
        && (name.starts_with(&format!("{stem}-")) || name.starts_with(&format!("{stem}.")));
    let fail = |why: String| {
        if claims {
            Err(format!("{index}: {why}"))
        } else {
            Ok(None)
        }
    };
    let shards = match read_weight_map(paths, &dir.join(index)) {
        Ok(shards) => shards,
        Err(why) => return fail(why),
    };
    if !shards.iter().any(|s| s == name) {
        // The index does not name this file: a broken download, or another model.
        return if claims {
            Err(format!("{index} does not list this file"))
        } else {
            Ok(None)
        };
    }
    for shard in &shards {
        if let Err(why) = open_shard_file(paths, dir, shard) {
            return Err(format!("{index}: shard {shard} {why}"));
        }
    }
    Ok(Some(Found {
        name: index.to_owned(),
        by: FoundBy::IndexJson,
        shards,
    }))
}

/// The distinct shard names of an index.json's weight map, sorted.
fn read_weight_map(paths: &dyn PathAccess, path: &Path) -> Result<Vec<String>, String> {
    use std::io::Read;
    let file = paths.open(path).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if size > MAX_INDEX_JSON_BYTES {
        return Err(format!("{size} bytes, larger than any weight map"));
    }
    let mut text = Vec::with_capacity(size as usize);
    file.take(MAX_INDEX_JSON_BYTES)
        .read_to_end(&mut text)
        .map_err(|e| e.to_string())?;
    let doc: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("not JSON: {e}"))?;
    let map = doc
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("no weight_map object")?;
    let mut shards = Vec::new();
    for (tensor, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| format!("weight_map entry {tensor:?} is not a file name"))?;
        if shard.contains('/') || shard.contains('\\') || shard == ".." || shard == "." {
            return Err(format!(
                "weight_map names {shard:?}, not a file of this directory"
            ));
        }
        shards.push(shard.to_owned());
    }
    shards.sort();
    shards.dedup();
    if shards.is_empty() {
        return Err("empty weight_map".into());
    }
    Ok(shards)
}

/// `(stem, number, count, width, extension)` of a name `STEM-NNNNN-of-NNNNN.EXT`.
fn parse_pattern(name: &str) -> Option<(&str, usize, usize, usize, &str)> {
    let (base, ext) = name.rsplit_once('.')?;
    let (rest, count) = base.rsplit_once("-of-")?;
    let (stem, number) = rest.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if stem.is_empty() || !digits(number) || !digits(count) || number.len() != count.len() {
        return None;
    }
    let (n, of) = (number.parse().ok()?, count.parse().ok()?);
    (n >= 1 && n <= of).then_some((stem, n, of, number.len(), ext))
}

fn is_shard_like(name: &str) -> bool {
    parse_pattern(name).is_some_and(|(_, _, of, _, _)| of > 1)
}

/// Shards `1..=N` of `name`'s pattern; an error names the first missing one.
fn from_pattern(paths: &dyn PathAccess, dir: &Path, name: &str) -> Result<Option<Found>, String> {
    let Some((stem, _, of, width, ext)) = parse_pattern(name) else {
        return Ok(None);
    };
    if of < 2 {
        return Ok(None);
    }
    let shards: Vec<String> = (1..=of)
        .map(|i| format!("{stem}-{i:0width$}-of-{of:0width$}.{ext}"))
        .collect();
    for shard in &shards {
        if let Err(why) = open_shard_file(paths, dir, shard) {
            return Err(format!("shard {shard} of this model {why}"));
        }
    }
    Ok(Some(Found {
        name: format!("{stem}-*-of-{of:0width$}.{ext}"),
        by: FoundBy::Pattern,
        shards,
    }))
}

/// Reads every shard's header and groups the model's blocks over all of them.
fn form(
    paths: &dyn PathAccess,
    found: &Found,
    (dir_rel, dir_abs): (&Path, &Path),
    saved: &SavedOrders,
) -> Result<ShardedModel, String> {
    let mut indexes = Vec::with_capacity(found.shards.len());
    let mut rights: Option<(String, Rights)> = None;
    for shard in &found.shards {
        let abs = dir_abs.join(shard);
        let file =
            open_shard_file(paths, dir_abs, shard).map_err(|e| format!("shard {shard} {e}"))?;
        let identity = SourceIdentity::of_file(&file).map_err(|e| format!("shard {shard}: {e}"))?;
        let these =
            Rights::of(paths, dir_abs, shard, &file).map_err(|e| format!("shard {shard}: {e}"))?;
        match &rights {
            Some((first, theirs)) if *theirs != these => {
                return Err(format!(
                    "shards {first} and {shard} are not open to the same users ({}): each file is served on its own",
                    theirs.difference(&these)
                ))
            }
            Some(_) => {}
            None => rights = Some((shard.clone(), these)),
        }
        let format = Format::of_path(&abs).unwrap_or_default();
        let index = TensorIndex::read_format(&file, format)
            .map_err(|e| format!("shard {shard} is not a valid {format:?} file: {e}"))?;
        indexes.push((shard, abs, identity, index));
    }
    let grouping = blocks::group(
        indexes
            .iter()
            .flat_map(|(_, _, _, index)| index.tensors.iter().map(|t| (t.name.as_str(), t.len()))),
    );
    let mut holders = vec![Vec::new(); grouping.blocks.len()];
    let mut assignment = grouping.assignment.iter();
    let mut shards = Vec::with_capacity(indexes.len());
    for (at, (name, abs, identity, index)) in indexes.into_iter().enumerate() {
        let mut to_model = vec![0; index.blocks.len()];
        let mut first_block = None;
        for tensor in &index.tensors {
            let block = assignment.next().copied().unwrap_or(0);
            first_block = first_block.or(Some(block));
            if let Some(slot) = to_model.get_mut(tensor.block) {
                *slot = block;
            }
            if let Some(list) = holders.get_mut(block) {
                if list.last() != Some(&at) {
                    list.push(at);
                }
            }
        }
        shards.push(Shard {
            rel: dir_rel.join(name),
            abs,
            identity,
            to_model,
            first_block,
        });
    }
    let size = shards.iter().map(|s| s.identity.size).sum();
    let order_key = order_key(&dir_abs.join(&found.name), &shards);
    let access = Arc::new(ReaderTracker::new(holders.len(), saved.get(&order_key)));
    Ok(ShardedModel {
        name: dir_rel.join(&found.name).to_string_lossy().into_owned(),
        by: found.by,
        shards,
        holders,
        access,
        order_key,
        size,
        superseded: AtomicBool::new(false),
    })
}

/// What decides who may open a shard besides the directory it is listed in (see "Whose
/// rights" in the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rights {
    /// Where the entry leads: `None` for a file of the directory itself, else the directory
    /// part of its link's target, as written.
    via: Option<PathBuf>,
    /// Owner, group and permission bits of the file (Unix).
    mode: Option<(u32, u32, u32)>,
    /// The file's `system.posix_acl_access` (Linux), if it has one.
    acl: Option<Vec<u8>>,
}

impl Rights {
    fn of(paths: &dyn PathAccess, dir: &Path, shard: &str, file: &File) -> Result<Rights, String> {
        let abs = dir.join(shard);
        let via = match paths.link_target(&abs).map_err(|e| e.to_string())? {
            None => None,
            Some(target) => {
                // A link to a link could lead anywhere: only one level is compared.
                let reached = dir.join(&target);
                if paths
                    .link_target(&reached)
                    .map_err(|e| e.to_string())?
                    .is_some()
                {
                    return Err("a link to a link".into());
                }
                Some(target.parent().map(Path::to_path_buf).unwrap_or_default())
            }
        };
        let via = via.filter(|v| !v.as_os_str().is_empty() && v != Path::new("."));
        let meta = file.metadata().map_err(|e| e.to_string())?;
        Ok(Rights {
            via,
            mode: unix_mode(&meta),
            acl: posix_acl(file),
        })
    }

    /// What differs between `self` and `other`, in words.
    fn difference(&self, other: &Rights) -> &'static str {
        if self.via != other.via {
            "reached through different directories"
        } else if self.mode != other.mode {
            "different owner, group or mode"
        } else {
            "different ACLs"
        }
    }
}

#[cfg(unix)]
fn unix_mode(meta: &std::fs::Metadata) -> Option<(u32, u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    Some((meta.uid(), meta.gid(), meta.mode() & 0o7777))
}

#[cfg(not(unix))]
fn unix_mode(_meta: &std::fs::Metadata) -> Option<(u32, u32, u32)> {
    None
}

#[cfg(target_os = "linux")]
fn posix_acl(file: &File) -> Option<Vec<u8>> {
    const NAME: &str = "system.posix_acl_access";
    let len = rustix::fs::fgetxattr_query(file, NAME).ok()?;
    let mut value = Vec::with_capacity(len);
    let spare = rustix::buffer::spare_capacity(&mut value);
    match rustix::fs::fgetxattr(file, NAME, spare) {
        Ok(_) => Some(value),
        // Grown since the query: unequal to anything, so the files stand alone.
        Err(_) => Some(vec![0xff; len + 1]),
    }
}

#[cfg(not(target_os = "linux"))]
fn posix_acl(_file: &File) -> Option<Vec<u8>> {
    None
}

/// The key of the model's learned order: its name, total size and newest shard mtime (so a
/// changed shard starts a new order, as a changed file does).
fn order_key(name: &Path, shards: &[Shard]) -> String {
    let dir = name.parent().unwrap_or(Path::new("."));
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let file = name.file_name().map(Path::new).unwrap_or(Path::new(""));
    let size: u64 = shards.iter().map(|s| s.identity.size).sum();
    let mtime = shards
        .iter()
        .map(|s| s.identity.mtime_ns)
        .max()
        .unwrap_or(0);
    format!("model:{}|{size}|{mtime}", dir.join(file).display())
}

impl ShardedModel {
    pub(super) fn order_key(&self) -> &str {
        &self.order_key
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

impl ModelStore {
    /// A reader entered `block` of `file`: prefetch what follows, in other shards of its model
    /// too.
    pub(super) fn entered_block(&self, file: &Arc<ModelFile>, block: usize, predicted: bool) {
        let Some(of) = file.shard_of.as_ref() else {
            self.prefetcher
                .queue_after_block_entry(file, block, predicted);
            return;
        };
        // The rest of the current block is fetched from this shard, and from the next one if
        // that one starts with it (a block cut at the shard boundary), not from the others: the
        // non-block group has tensors in the first shard (embeddings) and the last (output
        // layer), which the reader reaches much later. Blocks ahead are fetched wherever they
        // are.
        let continues = |s: usize| {
            s == of.shard + 1 && of.model.shards.get(s).and_then(|x| x.first_block) == Some(block)
        };
        let holders = |b: usize| -> Vec<Arc<ModelFile>> {
            of.model
                .holders(b)
                .iter()
                .filter(|&&s| b != block || s == of.shard || continues(s))
                .filter_map(|&s| {
                    if s == of.shard {
                        Some(Arc::clone(file))
                    } else {
                        self.open_shard(&of.model, s)
                    }
                })
                .collect()
        };
        self.prefetcher
            .queue_after_block_entry_in(file, block, predicted, holders);
    }

    /// A reader read chunk `chunk` of `file`: read ahead in file order and, for a shard whose
    /// end the read-ahead reaches, on into the next shard (index order), as if the shards were
    /// one file: a loader going through the shards one by one finds the next one's first
    /// chunks in memory when it gets there.
    pub(super) fn after_read(&self, file: &Arc<ModelFile>, chunk: usize) {
        let Some(left) = self.prefetcher.after_read(file, chunk) else {
            return;
        };
        let Some(of) = file.shard_of.as_ref() else {
            return;
        };
        if left.bytes == 0 || of.shard + 1 >= of.model.shards.len() {
            return;
        }
        if let Some(next) = self.open_shard(&of.model, of.shard + 1) {
            self.prefetcher.read_ahead(&next, 0, left);
        }
    }

    /// Shard `shard` of `model`, opened (indexed) if no reader opened it yet; `None` if it
    /// cannot be, or is no longer a shard of this model version.
    fn open_shard(&self, model: &Arc<ShardedModel>, shard: usize) -> Option<Arc<ModelFile>> {
        let s = model.shards.get(shard)?;
        match self.open_version((&s.rel, &s.abs, None), false) {
            Ok((file, _)) => file
                .shard_of
                .as_ref()
                .is_some_and(|of| Arc::ptr_eq(&of.model, model))
                .then_some(file),
            Err(e) => {
                tracing::debug!(file = %s.abs.display(), error = %e, "cannot open a shard for prefetch");
                None
            }
        }
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
            &model.access.order(),
            &parts,
            (model.access.current(), model.access.prefetch_front()),
            residency::Blocks::All,
        );
        let (order_learned, learned_blocks) = model.access.learned();
        let c = &model.access.counters;
        ModelSnapshot {
            name: model.name.clone(),
            found_by: model.by,
            size: model.size,
            blocks: model.blocks(),
            cached_bytes: shards.iter().map(|s| s.cached_bytes).sum(),
            order_learned,
            learned_blocks,
            prefetch: PrefetchSnapshot {
                issued_bytes: Counters::get(&c.prefetch_issued_bytes),
                used_bytes: Counters::get(&c.prefetch_used_bytes),
                wasted_bytes: Counters::get(&c.prefetch_wasted_bytes),
            },
            stall_seconds: Counters::get(&c.stall_ns) as f64 / 1e9,
            residency: strip.strip,
            residency_current: strip.current,
            residency_prefetch_front: strip.prefetch_front,
            shards,
        }
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

/// Whether `file` is a shard of a model larger than `budget`.
pub(super) fn too_large(file: &ModelFile, budget: u64) -> bool {
    file.shard_of
        .as_ref()
        .is_some_and(|of| of.model.size > budget)
}

/// Whether `file`'s model (if any) is still current (see "Versions").
pub(super) fn is_current(file: &ModelFile) -> bool {
    file.shard_of.as_ref().is_none_or(ShardOf::is_current)
}
