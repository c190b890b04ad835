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
//! **A fresh handle for an ordered stream.** On a network or FUSE source, a read of an ordered
//! stream ([`SourceSlot::read_stream`]: the lane's read-ahead, a reader's miss read with it)
//! first closes the descriptors and opens them again ([`SourceFile::renew`]) when they have sent
//! [`FRESH_HANDLE_AFTER_SCATTERED`] reads or more outside the stream (probes, uncached reads)
//! that did not continue the one before: the store's client judged that handle scattered and
//! would serve the stream as such ([`super::pattern`]). It costs one open, which the same scattered reads cost many times
//! over; the reopen is checked like every other.
//!
//! **Dead descriptors.** After `ENOTCONN` or `ESTALE` (a network filesystem's connection or
//! file handle is gone) a read's retry opens the version again the same way, checked the same
//! way, and the dead descriptors' holders read through the new ones from then on
//! ([`SourceFile::current`]); the new descriptors close with the dead ones.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::deadline::SourceIo;
use super::kind::StorageKind;
use super::meter::SourceMeter;
use super::{AlignedBytes, PathAccess, ReadWrapper, SourceError, SourceFile, SourceIdentity};
use crate::sync::{lock, Mutex};

/// Scattered reads outside a stream (requests that did not continue the one before) after
/// which an ordered stream on a network source gets a fresh handle: one open, a round trip,
/// against the per-request overhead of a scattered handle on every read of the stream; fewer
/// than the probes of one load (one per tensor), which switch a store's client to ranged
/// fetches ([measured](../../../docs/PERFORMANCE.md#a-fresh-handle-for-an-ordered-stream)).
pub const FRESH_HANDLE_AFTER_SCATTERED: u64 = 8;

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

    /// [`Self::read_aligned`] for a read of an ordered stream: on a network source whose
    /// descriptors sent [`FRESH_HANDLE_AFTER_SCATTERED`] scattered reads or more outside the
    /// stream, they are opened again first (see the module docs).
    pub fn read_stream(&self, start: u64, end: u64) -> Result<AlignedBytes, SourceError> {
        let inner = Arc::clone(&self.inner);
        let io = Arc::clone(&self.io);
        self.io.read((&self.inner.path, start), move |reopen| {
            let source = inner.source(reopen)?;
            if inner.wants_fresh_handle(&source) && source.renew(inner.paths.as_ref())? {
                io.counters().fresh_handles.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(path = %inner.path.display(), start, "fresh source handle for an ordered stream");
            }
            source.read_aligned_in_stream(start, end)
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

    /// Whether `source`'s descriptors should be opened again before an ordered stream reads
    /// through them (see the module docs).
    fn wants_fresh_handle(&self, source: &SourceFile) -> bool {
        let network = self
            .meter
            .as_ref()
            .is_some_and(|m| matches!(m.storage(), StorageKind::Network(_)));
        network && source.scattered_reads() >= FRESH_HANDLE_AFTER_SCATTERED
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

    /// A slot of `path` whose reads are measured on a meter that says the source is a FUSE file
    /// system (a store's client), with its I/O.
    #[cfg(target_os = "linux")]
    fn on_a_store_client(
        path: &Path,
        paths: Arc<dyn PathAccess>,
    ) -> (Arc<SourceFile>, SourceSlot, Arc<SourceIo>) {
        on_a_store_client_closing(path, paths, Arc::default())
    }

    /// [`on_a_store_client`], counting in `closed` the descriptors closed.
    #[cfg(target_os = "linux")]
    fn on_a_store_client_closing(
        path: &Path,
        paths: Arc<dyn PathAccess>,
        closed: Arc<AtomicU64>,
    ) -> (Arc<SourceFile>, SourceSlot, Arc<SourceIo>) {
        use crate::source::meter::{MeterConfig, MonotonicClock};
        struct Counted(std::fs::File, Arc<AtomicU64>);
        impl crate::source::ReadAt for Counted {
            fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
                std::os::unix::fs::FileExt::read_at(&self.0, buf, offset)
            }
        }
        impl Drop for Counted {
            fn drop(&mut self) {
                self.1.fetch_add(1, Ordering::SeqCst);
            }
        }
        let wrap: ReadWrapper = Arc::new(move |file| Arc::new(Counted(file, Arc::clone(&closed))));
        let meter = Arc::new(SourceMeter::new(
            1,
            MeterConfig::default(),
            Arc::new(MonotonicClock::default()),
        ));
        meter.note_storage(|| StorageKind::Network("fuse"));
        let held = Arc::new(
            SourceFile::open_with(paths.as_ref(), path, Some(&wrap))
                .unwrap()
                .with_meter(Some(meter)),
        );
        let io = Arc::new(SourceIo::default());
        let slot = SourceSlot::new(&held, Some(wrap), paths, Arc::clone(&io));
        (held, slot, io)
    }

    #[cfg(target_os = "linux")]
    fn numbered(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i / 3 + i / 4099) as u8).collect()
    }

    #[test]
    #[cfg(target_os = "linux")] // counts descriptors in /proc
    fn an_ordered_stream_after_scattered_reads_gets_fresh_descriptors_of_the_same_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes = numbered(64 * 4096 + 123);
        std::fs::write(&path, &bytes).unwrap();
        let closed = Arc::new(AtomicU64::new(0));
        let (held, slot, io) =
            on_a_store_client_closing(&path, Arc::new(PlainPaths), Arc::clone(&closed));
        // A stream from the start, then scattered reads outside it one short of the threshold,
        // and a jump of the stream itself, which does not count: no renewal.
        let got = slot.read_stream(0, 8192).unwrap();
        assert_eq!(got.as_slice(), &bytes[..8192]);
        let scattered = |i: u64| {
            let at = 4096 * (60 - 3 * i);
            let got = slot.read_aligned(at, at + 100).unwrap();
            assert_eq!(got.as_slice(), &bytes[at as usize..at as usize + 100]);
        };
        for i in 0..FRESH_HANDLE_AFTER_SCATTERED - 1 {
            scattered(i);
        }
        assert_eq!(
            slot.read_stream(8192, 12288).unwrap().as_slice(),
            &bytes[8192..12288]
        );
        assert_eq!(io.snapshot().fresh_handles, 0);
        assert_eq!(closed.load(Ordering::SeqCst), 0);
        scattered(FRESH_HANDLE_AFTER_SCATTERED);
        assert_eq!(held.scattered_reads(), FRESH_HANDLE_AFTER_SCATTERED);
        let open_before = descriptors_of(&path);
        // The threshold reached: the stream's next read closes the descriptors and opens new ones.
        let got = slot.read_stream(4096, 64 * 4096 + 123).unwrap();
        assert_eq!(
            got.as_slice(),
            &bytes[4096..],
            "a fresh handle read other bytes"
        );
        assert_eq!(io.snapshot().fresh_handles, 1);
        assert_eq!(
            held.scattered_reads(),
            0,
            "the new descriptors' pattern starts afresh"
        );
        // Both old descriptors (the plain one and its `O_DIRECT` twin, where the file system
        // takes `O_DIRECT`) closed; as many new ones open.
        let twin = u64::from(held.uses_direct_io());
        assert_eq!(
            closed.load(Ordering::SeqCst),
            1 + twin,
            "the old descriptors were not closed"
        );
        assert_eq!(descriptors_of(&path), open_before);
        // A read of a local, flash source never renews, however scattered.
        let local = Arc::new(SourceFile::open(&path).unwrap());
        let local_io = Arc::new(SourceIo::default());
        let local_slot = SourceSlot::new(&local, None, Arc::new(PlainPaths), Arc::clone(&local_io));
        for i in 0..2 * FRESH_HANDLE_AFTER_SCATTERED {
            local_slot
                .read_aligned(4096 * (40 - i), 4096 * (40 - i) + 10)
                .unwrap();
        }
        local_slot.read_stream(0, 4096).unwrap();
        assert_eq!(local_io.snapshot().fresh_handles, 0);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_replaced_file_keeps_its_descriptors_and_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes = numbered(16 * 4096);
        std::fs::write(&path, &bytes).unwrap();
        let (held, slot, io) = on_a_store_client(&path, Arc::new(PlainPaths));
        for i in 0..FRESH_HANDLE_AFTER_SCATTERED {
            slot.read_aligned(4096 * (15 - i), 4096 * (15 - i) + 10)
                .unwrap();
        }
        let other = dir.path().join("g");
        std::fs::write(&other, vec![0xEEu8; bytes.len()]).unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(
            !held.renew(&PlainPaths).unwrap(),
            "renewed by a path that names another file"
        );
        assert_eq!(
            slot.read_stream(0, bytes.len() as u64).unwrap().as_slice(),
            &bytes[..]
        );
        assert_eq!(io.snapshot().fresh_handles, 0);
    }

    /// Paths whose opens fail once `fail` is set (a store that refuses an open for a moment).
    #[cfg(target_os = "linux")]
    struct FailingOpens {
        fail: AtomicBool,
    }

    #[cfg(target_os = "linux")]
    impl PathAccess for FailingOpens {
        fn open(&self, abs: &Path) -> std::io::Result<crate::source::Opened> {
            if self.fail.swap(false, Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            PlainPaths.open(abs)
        }
        fn identity(&self, abs: &Path) -> std::io::Result<SourceIdentity> {
            PlainPaths.identity(abs)
        }
        fn list_dir(&self, abs: &Path) -> std::io::Result<Vec<std::ffi::OsString>> {
            PlainPaths.list_dir(abs)
        }
        fn dir_identity(&self, abs: &Path) -> std::io::Result<SourceIdentity> {
            PlainPaths.dir_identity(abs)
        }
        fn link_target(&self, abs: &Path) -> std::io::Result<Option<PathBuf>> {
            PlainPaths.link_target(abs)
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_renewal_whose_open_fails_is_answered_by_a_reopen_of_the_same_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes = numbered(16 * 4096);
        std::fs::write(&path, &bytes).unwrap();
        let paths = Arc::new(FailingOpens {
            fail: AtomicBool::new(false),
        });
        let (held, slot, io) = on_a_store_client(&path, paths.clone());
        for i in 0..FRESH_HANDLE_AFTER_SCATTERED {
            slot.read_aligned(4096 * (15 - i), 4096 * (15 - i) + 10)
                .unwrap();
        }
        paths.fail.store(true, Ordering::SeqCst);
        // The renewal closed the descriptors and could not open new ones: the try fails, its
        // retry opens the version again (checked), and the read gets its exact bytes.
        assert_eq!(
            slot.read_stream(0, bytes.len() as u64).unwrap().as_slice(),
            &bytes[..]
        );
        let s = io.snapshot();
        assert_eq!((s.fresh_handles, s.reopens), (0, 1), "{s:?}");
        // The handle that holds the version reads through the descriptors opened again.
        let mut buf = [0u8; 100];
        assert_eq!(held.current().read_at(&mut buf, 5000).unwrap(), 100);
        assert_eq!(&buf[..], &bytes[5000..5100]);
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
