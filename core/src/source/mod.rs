//! Reading source files without filling the kernel page cache.
//!
//! **Contract.** Every byte tierfs caches is read from the source file exactly once per miss,
//! and the kernel keeps no second copy of it in its page cache ("double caching": on a machine
//! with less RAM than the model, that second copy is what pushes everything else out).
//! [`SourceFile::read_aligned`] returns exactly the bytes asked for, in page-aligned memory of
//! its own, or an error (a short read is [`SourceError::Truncated`], never a partly stale
//! buffer). A [`SourceFile`] reads one version of a file ([`SourceIdentity`]). The locks here
//! are leaves: the spare buffers' (through [`crate::sync::lock_static`]) and a file's
//! successor's ([`SourceFile::current`]).
//!
//! Reads of a mount's files go through [`slot::SourceSlot`], whose reads are bounded in time
//! and retried by [`deadline::SourceIo`] (transient errors: [`retry`]): a source that stops
//! answering gives an error within `--source-timeout`, never a hang.
//!
//! The platform parts live in `linux.rs` (`O_DIRECT`, `posix_fadvise`, anonymous `mmap`) and
//! `windows.rs` (`FILE_FLAG_NO_BUFFERING`, `VirtualAlloc`); this file holds what both share: the
//! aligned read with its buffered fallback, and the error type. What follows
//! names the Linux calls; `windows.rs` says what differs there.
//!
//! **Aligned reads.** Chunk reads use `O_DIRECT` into page-aligned anonymous memory, which also
//! makes them zero-copy. Where the source filesystem refuses `O_DIRECT` (tmpfs, some network and
//! FUSE filesystems), reads fall back to buffered `pread` followed by `posix_fadvise(DONTNEED)` on
//! the range just read, so the page cache holds at most the chunks in flight.
//!
//! Chunk buffers and the spare mappings kept for reuse are in `buffers.rs` ([`AlignedBytes`]).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::sync::RwLock;

use thiserror::Error;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as platform;
#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as platform;
#[cfg(not(any(target_os = "linux", windows)))]
compile_error!("tierfs-core reads sources on Linux and Windows only");

mod boundary;
mod buffers;
pub mod deadline;
mod identity;
pub mod kind;
#[cfg(target_os = "linux")]
pub mod limits;
pub mod meter;
mod opened;
pub mod pattern;
pub mod retry;
pub mod slot;

use buffers::{align_down, map_buffer};
pub use buffers::{
    aligned_footprint, release_spare_buffers, set_spare_buffers_config, AlignedBytes,
    SpareBuffersConfig,
};
pub use identity::{PathAccess, PlainPaths, SourceIdentity};
use meter::{SourceMeter, SourceMeters};
pub use opened::{Opened, RemoteFile};
pub use platform::open_direct;

/// Alignment of `O_DIRECT` offsets, lengths and buffers. 4 KiB satisfies both 512-byte and
/// 4 KiB logical-sector devices, and is also what cuFile wants; anonymous mappings are always
/// page-aligned, so buffers need no extra care.
pub const DIRECT_IO_ALIGN: u64 = 4096;

/// A failure reading a source file.
#[derive(Debug, Error)]
pub enum SourceError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot read {path} at offset {offset}: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        source: io::Error,
    },
    #[error("{path} is shorter than expected: wanted bytes up to {wanted_end}, got up to {got_end} (file truncated while mounted?)")]
    Truncated {
        path: PathBuf,
        wanted_end: u64,
        got_end: u64,
    },
    #[error("{path} is no longer the version tierfs indexed (replaced or rewritten in SOURCE)")]
    Changed { path: PathBuf },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
    /// A read of a remote source failed after its client's own retries ([`RemoteFile`]): the
    /// error is final, never tried again here.
    #[error("cannot read {path} at offset {offset}: {source}")]
    Remote {
        path: PathBuf,
        offset: u64,
        source: io::Error,
    },
    #[error("cannot allocate a {len}-byte buffer: {source}")]
    Alloc { len: usize, source: io::Error },
    /// The source did not answer within the deadline ([`deadline`]).
    #[error("reading {path} at offset {offset} timed out after {after:?}: the source does not answer (--source-timeout)")]
    TimedOut {
        path: PathBuf,
        offset: u64,
        after: std::time::Duration,
    },
    /// Every I/O thread is stuck in a read the source never answered ([`deadline`]).
    #[error("cannot read {path}: the source does not answer ({stuck} reads stuck)")]
    Unresponsive { path: PathBuf, stuck: usize },
}

