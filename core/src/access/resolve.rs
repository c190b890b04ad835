//! Reaching a path under SOURCE: the one way the daemon resolves the paths SOURCE presents.
//!
//! **Contract.** [`SourceRoot`] resolves a path relative to SOURCE with the calling thread's
//! credentials (on a shared mount, the requester's: [`super::creds`]), following links as the
//! kernel does (at most [`MAX_LINKS`], `fs.protected_symlinks` honoured), except that it never
//! - follows a `/proc` magic link (`/proc/self/fd/N`, `/proc/PID/cwd`, `root`, `exe`, `map_files`):
//!   resolved by the daemon they are *its* descriptors and *its* view of other processes;
//! - enters a procfs at all: `/proc/self/environ`, `/proc/PID/mem` and the like are checked
//!   against the daemon's process, not the requester's;
//! - enters the mount this daemon serves ([`SourceRoot::served_device`]): a request thread
//!   that looks its own mount up waits on itself (a link `SOURCE/b -> MNT/a` hung the mount,
//!   its caller unkillable in `D` state).
//!
//! A path that would is refused: `ELOOP` for a magic link (the kernel's own answer under
//! `RESOLVE_NO_MAGICLINKS`) and for a path into the mount (it loops back into itself),
//! `EACCES` for procfs; `crate::fs::present` shows a link whose target is refused as a
//! dangling link. Refusals made here (procfs, the mount) are logged, at most once a second
//! with the count of those not logged; magic links are refused by the kernel itself, with no
//! line (a loader probing such a link would flood the log).
//!
//! **How.** The fast path is one `openat2` from SOURCE's descriptor with
//! `RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`: a resolution that never leaves SOURCE's mount
//! cannot reach a procfs or a FUSE mount, and it costs what the plain `open` it replaces cost.
//! When the path does leave it (a link to another disk, an absolute link while `/` is another
//! mount, a mount point under SOURCE), the kernel answers `EXDEV` and the path is walked a
//! component at a time: each step an `openat2(O_PATH | O_NOFOLLOW)` of one name (so the kernel
//! still checks search permission on every directory with the thread's credentials), links
//! read with `readlinkat` and resolved here, `..` left to the kernel. Each time a step lands
//! on another device, that device is checked before anything on it is looked up: not the
//! served mount (its device number; `statx` with `AT_STATX_DONT_SYNC`, which asks FUSE
//! nothing), not a procfs (`fstatfs`). The final object is then opened from its directory
//! with `O_NOFOLLOW`, and must be the object the walk reached (device and inode).
//!
//! Paths are relative to SOURCE, whose descriptor is held for the life of the mount: the
//! kernel checks only what lies below it, so a SOURCE inside a `0700` home still serves the
//! users the mount is shared with (who may reach the mount is decided where it is mounted).

use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, StatxFlags};

use crate::source::{PathAccess, SourceIdentity};
use crate::sync::{lock, Mutex};

/// Links followed in one resolution at most: the kernel's own limit (`MAXSYMLINKS`).
pub const MAX_LINKS: usize = 40;

/// `PROC_SUPER_MAGIC`.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Refusals are logged at most this often (with how many were not): a loader retrying a
/// refused path must not flood the log.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// SOURCE, held open, and the rules for resolving paths below it (see the module docs).
#[derive(Debug)]
pub struct SourceRoot {
    abs: PathBuf,
    fd: OwnedFd,
    served_device: ServedDevice,
    protected_symlinks: bool,
    refusals: RefusalLog,
}

/// The device number of the mount a daemon serves (0 until known), shared between the
/// resolver and the front end that mounts.
#[derive(Debug, Clone, Default)]
pub struct ServedDevice(Arc<AtomicU64>);

impl ServedDevice {
    pub fn set(&self, dev: u64) {
        self.0.store(dev, Ordering::Relaxed);
    }
}

