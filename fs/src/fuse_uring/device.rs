//! The `/dev/fuse` side of the io_uring transport: a thread that reads requests from the
//! device and writes their replies, as the classic transport does.
//!
//! With rings it serves what the kernel never puts in a ring (forgets and interrupts) and the
//! requests that arrive before every queue has an entry registered; without them (the kernel
//! refused a registration) it serves everything, one such thread per ring entry that could
//! not register.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use bytemuck::bytes_of;

use super::abi;
use super::dispatch::{split_device_request, Dispatcher, Reply};
use super::ring::Ended;

/// Room for one request: the largest write the mount accepts, its header and argument
/// struct (the kernel refuses a read into a smaller buffer).
pub fn request_buffer_size(max_write: usize) -> usize {
    max_write + 4096
}

/// Serves requests read from `device` until the connection ends.
pub fn serve_device(device: &Arc<OwnedFd>, buffer_size: usize, dispatcher: &Dispatcher) -> Ended {
    let mut buffer = vec![0u8; buffer_size];
    loop {
        // SAFETY: a read into a buffer this function owns, at most its length.
        let n = unsafe { libc::read(device.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Interrupted, or a request the kernel withdrew before it was read.
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                Some(libc::ENODEV | libc::ECONNABORTED) => return Ended::Disconnected,
                _ => return Ended::Failed(e),
            }
        }
        let Some((header, op, payload)) = split_device_request(&buffer[..n as usize]) else {
            tracing::warn!(len = n, "a malformed request from /dev/fuse");
            continue;
        };
        super::DEVICE_REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reply = dispatcher.handle(&header, op, payload);
        if let Err(e) = write_reply(device, header.unique, reply) {
            match e.raw_os_error() {
                // The request was interrupted and ended meanwhile: nobody waits for it.
                Some(libc::ENOENT) => {}
                Some(libc::ENODEV | libc::ECONNABORTED) => return Ended::Disconnected,
                _ => tracing::warn!(error = %e, "cannot write a reply to /dev/fuse"),
            }
        }
    }
}

/// Writes `reply` to request `unique` in one `writev` (header and the bytes' pieces, no copy).
fn write_reply(device: &Arc<OwnedFd>, unique: u64, reply: Reply) -> io::Result<()> {
    let (error, data) = match reply {
        Reply::None => return Ok(()),
        Reply::Error(errno) => (-errno, None),
        Reply::Data(data) => (0, Some(data)),
    };
    let header = abi::OutHeader {
        len: (std::mem::size_of::<abi::OutHeader>() + data.as_ref().map_or(0, |d| d.len())) as u32,
        error,
        unique,
    };
    let mut parts = vec![IoSlice::new(bytes_of(&header))];
    parts.extend(data.iter().flat_map(|d| d.slices()).map(IoSlice::new));
    // SAFETY: `IoSlice` is ABI-compatible with `iovec`; every slice outlives the call.
    let written = unsafe {
        libc::writev(
            device.as_raw_fd(),
            parts.as_ptr().cast(),
            parts.len() as libc::c_int,
        )
    };
    if written < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