/// Positional reads of one open file. Implemented by [`File`]; tests wrap it to inject the
/// faults real disks and filesystems produce (short reads, `EINTR`, `EIO`), see
/// [`SourceFile::open_with`].
pub trait ReadAt: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        platform::read_at(self, buf, offset)
    }
}

/// The reads of a [`RemoteFile`] as [`ReadAt`].
struct RemoteReads(Arc<dyn RemoteFile>);

impl ReadAt for RemoteReads {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
}

/// Wraps the descriptors a [`SourceFile`] reads through (fault-injection tests only).
pub type ReadWrapper = Arc<dyn Fn(File) -> Arc<dyn ReadAt> + Send + Sync>;

/// One open version of a source file.
///
/// It opens one descriptor at first, and its `O_DIRECT` twin only at the first aligned read:
/// most opens of a model file only read its header, which is in memory, and a folder scan
/// opens thousands, each closed again at release (see [`slot`];
/// [measured](../../../docs/PERFORMANCE.md#source-descriptors-per-file)).
pub struct SourceFile {
    path: PathBuf,
    /// The open descriptors; `None` only while [`Self::renew`] replaces them.
    open: RwLock<Option<Arc<Descriptors>>>,
    /// False once `O_DIRECT` failed to open or was refused by a read.
    direct_works: AtomicBool,
    /// The page the latest direct read ended inside, for the read of the chunk after it.
    boundary: boundary::BoundaryPage,
    identity: SourceIdentity,
    wrap: Option<ReadWrapper>,
    /// On a file system held in RAM (tmpfs, ramfs): see [`SourceFile::is_in_ram`].
    in_ram: bool,
    /// What a remote file's source is called in the stats ([`RemoteFile::kind`]); empty for
    /// a local file.
    remote_kind: &'static str,
    /// Where its reads are measured ([`meter`]); `None`: not measured.
    meter: Option<Arc<SourceMeter>>,
    /// Descriptors of this very version opened again after these died (`ENOTCONN`,
    /// `ESTALE`): reads go through them from then on ([`slot::SourceSlot`]); they close with
    /// this file.
    successor: crate::sync::Mutex<Option<Arc<SourceFile>>>,
}

/// One open of a version: what [`SourceFile::renew`] closes and opens again.
struct Descriptors {
    /// The plain descriptor: page-cache advice, and the reads `O_DIRECT` cannot do (`None`
    /// for a remote file, [`SourceFile::remote`]).
    advice: Option<Arc<File>>,
    /// Reads through `advice` (or, in fault-injection tests, a wrapped duplicate of it).
    buffered: Arc<dyn ReadAt>,
    /// The `O_DIRECT` twin, once the first aligned read tried to open it.
    direct: OnceLock<Option<Arc<dyn ReadAt>>>,
    /// The order of the requests these descriptors sent ([`pattern`]).
    pattern: pattern::ReadPattern,
}

impl Descriptors {
    fn of(file: File, wrap: Option<&ReadWrapper>) -> io::Result<Descriptors> {
        let advice = Arc::new(file);
        let buffered: Arc<dyn ReadAt> = match wrap {
            Some(wrap) => wrap(advice.try_clone()?),
            None => advice.clone(),
        };
        Ok(Descriptors {
            advice: Some(advice),
            buffered,
            direct: OnceLock::new(),
            pattern: pattern::ReadPattern::default(),
        })
    }
}

/// The error of a read that found the descriptors closed by a [`SourceFile::renew`] that could
/// not open them again: `NotConnected`, so that the read's retry opens the version again
/// ([`retry::needs_reopen`]).
fn closed_for_renewal() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the descriptors were closed for a fresh handle and could not be opened again",
    )
}

impl std::fmt::Debug for SourceFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceFile")
            .field("path", &self.path)
            .field("direct_io", &self.uses_direct_io())
            .field("identity", &self.identity)
            .finish()
    }
}

impl SourceFile {
    /// Opens `path` (following symlinks) for reading, with an `O_DIRECT` twin where supported.
    pub fn open(path: &Path) -> Result<Self, SourceError> {
        Self::open_with(&PlainPaths, path, None)
    }

