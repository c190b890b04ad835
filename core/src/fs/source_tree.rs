//! SOURCE as the filesystem walks it: a local directory ([`SourceRoot`], resolved as the
//! requester) or the tree of a remote source ([`RemoteTree`]: the objects under a prefix of an
//! object store).
//!
//! **Contract.** Every path the filesystem serves is relative to SOURCE. A local tree is what
//! the operating system shows, links and rights included ([`super::present`]); a remote tree
//! holds directories and regular files only, all readable by whoever reaches the mount (the
//! daemon reads the store with its own credentials, whoever asks), and each file's identity
//! names the version the tree listed: a replaced object is another object, never a mix of two.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::attr::{Attr, Kind};
use super::inodes::{generation_of, ObjectId};
use super::platform::{self, SourceRoot};
use super::StatFs;
use crate::source::{Opened, PathAccess, RemoteFile, SourceIdentity};
use crate::stats::RemoteSourceSnapshot;

/// One entry of a remote tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteEntry {
    /// [`Kind::File`] or [`Kind::Directory`].
    pub kind: Kind,
    /// A file's length; a directory's entries.
    pub size: u64,
    /// A file's last modification; a directory's newest entry's.
    pub mtime: SystemTime,
    /// What the entry is: a new version of a file is a new object.
    pub object: ObjectId,
    /// The version of a file (`None` for a directory).
    pub identity: Option<SourceIdentity>,
}

/// The tree of a remote source. Paths are relative to its root; [`PathAccess`] (which the model
/// store uses) takes them joined to [`RemoteTree::root`].
pub trait RemoteTree: Send + Sync {
    /// The source's name, which every path the model store sees starts with
    /// (`s3://bucket/prefix`).
    fn root(&self) -> &Path;
    /// The entry at `rel` (`NotFound` if there is none).
    fn entry(&self, rel: &Path) -> io::Result<RemoteEntry>;
    /// The names in directory `rel`.
    fn list(&self, rel: &Path) -> io::Result<Vec<OsString>>;
    /// The version of file `rel` the tree lists, for reading.
    fn open(&self, rel: &Path) -> io::Result<Arc<dyn RemoteFile>>;
    /// The figures `statfs` shows.
    fn statfs(&self) -> io::Result<StatFs>;
    /// What the source's client did since the mount started (the stats' `source.remote`).
    fn stats(&self) -> RemoteSourceSnapshot;
}

/// What a source entry's metadata is.
pub enum SourceMeta {
    Local(std::fs::Metadata),
    Remote(RemoteEntry),
}

impl SourceMeta {
    pub fn is_dir(&self) -> bool {
        match self {
            SourceMeta::Local(meta) => meta.is_dir(),
            SourceMeta::Remote(entry) => entry.kind == Kind::Directory,
        }
    }

    pub fn is_file(&self) -> bool {
        match self {
            SourceMeta::Local(meta) => meta.is_file(),
            SourceMeta::Remote(entry) => entry.kind == Kind::File,
        }
    }

