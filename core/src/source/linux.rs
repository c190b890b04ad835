//! The Linux side of [`super`]: `O_DIRECT`, `posix_fadvise`, anonymous `mmap` chunk memory and
//! identity from `stat`. See the parent module for why each is used.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use memmap2::MmapMut;

use super::SourceIdentity;

/// Chunk memory: one anonymous mapping, unmapped (its pages returned at once) when dropped.
pub(super) struct ChunkMemory(MmapMut);

impl ChunkMemory {
    pub(super) fn new(len: usize) -> io::Result<Self> {
        MmapMut::map_anon(len).map(ChunkMemory)
    }
}

impl std::ops::Deref for ChunkMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for ChunkMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

pub(super) fn identity_of_metadata(meta: &Metadata) -> SourceIdentity {
    let ns = |secs: i64, nsecs: i64| i128::from(secs) * 1_000_000_000 + i128::from(nsecs);
    SourceIdentity {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
        ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
    }
}

pub(super) fn identity(file: &File) -> io::Result<SourceIdentity> {
    file.metadata().map(|meta| identity_of_metadata(&meta))
}

pub(super) fn identity_of_path(path: &Path) -> io::Result<SourceIdentity> {
    std::fs::metadata(path).map(|meta| identity_of_metadata(&meta))
}

/// The identity of directory `path`, opened for reading (which a listing needs).
pub(super) fn identity_of_dir(path: &Path) -> io::Result<SourceIdentity> {
    identity(&File::open(path)?)
}

/// The wall-clock time of a [`SourceIdentity`]'s `mtime_ns`/`ctime_ns`, which count from the
/// Unix epoch.
pub(super) fn system_time(ns: i128) -> Option<std::time::SystemTime> {
    let ns = u64::try_from(ns).ok()?;
    std::time::SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::from_nanos(ns))
}

/// Advises random access on a source descriptor: the cache reads whole chunks itself, kernel
/// readahead on top of that would only put more pages in the page cache. Advice failing is
/// harmless.
pub(super) fn advise_random(file: &File) {
    fadvise(file, 0, 0, libc::POSIX_FADV_RANDOM);
}

/// `statfs` magic numbers of the file systems whose files live in RAM (`linux/magic.h`).
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Whether `file` lives on a file system held in RAM (tmpfs, ramfs): its pages are the file
/// itself, always resident, and no advice gives them back. Unknown (the call failed): no.
// `f_type`'s integer type differs between architectures.
#[allow(clippy::unnecessary_cast)]
pub(super) fn is_in_ram(file: &File) -> bool {
    rustix::fs::fstatfs(file).is_ok_and(|s| matches!(s.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC))
}

/// Opens `path` with `O_DIRECT` (also what cuFile requires of the descriptors it registers).
pub fn open_direct(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// The `O_DIRECT` twin of `open`, the very file it is (through its `/proc/self/fd` link: no
/// path is resolved again, so nothing swapped in SOURCE meanwhile is met); by `path`, checked
/// to be version `identity`, where `/proc` is missing. `None` where it cannot be opened.
pub(super) fn reopen_direct(open: &File, path: &Path, identity: &SourceIdentity) -> Option<File> {
    let own = format!("/proc/self/fd/{}", open.as_raw_fd());
    match open_direct(Path::new(&own)) {
        Ok(direct) => Some(direct),
        Err(e) if e.kind() == io::ErrorKind::NotFound => super::open_direct_twin(path, identity),
        Err(_) => None,
    }
}

/// The path the kernel holds for open file `file`.
pub(super) fn canonical_path(file: &File) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

pub(super) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    FileExt::read_at(file, buf, offset)
}

/// Whether a direct read failed because the filesystem refuses `O_DIRECT` (`EINVAL`: tmpfs,
/// some network and FUSE filesystems).
pub(super) fn refuses_direct_io(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EINVAL)
}

/// Drops `[offset, offset + len)` of `file` from the page cache.
pub(super) fn drop_cached(file: &File, offset: u64, len: u64) {
    fadvise(file, offset, len, libc::POSIX_FADV_DONTNEED);
}

fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is owned by `file`.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), offset, len, advice);
    }
}
