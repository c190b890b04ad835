//! Inode numbers for paths under the source root.
//!
//! tierfs is path-based: an inode number stands for a path relative to SOURCE, and every
//! operation looks the path up in SOURCE again, so changes made there show through at once.
//! Numbers are handed out on first sight and kept for the life of the mount (a path that comes
//! back gets its old number); the table grows with the number of distinct paths looked up, a
//! few hundred bytes each, which for a models folder is nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The root directory (FUSE's fixed root inode).
pub const ROOT_INO: u64 = 1;
/// `.tierfs/`, the control directory.
pub const CONTROL_DIR_INO: u64 = 2;
/// `.tierfs/stats`.
pub const STATS_INO: u64 = 3;
/// `.tierfs/control`.
pub const CONTROL_INO: u64 = 4;
/// First number handed to a source path; the ones below are reserved for virtual files.
const FIRST_SOURCE_INO: u64 = 16;

#[derive(Debug)]
struct Table {
    paths: HashMap<u64, PathBuf>,
    inos: HashMap<PathBuf, u64>,
    next: u64,
}

/// Two-way map between inode numbers and relative paths.
#[derive(Debug)]
pub struct Inodes {
    table: Mutex<Table>,
}

impl Default for Inodes {
    fn default() -> Self {
        let root = PathBuf::new();
        Inodes {
            table: Mutex::new(Table {
                paths: HashMap::from([(ROOT_INO, root.clone())]),
                inos: HashMap::from([(root, ROOT_INO)]),
                next: FIRST_SOURCE_INO,
            }),
        }
    }
}

impl Inodes {
    /// The inode number of `path`, assigning one if it is new.
    pub fn ino_of(&self, path: &Path) -> u64 {
        let mut table = self.lock();
        if let Some(&ino) = table.inos.get(path) {
            return ino;
        }
        let ino = table.next;
        table.next += 1;
        table.inos.insert(path.to_owned(), ino);
        table.paths.insert(ino, path.to_owned());
        ino
    }

    /// The relative path of inode `ino`, if it is a source path.
    pub fn path_of(&self, ino: u64) -> Option<PathBuf> {
        self.lock().paths.get(&ino).cloned()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_stable_and_distinct() {
        let inodes = Inodes::default();
        let a = inodes.ino_of(Path::new("a.safetensors"));
        let b = inodes.ino_of(Path::new("dir/b"));
        assert_ne!(a, b);
        assert!(a >= FIRST_SOURCE_INO && b >= FIRST_SOURCE_INO);
        assert_eq!(inodes.ino_of(Path::new("a.safetensors")), a);
        assert_eq!(inodes.path_of(b).as_deref(), Some(Path::new("dir/b")));
        assert_eq!(inodes.path_of(ROOT_INO).as_deref(), Some(Path::new("")));
        assert_eq!(inodes.path_of(STATS_INO), None);
    }
}
