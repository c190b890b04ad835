//! How much of a source file is in the page cache, and giving it back.
//!
//! Both open the file by path and check that it is still the version the tier knows
//! (device, inode, size, mtime): a file replaced since must not be measured or dropped in its
//! stead. No descriptor is kept between calls, so parked files cost the daemon none.

use std::fs::File;
use std::io;
#[cfg(target_os = "linux")]
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::source::SourceIdentity;

/// `cachestat(2)` (Linux 6.5+): the syscall number is the same on every architecture.
#[cfg(target_os = "linux")]
const SYS_CACHESTAT: libc::c_long = 451;

#[cfg(target_os = "linux")]
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

fn open_version(path: &Path, identity: &SourceIdentity) -> io::Result<File> {
    let file = File::open(path)?;
    if SourceIdentity::of_file(&file)? != *identity {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "the file changed since it was opened",
        ));
    }
    Ok(file)
}

/// Bytes of `path` (version `identity`) in the page cache.
pub fn resident_bytes(path: &Path, identity: &SourceIdentity) -> io::Result<u64> {
    let file = open_version(path, identity)?;
    cached_pages(&file).map(|pages| pages * page_size())
}

/// Resident pages of `file`, by `cachestat(2)`.
#[cfg(target_os = "linux")]
pub fn cached_pages(file: &File) -> io::Result<u64> {
    let range = CachestatRange { off: 0, len: 0 }; // len 0: to the end of the file
    let mut stat = Cachestat::default();
    // SAFETY: both pointers are to live, properly laid out structs for the duration of the call.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut stat as *mut Cachestat,
            0u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.nr_cache)
}

/// Resident pages of `file`: only Linux can tell.
#[cfg(not(target_os = "linux"))]
pub fn cached_pages(_file: &File) -> io::Result<u64> {
    Err(io::ErrorKind::Unsupported.into())
}

/// Asks the kernel to drop the clean page cache of `path` (version `identity`); returns the
/// bytes left, which pages a process still maps are (the kernel skips them).
#[cfg(target_os = "linux")]
pub fn drop_page_cache(path: &Path, identity: &SourceIdentity) -> io::Result<u64> {
    let file = open_version(path, identity)?;
    // SAFETY: plain syscall on a descriptor we own.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    cached_pages(&file).map(|pages| pages * page_size())
}

/// Only Linux has passthrough, hence parked files, at all.
#[cfg(not(target_os = "linux"))]
pub fn drop_page_cache(path: &Path, identity: &SourceIdentity) -> io::Result<u64> {
    open_version(path, identity).map(|_| 0)
}

#[cfg(unix)]
fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

#[cfg(not(unix))]
fn page_size() -> u64 {
    4096
}
