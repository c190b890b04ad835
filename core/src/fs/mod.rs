//! The filesystem of a tierfs mount, free of any kernel interface: requests in as plain values
//! (inode numbers, names, a [`Requester`]), answers out as plain values ([`Attr`],
//! [`Opened`], bytes) or an [`FsError`], which [`FsError::errno`] turns into the errno in one
//! place. The FUSE adapter (`fs/src/fuse`) only translates between these and `fuser`; a second
//! front end would do the same against its own kernel interface.
//!
//! What this type owns:
//! - **Inodes** ([`inodes`]): one number per source object, derived from its device and inode
//!   number in SOURCE (so stable for the mount, shared by hard links), counted references from
//!   the kernel's lookups, pruned at `forget` / last release.
//! - **Handles**: one per `open`/`opendir`, dropped at `release`/`releasedir`.
//! - **The open policy** ([`open`](TierFs::open)):
//!   - model files (`.safetensors`, `.sft`, `.gguf`) are served from the chunk cache, or, when
//!     the file fits the budget, handed to the kernel with FUSE passthrough
//!     ([`crate::passthrough`]). Cache-served model files are opened with `direct_io` where
//!     the kernel allows `mmap` of such files, with `keep_cache` when the inode's page cache
//!     holds the same file generation (see `model_open_flags`). Every range a model read puts
//!     in the kernel's page cache is recorded in a [`KernelCacheWindow`]; the ranges that fall
//!     out of it go to the front end's invalidation queue (never invalidated on a request
//!     thread, which could deadlock against a read holding the same pages locked). The page
//!     cache is shared by all handles of the inode, so it holds one version: a fill through a
//!     handle whose file was rewritten in place since it opened is the file as it is now, read
//!     uncached (never the old version's in-memory header over the new data).
//!   - other files go to the kernel with passthrough (Linux ≥ 6.9, root) where available,
//!     else they are served with plain `pread`. The front end makes the kernel's backing object
//!     (a callback of [`open`](TierFs::open)): this type only decides and keeps it alive (one
//!     per inode, as the kernel wants: a second backing id for an inode fails the open with
//!     EIO) until the last handle using it is released.
//! - **`.tierfs/stats`**, rendered at open (by the front end's [`RenderStats`]) and served with
//!   `direct_io`, so every open sees fresh figures whatever size `stat` reported.
//! - **`.tierfs/control`** (mode 0200, the mounting user's) takes one command per `write()`
//!   ([`crate::control`]); a bad one fails with `EINVAL` and changes nothing.
//! - **[`SOURCE_XATTR`]**, an extended attribute of every regular file naming the SOURCE file
//!   behind it, for tools that must bypass FUSE (`tierfs-gpu`).
//! - **Read-only**: every write path is refused with `EROFS` ([`FsError::ReadOnly`]); the mount
//!   cannot carry the kernel's `ro` flag since the control file must be writable.
//!
//! Attribute and entry timeouts are [`FsConfig::attr_ttl`] ([`ATTR_TTL`] by default), which is what bounds how long a change in
//! SOURCE takes to show through the mount.
//!
//! **Shared mounts** (`--allow-other`): every source access made for a request runs under
//! [`AccessRule::act_for`] ([`crate::access`]): with the requester's credentials for a root
//! daemon, without following links for other users otherwise. A link presented as its target
//! gets a zero timeout there, since the kernel's entry and attribute caches are shared by all
//! users and the next user may not be able to reach the target.
//!
//! **Locks.** No lock of this module is held across I/O on the source or an ioctl, except an
//! inode's own open gate (`open_gates`), which orders the opens of that one inode while its
//! mode is chosen and its passthrough backing opened: a source that stalls on one file stalls
//! only the opens of that file. The gate may be held while taking the tables' locks
//! (`open_modes`, `backings`, the store's); those are leaves, held for bookkeeping only. In the
//! store, the same holds for sharded models: a directory's discovery runs under that
//! directory's gate only (`crate::models::shards::Registry`). Gates are [`crate::sync::Gates`],
//! model-checked with loom.

pub mod attr;
mod config;
pub mod error;
mod handles;
pub mod inodes;
mod open;
mod platform;
pub mod present;
mod read;
mod source_tree;
// Linux only: the model of SOURCE makes symbolic links (a privilege on Windows), keeps
// objects alive with `O_PATH` and checks errnos.
#[cfg(test)]
#[cfg(target_os = "linux")]
mod reference_tests;
#[cfg(test)]
mod remote_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use crossbeam::channel::Sender;

