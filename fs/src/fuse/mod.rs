//! The FUSE adapter: kernel requests in, [`tierfs_core::fs::TierFs`] calls out, replies back.
//!
//! This layer only translates: `fuser`'s request types to the core's plain values (inode
//! numbers, a [`Requester`], `O_*` flags), the core's answers to `fuser` replies ([`Attr`] to
//! [`FileAttr`], [`OpenFlags`] to [`FopenFlags`]), and every error to its errno through
//! [`FsError::errno`]. What a mount serves, and how (inodes, handles, the open policy, the
//! control file, read-only refusals), is the core's ([`tierfs_core::fs`]). What is FUSE's alone
//! stays here: the kernel's capabilities at `init`, and making passthrough backing ids
//! (`ReplyOpen::open_backing`), which the core asks for through a callback.

use std::ffi::OsStr;
use std::io::{self, IoSlice};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crossbeam::channel::Sender;
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
};
use tierfs_core::access::{ServedDevice, Sharing};
use tierfs_core::budget::Governor;
use tierfs_core::fs::{
    self as core_fs, Attr, FsError, KernelCapabilities, Kind, Opened, ReadKind, Requester, SetAttr,
    Xattr,
};
use tierfs_core::kernel_cache::{InodeRange, KernelCacheWindow};
use tierfs_core::models::{ModelStore, ReadBytes};

use crate::stats_doc::DaemonStats;

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
    /// SOURCE's tree when it is an object store (`source` is then its URL).
    pub remote: Option<Arc<dyn core_fs::RemoteTree>>,
}

/// The `fuser::Filesystem` of a tierfs mount.
pub struct FuseAdapter {
    fs: core_fs::TierFs<BackingId>,
}

impl FuseAdapter {
    pub fn new(
        settings: MountSettings,
        store: Arc<ModelStore>,
        window: Arc<KernelCacheWindow>,
        invalidations: Sender<InodeRange>,
    ) -> io::Result<FuseAdapter> {
        Ok(FuseAdapter {
            fs: tier_fs(settings, store, window, invalidations)?,
        })
    }

    /// Where the mount's device number goes once mounted (paths into it are never resolved:
    /// [`tierfs_core::access::resolve`]).
    pub fn served_device(&self) -> ServedDevice {
        self.fs.served_device()
    }
}

/// The core filesystem of a mount, whichever transport serves it (`B`: its passthrough
/// backing object).
pub fn tier_fs<B: Send + Sync>(
    settings: MountSettings,
    store: Arc<ModelStore>,
    window: Arc<KernelCacheWindow>,
    invalidations: Sender<InodeRange>,
) -> io::Result<core_fs::TierFs<B>> {
    let mountpoint = settings.mountpoint;
    let metrics_mountpoint = mountpoint.clone();
    let render = move |view: &core_fs::StatsView| stats_json(view, &mountpoint);
    let render_metrics = move |view: &core_fs::StatsView| metrics_text(view, &metrics_mountpoint);
    let core_settings = core_fs::Settings {
        source: settings.source,
        passthrough: settings.passthrough,
        sharing: settings.sharing,
        model_passthrough: settings.model_passthrough,
        governor: settings.governor,
        remote: settings.remote,
    };
    Ok(core_fs::TierFs::new(
        core_settings,
        store,
        window,
        invalidations,
        Box::new(render),
    )?
    .with_metrics(Box::new(render_metrics)))
}

/// The capabilities asked of the kernel at `init`, whichever transport serves the mount;
/// returns what the core needs to know of the answer.
pub fn negotiate(config: &mut KernelConfig, passthrough_wanted: bool) -> KernelCapabilities {
    // Large reads: the kernel may send up to max_pages (1 MiB) per request.
    let _ = config.set_max_readahead(crate::mount::KERNEL_READAHEAD_BYTES);
    let direct_io_mmap = config
        .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
        .is_ok();
    // Asynchronous O_DIRECT reads (io_uring, aio) of handles the daemon serves reach it as
    // parallel requests, up to max_background, instead of one at a time
    // ([measured](../../../docs/PERFORMANCE.md#o_direct-loaders)).
    let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
    let mut passthrough = false;
    if passthrough_wanted {
        passthrough = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok();
        if !passthrough {
            tracing::info!(
                "the kernel does not offer FUSE passthrough: other files are served with pread"
            );
        }
    }
    KernelCapabilities {
        direct_io_mmap,
        passthrough,
    }
}

/// The `.tierfs/stats` document of this front end (with its privileged modes and budget).
fn stats_json(view: &core_fs::StatsView, mountpoint: &Path) -> Vec<u8> {
    let mut json = tierfs_core::stats_doc::render_json(&stats_document(view, mountpoint));
    json.push(b'\n');
    json
}

