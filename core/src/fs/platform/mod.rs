//! What the filesystem needs from the operating system, in one place per platform: everything
//! else in [`super`] is platform-neutral.
//!
//! - **Access** ([`Sharing`], [`AccessRule`], [`Acting`], [`SourceRoot`],
//!   [`open_for_request`]): on Linux, [`crate::access`] (per-request credentials, `openat2`,
//!   `/proc/self/fd`). On Windows, WinFsp checks each open against the volume's security
//!   descriptor before the file system sees it, and the daemon reads SOURCE with its own
//!   rights: a single-user rule that follows links and switches nothing.
//! - **Identity of a source object** ([`object_id`], [`file_object_id`]): device and inode
//!   number from `stat` on Linux; volume serial number and file index
//!   (`GetFileInformationByHandle`) on Windows, whose `std::fs::Metadata` does not expose
//!   them on stable Rust, so the path is opened once more there (without access rights, so a
//!   file opened by another process without sharing still answers).
//! - **Attributes** ([`kind_of`], [`attr_of`]): `stat`'s fields on Linux; on Windows the
//!   portable ones (size, times), a read-only mode, and the daemon as owner.
//! - **The daemon's ids** ([`daemon_ids`]): `getuid`/`getgid`; 0 on Windows, where requests
//!   carry no uid (the control file's owner check is WinFsp's security descriptor there).
//! - **File system figures** ([`statfs`]): `statvfs`, or `GetDiskFreeSpaceExW`.
//! - **Open flags** ([`oflag`]): the `O_*` values [`TierFs::open`](super::TierFs::open)
//!   takes. Linux's own; a Windows front end builds the same values from its granted access.
//! - **Name bytes** ([`name_has_separator`], [`path_bytes`]).
//!
//! Errors: [`FsError::errno`](super::FsError::errno) (Linux) maps to errno here in core,
//! since errno is what both the kernel and the core's own tests speak. The Windows mapping to
//! `NTSTATUS` lives in the WinFsp front end (`winfs/src/status.rs`), next to the WinFsp
//! types it serves and where its tests run on every CI run (NTSTATUS values are plain
//! constants, testable on Linux): core stays free of WinFsp's vocabulary.

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;

/// Birth (creation) time in nanoseconds since the Unix epoch, 0 if the filesystem keeps none:
/// part of a source object's identity on both platforms.
fn born(meta: &std::fs::Metadata) -> u64 {
    meta.created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64)
}
