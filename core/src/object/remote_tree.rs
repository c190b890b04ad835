//! The objects under a prefix as a mount's SOURCE ([`RemoteTree`]), and each object version
//! as a file the model store reads ([`RemoteFile`]).
//!
//! **Contract.** Paths are relative to the prefix; the tree answered is the client's listing
//! ([`ObjectSource::tree`], reused for [`ObjectStoreConfig::listing_ttl`](super::ObjectStoreConfig)).
//! A file opened is the version that listing names: its reads are conditional on the
//! version's ETag, so a replaced object fails them (`ESTALE`) rather than mix two versions,
//! and the next listing shows the new version as a new object. Directories have no objects of
//! their own: their time is their newest entry's, so a listing cached by a directory's
//! identity is read again once something in it changed.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::client::SOURCE_KIND;
use super::{ObjectError, ObjectSource, ObjectVersion, TreeEntry};
use crate::fs::inodes::ObjectId;
use crate::fs::{Kind, RemoteEntry, RemoteTree, StatFs};
use crate::source::{ReadAt, RemoteFile, SourceIdentity};
use crate::stats::RemoteSourceSnapshot;

/// Seed of the hash that numbers a directory (files are numbered by their key's hash,
/// [`ObjectVersion::identity`]).
const DIR_SEED: u64 = 0x7469_6572_6673_2d64; // "tierfs-d"
/// What `statfs` reports as the block size: the cache's chunk granularity.
const STATFS_BLOCK: u32 = 4096;
/// The longest name `statfs` reports (Linux's NAME_MAX, which the tree enforces).
const NAME_MAX: u32 = 255;

/// A prefix of an object store as a source tree.
pub struct ObjectRemoteTree {
    source: ObjectSource,
    /// `s3://bucket/prefix`: the name paths the model store sees start with.
    root: PathBuf,
    /// The device number of every entry: a hash of the store's address, bucket and prefix, so
    /// that the disk tier knows the same objects again after a restart.
    dev: u64,
}

impl ObjectRemoteTree {
    /// The tree of `source`'s prefix; `store_id` names the store (its endpoint), so that two
    /// stores with the same bucket and prefix are different devices.
    pub fn new(source: ObjectSource, store_id: &str) -> ObjectRemoteTree {
        let root = PathBuf::from(source.url().to_string().trim_end_matches('/'));
        let dev = xxhash_rust::xxh3::xxh3_64(format!("{store_id}\n{}", source.url()).as_bytes());
        ObjectRemoteTree { source, root, dev }
    }

    /// The device number of every entry.
    pub fn dev(&self) -> u64 {
        self.dev
    }

    fn lookup(&self, rel: &Path) -> io::Result<TreeEntry> {
        let tree = self.source.tree().map_err(ObjectError::into_io)?;
        tree.entry(rel)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn file_entry(&self, version: &ObjectVersion) -> RemoteEntry {
        let identity = version.identity(self.dev);
        RemoteEntry {
            kind: Kind::File,
            size: version.size,
            mtime: version.last_modified,
            object: object_of(&identity),
            identity: Some(identity),
        }
    }

    fn dir_entry(&self, rel: &Path) -> io::Result<RemoteEntry> {
        let tree = self.source.tree().map_err(ObjectError::into_io)?;
        let summary = tree
            .dir_summary(rel)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotADirectory))?;
        let key = rel.to_string_lossy();
        Ok(RemoteEntry {
            kind: Kind::Directory,
            size: summary.entries,
            mtime: summary.newest,
            object: ObjectId {
                dev: self.dev,
                ino: xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), DIR_SEED),
                born: 0,
            },
            identity: None,
        })
    }
}

/// The object a file version is: a new ETag is a new object (another birth).
fn object_of(identity: &SourceIdentity) -> ObjectId {
    ObjectId {
        dev: identity.dev,
        ino: identity.ino,
        born: identity.ctime_ns as u64,
    }
}

impl RemoteTree for ObjectRemoteTree {
    fn root(&self) -> &Path {
        &self.root
    }

    fn entry(&self, rel: &Path) -> io::Result<RemoteEntry> {
        match self.lookup(rel)? {
            TreeEntry::Dir => self.dir_entry(rel),
            TreeEntry::Object(version) => Ok(self.file_entry(&version)),
        }
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<OsString>> {
        let tree = self.source.tree().map_err(ObjectError::into_io)?;
        match tree.names(rel) {
            Some(names) => Ok(names),
            None if tree.entry(rel).is_some() => Err(io::Error::from(io::ErrorKind::NotADirectory)),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    fn open(&self, rel: &Path) -> io::Result<Arc<dyn RemoteFile>> {
        match self.lookup(rel)? {
            TreeEntry::Dir => Err(io::Error::from(io::ErrorKind::IsADirectory)),
            TreeEntry::Object(version) => Ok(Arc::new(ObjectFile {
                source: self.source.clone(),
                identity: version.identity(self.dev),
                version,
            })),
        }
    }

    fn statfs(&self) -> io::Result<StatFs> {
        let tree = self.source.tree().map_err(ObjectError::into_io)?;
        let blocks = tree.bytes().div_ceil(u64::from(STATFS_BLOCK));
        Ok(StatFs {
            blocks,
            bfree: 0,
            bavail: 0,
            files: tree.objects() as u64,
            ffree: 0,
            bsize: STATFS_BLOCK,
            namelen: NAME_MAX,
            frsize: STATFS_BLOCK,
        })
    }

    fn stats(&self) -> RemoteSourceSnapshot {
        self.source.stats()
    }
}

/// One version of one object, read with the client's conditional ranged reads.
struct ObjectFile {
    source: ObjectSource,
    version: ObjectVersion,
    identity: SourceIdentity,
}

impl ReadAt for ObjectFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if offset >= self.version.size {
            return Ok(0);
        }
        self.source
            .read_at(&self.version, buf, offset)
            .map_err(ObjectError::into_io)
    }
}

impl RemoteFile for ObjectFile {
    fn len(&self) -> u64 {
        self.version.size
    }

    fn identity(&self) -> SourceIdentity {
        self.identity
    }

    fn kind(&self) -> &'static str {
        SOURCE_KIND
    }
}