/// `.tierfs/metrics`: the same figures for a Prometheus scraper ([`crate::metrics`]).
fn metrics_text(view: &core_fs::StatsView, mountpoint: &Path) -> Vec<u8> {
    crate::metrics::render(stats_document(view, mountpoint), &view.store.counters().ops)
}

fn stats_document(view: &core_fs::StatsView, mountpoint: &Path) -> DaemonStats {
    DaemonStats::collect(
        view.store,
        view.window,
        view.source,
        mountpoint,
        view.passthrough,
        view.started,
    )
    .with_budget(view.governor.snapshot())
    .with_tables(view.inodes, view.handles)
    .with_remote_source(view.remote.clone())
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let offered = negotiate(config, self.fs.passthrough());
        self.fs.kernel_capabilities(offered);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(requester(req), parent.0, name) {
            Ok((attr, ttl)) => reply.entry(&ttl, &file_attr(&attr), Generation(attr.generation)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    // `batch_forget` is fuser's default, which calls this for each inode (fuser 0.18 does not
    // export its argument type, so it cannot be overridden).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(requester(req), ino.0) {
            Ok((attr, ttl)) => reply.attr(&ttl, &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(requester(req), ino.0) {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let open_backing = |file| reply.open_backing(file);
        match self.fs.open(requester(req), ino.0, flags.0, &open_backing) {
            Ok(Opened::Served { fh, flags }) => reply.opened(FileHandle(fh), fopen_flags(flags)),
            Ok(Opened::Passthrough { fh, backing }) => {
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &backing)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // The kernel tells `read()` calls from page-cache fills for us: direct reads carry the
        // reader's lock owner (`fuse_direct_io` passes `current->files`), readahead never does.
        // Every request carries the open's flags (`file->f_flags`), O_DIRECT among them.
        let kind = ReadKind {
            from_reader: lock_owner.is_some(),
            o_direct: flags.0 & libc::O_DIRECT != 0,
        };
        match self.fs.read(ino.0, fh.0, offset, size, kind) {
            // A read served from several chunks goes back in its pieces, in one `writev`.
            Ok(bytes @ ReadBytes::Gathered(_)) => {
                let parts: Vec<IoSlice<'_>> = bytes.slices().map(IoSlice::new).collect();
                reply.data_vectored(&parts);
            }
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.release(fh.0);
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
        reply_xattr(reply, self.fs.getxattr(requester(req), ino.0, name, size))
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        reply_xattr(reply, self.fs.listxattr(requester(req), ino.0, size))
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir(requester(req), ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
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
        let listed = self.fs.readdir(fh.0, offset, |entry, next| {
            reply.add(INodeNo(entry.ino), next, file_type(entry.kind), &entry.name)
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(&e)),
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
        let change = SetAttr {
            size,
            changes_mode_or_owner: mode.is_some() || uid.is_some() || gid.is_some(),
        };
        match self.fs.setattr(ino.0, change) {
            Ok((attr, ttl)) => reply.attr(&ttl, &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
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
        reply.error(read_only())
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
        reply.error(read_only())
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(read_only())
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(read_only())
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(read_only())
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
        reply.error(read_only())
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(read_only())
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
        match self.fs.write(ino.0, fh.0, data) {
            // A control command is at most one write, far below 4 GiB.
            Ok(written) => reply.written(u32::try_from(written).unwrap_or(u32::MAX)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        match self
            .fs
            .access(ino.0, mask.contains(fuser::AccessFlags::W_OK))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
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
        reply.error(read_only())
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
        reply.error(read_only())
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(read_only())
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
        reply.error(read_only())
    }
}

fn requester(req: &Request) -> Requester {
    Requester {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

/// The errno the kernel gets for `e` (the core decides which: [`FsError::errno`]).
fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn read_only() -> Errno {
    errno(&FsError::ReadOnly)
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Directory => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::NamedPipe => FileType::NamedPipe,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
        Kind::Socket => FileType::Socket,
    }
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: attr.atime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        crtime: attr.crtime,
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: 0,
    }
}

fn fopen_flags(flags: core_fs::OpenFlags) -> FopenFlags {
    let mut out = FopenFlags::empty();
    if flags.direct_io {
        out |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if flags.keep_cache {
        out |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    out
}

fn reply_xattr(reply: fuser::ReplyXattr, answer: Result<Xattr, FsError>) {
    match answer {
        Ok(Xattr::Size(len)) => reply.size(len),
        Ok(Xattr::Data(value)) => reply.data(&value),
        Err(e) => reply.error(errno(&e)),
    }
}

#[cfg(test)]
mod tests;