    /// [`Self::open`] through `paths`, reading through `wrap` when given (fault injection in
    /// tests).
    pub fn open_with(
        paths: &dyn PathAccess,
        path: &Path,
        wrap: Option<&ReadWrapper>,
    ) -> Result<Self, SourceError> {
        let opened = paths.open(path).map_err(|source| SourceError::Open {
            path: path.to_owned(),
            source,
        })?;
        match opened {
            Opened::File(file) => Self::adopt(path, file, wrap),
            Opened::Remote(remote) => Ok(Self::remote(path, remote)),
        }
    }

    /// Reads `remote`, a version of a file in a remote source, named `path` in the mount's
    /// terms. Its reads are the remote's own requests: no descriptors, no page cache to keep
    /// clear, nothing to open again.
    pub fn remote(path: &Path, remote: Arc<dyn RemoteFile>) -> Self {
        let identity = remote.identity();
        let remote_kind = remote.kind();
        let reads: Arc<dyn ReadAt> = Arc::new(RemoteReads(remote));
        SourceFile {
            path: path.to_owned(),
            open: RwLock::new(Some(Arc::new(Descriptors {
                advice: None,
                buffered: reads,
                direct: OnceLock::from(None),
                pattern: pattern::ReadPattern::default(),
            }))),
            direct_works: AtomicBool::new(false),
            boundary: boundary::BoundaryPage::default(),
            identity,
            wrap: None,
            in_ram: false,
            remote_kind,
            meter: None,
            successor: crate::sync::Mutex::new(None),
        }
    }

    /// Whether this version is read from a remote source ([`Self::remote`]).
    pub fn is_remote(&self) -> bool {
        !self.remote_kind.is_empty()
    }

    /// Reads the version `path` names through `file`, a descriptor of it the caller opened
    /// already (the requester's own open, in the FUSE adapter: one `open` less per open, and
    /// the version indexed is the one the requester opened).
    pub fn adopt(path: &Path, file: File, wrap: Option<&ReadWrapper>) -> Result<Self, SourceError> {
        platform::advise_random(&file);
        Self::with_file(path, file, wrap)
    }

    fn with_file(path: &Path, file: File, wrap: Option<&ReadWrapper>) -> Result<Self, SourceError> {
        let open_err = |source| SourceError::Open {
            path: path.to_owned(),
            source,
        };
        if !file.metadata().map_err(open_err)?.is_file() {
            return Err(SourceError::NotAFile {
                path: path.to_owned(),
            });
        }
        let in_ram = platform::is_in_ram(&file);
        let identity = SourceIdentity::of_file(&file).map_err(open_err)?;
        let descriptors = Descriptors::of(file, wrap).map_err(open_err)?;
        Ok(SourceFile {
            path: path.to_owned(),
            open: RwLock::new(Some(Arc::new(descriptors))),
            direct_works: AtomicBool::new(true),
            boundary: boundary::BoundaryPage::default(),
            identity,
            wrap: wrap.cloned(),
            in_ram,
            remote_kind: "",
            meter: None,
            successor: crate::sync::Mutex::new(None),
        })
    }

    /// Measures this file's reads on the meter of its device in `meters`.
    pub fn metered(self, meters: &SourceMeters) -> SourceFile {
        let meter = meters.for_dev(self.identity.dev);
        if let Ok(open) = self.descriptors() {
            meter.note_storage(|| match &open.advice {
                Some(advice) => kind::StorageKind::of(advice),
                None => kind::StorageKind::ObjectStore(self.remote_kind),
            });
        }
        self.with_meter(Some(meter))
    }

    /// Measures this file's reads on `meter` (`None`: not measured). A file on storage that
    /// [reads buffered](kind::StorageKind::reads_buffered) never opens its `O_DIRECT` twin.
    pub fn with_meter(mut self, meter: Option<Arc<SourceMeter>>) -> SourceFile {
        if meter.as_ref().is_some_and(|m| m.storage().reads_buffered()) {
            self.direct_works.store(false, Ordering::Relaxed);
        }
        self.meter = meter;
        self
    }

    /// The meter this file's reads are measured on.
    pub fn meter(&self) -> Option<&Arc<SourceMeter>> {
        self.meter.as_ref()
    }

