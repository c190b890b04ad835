//! The FUSE adapter: kernel requests in, `tierfs_core` calls out.
//!
//! This layer only translates. Paths come from [`inodes`], what a source entry looks like from
//! [`present_as()`], and bytes of model files from [`ModelStore`]; everything else here is glue:
//! - **Model files** (`.safetensors`, `.sft`, well-formed) are opened in page-cache mode and
//!   served from the chunk cache. Every served range is recorded in a [`KernelCacheWindow`]; the
//!   ranges that fall out of it are invalidated by a notifier thread (never from a request
//!   thread, which could deadlock against a read holding the same pages locked).
//! - **Other files** are handed to the kernel with FUSE passthrough
//!   (Linux ≥ 6.9, root), so their reads never reach this process: as fast as the source itself.
//!   Where passthrough is unavailable they are served with plain `pread`.
//! - **`.tierfs/stats`** is rendered when opened and served with `FOPEN_DIRECT_IO`, so every
//!   open sees fresh figures whatever size `stat` reported.
//! - **`.tierfs/control`** (mode 0200, the mounting user's) takes one command per `write()`
//!   ([`tierfs_core::control`]); a bad one fails with `EINVAL` and changes nothing.
//! - **`user.tierfs.source`** ([`SOURCE_XATTR`]), an extended attribute of every regular file,
//!   names the SOURCE file behind it, for tools that must bypass FUSE (`tierfs-gpu`).
//! - **Writes** of any other kind get `EROFS`. The mount itself cannot carry the kernel's `ro`
//!   flag, since the control file must be writable, so every write path is refused here, and
//!   `access(W_OK)` answers `EROFS` too.
//!
//! Attribute and entry timeouts are [`ATTR_TTL`], which is what bounds how long a change in
//! SOURCE takes to show through the mount.
//!
//! **Shared mounts** (`--allow-other`): every source access made for a request runs under
//! [`AccessRule::act_for`] ([`tierfs_core::access`]): with the requester's credentials for a
//! root daemon, without following links for other users otherwise. A link presented as its
//! target gets a zero timeout there, since the kernel's entry and attribute caches are shared
//! by all users and the next user may not be able to reach the target.

mod inodes;
mod present;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam::channel::Sender;
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
};
use tierfs_core::access::{open_for_request, AccessRule, Acting, Sharing, SourceRoot};
use tierfs_core::budget::Governor;
use tierfs_core::control::{self, Command};
use tierfs_core::kernel_cache::{InodeRange, KernelCacheWindow};
use tierfs_core::models::{
    is_model_path, ModelFile, ModelStore, OpenError, OpenModel, ReadBytes, ServeMode,
};
use tierfs_core::source::{read_full_at, SourceError, SourceIdentity};
use tierfs_core::stats::ops::{Op, OpStats};

use crate::stats_doc::StatsDocument;
use inodes::Inodes;
pub use inodes::{CONTROL_DIR_INO, CONTROL_INO, ROOT_INO, STATS_INO};
use present::present_as;

/// How long the kernel may trust attributes and lookups. Half a second keeps the promise that
/// a change in SOURCE shows within a second, and still saves most repeated `stat`s of a loader
/// that stats each file several times in a row.
pub const ATTR_TTL: Duration = Duration::from_millis(500);

/// A model read taking longer than this is logged: it means the disk is saturated or a reader
/// waits on a chunk another request is loading. Two seconds is a hundred times a 4 MiB chunk
/// read on a healthy disk.
const SLOW_READ: Duration = Duration::from_secs(2);

/// Name of the control directory at the mount root.
pub const CONTROL_DIR: &str = ".tierfs";

/// Extended attribute of every regular file of the mount: the absolute path of the SOURCE file
/// it presents. For tools that must read the source itself (`tierfs-gpu`: GPUDirect Storage
/// cannot read through FUSE). Directories, links and `.tierfs/` files have none (`ENODATA`).
pub const SOURCE_XATTR: &str = "user.tierfs.source";

