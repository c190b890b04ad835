//! The one error type of the filesystem, and the one place it becomes an errno.

use std::io;

use thiserror::Error;

use super::platform::AccessError;
use crate::models::{OpenError, ReadError};
#[cfg(target_os = "linux")]
use crate::source::SourceError;

/// Why a filesystem operation failed. Every variant maps to exactly one errno
/// ([`FsError::errno`]); front ends reply with that and log nothing more (the core logs what
/// an operator needs).
#[derive(Debug, Error)]
pub enum FsError {
    /// No such name, or an inode number the filesystem does not (or no longer) know.
    #[error("no such file or directory")]
    NotFound,
    /// The path now holds another object than the inode stands for: the kernel looks it up
    /// again.
    #[error("the file was replaced in SOURCE")]
    Stale,
    #[error("is a directory")]
    IsDirectory,
    /// An open or access the filesystem does not allow (a special file, the control file
    /// opened for reading or by another user).
    #[error("permission denied: {0}")]
    Denied(&'static str),
    /// The requester's credentials could not be taken on.
    #[error("request refused: {0}")]
    Refused(#[from] AccessError),
    /// Any change but a control command: the mount is read-only.
    #[error("read-only file system")]
    ReadOnly,
    /// A handle that is not open, or not of the kind the operation needs.
    #[error("bad file handle")]
    BadHandle,
    /// The entry has no such extended attribute.
    #[error("no such attribute")]
    NoAttribute,
    /// The caller's buffer is too small for the value.
    #[error("buffer too small")]
    TooSmall,
    /// A control command that was refused; nothing changed.
    #[error("control command refused: {0}")]
    Control(String),
    /// A source call failed: its own errno goes back (EACCES, ENOENT, ELOOP, ...).
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// A model file's inode is open in passthrough mode and this open cannot be: the kernel
    /// cannot mix modes on one inode.
    #[error("the inode's other handles are passthrough and this open cannot be")]
    ModeConflict,
    /// A model file could not be opened (its own errno) or indexed (EIO).
    #[error("cannot open model file: {0}")]
    ModelOpen(#[from] OpenError),
    /// Reading a model file through the cache failed: EIO, whatever the cause, a source that
    /// did not answer within `--source-timeout` included (EIO is the error `read(2)` documents
    /// and every loader handles as a failed read; the log says the source timed out).
    #[error("read failed: {0}")]
    Read(#[from] ReadError),
}

impl FsError {
    /// A failed source call, keeping its errno.
    pub fn io(op: &'static str) -> impl FnOnce(io::Error) -> FsError {
        move |source| FsError::Io { op, source }
    }

    /// The errno the kernel gets for this error. (Windows: the front end maps to `NTSTATUS`,
    /// see `platform`'s docs.)
    #[cfg(target_os = "linux")]
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Stale => libc::ESTALE,
            FsError::IsDirectory => libc::EISDIR,
            FsError::Denied(_) | FsError::Refused(_) => libc::EACCES,
            FsError::ReadOnly => libc::EROFS,
            FsError::BadHandle => libc::EBADF,
            FsError::NoAttribute => libc::ENODATA,
            FsError::TooSmall => libc::ERANGE,
            FsError::Control(_) => libc::EINVAL,
            FsError::Io { source, .. } => os_errno(source),
            // A remote source's header read: refused credentials (EACCES), an object gone
            // (ENOENT) say more than EIO.
            FsError::ModelOpen(OpenError::Source(
                SourceError::Open { source, .. } | SourceError::Remote { source, .. },
            )) => os_errno(source),
            // Replaced between the requester's open and the store's: the kernel looks it up
            // again.
            FsError::ModelOpen(OpenError::Source(SourceError::Changed { .. })) => libc::ESTALE,
            FsError::ModelOpen(_) | FsError::Read(_) | FsError::ModeConflict => libc::EIO,
        }
    }
}

/// The OS's own errno of `e`; for an error that carries none (a remote source's), the errno of
/// its kind; EIO for any other.
#[cfg(target_os = "linux")]
fn os_errno(e: &io::Error) -> i32 {
    use io::ErrorKind as K;
    match e.raw_os_error() {
        Some(code) if code > 0 => code,
        _ => match e.kind() {
            K::NotFound => libc::ENOENT,
            K::PermissionDenied => libc::EACCES,
            K::IsADirectory => libc::EISDIR,
            K::NotADirectory => libc::ENOTDIR,
            K::InvalidInput => libc::EINVAL,
            K::TimedOut => libc::ETIMEDOUT,
            K::StaleNetworkFileHandle => libc::ESTALE,
            K::Unsupported => libc::EOPNOTSUPP,
            _ => libc::EIO,
        },
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn os_errors_keep_their_errno_and_the_rest_map_to_one_each() {
        let io = |code| FsError::io("stat")(io::Error::from_raw_os_error(code));
        assert_eq!(io(libc::ELOOP).errno(), libc::ELOOP);
        assert_eq!(io(libc::EACCES).errno(), libc::EACCES);
        let kind = |k: io::ErrorKind| FsError::io("lookup")(io::Error::from(k)).errno();
        assert_eq!(kind(io::ErrorKind::NotFound), libc::ENOENT);
        assert_eq!(kind(io::ErrorKind::NotADirectory), libc::ENOTDIR);
        assert_eq!(kind(io::ErrorKind::Other), libc::EIO);
        assert_eq!(
            FsError::io("read")(io::Error::other("no code")).errno(),
            libc::EIO
        );
        let open = |source| {
            FsError::ModelOpen(OpenError::Source(SourceError::Open {
                path: "x".into(),
                source,
            }))
        };
        assert_eq!(
            open(io::Error::from_raw_os_error(libc::EMFILE)).errno(),
            libc::EMFILE
        );
        assert_eq!(open(io::Error::other("header")).errno(), libc::EIO);
        let changed = OpenError::Source(SourceError::Changed { path: "x".into() });
        assert_eq!(FsError::ModelOpen(changed).errno(), libc::ESTALE);
        assert_eq!(FsError::Stale.errno(), libc::ESTALE);
        assert_eq!(FsError::ReadOnly.errno(), libc::EROFS);
        assert_eq!(FsError::Control("x".into()).errno(), libc::EINVAL);
        assert_eq!(FsError::TooSmall.errno(), libc::ERANGE);
    }

    #[test]
    fn a_source_that_does_not_answer_is_eio_for_the_read() {
        use crate::cache::CacheError;
        use std::sync::Arc;
        let timed_out = || SourceError::TimedOut {
            path: "x".into(),
            offset: 0,
            after: std::time::Duration::from_secs(30),
        };
        let stuck = SourceError::Unresponsive {
            path: "x".into(),
            stuck: 32,
        };
        for read in [
            ReadError::Source(timed_out()),
            ReadError::Cache(CacheError::Source(Arc::new(timed_out()))),
            ReadError::Source(stuck),
        ] {
            assert_eq!(FsError::Read(read).errno(), libc::EIO);
        }
    }
}