    /// The descriptors reads of this version go through: these, or the last ones opened again
    /// after these died ([`Self::set_successor`]).
    pub fn current(self: &Arc<Self>) -> Arc<SourceFile> {
        let mut at = Arc::clone(self);
        loop {
            let next = crate::sync::lock(&at.successor).clone();
            match next {
                Some(next) => at = next,
                None => return at,
            }
        }
    }

    /// Makes `fresh`, descriptors of this same version opened again, the ones reads of this
    /// version go through from now on ([`Self::current`]).
    pub(crate) fn set_successor(&self, fresh: Arc<SourceFile>) {
        *crate::sync::lock(&self.successor) = Some(fresh);
    }

    /// Whether the file lives on a file system held in RAM (tmpfs, ramfs): its bytes are in
    /// memory already, always resident, and `POSIX_FADV_DONTNEED` cannot give them back, so
    /// neither tier has anything to hold for it.
    pub fn is_in_ram(&self) -> bool {
        self.in_ram
    }

    /// The open descriptors (an error while a failed [`Self::renew`] left none).
    fn descriptors(&self) -> io::Result<Arc<Descriptors>> {
        crate::sync::read(&self.open)
            .clone()
            .ok_or_else(closed_for_renewal)
    }

    /// Reads outside an ordered stream the open descriptors sent that did not continue the read
    /// before ([`pattern::ReadPattern::scattered`]; 0 while none are open).
    pub fn scattered_reads(&self) -> u64 {
        crate::sync::read(&self.open)
            .as_ref()
            .map_or(0, |open| open.pattern.scattered())
    }

    /// Closes the descriptors and opens the version again by path through `paths`, checked to
    /// be this very version, so that the source's client sees a new reader: a store's client
    /// that judged the old handle's requests scattered serves an ordered stream from the new
    /// one at its sequential speed ([`pattern`]). The old descriptors close first (a client
    /// that keeps one handle per file while any descriptor is open would otherwise hand the
    /// same one back). Returns false, with nothing changed, when a read is using them now (they
    /// would not close) or when the path no longer names this version (the handles that hold
    /// it keep reading it, as a plain file's would). If the new open fails the error is
    /// returned and reads of these descriptors fail with `NotConnected`, which their retry
    /// answers by opening the version again ([`slot`]).
    pub fn renew(&self, paths: &dyn PathAccess) -> Result<bool, SourceError> {
        if self.is_remote() {
            return Ok(false); // no descriptors: each read is a request of its own
        }
        if paths.identity(&self.path).ok() != Some(self.identity) {
            return Ok(false);
        }
        let old = {
            let mut open = crate::sync::write(&self.open);
            match open.as_ref() {
                Some(held) if Arc::strong_count(held) == 1 => open.take(),
                _ => return Ok(false),
            }
        };
        drop(old);
        let open_err = |source| SourceError::Open {
            path: self.path.clone(),
            source,
        };
        let file = paths
            .open(&self.path)
            .and_then(|opened| opened.into_file("renewing a descriptor"))
            .map_err(open_err)?;
        if SourceIdentity::of_file(&file).map_err(open_err)? != self.identity {
            return Err(SourceError::Changed {
                path: self.path.clone(),
            });
        }
        platform::advise_random(&file);
        let fresh = Descriptors::of(file, self.wrap.as_ref()).map_err(open_err)?;
        *crate::sync::write(&self.open) = Some(Arc::new(fresh));
        Ok(true)
    }

