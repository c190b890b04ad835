//! The adapter's own translations: core answers to `fuser` values.

use std::io;
use std::time::{Duration, UNIX_EPOCH};

use super::*;

#[test]
fn errors_reach_the_kernel_as_the_core_maps_them() {
    let cases = [
        (FsError::NotFound, Errno::ENOENT),
        (FsError::Stale, Errno::ESTALE),
        (FsError::IsDirectory, Errno::EISDIR),
        (FsError::Denied("x"), Errno::EACCES),
        (FsError::ReadOnly, Errno::EROFS),
        (FsError::BadHandle, Errno::EBADF),
        (FsError::NoAttribute, Errno::ENODATA),
        (FsError::TooSmall, Errno::ERANGE),
        (FsError::Control("bad".into()), Errno::EINVAL),
        (FsError::ModeConflict, Errno::EIO),
        (
            FsError::io("open")(io::Error::from_raw_os_error(libc::ELOOP)),
            Errno::ELOOP,
        ),
        (
            FsError::io("read")(io::Error::other("no errno")),
            Errno::EIO,
        ),
    ];
    for (error, expected) in cases {
        assert_eq!(errno(&error), expected, "{error}");
    }
    assert_eq!(read_only(), Errno::EROFS);
}

#[test]
fn attributes_carry_over_field_by_field() {
    let attr = Attr {
        ino: 77,
        generation: 5,
        size: 1 << 33,
        blocks: 9,
        atime: UNIX_EPOCH + Duration::from_secs(1),
        mtime: UNIX_EPOCH + Duration::from_secs(2),
        ctime: UNIX_EPOCH + Duration::from_secs(3),
        crtime: UNIX_EPOCH + Duration::from_secs(4),
        kind: Kind::Symlink,
        perm: 0o4755,
        nlink: 3,
        uid: 1000,
        gid: 1001,
        rdev: 5,
        blksize: 4096,
    };
    let out = file_attr(&attr);
    assert_eq!(out.ino, INodeNo(77));
    assert_eq!((out.size, out.blocks), (1 << 33, 9));
    assert_eq!(
        (out.atime, out.mtime, out.ctime, out.crtime),
        (attr.atime, attr.mtime, attr.ctime, attr.crtime)
    );
    assert_eq!(out.kind, FileType::Symlink);
    assert_eq!(
        (out.perm, out.nlink, out.uid, out.gid),
        (0o4755, 3, 1000, 1001)
    );
    assert_eq!((out.rdev, out.blksize, out.flags), (5, 4096, 0));
}

#[test]
fn every_kind_has_its_own_file_type() {
    let kinds = [
        (Kind::File, FileType::RegularFile),
        (Kind::Directory, FileType::Directory),
        (Kind::Symlink, FileType::Symlink),
        (Kind::NamedPipe, FileType::NamedPipe),
        (Kind::CharDevice, FileType::CharDevice),
        (Kind::BlockDevice, FileType::BlockDevice),
        (Kind::Socket, FileType::Socket),
    ];
    for (kind, expected) in kinds {
        assert_eq!(file_type(kind), expected);
    }
}

#[test]
fn open_flags_become_fopen_flags() {
    let flags = |direct_io, keep_cache| {
        fopen_flags(core_fs::OpenFlags {
            direct_io,
            keep_cache,
        })
    };
    assert_eq!(flags(false, false), FopenFlags::empty());
    assert_eq!(flags(true, false), FopenFlags::FOPEN_DIRECT_IO);
    assert_eq!(flags(false, true), FopenFlags::FOPEN_KEEP_CACHE);
    assert_eq!(
        flags(true, true),
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_KEEP_CACHE
    );
}
