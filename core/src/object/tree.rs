//! The objects under a prefix as a tree of paths, and what identifies one version of one.
//!
//! **Contract.** An [`ObjectTree`] is one listing: every object under the prefix at a path
//! relative to it, every directory that a key implies (`a/b/c` implies `a` and `a/b`) or that
//! a folder marker names (a key ending in `/`). Keys that cannot be shown as a path are left
//! out with a warning naming them, never a panic: an empty segment (`a//b`), a `.` or `..`
//! segment, a segment longer than a file name may be, a NUL, or a name that is both an object
//! and a directory (keys `a` and `a/b`: the directory is kept, the object `a` left out, whatever
//! the order of the listing). An [`ObjectVersion`] is one version of one object, its identity
//! `(key, size, etag)`: a replaced object is a new version, with a new
//! [`SourceIdentity`](crate::source::SourceIdentity).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::source::SourceIdentity;

/// The longest name of one path segment (Linux's NAME_MAX).
const MAX_NAME: usize = 255;
/// Seeds of the identity hashes: the inode number and the change stamp of a version are
/// hashes of different things and must not collide by construction.
const INO_SEED: u64 = 0x7469_6572_6673_2d6b; // "tierfs-k"
const ETAG_SEED: u64 = 0x7469_6572_6673_2d65; // "tierfs-e"

/// One version of one object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectVersion {
    /// The object's full key in the bucket (the prefix included).
    pub key: String,
    pub size: u64,
    /// The ETag the store gave, without its quotes.
    pub etag: String,
    pub last_modified: SystemTime,
}

impl ObjectVersion {
    /// The [`SourceIdentity`] of this version: `dev` the given per-mount device id, `ino` a
    /// stable hash of the key, `size`, `mtime_ns` from `last_modified`, `ctime_ns` a hash of
    /// the ETag (a new ETag is a new identity, even at the same size and time).
    pub fn identity(&self, dev: u64) -> SourceIdentity {
        SourceIdentity {
            dev,
            ino: xxhash_rust::xxh3::xxh3_64_with_seed(self.key.as_bytes(), INO_SEED),
            size: self.size,
            mtime_ns: nanos_since_epoch(self.last_modified),
            ctime_ns: i128::from(xxhash_rust::xxh3::xxh3_64_with_seed(
                self.etag.as_bytes(),
                ETAG_SEED,
            )),
        }
    }
}

/// Nanoseconds since the Unix epoch, negative before it.
fn nanos_since_epoch(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_nanos()).unwrap_or(i128::MAX),
        Err(e) => -i128::try_from(e.duration().as_nanos()).unwrap_or(i128::MAX),
    }
}

/// What a path of the tree is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeEntry {
    Dir,
    Object(ObjectVersion),
}

/// One listing of the objects under a prefix.
#[derive(Debug)]
pub struct ObjectTree {
    /// Each directory (`""`: the root) by its path.
    dirs: HashMap<String, Dir>,
    /// Each object by its path relative to the prefix.
    objects: HashMap<String, ObjectVersion>,
    bytes: u64,
    listed_at: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Child {
    Dir,
    Object,
}

/// A directory of the listing.
#[derive(Debug, Default)]
struct Dir {
    /// Its children by name.
    children: BTreeMap<String, Child>,
    /// The newest modification of the objects directly in it (the epoch if none).
    newest: Option<SystemTime>,
}

/// What a directory's attributes show, computed once per listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirSummary {
    /// Its entries (objects and directories directly in it).
    pub entries: u64,
    /// The newest modification of the objects directly in it; the epoch if it has none.
    pub newest: SystemTime,
}

/// One key of a listing: its path relative to the prefix (ending in `/` for a folder marker)
/// and, for an object, its version.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub rel: String,
    pub version: Option<ObjectVersion>,
}

