//! The Windows side of [`super`].
//!
//! - **Bypassing the system cache**: the direct twin is opened with `FILE_FLAG_NO_BUFFERING`,
//!   which, like `O_DIRECT`, wants sector-aligned offsets, lengths and buffer addresses.
//!   [`super::DIRECT_IO_ALIGN`] (4 KiB) is a multiple of both 512-byte and 4 KiB sectors, and
//!   chunk memory is page-aligned. A volume that refuses the read (`ERROR_INVALID_PARAMETER`: a
//!   larger sector size, or a redirector that does not support the flag) switches the file to
//!   buffered reads, as `EINVAL` does on Linux.
//! - **Buffered reads** (the fallback, and bytes served but not cached) go through the system
//!   cache, and Windows has no per-range equivalent of `POSIX_FADV_DONTNEED`: the cache manager
//!   ages those pages onto the standby list, which the memory manager reclaims under pressure.
//!   `FILE_FLAG_RANDOM_ACCESS` is deliberately not set: it makes the cache manager keep views
//!   mapped longer, the opposite of what tierfs wants.
//! - **Chunk memory** is `VirtualAlloc(MEM_RESERVE | MEM_COMMIT)` and `VirtualFree(MEM_RELEASE)`:
//!   commit charge and working set are taken when a chunk is read and given back the moment it
//!   is dropped, so both follow the cache budget (the heap would keep freed blocks committed).
//! - **Identity** is `GetFileInformationByHandle`: volume serial number, file index, size,
//!   last-write and creation time (see [`super::SourceIdentity`]).

use std::ffi::c_void;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::windows::fs::{FileExt, OpenOptionsExt};
use std::os::windows::io::AsRawHandle;
use std::path::Path;
use std::ptr::NonNull;

use windows_sys::Win32::Foundation::{ERROR_INVALID_PARAMETER, FILETIME};
use windows_sys::Win32::Storage::FileSystem::{
    GetFileInformationByHandle, BY_HANDLE_FILE_INFORMATION, FILE_FLAG_NO_BUFFERING,
};
use windows_sys::Win32::System::Memory::{
    VirtualAlloc, VirtualFree, MEM_COMMIT, MEM_RELEASE, MEM_RESERVE, PAGE_READWRITE,
};

use super::SourceIdentity;

