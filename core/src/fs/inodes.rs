//! Inode numbers for the objects under the source root, and how long they live.
//!
//! An inode number stands for *one source object at one path*: the pair (path relative to
//! SOURCE, the object's device and inode number there). Every operation looks the path up in
//! SOURCE again, so changes show through at once. When a file is replaced at its path (`mv`
//! over it, delete and recreate, a model re-downloaded), the new object gets a new number: the
//! kernel keeps a page cache per inode, and an `mmap` of the old version must never be filled
//! with pages of the new one (nor the other way round), since the old handle still reads the
//! old file. The number of the old object lives on, answering with its last known attributes,
//! until the kernel forgets it.
//!
//! **Lifetime.** Each entry counts the lookups the kernel was answered with (`lookup` replies,
//! each one a reference the kernel holds until it sends `forget` for it) and the handles open
//! on it. An entry goes when both are zero: at the `forget` that takes the last reference, or
//! at the release of its last handle after that. An entry a directory listing numbered but the
//! kernel never looked up holds no reference at all; it goes when that listing is released
//! ([`Inodes::drop_unreferenced`]), so listing a folder of 20 000 files does not leave 20 000
//! entries behind. (Its number then is not the one a later lookup gives: `readdir` numbers
//! only matter while the listing is open, which is when `ls -l` and `find` stat the entries.)
//!
//! Numbers are never reused during a mount (a counter, 2^64 of them): a number the kernel may
//! still hold — a lookup in flight while its entry was pruned, a handle being released — can
//! never come to mean another object. A pruned pair looked up again simply gets a new number.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::sync::{Mutex, MutexGuard};

use super::attr::Attr;

/// The root directory (FUSE's fixed root inode).
pub const ROOT_INO: u64 = 1;
/// `.tierfs/`, the control directory.
pub const CONTROL_DIR_INO: u64 = 2;
/// `.tierfs/stats`.
pub const STATS_INO: u64 = 3;
/// `.tierfs/control`.
pub const CONTROL_INO: u64 = 4;
/// `.tierfs/metrics`, where the front end renders metrics ([`super::TierFs::with_metrics`]).
pub const METRICS_INO: u64 = 5;
/// First number handed to a source object; the ones below are reserved for virtual files.
pub const FIRST_SOURCE_INO: u64 = 16;

/// The source object behind an inode: device and inode number in SOURCE.
pub type ObjectId = (u64, u64);

/// What the table knows of one inode.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    /// `None` for the root, which stands for SOURCE itself whatever it is.
    pub object: Option<ObjectId>,
    /// The attributes last reported for it.
    pub attr: Option<Attr>,
    /// Lookups answered and not yet forgotten by the kernel.
    lookups: u64,
    /// Handles open on it.
    handles: u64,
}

impl Entry {
    fn unused(&self) -> bool {
        self.lookups == 0 && self.handles == 0
    }
}

#[derive(Debug)]
struct Table {
    entries: HashMap<u64, Entry>,
    inos: HashMap<(PathBuf, ObjectId), u64>,
    next: u64,
}

/// Two-way map between inode numbers and (path, object) pairs.
#[derive(Debug)]
pub struct Inodes {
    table: Mutex<Table>,
}

impl Default for Inodes {
    fn default() -> Self {
        let root = Entry {
            path: PathBuf::new(),
            object: None,
            attr: None,
            lookups: 0,
            handles: 0,
        };
        Inodes {
            table: Mutex::new(Table {
                entries: HashMap::from([(ROOT_INO, root)]),
                inos: HashMap::new(),
                next: FIRST_SOURCE_INO,
            }),
        }
    }
}

impl Inodes {
    /// The inode number of `object` at `path`, assigning one if the pair is new (the flag
    /// says so). Counts no reference: for directory listings.
    pub fn ino_of(&self, path: &Path, object: ObjectId, attr: Attr) -> (u64, bool) {
        number(&mut self.lock(), path, object, attr)
    }

    /// The inode number of `object` at `path` for a lookup answered to the kernel: counts one
    /// reference, which the kernel gives back with `forget`.
    pub fn looked_up(&self, path: &Path, object: ObjectId, attr: Attr) -> u64 {
        let mut table = self.lock();
        let (ino, _) = number(&mut table, path, object, attr);
        if let Some(entry) = table.entries.get_mut(&ino) {
            entry.lookups += 1;
        }
        ino
    }

    /// What is known of inode `ino`, if it is a source object.
    pub fn entry(&self, ino: u64) -> Option<Entry> {
        self.lock().entries.get(&ino).cloned()
    }

    /// Records the attributes just reported for `ino`.
    pub fn remember(&self, ino: u64, attr: Attr) {
        remember(&mut self.lock(), ino, attr);
    }

    /// A handle was opened on `ino`; false if the inode is not (or no longer) known.
    pub fn opened(&self, ino: u64) -> bool {
        match self.lock().entries.get_mut(&ino) {
            Some(entry) => {
                entry.handles += 1;
                true
            }
            None => false,
        }
    }

    /// A handle of `ino` closed; prunes the entry if that was its last use. Returns whether
    /// it went.
    pub fn closed(&self, ino: u64) -> bool {
        let mut table = self.lock();
        if let Some(entry) = table.entries.get_mut(&ino) {
            entry.handles = entry.handles.saturating_sub(1);
        }
        prune(&mut table, ino)
    }

    /// The kernel dropped `count` references to `ino`; prunes the entry if nothing else uses
    /// it. Returns whether it went.
    pub fn forget(&self, ino: u64, count: u64) -> bool {
        let mut table = self.lock();
        if let Some(entry) = table.entries.get_mut(&ino) {
            entry.lookups = entry.lookups.saturating_sub(count);
        }
        prune(&mut table, ino)
    }

    /// Prunes `ino` if no lookup and no handle holds it (entries numbered by a listing).
    pub fn drop_unreferenced(&self, ino: u64) -> bool {
        prune(&mut self.lock(), ino)
    }

    /// How many inodes the table holds (the root included).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Never true: the root is always there (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        crate::sync::lock(&self.table)
    }
}

/// The number of `object` at `path`, with `attr` (its `ino` set) remembered for it.
fn number(table: &mut Table, path: &Path, object: ObjectId, attr: Attr) -> (u64, bool) {
    let key = (path.to_owned(), object);
    if let Some(&ino) = table.inos.get(&key) {
        remember(table, ino, Attr { ino, ..attr });
        return (ino, false);
    }
    let ino = table.next;
    table.next += 1;
    table.inos.insert(key, ino);
    let entry = Entry {
        path: path.to_owned(),
        object: Some(object),
        attr: Some(Attr { ino, ..attr }),
        lookups: 0,
        handles: 0,
    };
    table.entries.insert(ino, entry);
    (ino, true)
}

fn remember(table: &mut Table, ino: u64, attr: Attr) {
    if let Some(entry) = table.entries.get_mut(&ino) {
        entry.attr = Some(attr);
    }
}

/// Removes `ino` if unused (never the root); whether it went.
fn prune(table: &mut Table, ino: u64) -> bool {
    if ino == ROOT_INO || !table.entries.get(&ino).is_some_and(Entry::unused) {
        return false;
    }
    if let Some(entry) = table.entries.remove(&ino) {
        if let Some(object) = entry.object {
            table.inos.remove(&(entry.path, object));
        }
    }
    true
}