use crate::budget::Governor;
use crate::control::{self, Command};
use crate::kernel_cache::{InodeRange, KernelCacheWindow};
use crate::models::{ModelStore, ServeMode};
use crate::stats::ops::{Op, OpStats};
use crate::sync::{lock, Mutex};

pub use attr::{Attr, Kind};
pub use config::{FsConfig, ATTR_TTL};
pub use error::FsError;
use handles::{Handle, Handles};
use inodes::Inodes;
pub use inodes::{CONTROL_DIR_INO, CONTROL_INO, METRICS_INO, ROOT_INO, STATS_INO};
pub use open::{OpenFlags, Opened};
pub use platform::{oflag, AccessError, Sharing};
use platform::{AccessRule, Acting, SourceRoot};
use present::{present_as, present_object};
pub use read::ReadKind;
pub use source_tree::{RemoteEntry, RemoteTree, SourceMeta, SourceTree};

/// Name of the control directory at the mount root.
pub const CONTROL_DIR: &str = ".tierfs";

/// Extended attribute of every regular file of the mount: the absolute path of the SOURCE file
/// it presents. For tools that must read the source itself (`tierfs-gpu`: GPUDirect Storage
/// cannot read through FUSE). Directories, links and `.tierfs/` files have none (`ENODATA`).
pub const SOURCE_XATTR: &str = "user.tierfs.source";

/// What the filesystem needs to know of its mount.
pub struct Settings {
    pub source: PathBuf,
    /// Whether the kernel serves passthrough opens (may be turned off once the kernel's
    /// capabilities are known: [`TierFs::kernel_capabilities`]).
    pub passthrough: bool,
    /// Who may use the mount besides the mounting user (see [`crate::access`]).
    pub sharing: Sharing,
    /// Whether model files that fit the budget may be served by passthrough.
    pub model_passthrough: bool,
    /// Steers the cache budget under memory pressure ([`crate::budget`]).
    pub governor: Arc<Governor>,
    /// SOURCE's tree when it is remote (an object store; `source` is then its URL); `None`:
    /// `source` is a local directory.
    pub remote: Option<Arc<dyn RemoteTree>>,
}

/// What the kernel offered at mount time ([`TierFs::kernel_capabilities`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelCapabilities {
    /// `mmap` of `direct_io` files (`FUSE_DIRECT_IO_ALLOW_MMAP`): see `model_open_flags`.
    pub direct_io_mmap: bool,
    /// Passthrough opens (when off, other files are served with `pread`).
    pub passthrough: bool,
}

/// Who makes a request: the kernel's uid, gid and pid of the calling process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requester {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// What the stats document is made from; the front end renders it (its document may carry
/// what only it knows, such as which privileged modes are in force).
pub struct StatsView<'a> {
    pub store: &'a ModelStore,
    pub window: &'a KernelCacheWindow,
    pub source: &'a Path,
    pub passthrough: bool,
    pub started: SystemTime,
    pub governor: &'a Governor,
    /// Inodes the filesystem holds (the root included) and handles open.
    pub inodes: usize,
    pub handles: usize,
    /// The remote source's client figures (`None` for a folder).
    pub remote: Option<crate::stats::RemoteSourceSnapshot>,
}

/// Renders `.tierfs/stats` (JSON bytes), or `.tierfs/metrics` (text).
pub type RenderStats = Box<dyn Fn(&StatsView) -> Vec<u8> + Send + Sync>;

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: OsString,
}

/// The answer to a getxattr/listxattr: the value's size (the caller asked with size 0), or the
/// value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// File system figures for `statfs` (those of SOURCE's file system).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// A `setattr` request, reduced to what decides the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetAttr {
    /// The new size, if the request changes it.
    pub size: Option<u64>,
    /// Whether it also changes mode or owner.
    pub changes_mode_or_owner: bool,
}

