//! The Linux side of [`super`].

use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use crate::access::{AccessError, AccessRule, Acting, Sharing, SourceRoot};

/// Whether `acting` serves another user with the daemon's own rights (see
/// [`crate::access`]).
pub fn is_unswitched_other(acting: &Acting) -> bool {
    acting.is_unswitched_other()
}
use crate::models::{ModelStore, OpenError, OpenModel};
use crate::source::{SourceFile, SourceIdentity};

use super::super::attr::{Attr, Kind};
use super::super::inodes::{generation_of, ObjectId};
use super::super::StatFs;
use super::born;

/// The `open(2)` flags [`TierFs::open`](crate::fs::TierFs::open) looks at.
pub mod oflag {
    pub const RDONLY: i32 = libc::O_RDONLY;
    pub const WRONLY: i32 = libc::O_WRONLY;
    pub const RDWR: i32 = libc::O_RDWR;
    pub const ACCMODE: i32 = libc::O_ACCMODE;
    pub const TRUNC: i32 = libc::O_TRUNC;
}

/// Opens a handle of the model file at `rel` (source `abs`), adopting `opened` (the
/// requester's descriptor) where the version has none open; `None` when `opened` is not the
/// current version ([`ModelStore::open_handle_with`]).
pub fn open_model(
    store: &std::sync::Arc<ModelStore>,
    rel: &Path,
    abs: &Path,
    opened: File,
) -> Result<Option<OpenModel>, OpenError> {
    store.open_handle_with(rel, abs, opened)
}

/// A new descriptor of `source`'s version, for a passthrough backing.
pub fn reopen(source: &SourceFile) -> io::Result<File> {
    source.reopen()
}

/// The daemon's uid and gid.
pub fn daemon_ids() -> (u32, u32) {
    // SAFETY: getuid/getgid cannot fail and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// The source object `meta` (of `_abs`) stands for.
pub fn object_id(_abs: &Path, meta: &Metadata, _kind: Kind) -> io::Result<ObjectId> {
    Ok(object_of(meta))
}

/// The source object open as `file` (`meta` its metadata).
pub fn file_object_id(_file: &File, meta: &Metadata) -> io::Result<ObjectId> {
    Ok(object_of(meta))
}

/// Device, inode number and birth time (`statx`'s, where the filesystem keeps one).
fn object_of(meta: &Metadata) -> ObjectId {
    ObjectId {
        dev: meta.dev(),
        ino: meta.ino(),
        born: born(meta),
    }
}

/// The identity (version) of the open source file `file`.
pub fn file_identity(_file: &File, meta: &Metadata) -> io::Result<SourceIdentity> {
    Ok(SourceIdentity::of(meta))
}

/// The kind of a source entry as `stat` (or `lstat`) sees it.
pub fn kind_of(meta: &Metadata) -> Kind {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    match () {
        _ if t.is_dir() => Kind::Directory,
        _ if t.is_symlink() => Kind::Symlink,
        _ if t.is_fifo() => Kind::NamedPipe,
        _ if t.is_char_device() => Kind::CharDevice,
        _ if t.is_block_device() => Kind::BlockDevice,
        _ if t.is_socket() => Kind::Socket,
        _ => Kind::File,
    }
}

/// The attributes of source object `meta`, presented as `kind` under number `ino`.
pub fn attr_of(ino: u64, meta: &Metadata, kind: Kind) -> Attr {
    Attr {
        ino,
        generation: generation_of(born(meta)),
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
    }
}

/// A `stat` time (seconds and nanoseconds since the epoch, possibly before it).
fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs.clamp(0, 999_999_999) as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// Whether a name from the kernel contains a path separator.
pub fn name_has_separator(name: &OsStr) -> bool {
    name.as_bytes().contains(&b'/')
}

/// The bytes of `path` as the kernel spells it.
pub fn path_bytes(path: &Path) -> Vec<u8> {
    path.as_os_str().as_bytes().to_vec()
}

/// The figures of the file system holding `path`.
pub fn statfs(path: &Path) -> io::Result<StatFs> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut out = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is a valid NUL-terminated string and `out` is a valid statvfs buffer.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), out.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `out`.
    let s = unsafe { out.assume_init() };
    Ok(StatFs {
        blocks: s.f_blocks,
        bfree: s.f_bfree,
        bavail: s.f_bavail,
        files: s.f_files,
        ffree: s.f_ffree,
        bsize: s.f_bsize as u32,
        namelen: s.f_namemax as u32,
        frsize: s.f_frsize as u32,
    })
}
