//! The FUSE kernel ABI this transport speaks: request opcodes, the argument and reply structs
//! of the operations a tierfs mount serves, and the io_uring request header.
//!
//! Each struct is the kernel's (`include/uapi/linux/fuse.h`, protocol 7.38 and the io_uring
//! additions of 7.42), `#[repr(C)]` with fields of fixed-width integers only, so that
//! [`bytemuck`] can read and write them as bytes without `unsafe`. The sizes are checked
//! below, and `tests/abi/check-fuse-abi.sh` checks sizes and offsets against the system's
//! `<linux/fuse.h>` wherever it declares the struct.

use bytemuck::{Pod, Zeroable};

/// Operation codes (`enum fuse_opcode`) this transport answers or must recognise.
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const RENAME2: u32 = 45;
    pub const TMPFILE: u32 = 51;
}

/// `fuse_read_in.read_flags`: `lock_owner` is valid (a reader's own `read()`).
pub const READ_LOCKOWNER: u32 = 1 << 1;
/// `fuse_setattr_in.valid` bits that change the mode or the owner.
pub const FATTR_MODE_OR_OWNER: u32 = (1 << 0) | (1 << 1) | (1 << 2);
/// `fuse_setattr_in.valid`: `size` is set.
pub const FATTR_SIZE: u32 = 1 << 3;
/// `fuse_open_out.open_flags`.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;
/// `fuse_access_in.mask`: write access asked.
pub const W_OK: u32 = 2;

