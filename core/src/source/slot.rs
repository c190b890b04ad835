//! The source descriptors of one file version, open only while someone uses them.
//!
//! **Contract.** The daemon's descriptors are bounded by what readers hold open (at most two
//! per open model file version), never by how many files were ever opened; a version nobody holds has no
//! descriptor, so its disk space is freed as soon as SOURCE deletes it; and a reopen never reads
//! another file than the version indexed.
//!
//! A [`SourceFile`] holds up to two descriptors (a plain one, and its `O_DIRECT` twin from the
//! first aligned read on). Kept for every version ever indexed, they would run the daemon out of
//! descriptors (`EMFILE`) on a header scan of 20 000 small `.safetensors` (ComfyUI's startup scan
//! of a large LoRA collection; `tests/python/test_lifecycle.py`).
//!
//! So a file version keeps only what identifies it (path and [`SourceIdentity`]) and a *weak*
//! reference to its open descriptors. Whoever needs to read takes a strong one
//! ([`SourceSlot::get`]): the open descriptors if someone already holds them, else freshly
//! opened ones. The descriptors close when the last holder lets go. Holders are:
//! - every open handle of the file (`models::OpenModel`), for as long as it is open, so that a
//!   handle keeps reading the version it opened even after SOURCE replaced or deleted it, as a
//!   plain file would;
//! - a read or a prefetch, for the duration of one chunk read. A prefetch that outlives the
//!   file's handles (the `prefetch` command, or readahead queued just before a close) opens the
//!   file again for each chunk it reads: two `open`s and a few `fstat`s, a few microseconds next
//!   to a 4 MiB read.
//!
//! The daemon's descriptors are therefore bounded by what readers hold open (at most two per open
//! model file version, however many handles share it), not by how many files were ever opened,
//! and a version that nobody holds has none: its disk space is freed as soon as SOURCE deletes it.
//!
//! **Never the wrong bytes.** A reopen goes by path, which may name another file by now. The
//! opened file's identity (device, inode, size, mtime, ctime, from `fstat` of the very
//! descriptor opened) must equal the version's, else the reopen fails with
//! [`SourceError::Changed`] and nothing is read: a read of that version fails (`EIO`), a
//! prefetch is skipped. Readers that open the file again get its new version.
//!
//! **Dead descriptors.** After `ENOTCONN` or `ESTALE` (a network filesystem's connection or
//! file handle is gone) a read's retry opens the version again the same way, checked the same
//! way, and the dead descriptors' holders read through the new ones from then on
//! ([`SourceFile::current`]); the new descriptors close with the dead ones.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::deadline::SourceIo;
use super::meter::SourceMeter;
use super::{AlignedBytes, PathAccess, ReadWrapper, SourceError, SourceFile, SourceIdentity};
use crate::sync::{lock, Mutex};

/// One version of a source file, and its descriptors while someone holds them (see the module
/// docs). Its reads ([`Self::read_aligned`], [`Self::read_at`]) are bounded in time and retried
/// by the mount's [`SourceIo`].
pub struct SourceSlot {
    inner: Arc<SlotInner>,
    io: Arc<SourceIo>,
}

/// What a read on an I/O thread needs of the slot (it may outlive the caller's wait).
struct SlotInner {
    path: PathBuf,
    identity: SourceIdentity,
    wrap: Option<ReadWrapper>,
    /// How reopens reach the path.
    paths: Arc<dyn PathAccess>,
    open: Mutex<Weak<SourceFile>>,
    /// Whether the last descriptors opened read with `O_DIRECT` (for the stats while closed).
    direct_io: AtomicBool,
    /// Times the descriptors were opened again after being closed.
    reopens: AtomicU64,
    /// The meter of the first descriptors, which reopens measure on too.
    meter: Option<Arc<SourceMeter>>,
}

impl std::fmt::Debug for SourceSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceSlot")
            .field("path", &self.inner.path)
            .field("identity", &self.inner.identity)
            .field("open", &self.is_open())
            .finish()
    }
}