/// Settings the adapter needs beyond the store.
pub struct MountSettings {
    pub source: PathBuf,
    pub mountpoint: PathBuf,
    pub passthrough: bool,
    /// Who may use the mount besides the mounting user (see [`tierfs_core::access`]).
    pub sharing: Sharing,
    /// Whether model files that fit the budget may be served by passthrough.
    pub model_passthrough: bool,
    /// Steers the cache budget under memory pressure (`tierfs_core::budget`).
    pub governor: Arc<Governor>,
}

enum Handle {
    Model(OpenModel),
    /// A model file served by the kernel from its source ([`tierfs_core::passthrough`]); the
    /// backing id must live until release, which gives the file's reservation back.
    ModelPassthrough(OpenModel, #[allow(dead_code)] Arc<BackingId>),
    /// Served by the kernel; the backing id must live until release.
    Passthrough(#[allow(dead_code)] Arc<BackingId>),
    Plain(File),
    Stats(Vec<u8>),
    Control,
    Dir(Vec<(u64, FileType, OsString)>),
}

/// How an `open` is answered.
enum Opened {
    /// A handle served by this process, with the open flags to reply.
    Served(u64, FopenFlags),
    /// A handle whose reads the kernel serves from the backing file (passthrough).
    Passthrough(u64, Arc<BackingId>),
}

/// The `fuser::Filesystem` of a tierfs mount.
pub struct TierFs {
    settings: MountSettings,
    access: AccessRule,
    source_root: SourceRoot,
    store: Arc<ModelStore>,
    inodes: Inodes,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_handle: AtomicU64,
    window: Arc<KernelCacheWindow>,
    invalidations: Sender<InodeRange>,
    started: SystemTime,
    uid: u32,
    gid: u32,
    /// The kernel allows mmap of `FOPEN_DIRECT_IO` files (see `model_open_flags`).
    direct_io_mmap: bool,
    /// Per model inode, the file generation its kernel page cache was last opened with (see
    /// `model_open_flags`).
    page_cache_generations: Mutex<HashMap<u64, u64>>,
    /// Per inode, the backing file of its passthrough opens: the kernel wants one backing id
    /// per inode for all its open handles (a second id for the same inode fails the open
    /// with EIO).
    backings: Mutex<HashMap<u64, Weak<BackingId>>>,
    /// Per model inode with open handles, the mode they are served in and how many there are:
    /// the kernel cannot mix cached and passthrough opens of one inode (the second kind fails
    /// with EIO, `mmap` with ENODEV), so a mode holds until the inode's last handle closes.
    open_modes: Mutex<HashMap<u64, (ServeMode, usize)>>,
}

impl TierFs {
    pub fn new(
        settings: MountSettings,
        store: Arc<ModelStore>,
        window: Arc<KernelCacheWindow>,
        invalidations: Sender<InodeRange>,
    ) -> TierFs {
        // SAFETY: getuid/getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        TierFs {
            access: AccessRule::new(settings.sharing),
            source_root: SourceRoot::open(&settings.source),
            settings,
            store,
            inodes: Inodes::default(),
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            window,
            invalidations,
            started: SystemTime::now(),
            uid,
            gid,
            direct_io_mmap: false,
            page_cache_generations: Mutex::new(HashMap::new()),
            backings: Mutex::new(HashMap::new()),
            open_modes: Mutex::new(HashMap::new()),
        }
    }

    fn abs(&self, rel: &Path) -> PathBuf {
        self.settings.source.join(rel)
    }

    /// The path to reach `rel` by for a request: below SOURCE only, when acting as its user
    /// (see [`SourceRoot`]).
    fn reach(&self, rel: &Path, acting: &Acting) -> PathBuf {
        self.source_root.path_for(rel, acting)
    }

    /// The per-operation figures (`ops` in the stats).
    fn ops(&self) -> &OpStats {
        &self.store.counters().ops
    }

    fn stats_json(&self) -> Vec<u8> {
        let doc = StatsDocument::collect(
            &self.store,
            &self.window,
            &self.settings.source,
            &self.settings.mountpoint,
            self.settings.passthrough,
            self.started,
        )
        .with_budget(self.settings.governor.snapshot());
        let mut json = serde_json::to_vec_pretty(&doc).unwrap_or_else(|e| {
            format!("{{\"error\": \"cannot render stats: {e}\"}}").into_bytes()
        });
        json.push(b'\n');
        json
    }

    /// The attributes of inode `ino`, a source path or a virtual file, and how long the kernel
    /// may keep them.
    fn attr(&self, ino: u64, acting: &Acting) -> Result<(FileAttr, Duration), Errno> {
        let virtual_attr = |kind, perm| Ok((self.virtual_attr(ino, kind, perm, 0), ATTR_TTL));
        match ino {
            CONTROL_DIR_INO => virtual_attr(FileType::Directory, 0o555),
            STATS_INO => virtual_attr(FileType::RegularFile, 0o444),
            CONTROL_INO => virtual_attr(FileType::RegularFile, 0o200),
            _ => self.source_attr(ino, acting),
        }
    }

    /// How long the kernel may keep an entry or its attributes: not at all for a link shown as
    /// its target on a shared mount (see the module docs).
    fn ttl(&self, via_link: bool) -> Duration {
        if via_link && self.access.sharing().is_shared() {
            Duration::ZERO
        } else {
            ATTR_TTL
        }
    }

    /// Starts serving `req` under the access rule; a refusal is `EACCES`.
    fn act_for(&self, req: &Request) -> Result<Acting, Errno> {
        self.access
            .act_for(req.uid(), req.gid(), req.pid())
            .map_err(|e| {
                tracing::warn!(error = %e, pid = req.pid(), "request refused");
                Errno::EACCES
            })
    }

    /// Attributes of a source inode. An inode whose path now holds another object (the file was
    /// replaced or deleted) keeps answering with its last attributes: the kernel may still have
    /// it open, and must not shrink or refill an old mapping from the new file.
    fn source_attr(&self, ino: u64, acting: &Acting) -> Result<(FileAttr, Duration), Errno> {
        let entry = self.inodes.entry(ino).ok_or(Errno::ENOENT)?;
        match present_as(&self.reach(&entry.path, acting), acting.follow_links()) {
            Ok((meta, kind, via_link)) if entry.object.is_none_or(|o| o == object_id(&meta)) => {
                let attr = source_attr(ino, &meta, kind);
                self.inodes.remember(ino, attr);
                Ok((attr, self.ttl(via_link)))
            }
            Ok(_) => entry.attr.map(|a| (a, self.ttl(true))).ok_or(Errno::ESTALE),
            Err(e) => entry
                .attr
                .filter(|_| e.kind() == io::ErrorKind::NotFound)
                .map(|a| (a, self.ttl(true)))
                .ok_or_else(|| errno(e)),
        }
    }

    /// The current inode of `rel`: looks it up in SOURCE and numbers the object found there;
    /// with the entry's timeout.
    fn lookup_source(
        &self,
        rel: &Path,
        acting: &Acting,
    ) -> Result<(u64, FileAttr, Duration), Errno> {
        let (meta, kind, via_link) =
            present_as(&self.reach(rel, acting), acting.follow_links()).map_err(errno)?;
        let ino = self.inodes.ino_of(rel, object_id(&meta));
        let attr = source_attr(ino, &meta, kind);
        self.inodes.remember(ino, attr);
        Ok((ino, attr, self.ttl(via_link)))
    }

    fn virtual_attr(&self, ino: u64, kind: FileType, perm: u16, size: u64) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: 0,
            atime: self.started,
            mtime: SystemTime::now(),
            ctime: SystemTime::now(),
            crtime: self.started,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn child(
        &self,
        parent: u64,
        name: &OsStr,
        acting: &Acting,
    ) -> Result<(FileAttr, Duration), Errno> {
        if parent == ROOT_INO && name == CONTROL_DIR {
            return self.attr(CONTROL_DIR_INO, acting);
        }
        if parent == CONTROL_DIR_INO {
            return match name.to_str() {
                Some("stats") => self.attr(STATS_INO, acting),
                Some("control") => self.attr(CONTROL_INO, acting),
                _ => Err(Errno::ENOENT),
            };
        }
        let parent_path = self.inodes.entry(parent).ok_or(Errno::ENOENT)?.path;
        self.lookup_source(&parent_path.join(plain_name(name)?), acting)
            .map(|(_, attr, ttl)| (attr, ttl))
    }

    fn add_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.lock_handles().insert(fh, Arc::new(handle));
        fh
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.lock_handles().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn lock_handles(&self) -> MutexGuard<'_, HashMap<u64, Arc<Handle>>> {
        self.handles.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open_source(&self, ino: u64, acting: Acting, reply: &ReplyOpen) -> Result<Opened, Errno> {
        let Some(entry) = self.inodes.entry(ino) else {
            return Err(Errno::ENOENT);
        };
        let (rel, abs) = (entry.path.clone(), self.abs(&entry.path));
        let (reach, follow_links) = (self.reach(&rel, &acting), acting.follow_links());
        match present_as(&reach, follow_links) {
            // The path holds another object than this inode: the kernel looks it up again.
            Ok((meta, _, _)) if entry.object.is_some_and(|o| o != object_id(&meta)) => {
                return Err(Errno::ESTALE)
            }
            Ok((_, FileType::RegularFile, _)) => {}
            Ok((_, FileType::Directory, _)) => return Err(Errno::EISDIR),
            Ok(_) => return Err(Errno::EACCES),
            Err(e) => return Err(errno(e)),
        }
        // The open, made as the requester (see `tierfs_core::access`), is the access check;
        // what it opened must be the object this inode stands for, whatever was swapped since.
        let file = open_for_request(&reach, follow_links).map_err(errno)?;
        // The rest runs with the daemon's own rights: it only serves what `file` is.
        drop(acting);
        let opened = file.metadata().map_err(errno)?;
        if entry.object.is_some_and(|o| o != object_id(&opened)) {
            return Err(Errno::ESTALE);
        }
        if is_model_path(&rel) {
            // Malformed model files are served by the read path too (uncached), never with
            // passthrough: the kernel refuses a passthrough open of an inode that is open in
            // cached mode, which a model file's earlier, well-formed version may still be.
            return match self.store.open_handle_with(&rel, &abs, file) {
                // Cached bytes are served only for the version the requester itself opened.
                Ok(Some(model)) if model.source().identity() == SourceIdentity::of(&opened) => {
                    self.open_model(ino, model, reply)
                }
                Ok(_) => Err(Errno::ESTALE),
                Err(e) => {
                    tracing::warn!(file = %abs.display(), error = %e, "cannot open model file");
                    Err(open_errno(&e))
                }
            };
        }
        if self.settings.passthrough {
            match self.backing(ino, reply, || file.try_clone()) {
                Ok(backing) => {
                    let fh = self.add_handle(Handle::Passthrough(Arc::clone(&backing)));
                    return Ok(Opened::Passthrough(fh, backing));
                }
                Err(e) => {
                    tracing::debug!(file = %abs.display(), error = %e, "passthrough refused; serving with pread")
                }
            }
        }
        let fh = self.add_handle(Handle::Plain(file));
        Ok(Opened::Served(fh, FopenFlags::empty()))
    }

    /// Opens a model file in the mode its inode is already served in, or, for the inode's
    /// first open, passthrough if the file fits the budget ([`ModelStore::choose_mode`]).
    fn open_model(&self, ino: u64, model: OpenModel, reply: &ReplyOpen) -> Result<Opened, Errno> {
        let mut modes = lock(&self.open_modes);
        let mode = match modes.get(&ino) {
            Some((ServeMode::Passthrough, _)) => {
                self.store.force_passthrough(&model);
                ServeMode::Passthrough
            }
            Some((ServeMode::Cache, _)) => ServeMode::Cache,
            None => self.store.choose_mode(
                &model,
                self.settings.passthrough && self.settings.model_passthrough,
            ),
        };
        if mode == ServeMode::Passthrough {
            let backing = self.backing(ino, reply, || {
                #[cfg(target_os = "linux")]
                return model.source().reopen();
                #[cfg(not(target_os = "linux"))]
                return Err(io::ErrorKind::Unsupported.into());
            });
            match backing {
                Ok(backing) => {
                    modes.entry(ino).or_insert((mode, 0)).1 += 1;
                    let handle = Handle::ModelPassthrough(model, Arc::clone(&backing));
                    let fh = self.add_handle(handle);
                    return Ok(Opened::Passthrough(fh, backing));
                }
                Err(e) => {
                    tracing::info!(file = %model.path().display(), error = %e, "passthrough refused; serving from the cache");
                    self.store.close_passthrough(&model);
                    if modes.contains_key(&ino) {
                        return Err(Errno::EIO); // its other handles are passthrough
                    }
                    self.store.choose_mode(&model, false);
                }
            }
        }
        modes.entry(ino).or_insert((ServeMode::Cache, 0)).1 += 1;
        drop(modes);
        let flags = self.model_open_flags(ino, model.generation());
        let fh = self.add_handle(Handle::Model(model));
        Ok(Opened::Served(fh, flags))
    }

    /// The backing id of inode `ino`'s passthrough opens: the live one, or a new one made from
    /// the descriptor `open` gives.
    fn backing(
        &self,
        ino: u64,
        reply: &ReplyOpen,
        open: impl FnOnce() -> io::Result<File>,
    ) -> io::Result<Arc<BackingId>> {
        let mut backings = lock(&self.backings);
        if let Some(backing) = backings.get(&ino).and_then(Weak::upgrade) {
            return Ok(backing);
        }
        let backing = Arc::new(reply.open_backing(open()?)?);
        backings.retain(|_, b| b.strong_count() > 0);
        backings.insert(ino, Arc::downgrade(&backing));
        Ok(backing)
    }

    /// A handle of model inode `ino` closed.
    fn closed_model(&self, ino: u64, handle: &Handle) {
        if let Handle::ModelPassthrough(model, _) = handle {
            self.store.close_passthrough(model);
        }
        let mut modes = lock(&self.open_modes);
        if let Some((_, count)) = modes.get_mut(&ino) {
            *count -= 1;
            if *count == 0 {
                modes.remove(&ino);
            }
        }
    }

    /// Opens the control file: write-only, for the mounting user (or root).
    fn open_control(&self, req: &Request, flags: OpenFlags) -> Result<Opened, Errno> {
        if flags.acc_mode() != OpenAccMode::O_WRONLY {
            return Err(Errno::EACCES);
        }
        if req.uid() != self.uid && req.uid() != 0 {
            return Err(Errno::EACCES);
        }
        let fh = self.add_handle(Handle::Control);
        Ok(Opened::Served(fh, FopenFlags::FOPEN_DIRECT_IO))
    }

    /// Opens inode `ino` for `open`.
    fn open_ino(
        &self,
        req: &Request,
        ino: u64,
        flags: OpenFlags,
        reply: &ReplyOpen,
    ) -> Result<Opened, Errno> {
        if ino == CONTROL_INO {
            return self.open_control(req, flags);
        }
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return Err(Errno::EROFS);
        }
        match ino {
            CONTROL_DIR_INO => Err(Errno::EISDIR),
            STATS_INO => {
                let fh = self.add_handle(Handle::Stats(self.stats_json()));
                Ok(Opened::Served(fh, FopenFlags::FOPEN_DIRECT_IO))
            }
            ino => self.open_source(ino, self.act_for(req)?, reply),
        }
    }