/// The final object of a walk: `name` in directory `dir`, or `dir` itself.
struct Walked {
    dir: OwnedFd,
    name: Option<OsString>,
    /// Device and inode the walk found there.
    id: (u64, u64),
    /// An `O_PATH` descriptor of the object itself (`None`: `dir` is the object).
    object: Option<OwnedFd>,
}

/// Which links a resolution follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Follow {
    /// Any link at all (false: a link anywhere on the path fails with `ELOOP`, except a last
    /// component not followed).
    links: bool,
    /// A link as the last component (false: the link itself, as `lstat` sees it).
    last: bool,
}

impl Follow {
    /// Every link, the last one too, unless `links` is false.
    fn all(links: bool) -> Follow {
        Follow { links, last: links }
    }

    /// Links on the way only (when `links`): the last component itself.
    fn not_last(links: bool) -> Follow {
        Follow { links, last: false }
    }
}

impl SourceRoot {
    /// Opens SOURCE (an absolute, canonical path).
    pub fn open(abs: &Path) -> io::Result<SourceRoot> {
        let fd = rustix::fs::open(
            abs,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(SourceRoot {
            abs: abs.to_owned(),
            fd,
            served_device: ServedDevice::default(),
            protected_symlinks: std::fs::read_to_string("/proc/sys/fs/protected_symlinks")
                .is_ok_and(|v| v.trim() != "0"),
            refusals: RefusalLog::default(),
        })
    }

    /// SOURCE's path.
    pub fn abs(&self) -> &Path {
        &self.abs
    }

    /// Where to record the device number of the mount this daemon serves, which resolution
    /// must never enter: set once mounted, before the first request is served.
    pub fn served_device(&self) -> ServedDevice {
        self.served_device.clone()
    }

    /// The metadata of `rel` itself (a link as a link); links on the way are followed only if
    /// `follow_links`.
    pub fn lstat(&self, rel: &Path, follow_links: bool) -> io::Result<Metadata> {
        let fd = self.open_with(rel, Follow::not_last(follow_links), OFlags::PATH)?;
        File::from(fd).metadata()
    }

    /// The metadata of what `rel` resolves to, following links if `follow_links`.
    pub fn stat(&self, rel: &Path, follow_links: bool) -> io::Result<Metadata> {
        let fd = self.open_with(rel, Follow::all(follow_links), OFlags::PATH)?;
        File::from(fd).metadata()
    }

    /// Whether SOURCE's directories on the way to `rel`, or `rel` itself, carry a POSIX ACL
    /// (`system.posix_acl_access`). Resolved without following any link. An ACL on SOURCE
    /// itself does not count: who reaches the mount is decided where it is mounted.
    pub fn acl_on_path(&self, rel: &Path) -> io::Result<bool> {
        let mut prefix = PathBuf::new();
        for name in components(rel) {
            prefix.push(name);
            let fd = self.open_with(&prefix, Follow::all(false), OFlags::PATH)?;
            if statx(fd.as_fd())?.is_symlink() {
                continue; // shown as a link: what it points at is not served through it
            }
            // An O_PATH descriptor has no xattr calls of its own; its /proc link does.
            let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
            match rustix::fs::getxattr_query(proc_path.as_str(), "system.posix_acl_access") {
                Ok(_) => return Ok(true),
                Err(rustix::io::Errno::NODATA | rustix::io::Errno::OPNOTSUPP) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
    }

    /// Opens the regular file (or whatever is there) at `rel` for reading.
    pub fn open_file(&self, rel: &Path, follow_links: bool) -> io::Result<File> {
        self.open_with(rel, Follow::all(follow_links), OFlags::RDONLY)
            .map(File::from)
    }

    /// Opens `rel` for reading if it is a regular file, with its metadata: one resolution for
    /// what took a `stat` and an `open`. Non-blocking while the kind is unknown (a FIFO swapped
    /// in must not block the serving thread); `EISDIR` for a directory, `EACCES` for anything
    /// else but a regular file.
    pub fn open_regular(&self, rel: &Path, follow_links: bool) -> io::Result<(File, Metadata)> {
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
        let file = File::from(self.open_with(rel, Follow::all(follow_links), flags)?);
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        if !meta.is_file() {
            return Err(io::Error::from_raw_os_error(libc::EACCES));
        }
        rustix::fs::fcntl_setfl(&file, OFlags::RDONLY)?;
        Ok((file, meta))
    }

    /// The names in directory `rel` (without `.` and `..`).
    pub fn list_dir(&self, rel: &Path, follow_links: bool) -> io::Result<Vec<OsString>> {
        let fd = self.open_with(
            rel,
            Follow::all(follow_links),
            OFlags::RDONLY | OFlags::DIRECTORY,
        )?;
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::new(fd)? {
            let name = entry?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(OsString::from_vec(name));
            }
        }
        Ok(names)
    }

    /// The identity of directory `rel`, opened as [`SourceRoot::list_dir`] opens it.
    pub fn dir_identity(&self, rel: &Path, follow_links: bool) -> io::Result<SourceIdentity> {
        let fd = self.open_with(
            rel,
            Follow::all(follow_links),
            OFlags::RDONLY | OFlags::DIRECTORY,
        )?;
        SourceIdentity::of_file(&File::from(fd))
    }

    /// The target of link `rel`.
    pub fn read_link(&self, rel: &Path, follow_links: bool) -> io::Result<PathBuf> {
        let fd = self.open_with(rel, Follow::not_last(follow_links), OFlags::PATH)?;
        let target = rustix::fs::readlinkat(&fd, "", Vec::new())?;
        Ok(PathBuf::from(OsString::from_vec(target.into_bytes())))
    }

    /// Whether link `rel` resolves to a directory holding the link itself (following it would
    /// make an endless tree). True when that cannot be told (an unreachable directory on the
    /// way up): the link then stays a link, which is never more than SOURCE shows.
    pub fn link_points_at_ancestor(&self, rel: &Path) -> bool {
        let (Ok(target), Some(parent)) = (
            self.open_with(rel, Follow::all(true), OFlags::PATH),
            rel.parent(),
        ) else {
            return true;
        };
        let Ok(target) = object_id(target.as_fd()) else {
            return true;
        };
        let Ok(mut dir) = self.open_with(parent, Follow::all(true), OFlags::PATH) else {
            return true;
        };
        // Up from the link's directory to `/` (whose `..` is itself), through the kernel's `..`.
        for _ in 0..4096 {
            let Ok(id) = object_id(dir.as_fd()) else {
                return true;
            };
            if id == target {
                return true;
            }
            let Ok(up) = step(dir.as_fd(), OsStr::new("..")) else {
                return true;
            };
            if object_id(up.as_fd()).is_ok_and(|up| up == id) {
                return false;
            }
            dir = up;
        }
        true
    }

    /// Opens `rel` with `flags` (`O_PATH`, `O_RDONLY`, …; `O_CLOEXEC` is added).
    fn open_with(&self, rel: &Path, follow: Follow, flags: OFlags) -> io::Result<OwnedFd> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let mut resolve = ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV;
        if !follow.links {
            resolve |= ResolveFlags::NO_SYMLINKS;
        }
        let mut oflags = flags | OFlags::CLOEXEC;
        if !follow.last {
            oflags |= OFlags::NOFOLLOW;
        }
        match rustix::fs::openat2(&self.fd, rel, oflags, Mode::empty(), resolve) {
            Err(rustix::io::Errno::XDEV) => {}
            result => return result.map_err(io::Error::from),
        }
        let walked = self.walk(rel, follow)?;
        if flags == OFlags::PATH {
            // What the walk holds already is the `O_PATH` descriptor asked for.
            return Ok(walked.object.unwrap_or(walked.dir));
        }
        let name = walked.name.as_deref().unwrap_or(OsStr::new("."));
        let last = rustix::fs::openat2(
            &walked.dir,
            name,
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_SYMLINKS,
        )?;
        // The name could have been swapped since the walk looked at it.
        if object_id(last.as_fd())? != walked.id {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        Ok(last)
    }

    /// Resolves `rel` a component at a time (see the module docs).
    fn walk(&self, rel: &Path, follow: Follow) -> io::Result<Walked> {
        let mut pending: Vec<OsString> = components(rel);
        pending.reverse(); // a stack: the next component last
        let mut dir =
            rustix::fs::openat(&self.fd, ".", OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
        let mut dir_id = object_id(dir.as_fd())?;
        let mut links = 0;
        while let Some(name) = pending.pop() {
            let next = step(dir.as_fd(), &name)?;
            let info = statx(next.as_fd())?;
            let id = (info.dev, info.ino);
            if info.dev != dir_id.0 {
                self.check_device(rel, next.as_fd(), info.dev)?;
            }
            let is_last = pending.is_empty();
            if info.is_symlink() && (!is_last || follow.last) {
                if !follow.links {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                self.may_follow(dir.as_fd(), &info)?;
                let target = rustix::fs::readlinkat(&next, "", Vec::new())?;
                let target = PathBuf::from(OsString::from_vec(target.into_bytes()));
                if target.is_absolute() {
                    dir = rustix::fs::open("/", OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
                    let root = object_id(dir.as_fd())?;
                    if root.0 != dir_id.0 {
                        self.check_device(rel, dir.as_fd(), root.0)?;
                    }
                    dir_id = root;
                }
                let mut parts = components(&target);
                if parts.is_empty() {
                    parts.push(".".into());
                }
                pending.extend(parts.into_iter().rev());
                continue;
            }
            if is_last {
                // The object is `name` in `dir` (`.` and `..` name a directory itself).
                return Ok(Walked {
                    dir,
                    name: Some(name),
                    id,
                    object: Some(next),
                });
            }
            if !info.is_dir() {
                return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            dir = next;
            dir_id = id;
        }
        // Only for a path with no component at all (SOURCE itself).
        Ok(Walked {
            id: dir_id,
            dir,
            name: None,
            object: None,
        })
    }

    /// Refuses a device the resolution of `rel` may not enter (see the module docs).
    fn check_device(&self, rel: &Path, fd: BorrowedFd, dev: u64) -> io::Result<()> {
        let served = self.served_device.0.load(Ordering::Relaxed);
        let (errno, reason) = if served != 0 && dev == served {
            (libc::ELOOP, "it leads into this mount")
        } else if rustix::fs::fstatfs(fd).is_ok_and(|s| is_procfs(&s)) {
            (libc::EACCES, "it leads into /proc")
        } else {
            return Ok(());
        };
        self.refusals.log(rel, reason);
        Err(io::Error::from_raw_os_error(errno))
    }

    /// `fs.protected_symlinks`: a link in a sticky, world-writable directory is followed only
    /// by its owner, or when its owner also owns the directory (`may_follow_link` in the
    /// kernel, whose walk this one stands in for).
    fn may_follow(&self, dir: BorrowedFd, link: &Info) -> io::Result<()> {
        if !self.protected_symlinks {
            return Ok(());
        }
        let dir = statx(dir)?;
        let sticky_world_writable = dir.mode & 0o1002 == 0o1002;
        if !sticky_world_writable || link.uid == dir.uid || link.uid == fsuid() {
            return Ok(());
        }
        Err(io::Error::from_raw_os_error(libc::EACCES))
    }
}

/// The store's by-path access to SOURCE goes through the resolver too, following links, with
/// the calling thread's credentials.
impl PathAccess for SourceRoot {
    fn open(&self, abs: &Path) -> io::Result<crate::source::Opened> {
        self.open_file(self.below(abs)?, true)
            .map(crate::source::Opened::File)
    }

    fn identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
        self.stat(self.below(abs)?, true)
            .map(|meta| SourceIdentity::of(&meta))
    }

    fn list_dir(&self, abs: &Path) -> io::Result<Vec<OsString>> {
        SourceRoot::list_dir(self, self.below(abs)?, true)
    }

    fn dir_identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
        SourceRoot::dir_identity(self, self.below(abs)?, true)
    }

    fn link_target(&self, abs: &Path) -> io::Result<Option<PathBuf>> {
        let rel = self.below(abs)?;
        match self.lstat(rel, true)?.file_type().is_symlink() {
            true => self.read_link(rel, true).map(Some),
            false => Ok(None),
        }
    }
}

impl SourceRoot {
    /// `abs` relative to SOURCE; paths elsewhere are not reached through SOURCE at all.
    fn below<'a>(&self, abs: &'a Path) -> io::Result<&'a Path> {
        abs.strip_prefix(&self.abs).map_err(|_| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is not below SOURCE", abs.display()),
            )
        })
    }
}