impl ObjectTree {
    /// The tree of `listed` (see the module docs for the keys left out), listed at `listed_at`.
    pub(crate) fn build(listed: Vec<Listed>, listed_at: Instant) -> ObjectTree {
        let mut objects: HashMap<String, ObjectVersion> = HashMap::new();
        let mut dirs: HashSet<String> = HashSet::from([String::new()]);
        for item in listed {
            let marker = item.rel.ends_with('/');
            let path = item.rel.strip_suffix('/').unwrap_or(&item.rel);
            if path.is_empty() {
                continue; // the marker of the prefix itself: the root
            }
            if let Err(why) = check_path(path) {
                let key = item.version.as_ref().map_or(&item.rel, |v| &v.key);
                tracing::warn!(key = %key, "object key left out of the listing: {why}");
                continue;
            }
            let parents = ancestors(path);
            if marker {
                dirs.insert(path.to_string());
            } else if let Some(version) = item.version {
                objects.insert(path.to_string(), version);
            }
            dirs.extend(parents.map(str::to_string));
        }
        // A name that is both an object and a directory: the directory wins.
        objects.retain(|path, version| {
            let clash = dirs.contains(path);
            if clash {
                tracing::warn!(
                    key = %version.key,
                    "object key left out of the listing: other keys make {path:?} a directory"
                );
            }
            !clash
        });
        let mut tree: HashMap<String, Dir> = HashMap::new();
        for dir in &dirs {
            tree.entry(dir.clone()).or_default();
            if let Some((parent, name)) = split_parent(dir) {
                tree.entry(parent.to_string())
                    .or_default()
                    .children
                    .insert(name.to_string(), Child::Dir);
            }
        }
        for (path, version) in &objects {
            if let Some((parent, name)) = split_parent(path) {
                let dir = tree.entry(parent.to_string()).or_default();
                dir.children.insert(name.to_string(), Child::Object);
                dir.newest = dir.newest.max(Some(version.last_modified));
            }
        }
        let bytes = objects.values().map(|v| v.size).sum();
        ObjectTree {
            dirs: tree,
            objects,
            bytes,
            listed_at,
        }
    }

    /// What `rel` (relative to the prefix; `""` is the root directory) is, if anything.
    pub fn entry(&self, rel: &Path) -> Option<TreeEntry> {
        let rel = rel_str(rel)?;
        if self.dirs.contains_key(rel) {
            return Some(TreeEntry::Dir);
        }
        self.objects.get(rel).cloned().map(TreeEntry::Object)
    }

    /// The entry count and newest time of directory `rel`; `None` where it is not one.
    pub fn dir_summary(&self, rel: &Path) -> Option<DirSummary> {
        let dir = self.dirs.get(rel_str(rel)?)?;
        Some(DirSummary {
            entries: dir.children.len() as u64,
            newest: dir.newest.unwrap_or(UNIX_EPOCH),
        })
    }

    /// The names in directory `rel`, sorted; `None` where `rel` is not a directory.
    pub fn names(&self, rel: &Path) -> Option<Vec<OsString>> {
        let dir = self.dirs.get(rel_str(rel)?)?;
        Some(dir.children.keys().map(OsString::from).collect())
    }

    /// The entries of directory `rel`, sorted by name; `None` where `rel` is not a directory.
    pub fn list(&self, rel: &Path) -> Option<Vec<(OsString, TreeEntry)>> {
        let rel = rel_str(rel)?;
        let children = &self.dirs.get(rel)?.children;
        let entries = children
            .iter()
            .filter_map(|(name, child)| {
                let entry = match child {
                    Child::Dir => TreeEntry::Dir,
                    Child::Object => TreeEntry::Object(self.objects.get(&join(rel, name))?.clone()),
                };
                Some((OsString::from(name), entry))
            })
            .collect();
        Some(entries)
    }

    /// When the listing was made.
    pub fn listed_at(&self) -> Instant {
        self.listed_at
    }

    /// The number of objects in the tree.
    pub fn objects(&self) -> usize {
        self.objects.len()
    }

    /// The bytes of all objects in the tree.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The number of directories, the root included.
    pub fn dirs(&self) -> usize {
        self.dirs.len()
    }

    /// Every object with its path relative to the prefix, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ObjectVersion)> {
        self.objects.iter().map(|(path, v)| (path.as_str(), v))
    }
}

/// `rel` as the tree's key: UTF-8, without a leading or trailing `/` (`"."` is the root too).
fn rel_str(rel: &Path) -> Option<&str> {
    let s = rel.to_str()?;
    let s = s.trim_matches('/');
    Some(if s == "." { "" } else { s })
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// `a/b/c` -> `("a/b", "c")`; `a` -> `("", "a")`; the root has no parent.
fn split_parent(path: &str) -> Option<(&str, &str)> {
    if path.is_empty() {
        return None;
    }
    Some(path.rsplit_once('/').unwrap_or(("", path)))
}

/// The directories above `path`: `a/b/c` -> `a`, `a/b`.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(i, _)| &path[..i])
}

/// Why `path` (a key relative to the prefix, no trailing `/`) cannot be a path of the tree.
fn check_path(path: &str) -> Result<(), String> {
    if path.contains('\0') {
        return Err("it has a NUL character".into());
    }
    for segment in path.split('/') {
        match segment {
            "" => return Err("it has an empty path segment".into()),
            "." | ".." => return Err(format!("it has a {segment:?} path segment")),
            s if s.len() > MAX_NAME => {
                return Err(format!("a path segment is longer than {MAX_NAME} bytes"))
            }
            _ => {}
        }
    }
    Ok(())
}
