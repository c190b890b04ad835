//! Every error of the WinFsp front end, and the one place it becomes an `NTSTATUS`.
//!
//! The mapping mirrors the FUSE adapter's errnos: a missing file is `ENOENT` there and
//! `STATUS_OBJECT_NAME_NOT_FOUND` here; a failed source read is `EIO` there and
//! `STATUS_IO_DEVICE_ERROR` here (for that read only); writes are `EROFS` there and
//! `STATUS_MEDIA_WRITE_PROTECTED` here; a refused control command is `EINVAL` there and
//! `STATUS_INVALID_PARAMETER` here.

use std::io;

use thiserror::Error;
use tierfs_core::control::ControlError;
use tierfs_core::models::{OpenError, ReadError};
use tierfs_core::source::SourceError;
use windows_sys::Win32::Foundation::{
    NTSTATUS, STATUS_ACCESS_DENIED, STATUS_END_OF_FILE, STATUS_FILE_IS_A_DIRECTORY,
    STATUS_INVALID_PARAMETER, STATUS_IO_DEVICE_ERROR, STATUS_MEDIA_WRITE_PROTECTED,
    STATUS_NOT_A_DIRECTORY, STATUS_OBJECT_NAME_INVALID, STATUS_OBJECT_NAME_NOT_FOUND,
    STATUS_OBJECT_PATH_NOT_FOUND,
};

/// What a request of the WinFsp front end can fail with.
#[derive(Debug, Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("is a directory")]
    IsDirectory,
    #[error("not a directory")]
    NotDirectory,
    #[error("tierfs mounts are read-only (only .tierfs\\control takes writes)")]
    ReadOnly,
    #[error("access denied")]
    AccessDenied,
    #[error("invalid file name {0:?}")]
    InvalidName(String),
    #[error("read at or past the end of the file")]
    EndOfFile,
    #[error("control command refused: {0}")]
    Control(#[from] ControlError),
    #[error("cannot open a model file: {0}")]
    Open(#[from] OpenError),
    #[error("cannot read a model file: {0}")]
    Read(#[from] ReadError),
    #[error("source I/O failed: {0}")]
    Io(#[from] io::Error),
}

/// The `NTSTATUS` WinFsp returns to the application for `err`.
pub fn ntstatus(err: &FsError) -> NTSTATUS {
    match err {
        FsError::NotFound => STATUS_OBJECT_NAME_NOT_FOUND,
        FsError::IsDirectory => STATUS_FILE_IS_A_DIRECTORY,
        FsError::NotDirectory => STATUS_NOT_A_DIRECTORY,
        FsError::ReadOnly => STATUS_MEDIA_WRITE_PROTECTED,
        FsError::AccessDenied => STATUS_ACCESS_DENIED,
        FsError::InvalidName(_) => STATUS_OBJECT_NAME_INVALID,
        FsError::EndOfFile => STATUS_END_OF_FILE,
        FsError::Control(_) => STATUS_INVALID_PARAMETER,
        FsError::Open(OpenError::Source(SourceError::Open { source, .. }))
        | FsError::Io(source) => io_status(source),
        FsError::Open(_) | FsError::Read(_) => STATUS_IO_DEVICE_ERROR,
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

    #[test]
    fn errors_map_like_the_fuse_adapters_errnos() {
        let open = |kind: io::ErrorKind| {
            FsError::Open(OpenError::Source(SourceError::Open {
                path: PathBuf::from("m.safetensors"),
                source: kind.into(),
            }))
        };
        let read = FsError::Read(ReadError::Source(SourceError::Read {
            path: PathBuf::from("m.safetensors"),
            offset: 0,
            source: io::Error::other("disk gone"),
        }));
        let control = FsError::Control(tierfs_core::control::parse(b"dorp").unwrap_err());
        for (err, want) in [
            (FsError::NotFound, STATUS_OBJECT_NAME_NOT_FOUND),
            (FsError::ReadOnly, STATUS_MEDIA_WRITE_PROTECTED),
            (FsError::EndOfFile, STATUS_END_OF_FILE),
            (open(io::ErrorKind::NotFound), STATUS_OBJECT_NAME_NOT_FOUND),
            (open(io::ErrorKind::PermissionDenied), STATUS_ACCESS_DENIED),
            (read, STATUS_IO_DEVICE_ERROR),
            (control, STATUS_INVALID_PARAMETER),
            (FsError::Io(io::Error::other("x")), STATUS_IO_DEVICE_ERROR),
        ] {
            assert_eq!(ntstatus(&err), want, "{err}");
        }
    }
}
