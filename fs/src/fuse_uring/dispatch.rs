//! One FUSE request in, one [`Reply`] out: the operations of a tierfs mount over the core's
//! [`TierFs`], for a transport that carries raw requests (the io_uring rings and the
//! `/dev/fuse` reader beside them).
//!
//! The contract is the `fuser` adapter's ([`crate::fuse`]), operation for operation: the same
//! core calls with the same arguments, the same errors, the same refusals of every change
//! (read-only), the same access rule for a mount not shared with other users (the mounting
//! user only, except the operations the kernel sends on a user's behalf without its uid, as
//! `fuser` does). A request whose arguments are shorter than its operation needs gets `EINVAL`
//! and changes nothing; an operation the mount does not serve gets `ENOSYS`.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytemuck::{bytes_of, Pod};
use tierfs_core::fs::{self as core_fs, Attr, FsError, Kind, Opened, ReadKind, Requester, Xattr};
use tierfs_core::models::ReadBytes;

use super::abi::{self, opcode};

/// The kernel's backing object of a passthrough open made through this transport: its id,
/// closed (`FUSE_DEV_IOC_BACKING_CLOSE`) when the core drops the last handle using it.
#[derive(Debug)]
pub struct KernelBacking {
    id: u32,
    device: Arc<OwnedFd>,
}

impl KernelBacking {
    fn open(device: &Arc<OwnedFd>, file: &File) -> io::Result<KernelBacking> {
        let id = fuser::BackingId::create_raw(device.as_fd(), file.as_fd())?;
        Ok(KernelBacking {
            id,
            device: Arc::clone(device),
        })
    }
}

impl Drop for KernelBacking {
    fn drop(&mut self) {
        // `_IOW(229, 2, uint32_t)`: FUSE_DEV_IOC_BACKING_CLOSE.
        const BACKING_CLOSE: libc::c_ulong = 0x4004_e502;
        let id = self.id;
        // SAFETY: an ioctl on a descriptor this value keeps open, reading one u32 it owns.
        let closed = unsafe { libc::ioctl(self.device.as_raw_fd(), BACKING_CLOSE, &id) };
        if closed != 0 {
            tracing::debug!(id, error = %io::Error::last_os_error(), "cannot close a backing id");
        }
    }
}

/// The filesystem this transport serves.
pub type Fs = core_fs::TierFs<KernelBacking>;

/// What goes back to the kernel for one request.
pub enum Reply {
    /// Nothing: the operation has no reply (`FORGET`, `BATCH_FORGET`, `INTERRUPT`).
    None,
    /// An error (a positive errno).
    Error(i32),
    /// Success, with these bytes after the header: a read's own, in the pieces it was served
    /// from (no copy until they reach the kernel's buffer), or made here.
    Data(ReadBytes),
}

impl Reply {
    fn ok() -> Reply {
        Reply::Data(ReadBytes::Owned(Vec::new()))
    }

    fn of<T: Pod>(value: &T) -> Reply {
        Reply::Data(ReadBytes::Owned(bytes_of(value).to_vec()))
    }

    fn invalid() -> Reply {
        Reply::Error(libc::EINVAL)
    }
}

/// Turns requests into core calls.
pub struct Dispatcher {
    fs: Arc<Fs>,
    device: Arc<OwnedFd>,
    /// `Some(uid)`: only this user's requests are served (a mount not shared with others).
    owner_only: Option<u32>,
}

impl Dispatcher {
    pub fn new(fs: Arc<Fs>, device: Arc<OwnedFd>, owner_only: Option<u32>) -> Dispatcher {
        Dispatcher {
            fs,
            device,
            owner_only,
        }
    }

