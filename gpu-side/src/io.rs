//! Reading chunks of the source file into staging buffers, and asking the kernel how much of it
//! is in the page cache.
//!
//! # Direct or buffered
//!
//! A cold file is read with `O_DIRECT`: the bytes go from the disk into the (page-aligned) staging
//! buffer with no copy through the page cache, and the page cache does not fill up with a model
//! that is about to live in GPU memory. A file that is already in the page cache (a second load,
//! or one the tierfs mount has just streamed) is read with plain `pread`, which copies from RAM:
//! `O_DIRECT` would ignore the cached pages and read the disk again. [`ReadMode`] is chosen per
//! load from [`resident_fraction`].
//!
//! Where the filesystem refuses `O_DIRECT` (tmpfs, some network and FUSE filesystems), the reader
//! switches to buffered reads for the rest of the load, as `tierfs_core::source` does. This
//! module does not reuse `tierfs_core::source::SourceFile`: that type reads into buffers it
//! allocates itself and drops the page cache after buffered reads, and here the buffers are the
//! pipeline's pinned staging buffers and a warm page cache is welcome.
//!
//! # Residency
//!
//! `cachestat(2)` (Linux ≥ 6.5) counts the cached pages of a range without touching them; older
//! kernels fall back to `mincore(2)` on a read-only mapping of the range, which does not fault
//! pages in either.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use tierfs_core::source::{self, SourceIdentity};

/// Page-cache residency from which a load reads buffered instead of `O_DIRECT`: above half, most
/// of the bytes come from RAM at memory speed, and the rest costs what it would cost anyway.
pub const WARM_FRACTION: f64 = 0.5;

/// How chunks are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadMode {
    /// `O_DIRECT` (falling back to buffered where refused).
    Direct,
    /// Plain `pread` through the page cache.
    Buffered,
}

/// A failure reading the source file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot read {path} at offset {offset}: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        source: io::Error,
    },
    #[error("{path} ends at byte {got_end}, before the tensor data it declares (up to {wanted_end}): truncated or changed while loading")]
    Truncated {
        path: PathBuf,
        wanted_end: u64,
        got_end: u64,
    },
}

/// One open source file, with an `O_DIRECT` twin where the filesystem allows it.
#[derive(Debug)]
pub struct SourceReader {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    direct_works: AtomicBool,
}

impl SourceReader {
    /// Opens `path` for reading.
    pub fn open(path: &Path) -> Result<SourceReader, ReadError> {
        let open_err = |source| ReadError::Open {
            path: path.to_owned(),
            source,
        };
        let buffered = File::open(path).map_err(open_err)?;
        let meta = buffered.metadata().map_err(open_err)?;
        let direct = source::open_direct_twin(path, &SourceIdentity::of(&meta));
        Ok(SourceReader {
            path: path.to_owned(),
            direct_works: AtomicBool::new(direct.is_some()),
            buffered,
            direct,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plain descriptor (for the index, residency and advice).
    pub fn file(&self) -> &File {
        &self.buffered
    }

    /// Whether `O_DIRECT` reads are (still) possible on this file.
    pub fn direct_works(&self) -> bool {
        self.direct_works.load(Ordering::Relaxed)
    }

    /// Reads into `buf` from `offset` until it is full or the file ends; returns the bytes read.
    /// With [`ReadMode::Direct`], `offset`, `buf.len()` and `buf`'s address must be multiples of
    /// [`IO_ALIGN`](crate::plan::IO_ALIGN) (staging buffers and chunks are).
    pub fn read_into(
        &self,
        buf: &mut [u8],
        offset: u64,
        mode: ReadMode,
    ) -> Result<usize, ReadError> {
        let mut filled = 0;
        if mode == ReadMode::Direct && self.direct_works() {
            filled = self.fill_direct(buf, offset)?;
        }
        if filled < buf.len() {
            filled += self.fill_buffered(&mut buf[filled..], offset + filled as u64)?;
        }
        Ok(filled)
    }

    /// Like [`Self::read_into`], but fewer than `needed` bytes is an error.
    pub fn read_at_least(
        &self,
        buf: &mut [u8],
        offset: u64,
        needed: u64,
        mode: ReadMode,
    ) -> Result<usize, ReadError> {
        let got = self.read_into(buf, offset, mode)?;
        if (got as u64) < needed {
            return Err(ReadError::Truncated {
                path: self.path.clone(),
                wanted_end: offset + needed,
                got_end: offset + got as u64,
            });
        }
        Ok(got)
    }

    /// `O_DIRECT` reads until `buf` is full, the file ends, or the kernel refuses (direct I/O is
    /// then switched off and the caller completes the read buffered); see
    /// [`tierfs_core::source::read_direct`].
    fn fill_direct(&self, buf: &mut [u8], offset: u64) -> Result<usize, ReadError> {
        let Some(direct) = &self.direct else {
            return Ok(0);
        };
        source::read_direct(direct, &self.direct_works, &self.path, buf, offset)
            .map_err(|(filled, source)| self.read_error(offset + filled as u64, source))
    }

    fn fill_buffered(&self, buf: &mut [u8], offset: u64) -> Result<usize, ReadError> {
        source::read_full_at(&self.buffered, buf, offset)
            .map_err(|(filled, source)| self.read_error(offset + filled as u64, source))
    }

    fn read_error(&self, offset: u64, source: io::Error) -> ReadError {
        ReadError::Read {
            path: self.path.clone(),
            offset,
            source,
        }
    }
}

/// Fraction of `[start, end)` of `file` in the page cache, or `None` if the kernel cannot say.
pub fn resident_fraction(file: &File, start: u64, end: u64) -> Option<f64> {
    if end <= start {
        return Some(1.0);
    }
    let pages = cachestat_pages(file, start, end).or_else(|| mincore_pages(file, start, end))?;
    let total = (end - start).div_ceil(page_size());
    Some((pages as f64 / total as f64).min(1.0))
}

/// `cachestat(2)`: cached pages of the range.
fn cachestat_pages(file: &File, start: u64, end: u64) -> Option<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    /// The syscall number on x86-64 and aarch64 alike (Linux 6.5).
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range {
        off: start,
        len: end - start,
    };
    let mut stat = Stat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both valid for the call; the descriptor
    // is owned by `file`.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0u32,
        )
    };
    (rc == 0).then_some(stat.nr_cache)
}