impl SourceSlot {
    /// The slot of the version `source` was opened as; `source` stays open while the caller
    /// (or anyone it hands a clone to) holds it. Reopens go through `paths` and read through
    /// `wrap` too; reads are run by `io`.
    pub fn new(
        source: &Arc<SourceFile>,
        wrap: Option<ReadWrapper>,
        paths: Arc<dyn PathAccess>,
        io: Arc<SourceIo>,
    ) -> SourceSlot {
        SourceSlot {
            inner: Arc::new(SlotInner {
                path: source.path().to_owned(),
                identity: source.identity(),
                wrap,
                paths,
                open: Mutex::new(Arc::downgrade(source)),
                direct_io: AtomicBool::new(source.uses_direct_io()),
                reopens: AtomicU64::new(0),
                meter: source.meter().cloned(),
            }),
            io,
        }
    }

    /// The version's open descriptors: those someone already holds, or new ones, opened by path
    /// and checked to be this very version ([`SourceError::Changed`] if the path names another
    /// file now, the OS's error if it names none).
    pub fn get(&self) -> Result<Arc<SourceFile>, SourceError> {
        self.inner.get()
    }

    /// The meter this version's reads are measured on (`None`: not measured).
    pub fn meter(&self) -> Option<&Arc<SourceMeter>> {
        self.inner.meter.as_ref()
    }

    /// Bytes `[start, end)` of this version ([`SourceFile::read_aligned`]), within the mount's
    /// deadline, transient errors retried ([`SourceIo::read`]); a try after `ENOTCONN` or
    /// `ESTALE` opens the version again by path, checked to be this very version.
    pub fn read_aligned(&self, start: u64, end: u64) -> Result<AlignedBytes, SourceError> {
        let inner = Arc::clone(&self.inner);
        self.io.read((&self.inner.path, start), move |reopen| {
            inner.source(reopen)?.read_aligned(start, end)
        })
    }

    /// Up to `buf.len()` bytes at `offset` ([`SourceFile::read_at`]: short only at end of
    /// file), bounded and retried as [`Self::read_aligned`]. The try reads into a buffer of its
    /// own (a try abandoned at the deadline may still write), copied into `buf`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, SourceError> {
        let len = buf.len();
        let inner = Arc::clone(&self.inner);
        let got = self.io.read((&self.inner.path, offset), move |reopen| {
            let mut own = vec![0u8; len];
            let n = inner.source(reopen)?.read_at(&mut own, offset)?;
            own.truncate(n);
            Ok(own)
        })?;
        let n = got.len().min(len);
        buf[..n].copy_from_slice(&got[..n]);
        Ok(n)
    }

    /// [`Self::get`], taking `file` (a descriptor the caller opened by path) as the descriptor
    /// if none is open and `file` is this version; `None` when it is another version.
    #[cfg(target_os = "linux")]
    pub fn get_or_adopt(
        &self,
        file: std::fs::File,
    ) -> Result<Option<Arc<SourceFile>>, SourceError> {
        let inner = &self.inner;
        let mut open = lock(&inner.open);
        if let Some(source) = open.upgrade() {
            return Ok(Some(source.current()));
        }
        let source = Arc::new(
            SourceFile::adopt(&inner.path, file, inner.wrap.as_ref())?
                .with_meter(inner.meter.clone()),
        );
        if source.identity() != inner.identity {
            return Ok(None);
        }
        inner.reopens.fetch_add(1, Ordering::Relaxed);
        *open = Arc::downgrade(&source);
        Ok(Some(source))
    }

    /// Whether someone holds the descriptors now.
    pub fn is_open(&self) -> bool {
        lock(&self.inner.open).strong_count() > 0
    }

    /// Times the descriptors were opened again after everyone had let go of them (or after
    /// they died: `ENOTCONN`, `ESTALE`).
    pub fn reopens(&self) -> u64 {
        self.inner.reopens.load(Ordering::Relaxed)
    }

    /// The absolute source path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn identity(&self) -> SourceIdentity {
        self.inner.identity
    }

    /// Whether reads bypass the page cache (as of the descriptors open now, or last opened).
    pub fn uses_direct_io(&self) -> bool {
        let open = lock(&self.inner.open).upgrade();
        match open {
            Some(source) => source.current().uses_direct_io(),
            None => self.inner.direct_io.load(Ordering::Relaxed),
        }
    }

    /// Whether `path` names this version now (false when it names another file or none).
    pub fn is_current(&self) -> bool {
        self.inner
            .paths
            .identity(&self.inner.path)
            .is_ok_and(|now| now == self.inner.identity)
    }
}