/// Chunk memory: one committed `VirtualAlloc` region, released when dropped.
pub(super) struct ChunkMemory {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is owned by this value alone (like a `Vec<u8>`'s buffer); shared access
// only reads it.
unsafe impl Send for ChunkMemory {}
// SAFETY: as above; `&ChunkMemory` only hands out `&[u8]`.
unsafe impl Sync for ChunkMemory {}

impl ChunkMemory {
    pub(super) fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh allocation at an address of the system's choosing; no pointer is read.
        let base = unsafe {
            VirtualAlloc(
                std::ptr::null(),
                len,
                MEM_RESERVE | MEM_COMMIT,
                PAGE_READWRITE,
            )
        };
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        Ok(ChunkMemory { base, len })
    }
}

impl std::ops::Deref for ChunkMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` committed (zero-filled, so initialised) bytes live at `base` until drop.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for ChunkMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

impl Drop for ChunkMemory {
    fn drop(&mut self) {
        // SAFETY: `base` came from `VirtualAlloc` and no slice of it outlives `self`.
        let released = unsafe { VirtualFree(self.base.as_ptr().cast::<c_void>(), 0, MEM_RELEASE) };
        if released == 0 {
            tracing::warn!(
                len = self.len,
                error = %io::Error::last_os_error(),
                "VirtualFree of a chunk buffer failed"
            );
        }
    }
}

/// Nanoseconds since 1601 of a `FILETIME` (100 ns ticks).
fn filetime_ns(t: FILETIME) -> i128 {
    let ticks = (u64::from(t.dwHighDateTime) << 32) | u64::from(t.dwLowDateTime);
    i128::from(ticks) * 100
}

pub(super) fn identity(file: &File) -> io::Result<SourceIdentity> {
    // SAFETY: an all-zero BY_HANDLE_FILE_INFORMATION is a valid value (plain integers).
    let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is owned by `file` and stays open for the call; `info` is writable.
    if unsafe { GetFileInformationByHandle(file.as_raw_handle(), &mut info) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |high: u32, low: u32| (u64::from(high) << 32) | u64::from(low);
    Ok(SourceIdentity {
        dev: u64::from(info.dwVolumeSerialNumber),
        ino: join(info.nFileIndexHigh, info.nFileIndexLow),
        size: join(info.nFileSizeHigh, info.nFileSizeLow),
        mtime_ns: filetime_ns(info.ftLastWriteTime),
        ctime_ns: filetime_ns(info.ftCreationTime),
    })
}

pub(super) fn identity_of_path(path: &Path) -> io::Result<SourceIdentity> {
    identity(&File::open(path)?)
}

/// The identity of directory `path`, opened for listing (a directory handle needs
/// `FILE_FLAG_BACKUP_SEMANTICS`).
pub(super) fn identity_of_dir(path: &Path) -> io::Result<SourceIdentity> {
    const FILE_FLAG_BACKUP_SEMANTICS: u32 = 0x0200_0000;
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)?;
    identity(&dir)
}

/// The wall-clock time of a [`SourceIdentity`]'s `mtime_ns`/`ctime_ns`, which count from
/// 1601-01-01 (`FILETIME`), 11 644 473 600 s before the Unix epoch.
pub(super) fn system_time(ns: i128) -> Option<std::time::SystemTime> {
    let since_unix_epoch = ns.checked_sub(11_644_473_600 * 1_000_000_000)?;
    let since_unix_epoch = u64::try_from(since_unix_epoch).ok()?;
    std::time::SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::from_nanos(since_unix_epoch))
}

/// Not read from the handle on Windows: the caller canonicalizes the path.
pub(super) fn canonical_path(_file: &File) -> io::Result<std::path::PathBuf> {
    Err(io::ErrorKind::Unsupported.into())
}

/// Nothing to advise on Windows: reads of chunk-sized ranges are what the cache does.
pub(super) fn advise_random(_file: &File) {}

/// RAM disks on Windows are block devices with a page cache of their own: no.
pub(super) fn is_in_ram(_file: &File) -> bool {
    false
}

/// The unbuffered twin of `path`'s open version `identity`, opened by path and checked to be
/// that very file (`None` where it cannot be).
pub(super) fn reopen_direct(_open: &File, path: &Path, identity: &SourceIdentity) -> Option<File> {
    super::open_direct_twin(path, identity)
}

/// Opens `path` with `FILE_FLAG_NO_BUFFERING`: reads bypass the system cache.
pub fn open_direct(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(FILE_FLAG_NO_BUFFERING)
        .open(path)
}

/// A positional read. `seek_read` passes the offset in an `OVERLAPPED`, so concurrent calls on
/// one handle do not race (it also moves the file pointer, which nothing here uses).
pub(super) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    file.seek_read(buf, offset)
}

/// Whether a direct read failed because the volume refuses unbuffered reads of this alignment.
pub(super) fn refuses_direct_io(err: &io::Error) -> bool {
    err.raw_os_error() == Some(ERROR_INVALID_PARAMETER as i32)
}

/// No per-range cache drop exists on Windows (see the module docs).
pub(super) fn drop_cached(_file: &File, _offset: u64, _len: u64) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use windows_sys::Win32::System::Memory::{VirtualQuery, MEMORY_BASIC_INFORMATION, MEM_FREE};

    fn state_at(address: *const u8) -> u32 {
        // SAFETY: VirtualQuery only writes `info`; any address may be queried.
        let mut info: MEMORY_BASIC_INFORMATION = unsafe { std::mem::zeroed() };
        let got = unsafe {
            VirtualQuery(
                address.cast::<c_void>(),
                &mut info,
                std::mem::size_of::<MEMORY_BASIC_INFORMATION>(),
            )
        };
        assert_ne!(got, 0, "VirtualQuery: {}", io::Error::last_os_error());
        info.State
    }

    #[test]
    fn chunk_memory_is_committed_and_released() {
        let mut chunk = ChunkMemory::new(3 << 20).unwrap();
        chunk[(3 << 20) - 1] = 7;
        let base = chunk.as_ptr();
        assert_eq!(base as usize % 4096, 0, "not page-aligned");
        assert_eq!(state_at(base), MEM_COMMIT);
        drop(chunk);
        assert_eq!(state_at(base), MEM_FREE);
    }

    #[test]
    fn identity_tells_files_apart_and_holds_for_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::File::create(&a)
            .unwrap()
            .write_all(b"same")
            .unwrap();
        std::fs::File::create(&b)
            .unwrap()
            .write_all(b"same")
            .unwrap();
        let id_a = identity_of_path(&a).unwrap();
        assert_eq!(id_a.size, 4);
        assert_eq!(id_a, identity(&File::open(&a).unwrap()).unwrap());
        assert_ne!(id_a.ino, identity_of_path(&b).unwrap().ino);
    }

    #[test]
    fn unbuffered_reads_return_the_file_bytes() {
        let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, &data).unwrap();
        let direct = open_direct(&path).unwrap();
        let mut buf = ChunkMemory::new(4 * 4096).unwrap();
        let got = read_at(&direct, &mut buf, 4096).unwrap();
        assert_eq!(&buf[..got], &data[4096..4096 + got]);
        assert!(got > 0);
    }
}