/// The filesystem of one mount. `B` is the front end's kernel backing object for passthrough
/// opens (FUSE's `BackingId`); this type keeps each alive while a handle uses it.
pub struct TierFs<B> {
    settings: Settings,
    config: FsConfig,
    /// Whose credentials each source access of a request runs with ([`crate::access`]).
    access_rule: AccessRule,
    /// SOURCE, as every path below it is reached.
    source: SourceTree,
    store: Arc<ModelStore>,
    inodes: Inodes,
    handles: Handles<B>,
    window: Arc<KernelCacheWindow>,
    invalidations: Sender<InodeRange>,
    render_stats: RenderStats,
    /// Renders `.tierfs/metrics`; without it the file does not exist.
    render_metrics: Option<RenderStats>,
    started: SystemTime,
    uid: u32,
    gid: u32,
    /// The kernel allows mmap of `direct_io` files (see `model_open_flags`).
    direct_io_mmap: bool,
    /// Per model inode, the file generation its kernel page cache was last opened with (see
    /// `model_open_flags`).
    page_cache_generations: Mutex<HashMap<u64, u64>>,
    /// Per inode, the backing object of its passthrough opens (see the module docs).
    backings: Mutex<HashMap<u64, Weak<B>>>,
    /// Per model inode with open handles, the mode they are served in and how many there are:
    /// the kernel cannot mix cached and passthrough opens of one inode (the second kind fails
    /// with EIO, `mmap` with ENODEV), so a mode holds until the inode's last handle closes.
    /// Held only to read or update an entry, never across I/O.
    open_modes: Mutex<HashMap<u64, (ServeMode, usize)>>,
    /// Per model inode, the gate its opens pass one at a time while its mode is chosen and its
    /// backing file opened (I/O on the source, which may stall): opens of other inodes never
    /// wait for it.
    open_gates: crate::sync::Gates<u64>,
}

impl<B: Send + Sync> TierFs<B> {
    /// The filesystem of a mount of `settings.source`, which is opened now (and held open).
    pub fn new(
        settings: Settings,
        store: Arc<ModelStore>,
        window: Arc<KernelCacheWindow>,
        invalidations: Sender<InodeRange>,
        render_stats: RenderStats,
    ) -> std::io::Result<TierFs<B>> {
        let (uid, gid) = platform::daemon_ids();
        let source = match settings.remote.clone() {
            Some(tree) => SourceTree::Remote(tree),
            None => SourceTree::Local(Arc::new(SourceRoot::open(&settings.source)?)),
        };
        let source_dev = source
            .stat(Path::new(""), true)?
            .object_id(&settings.source, Kind::Directory)?
            .dev;
        store.reach_source_through(source.path_access());
        Ok(TierFs {
            access_rule: AccessRule::new(settings.sharing),
            source,
            settings,
            config: FsConfig::default(),
            store,
            inodes: Inodes::new(source_dev),
            handles: Handles::default(),
            window,
            invalidations,
            render_stats,
            render_metrics: None,
            started: SystemTime::now(),
            uid,
            gid,
            direct_io_mmap: false,
            page_cache_generations: Mutex::new(HashMap::new()),
            backings: Mutex::new(HashMap::new()),
            open_modes: Mutex::new(HashMap::new()),
            open_gates: crate::sync::Gates::new(),
        })
    }

    /// The same filesystem with `config` in place of [`FsConfig::default`].
    pub fn with_config(mut self, config: FsConfig) -> TierFs<B> {
        self.config = config;
        self
    }

    /// SOURCE, as every path below it is reached ([`SourceTree`]).
    pub fn source(&self) -> &SourceTree {
        &self.source
    }

    /// Where the mount's device number goes once mounted, so that resolving a local SOURCE
    /// never enters the mount (a remote SOURCE resolves nothing locally).
    #[cfg(target_os = "linux")]
    pub fn served_device(&self) -> crate::access::ServedDevice {
        match &self.source {
            SourceTree::Local(root) => root.served_device(),
            SourceTree::Remote(_) => crate::access::ServedDevice::default(),
        }
    }

    /// What the kernel offered at mount time ([`KernelCapabilities`]).
    pub fn kernel_capabilities(&mut self, offered: KernelCapabilities) {
        self.direct_io_mmap = offered.direct_io_mmap;
        self.settings.passthrough &= offered.passthrough;
    }

    /// Whether passthrough opens are in force.
    pub fn passthrough(&self) -> bool {
        self.settings.passthrough
    }

    /// The model store behind the mount.
    pub fn store(&self) -> &Arc<ModelStore> {
        &self.store
    }

    /// How many inodes the filesystem holds (the root included), for tests and stats.
    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    /// How many handles are open.
    pub fn handle_count(&self) -> usize {
        self.handles.len()
    }