// `f_type`'s integer type differs between architectures.
#[allow(clippy::unnecessary_cast)]
fn is_procfs(stat: &rustix::fs::StatFs) -> bool {
    stat.f_type as i64 == PROC_SUPER_MAGIC
}

/// One step of a walk: `name` in `dir`, the last link not followed, no magic link.
fn step(dir: BorrowedFd, name: &OsStr) -> io::Result<OwnedFd> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(io::Error::from)
}

/// The components of a relative or absolute path, as names (`..` kept, `.` and `/` dropped).
fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// What a walk needs to know of one object.
struct Info {
    dev: u64,
    ino: u64,
    mode: u32,
    uid: u32,
}

impl Info {
    fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }

    fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

/// `statx` of `fd` itself, asking a FUSE file system nothing (`AT_STATX_DONT_SYNC`): the
/// device number is the superblock's, and the type, mode and owner of a link or directory
/// are what was last looked up.
fn statx(fd: BorrowedFd) -> io::Result<Info> {
    let st = rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_DONT_SYNC,
        StatxFlags::TYPE | StatxFlags::MODE | StatxFlags::UID | StatxFlags::INO,
    )?;
    Ok(Info {
        dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
        mode: u32::from(st.stx_mode),
        uid: st.stx_uid,
    })
}