/// `enum fuse_uring_cmd`: the `cmd_op` of an `IORING_OP_URING_CMD` on `/dev/fuse`.
pub const URING_CMD_REGISTER: u32 = 1;
pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct OutHeader {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct OpenIn {
    pub flags: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct ReleaseIn {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct ForgetIn {
    pub nlookup: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct BatchForgetIn {
    pub count: u32,
    pub dummy: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct ForgetOne {
    pub nodeid: u64,
    pub nlookup: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct GetxattrIn {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct GetxattrOut {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct AccessIn {
    pub mask: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

/// `fuse_statfs_out` (its only member, `struct fuse_kstatfs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// `struct fuse_dirent` without its name, which follows it, padded to 8 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct Dirent {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub kind: u32,
}

/// `struct fuse_uring_ent_in_out`: the ring's own part of a request header.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct RingEntInOut {
    pub flags: u64,
    /// The id a reply commits (the request's `unique`).
    pub commit_id: u64,
    /// Bytes of the payload buffer used by the request, then by the reply.
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `FUSE_URING_IN_OUT_HEADER_SZ`: room for a `fuse_in_header` or `fuse_out_header`.
pub const RING_IN_OUT_HEADER_SIZE: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`: room for an operation's own argument struct.
pub const RING_OP_IN_SIZE: usize = 128;

/// `struct fuse_uring_req_header`: the first of an entry's two buffers.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct RingHeader {
    pub in_out: [u8; RING_IN_OUT_HEADER_SIZE],
    pub op_in: [u8; RING_OP_IN_SIZE],
    pub ent: RingEntInOut,
}

/// `struct fuse_uring_cmd_req`: the command area of a `URING_CMD` SQE.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub struct RingCmdReq {
    pub flags: u64,
    pub commit_id: u64,
    pub qid: u16,
    pub padding: [u8; 6],
}

/// Reads a `T` from the start of `bytes`, if they are long enough.
pub fn read<T: Pod>(bytes: &[u8]) -> Option<T> {
    bytes
        .get(..std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    /// The kernel's sizes (`FUSE_COMPAT_*` aside): a wrong one would shift every field after it.
    #[test]
    fn sizes_match_the_kernel() {
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<OutHeader>(), 16);
        assert_eq!(size_of::<Attr>(), 88);
        assert_eq!(size_of::<EntryOut>(), 128);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<OpenIn>(), 8);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<ReadIn>(), 40);
        assert_eq!(size_of::<WriteIn>(), 40);
        assert_eq!(size_of::<WriteOut>(), 8);
        assert_eq!(size_of::<ReleaseIn>(), 24);
        assert_eq!(size_of::<ForgetIn>(), 8);
        assert_eq!(size_of::<BatchForgetIn>(), 8);
        assert_eq!(size_of::<ForgetOne>(), 16);
        assert_eq!(size_of::<GetxattrIn>(), 8);
        assert_eq!(size_of::<GetxattrOut>(), 8);
        assert_eq!(size_of::<AccessIn>(), 8);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<Dirent>(), 24);
        assert_eq!(size_of::<RingEntInOut>(), 32);
        assert_eq!(size_of::<RingHeader>(), 288);
        assert_eq!(size_of::<RingCmdReq>(), 24);
    }

    /// A C struct's name, the `#ifdef` that guards it where a header may lack it, this
    /// module's size of it, and its fields' names and offsets here.
    type Layout = (
        &'static str,
        Option<&'static str>,
        usize,
        Vec<(&'static str, usize)>,
    );

    /// The [`Layout`] of every struct of this module that has a C counterpart.
    fn layouts() -> Vec<Layout> {
        use std::mem::offset_of;
        macro_rules! layout {
            ($c:literal, $guard:expr, $t:ty, [$($f:ident $(: $cf:literal)?),*]) => {
                ($c, $guard, size_of::<$t>(), vec![$((layout!(@name $f $($cf)?), offset_of!($t, $f))),*])
            };
            (@name $f:ident $cf:literal) => { $cf };
            (@name $f:ident) => { stringify!($f) };
        }
        vec![
            layout!(
                "fuse_in_header",
                None,
                InHeader,
                [len, opcode, unique, nodeid, uid, gid, pid, total_extlen]
            ),
            layout!("fuse_out_header", None, OutHeader, [len, error, unique]),
            layout!(
                "fuse_attr",
                None,
                Attr,
                [
                    ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec, mode,
                    nlink, uid, gid, rdev, blksize, flags
                ]
            ),
            layout!(
                "fuse_entry_out",
                None,
                EntryOut,
                [
                    nodeid,
                    generation,
                    entry_valid,
                    attr_valid,
                    entry_valid_nsec,
                    attr_valid_nsec,
                    attr
                ]
            ),
            layout!(
                "fuse_attr_out",
                None,
                AttrOut,
                [attr_valid, attr_valid_nsec, attr]
            ),
            layout!("fuse_open_in", None, OpenIn, [flags, open_flags]),
            layout!("fuse_open_out", None, OpenOut, [fh, open_flags]),
            layout!(
                "fuse_read_in",
                None,
                ReadIn,
                [fh, offset, size, read_flags, lock_owner, flags]
            ),
            layout!(
                "fuse_write_in",
                None,
                WriteIn,
                [fh, offset, size, write_flags, lock_owner, flags]
            ),
            layout!("fuse_write_out", None, WriteOut, [size]),
            layout!(
                "fuse_release_in",
                None,
                ReleaseIn,
                [fh, flags, release_flags, lock_owner]
            ),
            layout!("fuse_forget_in", None, ForgetIn, [nlookup]),
            layout!("fuse_batch_forget_in", None, BatchForgetIn, [count]),
            layout!("fuse_forget_one", None, ForgetOne, [nodeid, nlookup]),
            layout!("fuse_getxattr_in", None, GetxattrIn, [size]),
            layout!("fuse_getxattr_out", None, GetxattrOut, [size]),
            layout!("fuse_access_in", None, AccessIn, [mask]),
            layout!(
                "fuse_setattr_in",
                None,
                SetattrIn,
                [
                    valid, fh, size, lock_owner, atime, mtime, ctime, atimensec, mtimensec,
                    ctimensec, mode, uid, gid
                ]
            ),
            layout!(
                "fuse_kstatfs",
                None,
                StatfsOut,
                [blocks, bfree, bavail, files, ffree, bsize, namelen, frsize]
            ),
            layout!("fuse_dirent", None, Dirent, [ino, off, namelen, kind: "type"]),
            layout!(
                "fuse_uring_ent_in_out",
                Some("FUSE_URING_IN_OUT_HEADER_SZ"),
                RingEntInOut,
                [flags, commit_id, payload_sz]
            ),
            layout!("fuse_uring_req_header", Some("FUSE_URING_IN_OUT_HEADER_SZ"), RingHeader, [in_out, op_in, ent: "ring_ent_in_out"]),
            layout!(
                "fuse_uring_cmd_req",
                Some("FUSE_URING_IN_OUT_HEADER_SZ"),
                RingCmdReq,
                [flags, commit_id, qid]
            ),
        ]
    }

    /// Compiles a C program that prints the system header's size and offsets of each struct
    /// and compares them with this module's. Needs a C compiler and the kernel's headers
    /// (`linux-libc-dev`), which building the workspace needs anyway.
    #[test]
    fn structs_match_the_system_header() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <linux/fuse.h>\nint main(void) {\n",
        );
        for (name, guard, _, fields) in layouts() {
            if let Some(guard) = guard {
                c += &format!("#ifdef {guard}\n");
            }
            c += &format!("printf(\"{name} sizeof %zu\\n\", sizeof(struct {name}));\n");
            for (field, _) in &fields {
                c += &format!(
                    "printf(\"{name} {field} %zu\\n\", offsetof(struct {name}, {field}));\n"
                );
            }
            if guard.is_some() {
                c += "#endif\n";
            }
        }
        c += "return 0; }\n";
        let src = dir.path().join("abi.c");
        let exe = dir.path().join("abi");
        std::fs::write(&src, c).expect("write the C program");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let built = std::process::Command::new(&cc)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("run the C compiler");
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let out = std::process::Command::new(&exe).output().expect("run it");
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let mut checked = 0;
        for (name, guard, size, fields) in layouts() {
            let find = |what: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name} {what} ")))
                    .and_then(|v| v.parse::<usize>().ok())
            };
            let Some(c_size) = find("sizeof") else {
                assert!(guard.is_some(), "{name} missing from the header");
                continue;
            };
            assert_eq!(c_size, size, "size of {name}");
            for (field, offset) in fields {
                assert_eq!(find(field), Some(offset), "offset of {name}.{field}");
            }
            checked += 1;
        }
        assert!(checked >= 20, "only {checked} structs checked:\n{text}");
    }

    #[test]
    fn read_refuses_short_input() {
        assert!(read::<ReadIn>(&[0u8; 39]).is_none());
        let mut bytes = [0u8; 41];
        bytes[8] = 7; // offset, little endian, after fh
        assert_eq!(read::<ReadIn>(&bytes[..40]).map(|r| r.offset), Some(7));
    }
}