    /// The `O_DIRECT` twin of `open`, opened at the first call (`None` where it cannot be).
    fn direct<'a>(&self, open: &'a Descriptors) -> Option<&'a Arc<dyn ReadAt>> {
        open.direct
            .get_or_init(|| {
                let direct = open
                    .advice
                    .as_ref()
                    .and_then(|advice| platform::reopen_direct(advice, &self.path, &self.identity));
                if direct.is_none() {
                    self.direct_works.store(false, Ordering::Relaxed);
                }
                direct.map(|file| match &self.wrap {
                    Some(wrap) => wrap(file),
                    None => Arc::new(file) as Arc<dyn ReadAt>,
                })
            })
            .as_ref()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The canonical path of the file open here (on Linux read from its descriptor, so no
    /// path is resolved again; else `path` canonicalized, or as it is when that fails).
    pub fn canonical_path(&self) -> PathBuf {
        self.descriptors()
            .and_then(|open| match &open.advice {
                Some(advice) => platform::canonical_path(advice),
                None => Ok(self.path.clone()),
            })
            .or_else(|_| self.path.canonicalize())
            .unwrap_or_else(|_| self.path.clone())
    }

    pub fn identity(&self) -> SourceIdentity {
        self.identity
    }

    /// Whether the file open here is no longer this version (rewritten in place since it was
    /// opened: another size or modification time); an `fstat` of the descriptor. False while
    /// [`Self::renew`] has none open (it checks the version itself).
    pub fn changed_since_open(&self) -> io::Result<bool> {
        match crate::sync::read(&self.open).clone() {
            Some(open) => match &open.advice {
                Some(advice) => Ok(SourceIdentity::of_file(advice)? != self.identity),
                // A remote version's reads are conditional on it: a change fails them.
                None => Ok(false),
            },
            None => Ok(false),
        }
    }

    /// A new descriptor of this very version (not of whatever the path holds now), with its own
    /// file state: default readahead, unlike the descriptors here, which advise random access.
    /// For FUSE passthrough, where the kernel reads through the descriptor it is given.
    #[cfg(target_os = "linux")]
    pub fn reopen(&self) -> io::Result<File> {
        use std::os::fd::AsRawFd;
        let open = self.descriptors()?;
        let advice = open.advice.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "a remote file has no descriptor",
            )
        })?;
        File::open(format!("/proc/self/fd/{}", advice.as_raw_fd()))
    }

    /// Whether reads bypass the page cache with `O_DIRECT` (true until the first aligned read
    /// found they cannot).
    pub fn uses_direct_io(&self) -> bool {
        self.direct_works.load(Ordering::Relaxed)
    }

    /// Reads `[start, end)` into a page-aligned buffer, bypassing the page cache: with
    /// `O_DIRECT` the whole pages the range touches, else (buffered) exactly the range.
    pub fn read_aligned(&self, start: u64, end: u64) -> Result<AlignedBytes, SourceError> {
        self.read_aligned_as(start, end, false)
    }

    /// [`Self::read_aligned`] for a read of an ordered stream ([`pattern`]).
    pub fn read_aligned_in_stream(
        &self,
        start: u64,
        end: u64,
    ) -> Result<AlignedBytes, SourceError> {
        self.read_aligned_as(start, end, true)
    }

    fn read_aligned_as(
        &self,
        start: u64,
        end: u64,
        in_stream: bool,
    ) -> Result<AlignedBytes, SourceError> {
        let base = align_down(start);
        let map_len = usize::try_from(aligned_footprint(start, end)).unwrap_or(usize::MAX);
        let mut map = map_buffer(map_len.max(1)).map_err(|source| SourceError::Alloc {
            len: map_len,
            source,
        })?;
        let skip = (start - base) as usize;
        let needed = (end - base) as usize;
        let mut filled = 0usize;
        if self.uses_direct_io() {
            if needed > DIRECT_IO_ALIGN as usize && self.boundary.take_into(base, &mut map) {
                filled = DIRECT_IO_ALIGN as usize;
            }
            filled +=
                self.fill_direct(&mut map[filled..map_len], base + filled as u64, in_stream)?;
            self.boundary.keep_last_of(base, &map[..filled], end);
        }
        if filled < needed {
            // Buffered, from `start` at the earliest: the bytes before it on its page belong to
            // the chunk before, which read them, and reading them again costs a request (a seek,
            // a store's chunk) where the source charges per request.
            let from = filled.max(skip);
            filled =
                from + self.fill_buffered(&mut map[from..needed], base + from as u64, in_stream)?;
        }
        if filled < needed {
            return Err(SourceError::Truncated {
                path: self.path.clone(),
                wanted_end: end,
                got_end: base + filled as u64,
            });
        }
        Ok(AlignedBytes {
            map: Some(map),
            skip,
            len: (end - start) as usize,
        })
    }

    /// Plain `pread` of up to `buf.len()` bytes (short only at end of file), page cache dropped
    /// afterwards. For the bytes tierfs serves but does not cache.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, SourceError> {
        self.fill_buffered(buf, offset, false)
    }

    /// [`read_direct`] on this file's `O_DIRECT` descriptor (nothing when it has none).
    fn fill_direct(
        &self,
        buf: &mut [u8],
        offset: u64,
        in_stream: bool,
    ) -> Result<usize, SourceError> {
        let open = self
            .descriptors()
            .map_err(|source| self.read_error(offset, source))?;
        let Some(direct) = self.direct(&open) else {
            return Ok(0);
        };
        open.pattern.note(offset, buf.len() as u64, in_stream);
        self.measured(|| read_direct(direct.as_ref(), &self.direct_works, &self.path, buf, offset))
            .map_err(|(filled, source)| self.read_error(offset + filled as u64, source))
    }

    fn fill_buffered(
        &self,
        buf: &mut [u8],
        offset: u64,
        in_stream: bool,
    ) -> Result<usize, SourceError> {
        let open = self
            .descriptors()
            .map_err(|source| self.read_error(offset, source))?;
        open.pattern.note(offset, buf.len() as u64, in_stream);
        let filled = self
            .measured(|| read_full_at(open.buffered.as_ref(), buf, offset))
            .map_err(|(filled, source)| self.read_error(offset + filled as u64, source))?;
        if let Some(advice) = &open.advice {
            platform::drop_cached(advice, offset, filled as u64);
        }
        Ok(filled)
    }

    /// Runs `read`, one read of the source, on this file's meter (if any): issued now,
    /// completed with the bytes it returns, or failed.
    fn measured<E>(&self, read: impl FnOnce() -> Result<usize, E>) -> Result<usize, E> {
        let in_flight = self.meter.as_deref().map(SourceMeter::start);
        let result = read();
        if let (Some(in_flight), Ok(bytes)) = (in_flight, &result) {
            in_flight.finish(*bytes as u64);
        }
        result
    }

    fn read_error(&self, offset: u64, source: io::Error) -> SourceError {
        let path = self.path.clone();
        if self.is_remote() {
            SourceError::Remote {
                path,
                offset,
                source,
            }
        } else {
            SourceError::Read {
                path,
                offset,
                source,
            }
        }
    }
}

