//! The attributes the filesystem reports, in its own terms (no FUSE or WinFsp types): a front
//! end converts them to its kernel's structure.

use std::fs::Metadata;
use std::time::SystemTime;

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
        super::platform::kind_of(meta)
    }
}

/// The attributes of one inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    /// The generation of the object behind the number (see [`super::inodes`]); 0 for the
    /// virtual files.
    pub generation: u64,
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
        super::platform::attr_of(ino, meta, kind)
    }
}
