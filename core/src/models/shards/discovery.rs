//! Shard discovery: which files are one sharded model, found when a model file's version is
//! first opened ([`discover`]), and the model formed of them ([`form`]).
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
//! **Cost.** The directory's listing is kept while it does not change ([`IndexNames`]), so a
//! folder of many model files is listed once, not at each file's first open. Forming a model reads every shard's header once (one 256 KiB read each for real
//! checkpoints) besides the read the shard's own open does; it happens once per model version,
//! under its directory's gate so two shards opened at once do not form it twice (see
//! [`super::Registry`] for the locks).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde::Serialize;

use super::index_names::IndexNames;
use super::{Shard, ShardedModel};
use crate::index::blocks;
use crate::index::{Format, TensorIndex};
use crate::prefetch::saved::SavedOrders;
use crate::reader::ReaderTracker;
use crate::source::{Opened, PathAccess};

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

/// The sharded model `abs` belongs to, if any (see the module docs). `Err` is the reason a file
/// that looks like a shard stands alone.
/// `index_names` keeps the directories' listings ([`IndexNames`]).
pub fn discover(
    paths: &dyn PathAccess,
    index_names: &IndexNames,
    abs: &Path,
) -> Result<Option<Found>, String> {
    let dir = abs.parent().unwrap_or(Path::new("."));
    let Some(name) = abs.file_name().and_then(|n| n.to_str()) else {
        return Ok(None);
    };
    let indexes = index_names
        .of(paths, dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut broken = None;
    for index in indexes.iter() {
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
fn open_shard_file(paths: &dyn PathAccess, dir: &Path, name: &str) -> Result<Opened, String> {
    let file = paths.open(&dir.join(name)).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "is missing".to_string(),
        _ => format!("cannot be opened ({e})"),
    })?;
    match file.is_file() {
        Ok(true) => Ok(file),
        Ok(false) => Err("is not a regular file".into()),
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
    let file = paths.open(path).map_err(|e| e.to_string())?;
    let size = file.size().map_err(|e| e.to_string())?;
    if size > MAX_INDEX_JSON_BYTES {
        return Err(format!("{size} bytes, larger than any weight map"));
    }
    let text = file
        .read_head(MAX_INDEX_JSON_BYTES)
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
pub(super) fn form(
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
        let identity = file.identity().map_err(|e| format!("shard {shard}: {e}"))?;
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
        let size = file.size().map_err(|e| format!("shard {shard}: {e}"))?;
        let index = TensorIndex::read_format_at(file.reader(), size, format)
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
    let tracker = Arc::new(ReaderTracker::new(holders.len(), saved.get(&order_key)));
    Ok(ShardedModel {
        name: dir_rel.join(&found.name).to_string_lossy().into_owned(),
        by: found.by,
        shards,
        holders,
        tracker,
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
    fn of(
        paths: &dyn PathAccess,
        dir: &Path,
        shard: &str,
        file: &Opened,
    ) -> Result<Rights, String> {
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
        // A remote file's rights are the mount's, the same for every file.
        let Some(file) = file.as_file() else {
            return Ok(Rights {
                via,
                mode: None,
                acl: None,
            });
        };
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