    /// Carries out one control command; on error nothing has changed.
    fn run_control(&self, data: &[u8]) -> Result<(), String> {
        match control::parse(data).map_err(|e| e.to_string())? {
            // The budget goes through the governor, which also steers it under memory pressure.
            Command::RamCache(bytes) => {
                self.settings.governor.set_configured(bytes);
                tracing::info!(budget = bytes, "cache budget changed");
                Ok(())
            }
            command => control::apply(&self.store, &self.settings.source, command)
                .map_err(|e| e.to_string()),
        }
    }

    /// Model files are opened with `FOPEN_DIRECT_IO` where the kernel still allows `mmap` of
    /// such files (`FUSE_DIRECT_IO_ALLOW_MMAP`, Linux 6.6+): each `read()` then reaches the
    /// cache with the reader's own offsets and sizes, copied once, straight into the reader's
    /// buffer, with no page cache of the mounted file and no kernel readahead. Readahead would
    /// read past the end of what the reader asked for, into whatever block comes next *in the
    /// file*, which both blurs the block order tierfs learns and costs a disk read of a block
    /// the reader may not want; tierfs's own prefetch does the reading ahead instead. `mmap`
    /// readers still go through the page cache (kept to the window). Older kernels keep page
    /// cache mode.
    ///
    /// `FOPEN_KEEP_CACHE` is set when the inode's page cache was filled from this same file
    /// generation. Without it the kernel drops the inode's whole page cache at every open,
    /// waiting on each page still being read for an `mmap` reader, which then faults the pages
    /// it had just read in again (the stress test, with readers opening the same model every
    /// second or two, spent its disk bandwidth on that). When the generation changed (the file
    /// was rewritten in place), the flag is left out, so the stale pages go.
    fn model_open_flags(&self, ino: u64, generation: u64) -> FopenFlags {
        let previous = self
            .page_cache_generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ino, generation);
        let mut flags = if self.direct_io_mmap {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        if previous == Some(generation) {
            flags |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        flags
    }

    /// The bytes a `read` of handle `fh` answers, and whether they are a model file's (which the
    /// kernel may keep in the mounted file's page cache: see `read`).
    fn read_handle(
        &self,
        fh: FileHandle,
        offset: u64,
        size: u32,
    ) -> Result<(ReadBytes, bool), Errno> {
        match self.handle(fh)?.as_ref() {
            Handle::Model(model) => Ok((self.read_model(model.file(), offset, size)?, true)),
            Handle::Plain(file) => Ok((
                ReadBytes::Owned(pread_full(file, offset, size).map_err(errno)?),
                false,
            )),
            Handle::Stats(json) => {
                let start = (offset as usize).min(json.len());
                let end = start.saturating_add(size as usize).min(json.len());
                Ok((ReadBytes::Owned(json[start..end].to_vec()), false))
            }
            Handle::ModelPassthrough(..)
            | Handle::Passthrough(_)
            | Handle::Dir(_)
            | Handle::Control => Err(Errno::EBADF),
        }
    }

    /// Reads a model file through the cache.
    fn read_model(
        &self,
        model: &Arc<ModelFile>,
        offset: u64,
        size: u32,
    ) -> Result<ReadBytes, Errno> {
        let started = std::time::Instant::now();
        let result = self.store.read(model, offset, size);
        let elapsed = started.elapsed();
        if elapsed > SLOW_READ {
            tracing::warn!(file = %model.path().display(), offset, size, ms = elapsed.as_millis() as u64, "slow read");
        }
        result.map_err(|e| {
            tracing::warn!(file = %model.path().display(), offset, size, error = %e, "read failed: returning EIO");
            Errno::EIO
        })
    }

    /// The SOURCE path behind `ino`, if it is a regular file there ([`SOURCE_XATTR`]). On a
    /// shared mount, only for a requester who can open that file itself: the path is of no use
    /// to anyone else, and tells them where private files live.
    fn source_path(&self, ino: u64, acting: &Acting) -> Result<PathBuf, Errno> {
        let entry = self.inodes.entry(ino).ok_or(Errno::ENODATA)?;
        let (abs, reach) = (self.abs(&entry.path), self.reach(&entry.path, acting));
        match present_as(&reach, acting.follow_links()) {
            Ok((_, FileType::RegularFile, _)) => {}
            Ok(_) => return Err(Errno::ENODATA),
            Err(e) => return Err(errno(e)),
        }
        if self.access.sharing().is_shared() {
            open_for_request(&reach, acting.follow_links()).map_err(|_| Errno::ENODATA)?;
        }
        Ok(abs)
    }

    fn list_dir(&self, ino: u64, acting: &Acting) -> Result<Vec<(u64, FileType, OsString)>, Errno> {
        let mut entries = vec![
            (ino, FileType::Directory, OsString::from(".")),
            (ino, FileType::Directory, OsString::from("..")),
        ];
        if ino == CONTROL_DIR_INO {
            entries.push((STATS_INO, FileType::RegularFile, "stats".into()));
            entries.push((CONTROL_INO, FileType::RegularFile, "control".into()));
            return Ok(entries);
        }
        let rel = self.inodes.entry(ino).ok_or(Errno::ENOENT)?.path;
        if ino == ROOT_INO {
            entries.push((CONTROL_DIR_INO, FileType::Directory, CONTROL_DIR.into()));
        }
        for entry in std::fs::read_dir(self.reach(&rel, acting)).map_err(errno)? {
            let entry = entry.map_err(errno)?;
            let name = entry.file_name();
            if ino == ROOT_INO && name == CONTROL_DIR {
                continue; // hidden by the control directory
            }
            let Ok((ino, attr, _)) = self.lookup_source(&rel.join(&name), acting) else {
                continue; // vanished since read_dir listed it
            };
            entries.push((ino, attr.kind, name));
        }
        Ok(entries)
    }
}

impl Filesystem for TierFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Large reads: the kernel may send up to max_pages (1 MiB) per request.
        let _ = config.set_max_readahead(crate::mount::KERNEL_READAHEAD_BYTES);
        self.direct_io_mmap = config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_ok();
        if self.settings.passthrough {
            let enabled = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if !enabled {
                tracing::info!(
                    "the kernel does not offer FUSE passthrough: other files are served with pread"
                );
                self.settings.passthrough = false;
            }
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.ops().time(Op::Lookup, || {
            self.act_for(req)
                .and_then(|acting| self.child(parent.0, name, &acting))
        });
        match found {
            Ok((attr, ttl)) => reply.entry(&ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let found = self.ops().time(Op::Getattr, || {
            self.act_for(req)
                .and_then(|acting| self.attr(ino.0, &acting))
        });
        match found {
            Ok((attr, ttl)) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let target = self.act_for(req).and_then(|acting| {
            let entry = self.inodes.entry(ino.0).ok_or(Errno::ENOENT)?;
            std::fs::read_link(self.reach(&entry.path, &acting)).map_err(errno)
        });
        match target {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self
            .ops()
            .time(Op::Open, || self.open_ino(req, ino.0, flags, &reply))
        {
            Ok(Opened::Served(fh, flags)) => reply.opened(FileHandle(fh), flags),
            Ok(Opened::Passthrough(fh, backing)) => {
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &backing)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let served = self
            .ops()
            .time(Op::Read, || self.read_handle(fh, offset, size));
        let (bytes, model) = match served {
            Ok(served) => served,
            Err(e) => return reply.error(e),
        };
        reply.data(&bytes);
        // Which reads fill the mounted file's page cache: with `FOPEN_DIRECT_IO`, a `read()`
        // goes straight into the reader's buffer, and only `mmap` faults (kernel readahead)
        // land in the page cache. The kernel tells them apart for us: direct reads carry the
        // reader's lock owner (`fuse_direct_io` passes `current->files`), readahead requests
        // never do. Recording direct reads in the window would only cost a needless page-cache
        // invalidation per range: about 15 % of warm `read()` throughput when measured.
        let into_page_cache = !(self.direct_io_mmap && lock_owner.is_some());
        if model && into_page_cache {
            for range in self.window.record(ino.0, offset, bytes.len() as u64) {
                // The notifier thread only stops when the mount does.
                let _ = self.invalidations.send(range);
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let handle = self.lock_handles().remove(&fh.0);
        if let Some(handle) = handle {
            if matches!(*handle, Handle::Model(_) | Handle::ModelPassthrough(..)) {
                self.closed_model(ino.0, &handle);
            }
        }
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok() // nothing is ever buffered for writing
    }

    fn getxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: fuser::ReplyXattr,
    ) {
        if name != OsStr::new(SOURCE_XATTR) {
            return reply.error(Errno::ENODATA);
        }
        let path = self
            .act_for(req)
            .and_then(|acting| self.source_path(ino.0, &acting));
        match path {
            Ok(path) => reply_xattr(reply, size, path.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        let path = self
            .act_for(req)
            .and_then(|acting| self.source_path(ino.0, &acting));
        let names = match path {
            Ok(_) => format!("{SOURCE_XATTR}\0").into_bytes(),
            Err(_) => Vec::new(),
        };
        reply_xattr(reply, size, &names)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let listed = self.ops().time(Op::Readdir, || {
            self.act_for(req)
                .and_then(|acting| self.list_dir(ino.0, &acting))
        });
        match listed {
            Ok(entries) => {
                let fh = self.add_handle(Handle::Dir(entries));
                reply.opened(FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let handle = match self.handle(fh) {
            Ok(handle) => handle,
            Err(e) => return reply.error(e),
        };
        let Handle::Dir(entries) = handle.as_ref() else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.lock_handles().remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match statvfs(&self.settings.source) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    // Every way of changing anything: read-only.

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // `echo drop > control` opens with O_TRUNC, which the kernel sends as a size-0 setattr.
        if ino.0 == CONTROL_INO
            && size == Some(0)
            && mode.is_none()
            && uid.is_none()
            && gid.is_none()
        {
            return reply.attr(
                &ATTR_TTL,
                &self.virtual_attr(CONTROL_INO, FileType::RegularFile, 0o200, 0),
            );
        }
        reply.error(Errno::EROFS)
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS)
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS)
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS)
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS)
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS)
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS)
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS)
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let is_control = self
            .handle(fh)
            .is_ok_and(|h| matches!(h.as_ref(), Handle::Control));
        if ino.0 != CONTROL_INO || !is_control {
            return reply.error(Errno::EROFS);
        }
        match self.run_control(data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(reason) => {
                tracing::warn!(command = %String::from_utf8_lossy(&data[..data.len().min(200)]).trim(), %reason, "control command refused");
                reply.error(Errno::EINVAL)
            }
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if mask.contains(fuser::AccessFlags::W_OK) && ino.0 != CONTROL_INO {
            return reply.error(Errno::EROFS);
        }
        reply.ok()
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(Errno::EROFS)
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS)
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS)
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS)
    }
}

/// A name from the kernel as a single relative path component (never `..`, `.` or a path).
fn plain_name(name: &OsStr) -> Result<&Path, Errno> {
    let path = Path::new(name);
    let mut components = path.components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(_)), None) if !name.as_bytes().contains(&b'/') => Ok(path),
        _ => Err(Errno::ENOENT),
    }
}

