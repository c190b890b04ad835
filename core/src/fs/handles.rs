//! The open handles of a mount: one per `open`/`opendir`, numbered from 1 and never reused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::models::OpenModel;
use crate::sync::{lock, Mutex};

use super::{DirEntry, FsError};

/// What a handle serves. `B` is the front end's passthrough backing object, kept alive here
/// until release.
pub enum Handle<B> {
    /// A model file served from the cache; holds its source descriptors until release.
    Model(OpenModel),
    /// A model file served by the kernel from its source ([`crate::passthrough`]); release
    /// gives the file's reservation back.
    ModelPassthrough(OpenModel, #[allow(dead_code)] Arc<B>),
    /// Served by the kernel; the backing object must live until release.
    Passthrough(#[allow(dead_code)] Arc<B>),
    /// Any other file of SOURCE, read with positional reads.
    Plain(crate::source::Opened),
    Stats(Vec<u8>),
    Control,
    /// A directory listing, and the inodes it numbered that no lookup holds.
    Dir(Vec<DirEntry>, Vec<u64>),
}

/// An open handle: the inode it was opened on and what it serves.
pub struct Open<B> {
    pub ino: u64,
    pub kind: Handle<B>,
}

pub struct Handles<B> {
    table: Mutex<HashMap<u64, Arc<Open<B>>>>,
    next: AtomicU64,
}

impl<B> Default for Handles<B> {
    fn default() -> Self {
        Handles {
            table: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }
}

impl<B> Handles<B> {
    pub fn add(&self, ino: u64, kind: Handle<B>) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.table).insert(fh, Arc::new(Open { ino, kind }));
        fh
    }

    pub fn get(&self, fh: u64) -> Result<Arc<Open<B>>, FsError> {
        lock(&self.table)
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<Open<B>>> {
        lock(&self.table).remove(&fh)
    }

    pub fn len(&self) -> usize {
        lock(&self.table).len()
    }
}