    pub fn is_symlink(&self) -> bool {
        match self {
            SourceMeta::Local(meta) => meta.file_type().is_symlink(),
            SourceMeta::Remote(_) => false,
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            SourceMeta::Local(meta) => meta.len(),
            SourceMeta::Remote(entry) => entry.size,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The kind of the entry itself (a link as a link).
    pub fn kind(&self) -> Kind {
        match self {
            SourceMeta::Local(meta) => Kind::of(meta),
            SourceMeta::Remote(entry) => entry.kind,
        }
    }

    /// The source object the entry (of `abs`) is, presented as `kind`.
    pub fn object_id(&self, abs: &Path, kind: Kind) -> io::Result<ObjectId> {
        match self {
            SourceMeta::Local(meta) => platform::object_id(abs, meta, kind),
            SourceMeta::Remote(entry) => Ok(entry.object),
        }
    }

    /// Its attributes, presented as `kind` under number `ino`: a remote entry is read-only,
    /// open to everyone, and owned by the daemon's user.
    pub fn attr(&self, ino: u64, kind: Kind) -> Attr {
        match self {
            SourceMeta::Local(meta) => Attr::of_source(ino, meta, kind),
            SourceMeta::Remote(entry) => remote_attr(ino, entry, kind),
        }
    }
}

/// Block size a remote file's attributes report: the chunk size readers are best served in.
const REMOTE_BLKSIZE: u32 = 1 << 20;

fn remote_attr(ino: u64, entry: &RemoteEntry, kind: Kind) -> Attr {
    let (uid, gid) = platform::daemon_ids();
    let dir = kind == Kind::Directory;
    Attr {
        ino,
        generation: generation_of(entry.object.born),
        size: entry.size,
        blocks: entry.size.div_ceil(512),
        atime: entry.mtime,
        mtime: entry.mtime,
        ctime: entry.mtime,
        crtime: entry.mtime,
        kind,
        perm: if dir { 0o555 } else { 0o444 },
        nlink: if dir { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: REMOTE_BLKSIZE,
    }
}

/// SOURCE, local or remote.
#[derive(Clone)]
pub enum SourceTree {
    Local(Arc<SourceRoot>),
    Remote(Arc<dyn RemoteTree>),
}

impl SourceTree {
    /// How the model store reaches SOURCE's files by path.
    pub fn path_access(&self) -> Arc<dyn PathAccess> {
        match self {
            SourceTree::Local(root) => root.clone(),
            SourceTree::Remote(tree) => Arc::new(RemotePaths(Arc::clone(tree))),
        }
    }

    pub fn is_remote(&self) -> bool {
        matches!(self, SourceTree::Remote(_))
    }

    /// The metadata of `rel` itself (a link as a link); links on the way followed only if
    /// `follow_links`.
    pub fn lstat(&self, rel: &Path, follow_links: bool) -> io::Result<SourceMeta> {
        match self {
            SourceTree::Local(root) => root.lstat(rel, follow_links).map(SourceMeta::Local),
            SourceTree::Remote(tree) => tree.entry(rel).map(SourceMeta::Remote),
        }
    }

    /// The metadata of what `rel` resolves to.
    pub fn stat(&self, rel: &Path, follow_links: bool) -> io::Result<SourceMeta> {
        match self {
            SourceTree::Local(root) => root.stat(rel, follow_links).map(SourceMeta::Local),
            SourceTree::Remote(tree) => tree.entry(rel).map(SourceMeta::Remote),
        }
    }

    /// Whether a directory on the way to `rel`, or `rel`, carries a POSIX ACL (never in a
    /// remote tree).
    pub fn acl_on_path(&self, rel: &Path) -> io::Result<bool> {
        match self {
            SourceTree::Local(root) => root.acl_on_path(rel),
            SourceTree::Remote(_) => Ok(false),
        }
    }

    /// Opens `rel` for reading (the access check of a shared mount's requester).
    pub fn check_open(&self, rel: &Path, follow_links: bool) -> io::Result<()> {
        match self {
            SourceTree::Local(root) => root.open_file(rel, follow_links).map(drop),
            SourceTree::Remote(tree) => tree.entry(rel).map(drop),
        }
    }

    /// Opens `rel` if it is a regular file, with its metadata (see
    /// [`SourceRoot::open_regular`]).
    pub fn open_regular(&self, rel: &Path, follow_links: bool) -> io::Result<(Opened, SourceMeta)> {
        match self {
            SourceTree::Local(root) => {
                let (file, meta) = root.open_regular(rel, follow_links)?;
                Ok((Opened::File(file), SourceMeta::Local(meta)))
            }
            SourceTree::Remote(tree) => {
                let entry = tree.entry(rel)?;
                if entry.kind == Kind::Directory {
                    return Err(io::Error::from(io::ErrorKind::IsADirectory));
                }
                let file = tree.open(rel)?;
                Ok((Opened::Remote(file), SourceMeta::Remote(entry)))
            }
        }
    }

    /// The names in directory `rel`.
    pub fn list_dir(&self, rel: &Path, follow_links: bool) -> io::Result<Vec<OsString>> {
        match self {
            SourceTree::Local(root) => root.list_dir(rel, follow_links),
            SourceTree::Remote(tree) => tree.list(rel),
        }
    }

    /// The target of link `rel` (a remote tree has none: `EINVAL`, as for a file).
    pub fn read_link(&self, rel: &Path, follow_links: bool) -> io::Result<PathBuf> {
        match self {
            SourceTree::Local(root) => root.read_link(rel, follow_links),
            SourceTree::Remote(_) => Err(io::Error::from(io::ErrorKind::InvalidInput)),
        }
    }

    /// Whether link `rel` leads to one of its own ancestors.
    pub fn link_points_at_ancestor(&self, rel: &Path) -> bool {
        match self {
            SourceTree::Local(root) => root.link_points_at_ancestor(rel),
            SourceTree::Remote(_) => false,
        }
    }

    /// SOURCE's name: its path, or the remote source's URL.
    pub fn abs(&self) -> &Path {
        match self {
            SourceTree::Local(root) => root.abs(),
            SourceTree::Remote(tree) => tree.root(),
        }
    }
}

/// A remote tree's files by their paths joined to its root, for the model store.
struct RemotePaths(Arc<dyn RemoteTree>);

impl RemotePaths {
    fn rel<'a>(&self, abs: &'a Path) -> io::Result<&'a Path> {
        abs.strip_prefix(self.0.root())
            .map_err(|_| io::Error::from(io::ErrorKind::NotFound))
    }
}

impl PathAccess for RemotePaths {
    fn open(&self, abs: &Path) -> io::Result<Opened> {
        self.0.open(self.rel(abs)?).map(Opened::Remote)
    }

    fn identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
        let entry = self.0.entry(self.rel(abs)?)?;
        entry
            .identity
            .ok_or_else(|| io::Error::from(io::ErrorKind::IsADirectory))
    }

    fn list_dir(&self, abs: &Path) -> io::Result<Vec<OsString>> {
        self.0.list(self.rel(abs)?)
    }

    fn dir_identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
        let entry = self.0.entry(self.rel(abs)?)?;
        if entry.kind != Kind::Directory {
            return Err(io::Error::from(io::ErrorKind::NotADirectory));
        }
        // A directory's time is its newest entry's (`RemoteEntry::mtime`): a listing of it
        // cached by that identity is listed again once something in it changed.
        let mtime_ns = entry
            .mtime
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        Ok(SourceIdentity {
            dev: entry.object.dev,
            ino: entry.object.ino,
            size: entry.size,
            mtime_ns,
            ctime_ns: 0,
        })
    }

    fn link_target(&self, abs: &Path) -> io::Result<Option<PathBuf>> {
        self.0.entry(self.rel(abs)?).map(|_| None)
    }
}
