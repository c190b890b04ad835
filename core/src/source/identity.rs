//! What one version of a source file is, and how the daemon reaches SOURCE's files by path.
//!
//! **Contract.** A [`SourceIdentity`] names one version of a file: bytes cached for it are
//! served only while the file the path names has the same identity. [`PathAccess`] is every
//! path operation the daemon makes on SOURCE (opens, identities, listings, links), so that a
//! mount can route them through its access rule and tests through [`PlainPaths`].

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use super::linux;
use super::platform;

/// What identifies one version of a file: if any of these change, cached bytes are stale.
///
/// On Linux: device, inode, size, mtime and ctime. On Windows: the volume serial number, the
/// file index (the NTFS file ID), size, last-write time, and creation time in `ctime_ns`
/// (Windows has no inode change time in `GetFileInformationByHandle`; a replaced file has a new
/// file index anyway). Times are nanoseconds since the platform's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceIdentity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl SourceIdentity {
    /// The identity of the file `meta` was taken from.
    #[cfg(target_os = "linux")]
    pub fn of(meta: &std::fs::Metadata) -> Self {
        linux::identity_of_metadata(meta)
    }

    /// The identity of the open file `file`.
    pub fn of_file(file: &File) -> io::Result<Self> {
        platform::identity(file)
    }

    /// The identity of the file `path` names now (following symlinks).
    pub fn of_path(path: &Path) -> io::Result<Self> {
        platform::identity_of_path(path)
    }

    /// The identity of directory `path`, opened for listing (following symlinks).
    pub fn of_dir(path: &Path) -> io::Result<Self> {
        platform::identity_of_dir(path)
    }

    /// When the file was last modified, by the wall clock (`None` for a time before the
    /// platform's epoch).
    pub fn modified(&self) -> Option<std::time::SystemTime> {
        platform::system_time(self.mtime_ns)
    }
}

/// How the daemon reaches SOURCE's files by path when no requester's descriptor is at hand
/// (indexing for a prefetch, reopening a closed version, shard discovery): on a Linux mount,
/// `crate::access::SourceRoot`, which never resolves a path through `/proc` or into the mount
/// itself, with the calling thread's credentials (so discovery done on a requester's thread,
/// while acting for them, has their rights); elsewhere, and in tests, [`PlainPaths`].
pub trait PathAccess: Send + Sync {
    /// Opens `abs` for reading, following links.
    fn open(&self, abs: &Path) -> io::Result<super::Opened>;
    /// The identity of the file `abs` names now, following links.
    fn identity(&self, abs: &Path) -> io::Result<SourceIdentity>;
    /// The names in directory `abs`.
    fn list_dir(&self, abs: &Path) -> io::Result<Vec<std::ffi::OsString>>;
    /// The identity of directory `abs`, opened as [`PathAccess::list_dir`] opens it: with the
    /// same rights, so it fails where the listing would.
    fn dir_identity(&self, abs: &Path) -> io::Result<SourceIdentity>;
    /// The target of `abs` if it is a symbolic link, `None` if it is not one.
    fn link_target(&self, abs: &Path) -> io::Result<Option<PathBuf>>;
}

/// [`PathAccess`] by plain paths, with the process's rights.
#[derive(Debug, Default, Clone, Copy)]
pub struct PlainPaths;

impl PathAccess for PlainPaths {
    fn open(&self, abs: &Path) -> io::Result<super::Opened> {
        File::open(abs).map(super::Opened::File)
    }

    fn identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
        SourceIdentity::of_path(abs)
    }

    fn list_dir(&self, abs: &Path) -> io::Result<Vec<std::ffi::OsString>> {
        std::fs::read_dir(abs)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect()
    }

    fn dir_identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
        SourceIdentity::of_dir(abs)
    }

    fn link_target(&self, abs: &Path) -> io::Result<Option<PathBuf>> {
        match std::fs::symlink_metadata(abs)?.file_type().is_symlink() {
            true => std::fs::read_link(abs).map(Some),
            false => Ok(None),
        }
    }
}