    /// Answers one request: `header`, its operation's argument struct `op` and the rest of
    /// its arguments `payload` (the layout of the io_uring transport; a `/dev/fuse` request
    /// is split the same way by [`split_device_request`]).
    pub fn handle(&self, header: &abi::InHeader, op: &[u8], payload: &[u8]) -> Reply {
        if !self.allowed(header) {
            return Reply::Error(libc::EACCES);
        }
        let req = Requester {
            uid: header.uid,
            gid: header.gid,
            pid: header.pid,
        };
        let ino = header.nodeid;
        match header.opcode {
            opcode::LOOKUP => match c_name(payload) {
                Some(name) => entry_reply(self.fs.lookup(req, ino, name)),
                None => Reply::invalid(),
            },
            opcode::FORGET => {
                if let Some(forget) = abi::read::<abi::ForgetIn>(op) {
                    self.fs.forget(ino, forget.nlookup);
                }
                Reply::None
            }
            opcode::BATCH_FORGET => {
                self.batch_forget(op, payload);
                Reply::None
            }
            opcode::INTERRUPT => Reply::None, // reads are not interruptible; the kernel waits
            opcode::GETATTR => attr_reply(self.fs.getattr(req, ino)),
            opcode::SETATTR => match abi::read::<abi::SetattrIn>(op) {
                Some(set) => attr_reply(self.fs.setattr(
                    ino,
                    core_fs::SetAttr {
                        size: (set.valid & abi::FATTR_SIZE != 0).then_some(set.size),
                        changes_mode_or_owner: set.valid & abi::FATTR_MODE_OR_OWNER != 0,
                    },
                )),
                None => Reply::invalid(),
            },
            opcode::READLINK => match self.fs.readlink(req, ino) {
                Ok(target) => Reply::Data(ReadBytes::Owned(target.as_os_str().as_bytes().to_vec())),
                Err(e) => error(&e),
            },
            opcode::OPEN => match abi::read::<abi::OpenIn>(op) {
                Some(open) => self.open(req, ino, open.flags),
                None => Reply::invalid(),
            },
            opcode::READ => match abi::read::<abi::ReadIn>(op) {
                Some(read) => {
                    // As in the `fuser` adapter: a reader's own `read()` carries its lock
                    // owner, a page-cache fill never does; every request carries the open's
                    // flags.
                    let kind = ReadKind {
                        from_reader: read.read_flags & abi::READ_LOCKOWNER != 0,
                        o_direct: read.flags as i32 & libc::O_DIRECT != 0,
                    };
                    match self.fs.read(ino, read.fh, read.offset, read.size, kind) {
                        Ok(bytes) => Reply::Data(bytes),
                        Err(e) => error(&e),
                    }
                }
                None => Reply::invalid(),
            },
            opcode::WRITE => match abi::read::<abi::WriteIn>(op) {
                Some(write) => {
                    let data = &payload[..payload.len().min(write.size as usize)];
                    match self.fs.write(ino, write.fh, data) {
                        Ok(written) => Reply::of(&abi::WriteOut {
                            size: u32::try_from(written).unwrap_or(u32::MAX),
                            padding: 0,
                        }),
                        Err(e) => error(&e),
                    }
                }
                None => Reply::invalid(),
            },
            opcode::STATFS => match self.fs.statfs() {
                Ok(s) => Reply::of(&abi::StatfsOut {
                    blocks: s.blocks,
                    bfree: s.bfree,
                    bavail: s.bavail,
                    files: s.files,
                    ffree: s.ffree,
                    bsize: s.bsize,
                    namelen: s.namelen,
                    frsize: s.frsize,
                    ..Default::default()
                }),
                Err(e) => error(&e),
            },
            opcode::RELEASE => match abi::read::<abi::ReleaseIn>(op) {
                Some(release) => {
                    self.fs.release(release.fh);
                    Reply::ok()
                }
                None => Reply::invalid(),
            },
            opcode::FLUSH => Reply::ok(), // nothing is ever buffered for writing
            opcode::GETXATTR => match (abi::read::<abi::GetxattrIn>(op), c_name(payload)) {
                (Some(get), Some(name)) => xattr_reply(self.fs.getxattr(req, ino, name, get.size)),
                _ => Reply::invalid(),
            },
            opcode::LISTXATTR => match abi::read::<abi::GetxattrIn>(op) {
                Some(list) => xattr_reply(self.fs.listxattr(req, ino, list.size)),
                None => Reply::invalid(),
            },
            opcode::OPENDIR => match self.fs.opendir(req, ino) {
                Ok(fh) => Reply::of(&abi::OpenOut {
                    fh,
                    ..Default::default()
                }),
                Err(e) => error(&e),
            },
            opcode::READDIR => match abi::read::<abi::ReadIn>(op) {
                Some(read) => self.readdir(read),
                None => Reply::invalid(),
            },
            opcode::RELEASEDIR => match abi::read::<abi::ReleaseIn>(op) {
                Some(release) => {
                    self.fs.releasedir(release.fh);
                    Reply::ok()
                }
                None => Reply::invalid(),
            },
            opcode::ACCESS => match abi::read::<abi::AccessIn>(op) {
                Some(access) => match self.fs.access(ino, access.mask & abi::W_OK != 0) {
                    Ok(()) => Reply::ok(),
                    Err(e) => error(&e),
                },
                None => Reply::invalid(),
            },
            // Every way of changing anything: read-only.
            opcode::MKNOD
            | opcode::MKDIR
            | opcode::UNLINK
            | opcode::RMDIR
            | opcode::SYMLINK
            | opcode::RENAME
            | opcode::RENAME2
            | opcode::LINK
            | opcode::CREATE
            | opcode::TMPFILE
            | opcode::SETXATTR
            | opcode::REMOVEXATTR
            | opcode::FALLOCATE => error(&FsError::ReadOnly),
            opcode::DESTROY => Reply::ok(),
            opcode::INIT => Reply::Error(libc::EIO), // only once, at the handshake
            _ => Reply::Error(libc::ENOSYS),
        }
    }

