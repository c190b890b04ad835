//! `fuse-ceiling` — a yardstick for tierfs's warm `read()` speed (benchmark row 2): the fastest a
//! FUSE file system can serve bytes it already holds in RAM, on this kernel and machine.
//!
//! ```text
//! fuse-ceiling MOUNTPOINT SIZE
//! ```
//!
//! Serves one file, `MOUNTPOINT/data`, of `SIZE` bytes, answered from an anonymous mapping of
//! that size filled once at start (so the copies touch as much memory as tierfs's cache does,
//! not one cache-hot buffer). Each read is a slice of that mapping handed to the kernel: no
//! lookups, no locks, no accounting. The FUSE settings are tierfs's for model files:
//! `FOPEN_DIRECT_IO`, 8 request threads, one cloned `/dev/fuse` descriptor per thread. What is
//! left is the kernel's FUSE round trip and copy, which is the floor under any FUSE file system.
//! Unmount with `umount`; the process exits when the mount goes away.

use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
    Session,
};

const ROOT: u64 = 1;
const DATA: u64 = 2;
const TTL: Duration = Duration::from_secs(3600);

struct Ceiling {
    bytes: Vec<u8>,
}

impl Ceiling {
    fn attr(&self, ino: u64) -> FileAttr {
        let (kind, perm, size) = match ino {
            ROOT => (FileType::Directory, 0o555, 0),
            _ => (FileType::RegularFile, 0o444, self.bytes.len() as u64),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

impl Filesystem for Ceiling {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == ROOT && name == "data" {
            reply.entry(&TTL, &self.attr(DATA), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino.0 {
            ROOT | DATA => reply.attr(&TTL, &self.attr(ino.0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match ino.0 {
            DATA => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            _ => reply.error(Errno::EISDIR),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = self.bytes.len();
        let start = usize::try_from(offset).unwrap_or(len).min(len);
        let end = start.saturating_add(size as usize).min(len);
        reply.data(&self.bytes[start..end]);
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mountpoint), Some(Ok(size))) = (args.get(1), args.get(2).map(|s| s.parse::<usize>()))
    else {
        eprintln!("usage: fuse-ceiling MOUNTPOINT SIZE");
        return ExitCode::from(2);
    };
    // Every page written, so that reads copy real memory (not the shared zero page).
    let bytes: Vec<u8> = (0..size).map(|i| (i / 4096) as u8).collect();
    let mut config = Config::default();
    config.mount_options = vec![MountOption::RO, MountOption::FSName("fuse-ceiling".into())];
    config.n_threads = Some(8);
    config.clone_fd = true;
    let session = match Session::new(Ceiling { bytes }, Path::new(mountpoint), &config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fuse-ceiling: mount on {mountpoint}: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("fuse-ceiling: mounted");
    match session.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fuse-ceiling: session ended with error: {e}");
            ExitCode::FAILURE
        }
    }
}
