//! The disk tier's file operations that differ by platform: writing a chunk without leaving it
//! in the page cache, giving a dropped chunk's space back, reading a chunk back bypassing the
//! page cache.
//!
//! **Contract.** [`write_chunk`] returns once the bytes reached the device's queue (written
//! back, not only buffered) and the page cache no longer holds them; [`punch`] frees the whole
//! pages inside a range (the pages at its edges may hold a neighbour's bytes) where the file
//! system can, and is a no-op elsewhere; [`read_chunk`] returns exactly `[start, end)` or an
//! error, `O_DIRECT` where the file system takes it (`direct` given), buffered otherwise.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::source::{read_direct, read_full_at, AlignedBytes, DIRECT_IO_ALIGN};

/// Writes `bytes` at `offset` of `file`, waits for their write-back and drops them from the
/// page cache: the tier's copy must not be a second copy in RAM.
pub(super) fn write_chunk(file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
    write_all_at(file, bytes, offset)?;
    settle(file, offset, bytes.len() as u64)
}

#[cfg(unix)]
fn write_all_at(file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, offset)
}

#[cfg(windows)]
fn write_all_at(file: &File, mut bytes: &[u8], mut offset: u64) -> io::Result<()> {
    while !bytes.is_empty() {
        let n = std::os::windows::fs::FileExt::seek_write(file, bytes, offset)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n..];
        offset += n as u64;
    }
    Ok(())
}

#[cfg(target_os = "linux")]
fn settle(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    let (off, n) = (to_off(offset)?, to_off(len)?);
    // SAFETY: a plain system call on a descriptor this function borrows; no memory is passed.
    if unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), off, n, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}

#[cfg(windows)]
fn settle(file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    file.sync_data()
}

#[cfg(target_os = "linux")]
fn to_off(x: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(x).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Frees the whole pages of `[start, end)` in `file`, keeping its size. Errors are ignored: a
/// file system without hole punching keeps the bytes, which are no longer counted or served.
pub(super) fn punch(file: &File, start: u64, end: u64) {
    let from = start.next_multiple_of(DIRECT_IO_ALIGN);
    let to = end - end % DIRECT_IO_ALIGN;
    if from < to {
        punch_pages(file, from, to);
    }
}

#[cfg(target_os = "linux")]
fn punch_pages(file: &File, from: u64, to: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (to_off(from), to_off(to - from)) else {
        return;
    };
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: a plain system call on a borrowed descriptor; no memory is passed.
    if unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) } != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "the disk tier cannot punch holes here");
    }
}

#[cfg(windows)]
fn punch_pages(_file: &File, _from: u64, _to: u64) {}

/// Opens `path` for `O_DIRECT` reads (`None` where the file system refuses it).
pub(super) fn open_direct(path: &Path) -> Option<File> {
    crate::source::open_direct(path).ok()
}

/// Exactly `[start, end)` of the data file: through `direct` (`O_DIRECT`, whole pages) while
/// `direct_works`, else buffered through `file`, whose pages are dropped afterwards.
pub(super) fn read_chunk(
    (file, direct, direct_works): (&File, Option<&File>, &AtomicBool),
    path: &Path,
    start: u64,
    end: u64,
) -> io::Result<AlignedBytes> {
    let mut bytes = AlignedBytes::for_range(start, end)?;
    let base = start - start % DIRECT_IO_ALIGN;
    let needed = (end - base) as usize;
    let mut filled = 0;
    if let Some(direct) = direct.filter(|_| direct_works.load(std::sync::atomic::Ordering::Relaxed))
    {
        filled = read_direct(direct, direct_works, path, bytes.whole_pages_mut(), base)
            .map_err(|(_, e)| e)?;
    }
    let skip = (start - base) as usize;
    if filled < needed {
        let from = filled.max(skip);
        let buf = &mut bytes.whole_pages_mut()[from..needed];
        let got = read_full_at(file, buf, base + from as u64).map_err(|(_, e)| e)?;
        drop_cached(file, base + from as u64, got as u64);
        filled = from + got;
    }
    if filled < needed {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the disk tier's file ends at {}", base + filled as u64),
        ));
    }
    Ok(bytes)
}

#[cfg(target_os = "linux")]
fn drop_cached(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    if let (Ok(off), Ok(n)) = (to_off(offset), to_off(len)) {
        // SAFETY: a plain system call on a borrowed descriptor; no memory is passed.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), off, n, libc::POSIX_FADV_DONTNEED) };
    }
}

#[cfg(windows)]
fn drop_cached(_file: &File, _offset: u64, _len: u64) {}