    /// `fuser`'s rule for a mount only its owner uses: the operations the kernel may send
    /// without the caller's uid are served, any other from another user is refused.
    fn allowed(&self, header: &abi::InHeader) -> bool {
        match self.owner_only {
            Some(owner) if header.uid != owner => matches!(
                header.opcode,
                opcode::INIT
                    | opcode::DESTROY
                    | opcode::READ
                    | opcode::READDIR
                    | opcode::FORGET
                    | opcode::BATCH_FORGET
                    | opcode::WRITE
                    | opcode::RELEASE
                    | opcode::RELEASEDIR
                    | opcode::INTERRUPT
            ),
            _ => true,
        }
    }

    fn open(&self, req: Requester, ino: u64, flags: u32) -> Reply {
        let open_backing = |file: File| KernelBacking::open(&self.device, &file);
        match self.fs.open(req, ino, flags as i32, &open_backing) {
            Ok(Opened::Served { fh, flags }) => {
                let mut open_flags = 0;
                if flags.direct_io {
                    open_flags |= abi::FOPEN_DIRECT_IO;
                }
                if flags.keep_cache {
                    open_flags |= abi::FOPEN_KEEP_CACHE;
                }
                Reply::of(&abi::OpenOut {
                    fh,
                    open_flags,
                    backing_id: 0,
                })
            }
            Ok(Opened::Passthrough { fh, backing }) => Reply::of(&abi::OpenOut {
                fh,
                open_flags: abi::FOPEN_PASSTHROUGH,
                backing_id: backing.id as i32,
            }),
            Err(e) => error(&e),
        }
    }

    fn readdir(&self, read: abi::ReadIn) -> Reply {
        let room = read.size as usize;
        let mut out = Vec::with_capacity(room.min(64 << 10));
        let listed = self.fs.readdir(read.fh, read.offset, |entry, next| {
            let name = entry.name.as_bytes();
            let header = std::mem::size_of::<abi::Dirent>();
            let padded = (header + name.len()).next_multiple_of(8);
            if out.len() + padded > room {
                return true;
            }
            let dirent = abi::Dirent {
                ino: entry.ino,
                off: next,
                namelen: name.len() as u32,
                kind: mode_type(entry.kind) >> 12,
            };
            out.extend_from_slice(bytes_of(&dirent));
            out.extend_from_slice(name);
            out.resize(out.len() + padded - header - name.len(), 0);
            false
        });
        match listed {
            Ok(()) => Reply::Data(ReadBytes::Owned(out)),
            Err(e) => error(&e),
        }
    }

    fn batch_forget(&self, op: &[u8], payload: &[u8]) {
        let Some(batch) = abi::read::<abi::BatchForgetIn>(op) else {
            return;
        };
        let one = std::mem::size_of::<abi::ForgetOne>();
        for chunk in payload.chunks_exact(one).take(batch.count as usize) {
            if let Some(forget) = abi::read::<abi::ForgetOne>(chunk) {
                self.fs.forget(forget.nodeid, forget.nlookup);
            }
        }
    }
}

/// How many bytes of a `/dev/fuse` request after its header are the operation's argument
/// struct (the io_uring transport's `op_in`); the rest is its payload. Opcodes whose first
/// argument is a name or data have none.
pub fn op_struct_size(opcode: u32) -> usize {
    use std::mem::size_of;
    match opcode {
        opcode::FORGET => size_of::<abi::ForgetIn>(),
        opcode::SETATTR => size_of::<abi::SetattrIn>(),
        opcode::OPEN | opcode::OPENDIR => size_of::<abi::OpenIn>(),
        opcode::READ | opcode::READDIR => size_of::<abi::ReadIn>(),
        opcode::WRITE => size_of::<abi::WriteIn>(),
        opcode::RELEASE | opcode::RELEASEDIR => size_of::<abi::ReleaseIn>(),
        opcode::GETXATTR | opcode::LISTXATTR => size_of::<abi::GetxattrIn>(),
        opcode::ACCESS => size_of::<abi::AccessIn>(),
        opcode::BATCH_FORGET => size_of::<abi::BatchForgetIn>(),
        opcode::GETATTR => 16, // fuse_getattr_in: flags and a handle, not used
        opcode::FLUSH => 24,   // fuse_flush_in, not used
        opcode::INTERRUPT => 8,
        _ => 0,
    }
}

/// A request read from `/dev/fuse` as header, argument struct and payload.
pub fn split_device_request(request: &[u8]) -> Option<(abi::InHeader, &[u8], &[u8])> {
    let header: abi::InHeader = abi::read(request)?;
    let body = request.get(std::mem::size_of::<abi::InHeader>()..header.len as usize)?;
    let op = op_struct_size(header.opcode).min(body.len());
    Some((header, &body[..op], &body[op..]))
}