/// `mincore(2)` over a read-only mapping of the range (mapping does not fault pages in).
fn mincore_pages(file: &File, start: u64, end: u64) -> Option<u64> {
    let page = page_size();
    let base = start - start % page;
    let len = usize::try_from(end - base).ok()?;
    // SAFETY: the mapping is read-only and never dereferenced, only passed to mincore; a file
    // changing under it cannot affect us.
    let map = unsafe { memmap2::MmapOptions::new().offset(base).len(len).map(file) }.ok()?;
    let mut vec = vec![0u8; len.div_ceil(page as usize)];
    // SAFETY: `map` is a live mapping of `len` bytes and `vec` has one byte per page of it.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    (rc == 0).then(|| vec.iter().filter(|&&b| b & 1 != 0).count() as u64)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096).max(1)
}

/// Asks the kernel to drop `file`'s cached pages, so the next load is cold: writes dirty pages
/// back first (they cannot be dropped otherwise), then `POSIX_FADV_DONTNEED`. Needs no
/// privileges; pages someone has mapped stay. Returns whether the kernel accepted.
pub fn evict(file: &File) -> bool {
    // Failure to flush only leaves those pages cached.
    let _ = file.sync_data();
    // SAFETY: posix_fadvise only reads its integer arguments.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{pseudo_random, temp_file};
    use memmap2::MmapMut;
    use std::os::unix::fs::FileExt;

    fn aligned(len: usize) -> MmapMut {
        MmapMut::map_anon(len).unwrap()
    }

    #[test]
    fn direct_and_buffered_reads_return_the_same_bytes_and_stop_at_eof() {
        let data = pseudo_random(3 * 4096 + 1000, 1);
        let f = temp_file(&data);
        let reader = SourceReader::open(f.path()).unwrap();
        for mode in [ReadMode::Direct, ReadMode::Buffered] {
            let mut buf = aligned(8 * 4096);
            let got = reader.read_into(&mut buf[..], 4096, mode).unwrap();
            assert_eq!(got, data.len() - 4096, "{mode:?}");
            assert_eq!(&buf[..got], &data[4096..], "{mode:?}");
        }
    }

    #[test]
    fn too_few_bytes_is_a_truncation_error() {
        let f = temp_file(&pseudo_random(5000, 2));
        let reader = SourceReader::open(f.path()).unwrap();
        let mut buf = aligned(8192);
        let err = reader
            .read_at_least(&mut buf[..], 4096, 4096, ReadMode::Direct)
            .unwrap_err();
        assert!(
            matches!(
                err,
                ReadError::Truncated {
                    wanted_end: 8192,
                    got_end: 5000,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_refused_direct_read_falls_back_to_buffered() {
        // O_DIRECT into a misaligned buffer fails with EINVAL, as on filesystems that refuse
        // direct I/O: the reader must finish the read buffered and stop trying O_DIRECT.
        let data = pseudo_random(10_000, 3);
        let f = temp_file(&data);
        let reader = SourceReader::open(f.path()).unwrap();
        assert!(
            reader.direct_works(),
            "ext4-like temp dir expected to allow O_DIRECT"
        );
        let mut buf = aligned(16384 + 1);
        let got = reader
            .read_into(&mut buf[1..16385], 0, ReadMode::Direct)
            .unwrap();
        assert_eq!(&buf[1..1 + got], &data[..]);
        assert!(!reader.direct_works(), "EINVAL must switch direct I/O off");
    }

    #[test]
    fn residency_reports_a_file_just_read_as_cached() {
        let data = pseudo_random(64 * 4096, 4);
        let f = temp_file(&data);
        let file = File::open(f.path()).unwrap();
        let mut sink = vec![0u8; data.len()];
        file.read_exact_at(&mut sink, 0).unwrap();
        let len = data.len() as u64;
        assert_eq!(resident_fraction(&file, 0, len), Some(1.0));
        assert_eq!(mincore_pages(&file, 0, len), Some(64), "mincore agrees");
        assert_eq!(resident_fraction(&file, 10, 10), Some(1.0), "empty range");
    }

    #[test]
    fn evicting_a_clean_file_makes_it_cold() {
        let f = temp_file(&pseudo_random(64 * 4096, 5));
        let file = File::open(f.path()).unwrap();
        assert!(evict(&file));
        let cached = resident_fraction(&file, 0, 64 * 4096).unwrap();
        assert!(
            cached < WARM_FRACTION,
            "still {cached} resident after DONTNEED"
        );
    }
}