/// Device and inode of `fd`.
fn object_id(fd: BorrowedFd) -> io::Result<(u64, u64)> {
    statx(fd).map(|info| (info.dev, info.ino))
}

/// The calling thread's filesystem uid (`setfsuid(-1)` changes nothing and returns it).
fn fsuid() -> u32 {
    // SAFETY: an invalid id changes nothing; the call only returns the current fsuid.
    unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32 }
}

/// The device number of the mount at `mountpoint` (its root), without asking the file
/// system mounted there anything: safe to call before the daemon serves its own mount.
pub fn mount_device(mountpoint: &Path) -> io::Result<u64> {
    let fd = rustix::fs::open(
        mountpoint,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    statx(fd.as_fd()).map(|info| info.dev)
}

/// Rate-limited log of refusals.
#[derive(Debug)]
struct RefusalLog {
    /// At most one line per this long ([`REFUSAL_LOG_INTERVAL`]).
    interval: Duration,
    state: Mutex<Option<(Instant, u64)>>,
}

impl Default for RefusalLog {
    fn default() -> RefusalLog {
        RefusalLog::with_interval(REFUSAL_LOG_INTERVAL)
    }
}

impl RefusalLog {
    fn with_interval(interval: Duration) -> RefusalLog {
        RefusalLog {
            interval,
            state: Mutex::default(),
        }
    }

    /// Logs the refusal of `rel`, unless one was logged less than the interval ago; true if
    /// it was logged.
    fn log(&self, rel: &Path, reason: &str) -> bool {
        let mut state = lock(&self.state);
        match &mut *state {
            Some((at, suppressed)) if at.elapsed() < self.interval => {
                *suppressed += 1;
                false
            }
            _ => {
                let suppressed = state.map_or(0, |(_, n)| n);
                tracing::warn!(path = %rel.display(), reason, suppressed, "refused to resolve a path of SOURCE");
                *state = Some((Instant::now(), 0));
                true
            }
        }
    }
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
mod tests;