/// The name at the start of `payload`, up to its NUL.
fn c_name(payload: &[u8]) -> Option<&OsStr> {
    let end = payload.iter().position(|&b| b == 0)?;
    Some(OsStr::from_bytes(&payload[..end]))
}

fn error(e: &FsError) -> Reply {
    Reply::Error(e.errno())
}

fn entry_reply(answer: Result<(Attr, Duration), FsError>) -> Reply {
    match answer {
        Ok((attr, ttl)) => Reply::of(&abi::EntryOut {
            nodeid: attr.ino,
            generation: attr.generation,
            entry_valid: ttl.as_secs(),
            attr_valid: ttl.as_secs(),
            entry_valid_nsec: ttl.subsec_nanos(),
            attr_valid_nsec: ttl.subsec_nanos(),
            attr: fuse_attr(&attr),
        }),
        Err(e) => error(&e),
    }
}

fn attr_reply(answer: Result<(Attr, Duration), FsError>) -> Reply {
    match answer {
        Ok((attr, ttl)) => Reply::of(&abi::AttrOut {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            dummy: 0,
            attr: fuse_attr(&attr),
        }),
        Err(e) => error(&e),
    }
}

fn xattr_reply(answer: Result<Xattr, FsError>) -> Reply {
    match answer {
        Ok(Xattr::Size(size)) => Reply::of(&abi::GetxattrOut { size, padding: 0 }),
        Ok(Xattr::Data(value)) => Reply::Data(ReadBytes::Owned(value)),
        Err(e) => error(&e),
    }
}

/// The `S_IFMT` bits of `kind`.
fn mode_type(kind: Kind) -> u32 {
    match kind {
        Kind::File => libc::S_IFREG,
        Kind::Directory => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::NamedPipe => libc::S_IFIFO,
        Kind::CharDevice => libc::S_IFCHR,
        Kind::BlockDevice => libc::S_IFBLK,
        Kind::Socket => libc::S_IFSOCK,
    }
}

/// Seconds and nanoseconds since the epoch, negative before it (the kernel's signed time in an
/// unsigned field).
fn timestamp(time: SystemTime) -> (u64, u32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(before) => {
            let d = before.duration();
            let secs = d.as_secs().min(i64::MAX as u64) as i64;
            match d.subsec_nanos() {
                0 => ((-secs) as u64, 0),
                nanos => ((-secs - 1) as u64, 1_000_000_000 - nanos),
            }
        }
    }
}

fn fuse_attr(attr: &Attr) -> abi::Attr {
    let (atime, atimensec) = timestamp(attr.atime);
    let (mtime, mtimensec) = timestamp(attr.mtime);
    let (ctime, ctimensec) = timestamp(attr.ctime);
    abi::Attr {
        ino: attr.ino,
        size: attr.size,
        blocks: attr.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: mode_type(attr.kind) | u32::from(attr.perm),
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_request_splits_into_header_struct_and_payload() {
        let header = abi::InHeader {
            len: 40 + 40,
            opcode: opcode::READ,
            unique: 9,
            nodeid: 5,
            ..Default::default()
        };
        let read = abi::ReadIn {
            fh: 3,
            offset: 4096,
            size: 131072,
            ..Default::default()
        };
        let mut bytes = bytes_of(&header).to_vec();
        bytes.extend_from_slice(bytes_of(&read));
        bytes.extend_from_slice(b"trailing garbage past len");
        let (h, op, payload) = split_device_request(&bytes).expect("splits");
        assert_eq!(h.unique, 9);
        assert_eq!(abi::read::<abi::ReadIn>(op).map(|r| r.offset), Some(4096));
        assert!(payload.is_empty());
    }

    #[test]
    fn a_lookup_is_all_payload_and_a_truncated_request_is_refused() {
        let name = b"model.safetensors\0";
        let header = abi::InHeader {
            len: (40 + name.len()) as u32,
            opcode: opcode::LOOKUP,
            ..Default::default()
        };
        let mut bytes = bytes_of(&header).to_vec();
        bytes.extend_from_slice(name);
        let (_, op, payload) = split_device_request(&bytes).expect("splits");
        assert!(op.is_empty());
        assert_eq!(c_name(payload), Some(OsStr::new("model.safetensors")));
        assert!(split_device_request(&bytes[..bytes.len() - 1]).is_none());
        assert!(c_name(b"no terminator").is_none());
    }

    #[test]
    fn times_before_the_epoch_are_negative_seconds_and_positive_nanoseconds() {
        let t = UNIX_EPOCH - Duration::new(1, 250_000_000);
        assert_eq!(timestamp(t), ((-2i64) as u64, 750_000_000));
        assert_eq!(timestamp(UNIX_EPOCH + Duration::new(5, 7)), (5, 7));
    }
}
