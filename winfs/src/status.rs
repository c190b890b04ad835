//! Every error of the WinFsp front end, and the one place it becomes an `NTSTATUS`.
//!
//! Errors are the core filesystem's own ([`FsError`], the same the FUSE adapter turns into
//! errnos with `FsError::errno`) plus the few that only WinFsp's requests can cause
//! ([`WinError`]). The mapping mirrors the errnos: a missing file is `ENOENT` there and
//! `STATUS_OBJECT_NAME_NOT_FOUND` here; a failed source read is `EIO` there and
//! `STATUS_IO_DEVICE_ERROR` here (for that read only); writes are `EROFS` there and
//! `STATUS_MEDIA_WRITE_PROTECTED` here; a refused control command is `EINVAL` there and
//! `STATUS_INVALID_PARAMETER` here; a file replaced in SOURCE since it was named is `ESTALE`
//! there and `STATUS_FILE_INVALID` here.
//!
//! Why here and not in core: `NTSTATUS` is WinFsp's vocabulary, like errno is the kernel's;
//! core stays free of both front ends' types but its errno (which its own tests speak). Every
//! variant of [`FsError`] is matched by name, so a new one fails this crate's build until it
//! is mapped.

use std::io;

use thiserror::Error;
use tierfs_core::fs::FsError;
use tierfs_core::models::OpenError;
use tierfs_core::source::SourceError;
use windows_sys::Win32::Foundation::{
    NTSTATUS, STATUS_ACCESS_DENIED, STATUS_BUFFER_TOO_SMALL, STATUS_END_OF_FILE,
    STATUS_FILE_INVALID, STATUS_FILE_IS_A_DIRECTORY, STATUS_INVALID_HANDLE,
    STATUS_INVALID_PARAMETER, STATUS_IO_DEVICE_ERROR, STATUS_MEDIA_WRITE_PROTECTED,
    STATUS_NOT_A_DIRECTORY, STATUS_NO_EAS_ON_FILE, STATUS_OBJECT_NAME_INVALID,
    STATUS_OBJECT_NAME_NOT_FOUND, STATUS_OBJECT_PATH_NOT_FOUND,
};

/// What a request of the WinFsp front end can fail with.
#[derive(Debug, Error)]
pub enum WinError {
    /// The core filesystem's answer.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A WinFsp file name that names nothing under SOURCE ([`crate::path`]).
    #[error("invalid file name {0:?}")]
    InvalidName(String),
    /// A directory was asked for (`FILE_DIRECTORY_FILE`, a listing) and this is a file.
    #[error("not a directory")]
    NotDirectory,
    /// A read at or past the end of the file (WinFsp wants a status, not 0 bytes).
    #[error("read at or past the end of the file")]
    EndOfFile,
}

/// The `NTSTATUS` WinFsp returns to the application for `err`.
pub fn ntstatus(err: &WinError) -> NTSTATUS {
    match err {
        WinError::Fs(e) => fs_status(e),
        WinError::InvalidName(_) => STATUS_OBJECT_NAME_INVALID,
        WinError::NotDirectory => STATUS_NOT_A_DIRECTORY,
        WinError::EndOfFile => STATUS_END_OF_FILE,
    }
}

fn fs_status(err: &FsError) -> NTSTATUS {
    match err {
        FsError::NotFound => STATUS_OBJECT_NAME_NOT_FOUND,
        FsError::Stale => STATUS_FILE_INVALID,
        FsError::IsDirectory => STATUS_FILE_IS_A_DIRECTORY,
        FsError::Denied(_) | FsError::Refused(_) => STATUS_ACCESS_DENIED,
        FsError::ReadOnly => STATUS_MEDIA_WRITE_PROTECTED,
        FsError::BadHandle => STATUS_INVALID_HANDLE,
        FsError::NoAttribute => STATUS_NO_EAS_ON_FILE,
        FsError::TooSmall => STATUS_BUFFER_TOO_SMALL,
        FsError::Control(_) => STATUS_INVALID_PARAMETER,
        FsError::Io { source, .. }
        | FsError::ModelOpen(OpenError::Source(SourceError::Open { source, .. })) => {
            io_status(source)
        }
        // Replaced between the requester's open and the store's.
        FsError::ModelOpen(OpenError::Source(SourceError::Changed { .. })) => STATUS_FILE_INVALID,
        FsError::ModelOpen(_) | FsError::Read(_) | FsError::ModeConflict => STATUS_IO_DEVICE_ERROR,
    }
}

/// Source I/O errors by kind, the same on every platform (so the mapping is testable here).
fn io_status(err: &io::Error) -> NTSTATUS {
    match err.kind() {
        io::ErrorKind::NotFound => STATUS_OBJECT_NAME_NOT_FOUND,
        io::ErrorKind::NotADirectory => STATUS_OBJECT_PATH_NOT_FOUND,
        io::ErrorKind::IsADirectory => STATUS_FILE_IS_A_DIRECTORY,
        io::ErrorKind::PermissionDenied => STATUS_ACCESS_DENIED,
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidFilename => STATUS_OBJECT_NAME_INVALID,
        _ => STATUS_IO_DEVICE_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use tierfs_core::models::ReadError;

    #[test]
    fn errors_map_like_the_fuse_adapters_errnos() {
        let fs = |e: FsError| WinError::Fs(e);
        let open = |kind: io::ErrorKind| {
            fs(FsError::ModelOpen(OpenError::Source(SourceError::Open {
                path: PathBuf::from("m.safetensors"),
                source: kind.into(),
            })))
        };
        let read = fs(FsError::Read(ReadError::Source(SourceError::Read {
            path: PathBuf::from("m.safetensors"),
            offset: 0,
            source: io::Error::other("disk gone"),
        })));
        let changed = fs(FsError::ModelOpen(OpenError::Source(
            SourceError::Changed {
                path: PathBuf::from("m.safetensors"),
            },
        )));
        let io = |kind: io::ErrorKind| fs(FsError::io("stat")(kind.into()));
        for (err, want) in [
            (fs(FsError::NotFound), STATUS_OBJECT_NAME_NOT_FOUND),
            (fs(FsError::ReadOnly), STATUS_MEDIA_WRITE_PROTECTED),
            (fs(FsError::Stale), STATUS_FILE_INVALID),
            (fs(FsError::IsDirectory), STATUS_FILE_IS_A_DIRECTORY),
            (fs(FsError::Denied("x")), STATUS_ACCESS_DENIED),
            (fs(FsError::BadHandle), STATUS_INVALID_HANDLE),
            (fs(FsError::Control("bad".into())), STATUS_INVALID_PARAMETER),
            (WinError::EndOfFile, STATUS_END_OF_FILE),
            (WinError::NotDirectory, STATUS_NOT_A_DIRECTORY),
            (
                WinError::InvalidName("a:b".into()),
                STATUS_OBJECT_NAME_INVALID,
            ),
            (open(io::ErrorKind::NotFound), STATUS_OBJECT_NAME_NOT_FOUND),
            (open(io::ErrorKind::PermissionDenied), STATUS_ACCESS_DENIED),
            (changed, STATUS_FILE_INVALID),
            (read, STATUS_IO_DEVICE_ERROR),
            (io(io::ErrorKind::NotFound), STATUS_OBJECT_NAME_NOT_FOUND),
            (io(io::ErrorKind::Other), STATUS_IO_DEVICE_ERROR),
        ] {
            assert_eq!(ntstatus(&err), want, "{err}");
        }
    }
}