    /// `lookup`: the entry `name` in directory `parent`, with how long the kernel may keep it.
    /// On success the kernel holds one more reference to the inode, given back by
    /// [`forget`](Self::forget).
    pub fn lookup(
        &self,
        req: Requester,
        parent: u64,
        name: &OsStr,
    ) -> Result<(Attr, Duration), FsError> {
        self.ops().time(Op::Lookup, || {
            let acting = self.act_for(req)?;
            self.child(parent, name, &acting)
        })
    }

    /// `getattr`.
    pub fn getattr(&self, req: Requester, ino: u64) -> Result<(Attr, Duration), FsError> {
        self.ops().time(Op::Getattr, || {
            let acting = self.act_for(req)?;
            self.attr(ino, &acting)
        })
    }

    /// `forget`: the kernel dropped `count` references to `ino`. The inode goes once no
    /// reference and no handle is left (see [`inodes`]).
    pub fn forget(&self, ino: u64, count: u64) {
        if self.inodes.forget(ino, count) {
            self.pruned(ino);
        }
    }

    /// `readlink`.
    pub fn readlink(&self, req: Requester, ino: u64) -> Result<PathBuf, FsError> {
        let acting = self.act_for(req)?;
        let entry = self.inodes.entry(ino).ok_or(FsError::NotFound)?;
        let path = self.live_path(&entry, acting.follow_links());
        self.check_acl(&path, &acting)?;
        self.source
            .read_link(&path, acting.follow_links())
            .map_err(FsError::io("readlink"))
    }

    /// `opendir`: lists the directory now; [`readdir`](Self::readdir) pages through that list.
    pub fn opendir(&self, req: Requester, ino: u64) -> Result<u64, FsError> {
        let (entries, numbered) = self.ops().time(Op::Readdir, || {
            let acting = self.act_for(req)?;
            self.list_dir(ino, &acting)
        })?;
        Ok(self.add_handle(ino, Handle::Dir(entries, numbered)))
    }

