//! A source file as [`super::PathAccess::open`] hands it back: a descriptor of a local file, or
//! a version of a file in a remote source (an object store) that is read by ranged requests.
//!
//! **Contract.** An [`Opened`] reads one version of one file: a local descriptor the version
//! the path named when it was opened; a [`RemoteFile`] the version whose identity it reports,
//! every read of it either that version's bytes or an error (never bytes of a newer version).
//! Nothing here caches: the chunk cache and the disk tier sit above.

use std::fs::File;
use std::io;
use std::sync::Arc;

use super::{ReadAt, SourceIdentity};

/// One version of a file in a remote source, read by positional requests.
pub trait RemoteFile: ReadAt {
    /// The version's length in bytes.
    fn len(&self) -> u64;
    /// Whether the version is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The version's identity: a replaced file has another one.
    fn identity(&self) -> SourceIdentity;
    /// What the source is, for the stats (`s3`).
    fn kind(&self) -> &'static str;
}

/// A source file opened for reading.
pub enum Opened {
    /// A local file (or one of a file system the kernel mounts).
    File(File),
    /// A version of a file in a remote source.
    Remote(Arc<dyn RemoteFile>),
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Opened::File(file) => f.debug_tuple("File").field(file).finish(),
            Opened::Remote(remote) => f.debug_tuple("Remote").field(&remote.identity()).finish(),
        }
    }
}

impl From<File> for Opened {
    fn from(file: File) -> Opened {
        Opened::File(file)
    }
}

impl Opened {
    /// Its length in bytes.
    pub fn size(&self) -> io::Result<u64> {
        match self {
            Opened::File(file) => Ok(file.metadata()?.len()),
            Opened::Remote(remote) => Ok(remote.len()),
        }
    }

    /// Whether it is a regular file (a remote file always is).
    pub fn is_file(&self) -> io::Result<bool> {
        match self {
            Opened::File(file) => Ok(file.metadata()?.is_file()),
            Opened::Remote(_) => Ok(true),
        }
    }

    /// The identity of the version it reads.
    pub fn identity(&self) -> io::Result<SourceIdentity> {
        match self {
            Opened::File(file) => SourceIdentity::of_file(file),
            Opened::Remote(remote) => Ok(remote.identity()),
        }
    }

    /// What its positional reads go through.
    pub fn reader(&self) -> &dyn ReadAt {
        match self {
            Opened::File(file) => file,
            Opened::Remote(remote) => remote.as_ref(),
        }
    }

    /// The local descriptor, if it is one.
    pub fn as_file(&self) -> Option<&File> {
        match self {
            Opened::File(file) => Some(file),
            Opened::Remote(_) => None,
        }
    }

    /// The local descriptor, or an `Unsupported` error naming `what` needs one.
    pub fn into_file(self, what: &str) -> io::Result<File> {
        match self {
            Opened::File(file) => Ok(file),
            Opened::Remote(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{what} needs a local file; this one is in a remote source"),
            )),
        }
    }

    /// Up to `limit` bytes from its start (fewer for a shorter file).
    pub fn read_head(&self, limit: u64) -> io::Result<Vec<u8>> {
        let len = self.size()?.min(limit);
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        let filled = super::read_full_at(self.reader(), &mut buf, 0).map_err(|(_, e)| e)?;
        buf.truncate(filled);
        Ok(buf)
    }
}
