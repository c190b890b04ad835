//! One ring entry: a thread that owns an io_uring of its own, registers one entry (a header
//! buffer and a payload buffer) with a queue of the FUSE connection, and then answers the
//! requests the kernel puts in it, each answer committed together with the fetch of the next
//! request (`COMMIT_AND_FETCH`): one system call per request, where `/dev/fuse` takes a
//! `read` and a `write`.
//!
//! Why a ring per entry, not one ring per queue with many entries: a request may block on the
//! source (a cache miss waits for its chunk), and the kernel hands a queue's requests to that
//! queue's free entries only. With one thread per entry, a blocked request holds one entry and
//! the queue's other entries keep serving, exactly as the `/dev/fuse` transport's threads do;
//! one thread serving many entries would serialise them behind the slowest.
//!
//! The buffers are the kernel's to write from registration until the connection ends, so they
//! are never freed (see [`EntryBuffers`]); the thread ends when the kernel ends the entry's
//! command (unmount, abort: `ENOTCONN`, `ECONNABORTED`) and reports how.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use bytemuck::{bytes_of, Zeroable};
use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::abi;
use super::dispatch::{Dispatcher, Reply};

/// An entry's two buffers, at fixed addresses for the connection's life.
struct EntryBuffers {
    header: &'static mut abi::RingHeader,
    payload: &'static mut [u8],
    /// The `iovec` pair the registration points the kernel at.
    iov: &'static mut [libc::iovec; 2],
}

impl EntryBuffers {
    /// Allocates them and leaks them: the kernel keeps their addresses after the ring that
    /// registered them is gone (until it tears the connection down), so freeing them when the
    /// thread ends could let it write into memory reused for something else. They are a few
    /// per CPU, and the thread ends only when the mount does.
    fn leak(payload_size: usize) -> EntryBuffers {
        let header: &'static mut abi::RingHeader = Box::leak(Box::new(Zeroable::zeroed()));
        let payload: &'static mut [u8] = Box::leak(vec![0u8; payload_size].into_boxed_slice());
        let iov = Box::leak(Box::new([
            libc::iovec {
                iov_base: std::ptr::from_mut(header).cast(),
                iov_len: std::mem::size_of::<abi::RingHeader>(),
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]));
        EntryBuffers {
            header,
            payload,
            iov,
        }
    }
}

/// How an entry's thread ended.
#[derive(Debug)]
pub enum Ended {
    /// The kernel ended the connection (unmount or abort).
    Disconnected,
    /// The ring failed: the entry no longer serves.
    Failed(io::Error),
}

/// Serves one entry of queue `qid` until the connection ends.
pub fn serve_entry(
    device: &Arc<OwnedFd>,
    qid: u16,
    payload_size: usize,
    dispatcher: &Dispatcher,
) -> Ended {
    // Not `IORING_SETUP_DEFER_TASKRUN`: with it, a request the kernel handed to an idle entry
    // from another context now and then stayed undelivered while the entry's thread waited
    // (a file's `RELEASE` more than 10 s late in 4 of 70 runs of `tests/python/test_forget.py`,
    // none of 110 without it; [measured](../../../docs/PERFORMANCE.md#the-io-uring-transport)).
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        match IoUring::builder().setup_single_issuer().build(2) {
            Ok(ring) => ring,
            Err(e) => return Ended::Failed(e),
        };
    let buffers = EntryBuffers::leak(payload_size);
    let register = command(
        device,
        abi::URING_CMD_REGISTER,
        abi::RingCmdReq {
            qid,
            ..Default::default()
        },
        Some(std::ptr::from_ref(buffers.iov) as u64),
    );
    if let Err(e) = push(&mut ring, &register) {
        return Ended::Failed(e);
    }
    loop {
        let cqe = match wait(&mut ring) {
            Ok(cqe) => cqe,
            Err(e) => return Ended::Failed(e),
        };
        if cqe.result() < 0 {
            return match -cqe.result() {
                libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED => {
                    Ended::Disconnected
                }
                errno => Ended::Failed(io::Error::from_raw_os_error(errno)),
            };
        }
        super::RING_REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let commit_id = answer(&mut *buffers.header, &mut *buffers.payload, dispatcher);
        let commit = command(
            device,
            abi::URING_CMD_COMMIT_AND_FETCH,
            abi::RingCmdReq {
                commit_id,
                qid,
                ..Default::default()
            },
            None,
        );
        if let Err(e) = push(&mut ring, &commit) {
            return Ended::Failed(e);
        }
    }
}

/// Answers the request in an entry's buffers, in place; returns the id that commits it.
fn answer(header: &mut abi::RingHeader, payload: &mut [u8], dispatcher: &Dispatcher) -> u64 {
    let request: abi::InHeader = abi::read(&header.in_out).unwrap_or_default();
    let used = (header.ent.payload_sz as usize).min(payload.len());
    let reply = dispatcher.handle(&request, &header.op_in, &payload[..used]);
    let (error, len) = match reply {
        // An operation without a reply never comes through a ring (the kernel sends forgets
        // and interrupts through `/dev/fuse`); the commit still needs an answer.
        Reply::None => (0, 0),
        Reply::Error(errno) => (-errno, 0),
        Reply::Data(data) if data.len() > payload.len() => {
            tracing::error!(
                len = data.len(),
                room = payload.len(),
                "a reply larger than the ring's payload buffer"
            );
            (-libc::EIO, 0)
        }
        Reply::Data(data) => (0, data.copy_into(payload)),
    };
    let out = abi::OutHeader {
        len: (std::mem::size_of::<abi::OutHeader>() + len) as u32,
        error,
        unique: request.unique,
    };
    header.in_out[..std::mem::size_of::<abi::OutHeader>()].copy_from_slice(bytes_of(&out));
    header.ent.payload_sz = len as u32;
    header.ent.commit_id
}

/// An `IORING_OP_URING_CMD` for `/dev/fuse`: `cmd_op`, the FUSE command in the SQE's command
/// area, and for a registration the address of the two `iovec`s (with `len` 2, which the
/// crate's builder has no setter for).
fn command(
    device: &Arc<OwnedFd>,
    cmd_op: u32,
    request: abi::RingCmdReq,
    iov: Option<u64>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[..std::mem::size_of::<abi::RingCmdReq>()].copy_from_slice(bytes_of(&request));
    let entry = opcode::UringCmd80::new(types::Fd(device.as_raw_fd()), cmd_op)
        .cmd(cmd)
        .addr(iov)
        .build();
    if iov.is_none() {
        return entry;
    }
    // SAFETY: `Entry128` is `#[repr(C)]`: a kernel `io_uring_sqe` (64 bytes) then 64 bytes of
    // command; every bit pattern of those 128 bytes is a valid value of it. `len` is the u32
    // at offset 24 of `io_uring_sqe` (after opcode, flags, ioprio, fd, off, addr).
    unsafe {
        let mut raw: [u8; 128] = std::mem::transmute(entry);
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
    }
}

/// Queues `entry`; the next [`wait`] submits it in the same system call that waits.
fn push(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    entry: &squeue::Entry128,
) -> io::Result<()> {
    // SAFETY: the entry's buffers (the leaked `EntryBuffers`) outlive the command.
    unsafe { ring.submission().push(entry) }
        .map_err(|_| io::Error::other("the ring's submission queue is full"))
}

/// Submits what is queued and waits for one completion.
fn wait(ring: &mut IoUring<squeue::Entry128, cqueue::Entry>) -> io::Result<cqueue::Entry> {
    loop {
        if let Some(cqe) = ring.completion().next() {
            return Ok(cqe);
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}