impl SlotInner {
    /// See [`SourceSlot::get`]. The path is opened without the lock held: an open that hangs
    /// on a source that stopped answering blocks only its own read, never the stats or the
    /// other reads of descriptors already open.
    fn get(&self) -> Result<Arc<SourceFile>, SourceError> {
        if let Some(source) = lock(&self.open).upgrade() {
            return Ok(source.current());
        }
        let fresh = self.open_checked()?;
        let mut open = lock(&self.open);
        if let Some(source) = open.upgrade() {
            return Ok(source.current()); // opened by another read meanwhile
        }
        self.direct_io
            .store(fresh.uses_direct_io(), Ordering::Relaxed);
        self.reopens.fetch_add(1, Ordering::Relaxed);
        *open = Arc::downgrade(&fresh);
        Ok(fresh)
    }

    /// New descriptors of this version, opened by path and checked to be this very version.
    fn open_checked(&self) -> Result<Arc<SourceFile>, SourceError> {
        let source = Arc::new(
            SourceFile::open_with(self.paths.as_ref(), &self.path, self.wrap.as_ref())?
                .with_meter(self.meter.clone()),
        );
        if source.identity() != self.identity {
            return Err(SourceError::Changed {
                path: self.path.clone(),
            });
        }
        Ok(source)
    }

    /// Descriptors for a try: the open ones, or (`reopen`: the previous try's descriptor died)
    /// new ones of this very version, which the holders of the dead ones read through from now
    /// on ([`SourceFile::current`]).
    fn source(&self, reopen: bool) -> Result<Arc<SourceFile>, SourceError> {
        if !reopen {
            return self.get();
        }
        let fresh = self.open_checked()?;
        let mut open = lock(&self.open);
        match open.upgrade() {
            Some(held) => held.current().set_successor(Arc::clone(&fresh)),
            None => *open = Arc::downgrade(&fresh),
        }
        self.reopens.fetch_add(1, Ordering::Relaxed);
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::PlainPaths;

    #[cfg(target_os = "linux")]
    fn descriptors_of(path: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target == path)
            .count()
    }

    #[test]
    #[cfg(target_os = "linux")] // counts descriptors in /proc
    fn descriptors_close_with_the_last_holder_and_reopen_on_demand() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 10_000]).unwrap();
        let first = Arc::new(SourceFile::open(&path).unwrap());
        let slot = SourceSlot::new(&first, None, Arc::new(PlainPaths), Arc::default());
        let again = slot.get().unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "a held version was opened twice"
        );
        assert!(descriptors_of(&path) >= 1);
        drop((first, again));
        assert!(!slot.is_open());
        assert_eq!(
            descriptors_of(&path),
            0,
            "descriptors outlived their holders"
        );
        let reopened = slot.get().unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(reopened.read_at(&mut buf, 100).unwrap(), 16);
        assert_eq!(buf, [7u8; 16]);
        assert_eq!(slot.reopens(), 1);
    }

    #[test]
    fn a_replaced_or_deleted_file_is_not_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 4096]).unwrap();
        let slot = SourceSlot::new(
            &Arc::new(SourceFile::open(&path).unwrap()),
            None,
            Arc::new(PlainPaths),
            Arc::default(),
        );
        assert!(slot.is_current());
        // Same size, new inode: another file, whatever its bytes.
        let other = dir.path().join("g");
        std::fs::write(&other, vec![2u8; 4096]).unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(!slot.is_current());
        assert!(
            matches!(slot.get(), Err(SourceError::Changed { .. })),
            "a replaced file was reopened as the old version"
        );
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(slot.get(), Err(SourceError::Open { .. })));
    }

    #[test]
    #[cfg(target_os = "linux")] // Windows refuses to delete a file open without FILE_SHARE_DELETE
    fn a_held_version_keeps_reading_after_it_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![3u8; 8192]).unwrap();
        let held = Arc::new(SourceFile::open(&path).unwrap());
        let slot = SourceSlot::new(&held, None, Arc::new(PlainPaths), Arc::default());
        std::fs::remove_file(&path).unwrap();
        let got = slot.get().unwrap().read_aligned(4096, 8192).unwrap();
        assert_eq!(got.as_slice(), &[3u8; 4096][..]);
    }
}
