//! Inode numbers for the objects under the source root.
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
//! Numbers are never reused during a mount; the table grows with the number of distinct objects
//! seen, a few hundred bytes each, which for a models folder is nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use fuser::FileAttr;

/// The root directory (FUSE's fixed root inode).
pub const ROOT_INO: u64 = 1;
/// `.tierfs/`, the control directory.
pub const CONTROL_DIR_INO: u64 = 2;
/// `.tierfs/stats`.
pub const STATS_INO: u64 = 3;
/// `.tierfs/control`.
pub const CONTROL_INO: u64 = 4;
/// First number handed to a source object; the ones below are reserved for virtual files.
const FIRST_SOURCE_INO: u64 = 16;

/// The source object behind an inode: device and inode number in SOURCE.
pub type ObjectId = (u64, u64);

/// What the table knows of one inode.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    /// `None` for the root, which stands for SOURCE itself whatever it is.
    pub object: Option<ObjectId>,
    /// The attributes last reported for it.
    pub attr: Option<FileAttr>,
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
    /// The inode number of `object` at `path`, assigning one if the pair is new.
    pub fn ino_of(&self, path: &Path, object: ObjectId) -> u64 {
        let mut table = self.lock();
        let key = (path.to_owned(), object);
        if let Some(&ino) = table.inos.get(&key) {
            return ino;
        }
        let ino = table.next;
        table.next += 1;
        table.inos.insert(key, ino);
        let entry = Entry {
            path: path.to_owned(),
            object: Some(object),
            attr: None,
        };
        table.entries.insert(ino, entry);
        ino
    }

    /// What is known of inode `ino`, if it is a source object.
    pub fn entry(&self, ino: u64) -> Option<Entry> {
        self.lock().entries.get(&ino).cloned()
    }

    /// Records the attributes just reported for `ino`.
    pub fn remember(&self, ino: u64, attr: FileAttr) {
        if let Some(entry) = self.lock().entries.get_mut(&ino) {
            entry.attr = Some(attr);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_stable_per_object_and_new_for_a_replacement() {
        let inodes = Inodes::default();
        let a = inodes.ino_of(Path::new("a.safetensors"), (1, 100));
        let b = inodes.ino_of(Path::new("dir/b"), (1, 101));
        assert_ne!(a, b);
        assert!(a >= FIRST_SOURCE_INO && b >= FIRST_SOURCE_INO);
        assert_eq!(inodes.ino_of(Path::new("a.safetensors"), (1, 100)), a);
        let replaced = inodes.ino_of(Path::new("a.safetensors"), (1, 102));
        assert_ne!(replaced, a, "a file replaced at its path is a new inode");
        assert_eq!(
            inodes.entry(b).map(|e| e.path),
            Some(PathBuf::from("dir/b"))
        );
        assert_eq!(inodes.entry(ROOT_INO).map(|e| e.path), Some(PathBuf::new()));
        assert!(inodes.entry(STATS_INO).is_none());
    }
}