/// The source object a presented entry stands for.
fn object_id(meta: &std::fs::Metadata) -> inodes::ObjectId {
    (meta.dev(), meta.ino())
}

fn source_attr(ino: u64, meta: &std::fs::Metadata, kind: FileType) -> FileAttr {
    let time = |secs: i64, nsecs: i64| {
        if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
        } else {
            UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
        }
    };
    FileAttr {
        ino: INodeNo(ino),
        size: meta.size(),
        blocks: meta.blocks(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        crtime: time(meta.mtime(), meta.mtime_nsec()),
        kind,
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: meta.rdev() as u32,
        blksize: meta.blksize() as u32,
        flags: 0,
    }
}

/// Answers a getxattr/listxattr request for `value`: its size when asked (`size == 0`), else
/// the value, or `ERANGE` if it does not fit the caller's buffer.
fn reply_xattr(reply: fuser::ReplyXattr, size: u32, value: &[u8]) {
    match u32::try_from(value.len()) {
        Ok(len) if size == 0 => reply.size(len),
        Ok(len) if len <= size => reply.data(value),
        _ => reply.error(Errno::ERANGE),
    }
}

fn pread_full(file: &File, offset: u64, size: u32) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize];
    let filled = read_full_at(file, &mut buf, offset).map_err(|(_, e)| e)?;
    buf.truncate(filled);
    Ok(buf)
}

fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut out = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is a valid NUL-terminated string and `out` is a valid statvfs buffer.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), out.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `out`.
    Ok(unsafe { out.assume_init() })
}

/// The errno for a model file that could not be opened: the OS's own (EACCES, ENOENT…) when
/// opening failed, EIO when reading its header did.
fn open_errno(e: &OpenError) -> Errno {
    match e {
        OpenError::Source(SourceError::Open { source, .. }) => match source.raw_os_error() {
            Some(code) if code > 0 => Errno::from_i32(code),
            _ => Errno::EIO,
        },
        // Replaced between the requester's open and the store's: the kernel looks it up again.
        OpenError::Source(SourceError::Changed { .. }) => Errno::ESTALE,
        OpenError::Source(_) => Errno::EIO,
    }
}

/// An OS error as an errno for the kernel (EIO when it carries none).
fn errno(e: io::Error) -> Errno {
    match e.raw_os_error() {
        Some(code) if code > 0 => Errno::from_i32(code),
        _ => Errno::EIO,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