/// `O_DIRECT` reads from `direct` into `buf` (aligned, starting at aligned `offset`) until it is
/// full, the file ends (a short read), or the kernel refuses with `EINVAL` (tmpfs, some network
/// and FUSE filesystems): `direct_works` is then switched off for the file and the caller
/// completes the read buffered from the aligned point returned. Interrupted calls are retried.
/// Returns the bytes filled, or the bytes filled before an error and the error. Shared with the
/// GPU helper, which reads into its own staging buffers.
pub fn read_direct(
    direct: &dyn ReadAt,
    direct_works: &AtomicBool,
    path: &Path,
    buf: &mut [u8],
    offset: u64,
) -> Result<usize, (usize, io::Error)> {
    let mut filled = 0;
    while filled < buf.len() {
        match direct.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if platform::refuses_direct_io(&e) => {
                tracing::info!(path = %path.display(), "O_DIRECT refused; reading through the page cache");
                direct_works.store(false, Ordering::Relaxed);
                return Ok(filled - filled % DIRECT_IO_ALIGN as usize);
            }
            Err(e) => return Err((filled, e)),
        }
        if filled % DIRECT_IO_ALIGN as usize != 0 {
            break; // a short read: end of file, or the buffered path finishes it.
        }
    }
    Ok(filled)
}

/// `pread` into `buf` until it is full or the file ends, retrying interrupted calls. Returns the
/// bytes read, or the bytes read before the error and the error.
pub fn read_full_at(
    file: &dyn ReadAt,
    buf: &mut [u8],
    offset: u64,
) -> Result<usize, (usize, io::Error)> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err((filled, e)),
        }
    }
    Ok(filled)
}

/// The `O_DIRECT` twin of the file `identity` was taken from: `None` where the filesystem
/// refuses `O_DIRECT`, or where `path` now names another file (replaced between the two opens).
pub fn open_direct_twin(path: &Path, identity: &SourceIdentity) -> Option<File> {
    open_direct(path).ok().filter(|direct| {
        SourceIdentity::of_file(direct)
            .is_ok_and(|m| m.dev == identity.dev && m.ino == identity.ino)
    })
}

#[cfg(test)]
mod tests;