    /// `readdir`: the entries of listing `fh` from `offset` on, each given to `add` with the
    /// offset of the entry after it, until `add` says the reply is full (returns true).
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(&DirEntry, u64) -> bool,
    ) -> Result<(), FsError> {
        let handle = self.handles.get(fh)?;
        let Handle::Dir(entries, _) = &handle.kind else {
            return Err(FsError::BadHandle);
        };
        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
            if add(entry, i as u64 + 1) {
                break;
            }
        }
        Ok(())
    }

    /// `releasedir`.
    pub fn releasedir(&self, fh: u64) {
        self.release(fh);
    }

    /// `getxattr`: only [`SOURCE_XATTR`] exists. `size` is the caller's buffer (0: asks the
    /// value's size).
    pub fn getxattr(
        &self,
        req: Requester,
        ino: u64,
        name: &OsStr,
        size: u32,
    ) -> Result<Xattr, FsError> {
        if name != OsStr::new(SOURCE_XATTR) {
            return Err(FsError::NoAttribute);
        }
        let acting = self.act_for(req)?;
        let path = self.source_path(ino, &acting)?;
        xattr_reply(size, &platform::path_bytes(&path))
    }

    /// `listxattr`.
    pub fn listxattr(&self, req: Requester, ino: u64, size: u32) -> Result<Xattr, FsError> {
        let has_source = self
            .act_for(req)
            .and_then(|acting| self.source_path(ino, &acting))
            .is_ok();
        let names = match has_source {
            true => format!("{SOURCE_XATTR}\0").into_bytes(),
            false => Vec::new(),
        };
        xattr_reply(size, &names)
    }

    /// `statfs`: the figures of SOURCE's file system.
    pub fn statfs(&self) -> Result<StatFs, FsError> {
        match &self.source {
            SourceTree::Local(_) => platform::statfs(&self.settings.source),
            SourceTree::Remote(tree) => tree.statfs(),
        }
        .map_err(FsError::io("statfs"))
    }

    /// `setattr`: refused (read-only), except the size-0 truncation `echo cmd > control` makes
    /// (`O_TRUNC` arrives as a setattr), which changes nothing.
    pub fn setattr(&self, ino: u64, change: SetAttr) -> Result<(Attr, Duration), FsError> {
        if ino == CONTROL_INO && change.size == Some(0) && !change.changes_mode_or_owner {
            return Ok((
                self.virtual_attr(CONTROL_INO, Kind::File, 0o200),
                self.config.attr_ttl,
            ));
        }
        Err(FsError::ReadOnly)
    }

    /// The `access` operation (`access(2)` through the mount): writing is refused everywhere
    /// but the control file; reading is checked by the kernel (`default_permissions`) and by
    /// the open itself. (Who may reach what in SOURCE is [`AccessRule`]'s, [`crate::access`].)
    pub fn access(&self, ino: u64, write: bool) -> Result<(), FsError> {
        if write && ino != CONTROL_INO {
            return Err(FsError::ReadOnly);
        }
        Ok(())
    }

    /// `write`: only a control command, to a control handle; returns the bytes taken.
    pub fn write(&self, ino: u64, fh: u64, data: &[u8]) -> Result<usize, FsError> {
        let is_control = self
            .handles
            .get(fh)
            .is_ok_and(|h| matches!(h.kind, Handle::Control));
        if ino != CONTROL_INO || !is_control {
            return Err(FsError::ReadOnly);
        }
        self.run_control(data).inspect_err(|reason| {
            let command = String::from_utf8_lossy(&data[..data.len().min(200)]);
            tracing::warn!(command = %command.trim(), %reason, "control command refused");
        })?;
        Ok(data.len())
    }

    /// The per-operation figures (`ops` in the stats).
    fn ops(&self) -> &OpStats {
        &self.store.counters().ops
    }

    fn abs(&self, rel: &Path) -> PathBuf {
        self.settings.source.join(rel)
    }

    /// Refuses `rel` to a request served with the daemon's own rights for another user (a
    /// non-root daemon with `--allow-other`) when a POSIX ACL lies on the way: the kernel's
    /// `default_permissions` check of the presented path knows only mode bits, and an ACL may
    /// deny what they allow (see [`crate::access`]).
    fn check_acl(&self, rel: &Path, acting: &Acting) -> Result<(), FsError> {
        if !platform::is_unswitched_other(acting) {
            return Ok(());
        }
        match self.source.acl_on_path(rel) {
            Ok(false) => Ok(()),
            Ok(true) => Err(FsError::Denied(
                "a POSIX ACL lies on the way, which this daemon cannot check for other users",
            )),
            Err(e) => Err(FsError::io("getxattr")(e)),
        }
    }

    /// Starts serving `req` under the access rule.
    fn act_for(&self, req: Requester) -> Result<Acting, FsError> {
        self.access_rule
            .act_for(req.uid, req.gid, req.pid)
            .map_err(|e| {
                tracing::warn!(error = %e, pid = req.pid, "request refused");
                FsError::Refused(e)
            })
    }

    /// Serves `.tierfs/metrics` (beside the stats, under the same access rule), rendered by
    /// `render` from the same figures.
    pub fn with_metrics(mut self, render: RenderStats) -> TierFs<B> {
        self.render_metrics = Some(render);
        self
    }

    fn stats_json(&self) -> Vec<u8> {
        (self.render_stats)(&self.stats_view())
    }

    /// `.tierfs/metrics`, if this front end serves it.
    fn metrics_text(&self) -> Option<Vec<u8>> {
        let render = self.render_metrics.as_ref()?;
        Some(render(&self.stats_view()))
    }

    fn stats_view(&self) -> StatsView<'_> {
        StatsView {
            store: &self.store,
            window: &self.window,
            source: &self.settings.source,
            passthrough: self.settings.passthrough,
            started: self.started,
            governor: &self.settings.governor,
            inodes: self.inodes.len(),
            handles: self.handles.len(),
            remote: match &self.source {
                SourceTree::Remote(tree) => Some(tree.stats()),
                SourceTree::Local(_) => None,
            },
        }
    }

    /// The attributes of inode `ino`, a source path or a virtual file, and how long the kernel
    /// may keep them.
    fn attr(&self, ino: u64, acting: &Acting) -> Result<(Attr, Duration), FsError> {
        let virtual_attr =
            |kind, perm| Ok((self.virtual_attr(ino, kind, perm), self.config.attr_ttl));
        match ino {
            CONTROL_DIR_INO => virtual_attr(Kind::Directory, 0o555),
            // The mounting user's (and root's) alone: it names every model anyone opened.
            STATS_INO => virtual_attr(Kind::File, 0o400),
            METRICS_INO if self.render_metrics.is_some() => virtual_attr(Kind::File, 0o400),
            METRICS_INO => Err(FsError::NotFound),
            CONTROL_INO => virtual_attr(Kind::File, 0o200),
            _ => self.source_attr(ino, acting),
        }
    }

    /// How long the kernel may keep an entry or its attributes: not at all for a link shown as
    /// its target on a shared mount (see the module docs).
    fn ttl(&self, via_link: bool) -> Duration {
        if via_link && self.access_rule.sharing().is_shared() {
            Duration::ZERO
        } else {
            self.config.attr_ttl
        }
    }

    /// Attributes of a source inode. An inode whose path now holds another object (the file was
    /// replaced or deleted) keeps answering with its last attributes: the kernel may still have
    /// it open, and must not shrink or refill an old mapping from the new file.
    fn source_attr(&self, ino: u64, acting: &Acting) -> Result<(Attr, Duration), FsError> {
        let entry = self.inodes.entry(ino).ok_or(FsError::NotFound)?;
        let path = self.live_path(&entry, acting.follow_links());
        self.check_acl(&path, acting)?;
        match present_object(&self.source, &path, acting.follow_links()) {
            Ok((object, meta, kind, via_link)) if entry.object.is_none_or(|o| o == object) => {
                let attr = meta.attr(ino, kind);
                self.inodes.remember(ino, attr);
                Ok((attr, self.ttl(via_link)))
            }
            Ok(_) => entry
                .attr
                .map(|a| (a, self.ttl(true)))
                .ok_or(FsError::Stale),
            Err(e) => match entry.attr {
                Some(attr) if e.kind() == std::io::ErrorKind::NotFound => {
                    Ok((attr, self.ttl(true)))
                }
                _ => Err(FsError::io("stat")(e)),
            },
        }
    }

    /// The path of `entry` to reach its object by: of the paths it was met at (hard links have
    /// several, see [`inodes`]), the most recent one that still presents the object, else the
    /// most recent one.
    fn live_path(&self, entry: &inodes::Entry, follow_links: bool) -> PathBuf {
        let (Some(object), [first, _, ..]) = (entry.object, entry.paths.as_slice()) else {
            return entry.path().to_owned();
        };
        let presents = |path: &&PathBuf| {
            present_object(&self.source, path, follow_links).is_ok_and(|(o, ..)| o == object)
        };
        entry.paths.iter().find(presents).unwrap_or(first).clone()
    }

    /// Looks `rel` up in SOURCE: the object there, presented, and its entry's timeout.
    fn present(&self, rel: &Path, acting: &Acting) -> Result<(ObjectAttr, Duration), FsError> {
        let (object, meta, kind, via_link) =
            present_object(&self.source, rel, acting.follow_links())
                .map_err(FsError::io("lookup"))?;
        let attr = meta.attr(0, kind);
        Ok(((object, attr), self.ttl(via_link)))
    }

    fn virtual_attr(&self, ino: u64, kind: Kind, perm: u16) -> Attr {
        Attr {
            ino,
            generation: 0,
            size: 0,
            blocks: 0,
            atime: self.started,
            mtime: SystemTime::now(),
            ctime: SystemTime::now(),
            crtime: self.started,
            kind,
            perm,
            nlink: if kind == Kind::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
        }
    }

    fn child(
        &self,
        parent: u64,
        name: &OsStr,
        acting: &Acting,
    ) -> Result<(Attr, Duration), FsError> {
        if parent == ROOT_INO && name == CONTROL_DIR {
            return self.attr(CONTROL_DIR_INO, acting);
        }
        if parent == CONTROL_DIR_INO {
            return match name.to_str() {
                Some("stats") => self.attr(STATS_INO, acting),
                Some("metrics") => self.attr(METRICS_INO, acting),
                Some("control") => self.attr(CONTROL_INO, acting),
                _ => Err(FsError::NotFound),
            };
        }
        let parent = self.inodes.entry(parent).ok_or(FsError::NotFound)?;
        let rel = self
            .live_path(&parent, acting.follow_links())
            .join(plain_name(name)?);
        self.check_acl(&rel, acting)?;
        let ((object, attr), ttl) = self.present(&rel, acting)?;
        let ino = self.inodes.looked_up(&rel, object, attr);
        Ok((Attr { ino, ..attr }, ttl))
    }

    /// Lists directory `ino`; also returns the inodes the listing numbered that no lookup
    /// holds (pruned again when the listing is released).
    fn list_dir(&self, ino: u64, acting: &Acting) -> Result<(Vec<DirEntry>, Vec<u64>), FsError> {
        let entry = |ino, kind, name: &str| DirEntry {
            ino,
            kind,
            name: name.into(),
        };
        let mut entries = vec![
            entry(ino, Kind::Directory, "."),
            entry(ino, Kind::Directory, ".."),
        ];
        if ino == CONTROL_DIR_INO {
            entries.push(entry(STATS_INO, Kind::File, "stats"));
            entries.push(entry(CONTROL_INO, Kind::File, "control"));
            if self.render_metrics.is_some() {
                entries.push(entry(METRICS_INO, Kind::File, "metrics"));
            }
            return Ok((entries, Vec::new()));
        }
        let dir = self.inodes.entry(ino).ok_or(FsError::NotFound)?;
        let rel = self.live_path(&dir, acting.follow_links());
        if ino == ROOT_INO {
            entries.push(entry(CONTROL_DIR_INO, Kind::Directory, CONTROL_DIR));
        }
        self.check_acl(&rel, acting)?;
        let mut numbered = Vec::new();
        let listing = self
            .source
            .list_dir(&rel, acting.follow_links())
            .map_err(FsError::io("readdir"))?;
        for name in listing {
            if ino == ROOT_INO && name == CONTROL_DIR {
                continue; // hidden by the control directory
            }
            let path = rel.join(&name);
            let Ok(((object, attr), _)) = self.present(&path, acting) else {
                continue; // vanished since read_dir listed it
            };
            let (child, new) = self.inodes.ino_of(&path, object, attr);
            if new {
                numbered.push(child);
            }
            entries.push(DirEntry {
                ino: child,
                kind: attr.kind,
                name,
            });
        }
        Ok((entries, numbered))
    }

    /// The SOURCE path behind `ino`, if it is a regular file there ([`SOURCE_XATTR`]). On a
    /// shared mount, only for a requester who can open that file itself: the path is of no use
    /// to anyone else, and tells them where private files live.
    fn source_path(&self, ino: u64, acting: &Acting) -> Result<PathBuf, FsError> {
        let entry = self.inodes.entry(ino).ok_or(FsError::NoAttribute)?;
        let follow = acting.follow_links();
        let path = self.live_path(&entry, follow);
        self.check_acl(&path, acting)?;
        match present_as(&self.source, &path, follow) {
            Ok((_, Kind::File, _)) => {}
            Ok(_) => return Err(FsError::NoAttribute),
            Err(e) => return Err(FsError::io("getxattr")(e)),
        }
        if self.access_rule.sharing().is_shared() {
            self.source
                .check_open(&path, follow)
                .map_err(|_| FsError::NoAttribute)?;
        }
        Ok(self.abs(&path))
    }

    /// Carries out one control command; on error nothing has changed.
    fn run_control(&self, data: &[u8]) -> Result<(), FsError> {
        let command = control::parse(data).map_err(|e| FsError::Control(e.to_string()))?;
        match command {
            // The budget goes through the governor, which also steers it under memory pressure.
            Command::RamCache(bytes) => {
                self.settings.governor.set_configured(bytes);
                tracing::info!(budget = bytes, "cache budget changed");
                Ok(())
            }
            command => control::apply(&self.store, &self.settings.source, command)
                .map_err(|e| FsError::Control(e.to_string())),
        }
    }

    /// Inode `ino` went from the table: what was kept per inode goes with it.
    fn pruned(&self, ino: u64) {
        lock(&self.page_cache_generations).remove(&ino);
        lock(&self.backings).remove(&ino);
    }
}

/// A source object and its presented attributes (number not yet assigned).
type ObjectAttr = (inodes::ObjectId, Attr);

/// A name from the kernel as a single relative path component (never `..`, `.` or a path).
fn plain_name(name: &OsStr) -> Result<&Path, FsError> {
    let path = Path::new(name);
    let mut components = path.components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(_)), None) if !platform::name_has_separator(name) => Ok(path),
        _ => Err(FsError::NotFound),
    }
}

/// A getxattr/listxattr answer for `value`: its size when asked (`size == 0`), else the value,
/// or `TooSmall` (ERANGE) if it does not fit the caller's buffer.
fn xattr_reply(size: u32, value: &[u8]) -> Result<Xattr, FsError> {
    match u32::try_from(value.len()) {
        Ok(len) if size == 0 => Ok(Xattr::Size(len)),
        Ok(len) if len <= size => Ok(Xattr::Data(value.to_vec())),
        _ => Err(FsError::TooSmall),
    }
}
