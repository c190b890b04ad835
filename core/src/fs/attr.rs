//! The attributes the filesystem reports, in its own terms (no FUSE or WinFsp types): a front
//! end converts them to its kernel's structure.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What an entry is presented as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    File,
    Directory,
    Symlink,
    NamedPipe,
    CharDevice,
    BlockDevice,
    Socket,
}

impl Kind {
    /// The kind of a source entry as `stat` (or `lstat`) sees it.
    pub fn of(meta: &Metadata) -> Kind {
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
}

/// The attributes of one inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
    pub kind: Kind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    /// The attributes of source object `meta`, presented as `kind` under number `ino`.
    pub fn of_source(ino: u64, meta: &Metadata, kind: Kind) -> Attr {
        Attr {
            ino,
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
}

/// A `stat` time (seconds and nanoseconds since the epoch, possibly before it).
fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs.clamp(0, 999_999_999) as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}
