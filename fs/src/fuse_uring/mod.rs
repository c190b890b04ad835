//! The io_uring transport of a mount (`--io-uring`): the kernel hands FUSE requests to
//! entries registered in io_uring rings, one queue per CPU, and takes each reply together with
//! the fetch of the next request, instead of a `read` and a `write` of `/dev/fuse` per
//! request. It serves the same core ([`tierfs_core::fs::TierFs`]) with the same semantics as
//! the `fuser` transport ([`crate::fuse`]): see [`dispatch`] for the operations.
//!
//! How it is built: `fuser` still mounts and performs the `INIT` handshake (asking for
//! `FUSE_OVER_IO_URING` besides the usual capabilities, [`Handshake`]), then this module takes
//! the connection's descriptor and serves it with its own request loop: per queue,
//! [`entries_per_queue`] threads, each with a ring and one registered entry ([`ring`]), and one
//! thread reading `/dev/fuse` for what the kernel never puts in a ring (forgets, interrupts)
//! and for requests that come before every queue is registered ([`device`]). `fuser` has no
//! io_uring transport, and its request parsing is private: the ABI structs are this module's
//! ([`abi`], checked against the kernel's header). Notifications (page-cache invalidations)
//! still go through `/dev/fuse`, as the kernel requires.
//!
//! Where the kernel cannot (its `fuse` module's `enable_uring` is off, or it is older than
//! 6.14), `--io-uring auto` serves with the `/dev/fuse` transport and says why, in the log
//! and in the stats (`mount.transport`); `--io-uring on` refuses to mount.

pub mod abi;
pub mod device;
pub mod dispatch;
pub mod ring;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use fuser::{InitFlags, KernelConfig, Request};
use tierfs_core::fs::KernelCapabilities;

use dispatch::{Dispatcher, Fs};
use ring::Ended;

/// Which transport `--io-uring` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum TransportMode {
    /// The `/dev/fuse` transport.
    #[default]
    Off,
    /// io_uring where the kernel allows it, else `/dev/fuse` (the reason is logged).
    Auto,
    /// io_uring, or no mount.
    On,
}

/// The smallest request size this transport negotiates: 1 MiB, the kernel's default largest
/// request (`fs.fuse.max_pages_limit` 256 pages).
const MIN_REQUEST_BYTES: usize = 1 << 20;
/// The largest: 16 MiB, `fuser`'s largest write (and the most the kernel allows).
const MAX_REQUEST_BYTES: usize = 16 << 20;

/// The largest request (and reply) of a mount through this transport: as large as the kernel
/// allows (`fs.fuse.max_pages_limit`, read at mount), within 1–16 MiB. It is the `max_write`
/// asked at `INIT` (control commands are the only writes) and so the kernel's `max_pages`,
/// and the size of every ring entry's payload buffer (the kernel refuses a smaller one).
pub fn request_bytes(max_pages_limit: Option<usize>) -> usize {
    let page = 4096;
    max_pages_limit
        .map_or(MIN_REQUEST_BYTES, |pages| pages.saturating_mul(page))
        .clamp(MIN_REQUEST_BYTES, MAX_REQUEST_BYTES)
}

/// Where the kernel says whether FUSE may use io_uring.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Why the kernel cannot serve a mount through io_uring, or `Ok` where it can.
pub fn kernel_allows() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(value) if value.trim() == "Y" => Ok(()),
        Ok(_) => Err(format!(
            "the kernel's FUSE io_uring transport is off ({ENABLE_URING} is N; as root: \
             echo Y > {ENABLE_URING})"
        )),
        Err(_) => Err(format!(
            "this kernel has no FUSE io_uring transport ({ENABLE_URING} is missing; Linux 6.14 \
             or later)"
        )),
    }
}

/// How a mount is served, for the log and the stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// `/dev/fuse`, with why io_uring is not used when it was asked for.
    Device { reason: Option<String> },
    /// io_uring: `queues` queues of `entries` entries each, with `payload`-byte buffers.
    Uring {
        queues: usize,
        entries: usize,
        payload: usize,
    },
}

/// The `transport` section of the stats document.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TransportStats {
    /// `io_uring` or `dev_fuse`.
    pub kind: &'static str,
    /// Why `dev_fuse` serves a mount that asked for io_uring.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// io_uring queues (one per CPU) and entries (request threads) per queue.
    pub queues: usize,
    pub entries_per_queue: usize,
    /// Memory of the entries' buffers (`queues × entries_per_queue ×` the payload buffer and
    /// header): held for the mount's life, outside the budget, resident once requests have
    /// used it.
    pub buffer_bytes: u64,
    /// Requests answered through the rings, and through `/dev/fuse` by this transport (forgets,
    /// requests before the rings were ready). 0 under `fuser`'s `/dev/fuse` transport.
    pub ring_requests: u64,
    pub device_requests: u64,
}

/// Requests this transport answered, by path.
pub static RING_REQUESTS: AtomicU64 = AtomicU64::new(0);
pub static DEVICE_REQUESTS: AtomicU64 = AtomicU64::new(0);

impl TransportStats {
    /// The transport of this process's mount, now.
    pub fn now() -> TransportStats {
        let (kind, reason, queues, entries_per_queue, payload) = match transport() {
            Transport::Device { reason } => ("dev_fuse", reason, 0, 0, 0),
            Transport::Uring {
                queues,
                entries,
                payload,
            } => ("io_uring", None, queues, entries, payload),
        };
        let entry_bytes = payload + std::mem::size_of::<abi::RingHeader>();
        TransportStats {
            kind,
            reason,
            queues,
            entries_per_queue,
            buffer_bytes: (queues * entries_per_queue * entry_bytes) as u64,
            ring_requests: RING_REQUESTS.load(Ordering::Relaxed),
            device_requests: DEVICE_REQUESTS.load(Ordering::Relaxed),
        }
    }
}

/// The transport of this process's mount, for its stats document (one mount per process).
static TRANSPORT: Mutex<Option<Transport>> = Mutex::new(None);

/// Records how the mount is served.
pub fn set_transport(transport: Transport) {
    if let Ok(mut slot) = TRANSPORT.lock() {
        *slot = Some(transport);
    }
}

/// How the mount is served (`/dev/fuse` until said otherwise).
pub fn transport() -> Transport {
    TRANSPORT
        .lock()
        .ok()
        .and_then(|t| t.clone())
        .unwrap_or(Transport::Device { reason: None })
}

/// Ring entries per queue, each a thread that can wait on the source for one request:
/// `threads` request threads (`--threads`) shared out over `queues` queues, at least one each,
/// so as many threads as the `/dev/fuse` transport runs (each costs a thread's memory and a
/// payload buffer). The kernel gives a request to a free entry of its caller's CPU's queue
/// only, so when every entry of one CPU waits on the source, that CPU's next request waits for
/// one of them.
pub fn entries_per_queue(threads: usize, queues: usize) -> usize {
    threads.div_ceil(queues.max(1)).max(1)
}

/// The `fuser` filesystem that only performs the handshake: the capabilities of the `fuser`
/// transport, `FUSE_OVER_IO_URING`, and a write size the ring buffers can hold.
pub struct Handshake {
    passthrough_wanted: bool,
    request_bytes: usize,
    offered: Arc<Mutex<Option<Offered>>>,
}

/// What the kernel accepted at `INIT`.
#[derive(Debug, Clone, Copy)]
pub struct Offered {
    pub capabilities: KernelCapabilities,
    pub io_uring: bool,
    /// The largest request, as asked ([`request_bytes`]).
    pub request_bytes: usize,
}

impl Handshake {
    /// The handshake of a mount whose requests are at most `request_bytes` ([`request_bytes`]).
    pub fn new(
        passthrough_wanted: bool,
        request_bytes: usize,
    ) -> (Handshake, Arc<Mutex<Option<Offered>>>) {
        let offered = Arc::new(Mutex::new(None));
        (
            Handshake {
                passthrough_wanted,
                request_bytes,
                offered: Arc::clone(&offered),
            },
            offered,
        )
    }
}

impl fuser::Filesystem for Handshake {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let capabilities = crate::fuse::negotiate(config, self.passthrough_wanted);
        let _ = config.set_max_write(u32::try_from(self.request_bytes).unwrap_or(u32::MAX));
        let io_uring = config
            .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
            .is_ok();
        if let Ok(mut slot) = self.offered.lock() {
            *slot = Some(Offered {
                capabilities,
                io_uring,
                request_bytes: self.request_bytes,
            });
        }
        Ok(())
    }
}

/// How many queues the kernel makes: one per possible CPU (`num_possible_cpus`).
pub fn queue_count() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|list| possible_cpus(&list))
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The number of CPUs in a kernel CPU list such as `0-3,8-11`.
fn possible_cpus(list: &str) -> Option<usize> {
    let mut count = 0;
    for part in list.trim().split(',') {
        count += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1,
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (count > 0).then_some(count)
}

/// `fs.fuse.max_pages_limit`: the most pages the kernel puts in one request.
pub fn max_pages_limit() -> Option<usize> {
    std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

/// The threads serving a mount through this transport.
pub struct Serving {
    threads: Vec<JoinHandle<Ended>>,
}

impl Serving {
    /// Starts serving connection `device` with `fs`: rings when `offered.io_uring`, else (unless
    /// `required`) `request_threads` threads on `/dev/fuse`, the reason recorded.
    pub fn start(
        fs: Arc<Fs>,
        device: &impl AsFd,
        owner_only: Option<u32>,
        offered: Offered,
        (request_threads, required): (usize, bool),
    ) -> io::Result<Serving> {
        if required && !offered.io_uring {
            return Err(io::Error::other(
                "--io-uring on: the kernel did not accept FUSE_OVER_IO_URING at INIT",
            ));
        }
        let device: Arc<OwnedFd> = Arc::new(device.as_fd().try_clone_to_owned()?);
        let dispatcher = Arc::new(Dispatcher::new(fs, Arc::clone(&device), owner_only));
        let buffer = device::request_buffer_size(offered.request_bytes);
        let mut threads = Vec::new();
        if !offered.io_uring {
            let reason = "the kernel did not accept FUSE_OVER_IO_URING at INIT".to_string();
            tracing::warn!(%reason, "serving through /dev/fuse");
            set_transport(Transport::Device {
                reason: Some(reason),
            });
            for i in 0..request_threads.max(1) {
                threads.push(spawn_device_thread(
                    format!("tierfs-dev-{i}"),
                    &device,
                    &dispatcher,
                    buffer,
                )?);
            }
            return Ok(Serving { threads });
        }
        let queues = queue_count();
        let entries = entries_per_queue(request_threads, queues);
        let payload = offered.request_bytes;
        // Said before the first entry serves (the stats of a request it answers name the
        // transport that answered); an entry the kernel refuses says otherwise.
        set_transport(Transport::Uring {
            queues,
            entries,
            payload,
        });
        threads.push(spawn_device_thread(
            "tierfs-dev".into(),
            &device,
            &dispatcher,
            buffer,
        )?);
        for qid in 0..queues {
            for e in 0..entries {
                let (device, dispatcher) = (Arc::clone(&device), Arc::clone(&dispatcher));
                threads.push(
                    thread::Builder::new()
                        .name(format!("tierfs-q{qid}-{e}"))
                        .spawn(move || {
                            pin_to_cpu(qid);
                            match ring::serve_entry(&device, qid as u16, payload, &dispatcher) {
                                // An entry the kernel refused: serve from /dev/fuse instead,
                                // so that the mount keeps as many request threads.
                                Ended::Failed(e) => {
                                    tracing::warn!(error = %e, qid, "a ring entry failed: serving through /dev/fuse");
                                    set_transport(Transport::Device {
                                        reason: Some(format!("a ring entry failed: {e}")),
                                    });
                                    device::serve_device(&device, buffer, &dispatcher)
                                }
                                ended => ended,
                            }
                        })?,
                );
            }
        }
        tracing::info!(queues, entries, payload, "serving through io_uring");
        Ok(Serving { threads })
    }

    /// Waits until every thread has ended: `Ok` when the connection ended (unmounted or
    /// aborted), else the first failure.
    pub fn join(self) -> io::Result<()> {
        let mut result = Ok(());
        for thread in self.threads {
            match thread.join() {
                Ok(Ended::Disconnected) => {}
                Ok(Ended::Failed(e)) => {
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
                Err(_) => {
                    if result.is_ok() {
                        result = Err(io::Error::other("a request thread panicked"));
                    }
                }
            }
        }
        result
    }
}

/// A thread serving `device` through `/dev/fuse` reads until the connection ends.
fn spawn_device_thread(
    name: String,
    device: &Arc<OwnedFd>,
    dispatcher: &Arc<Dispatcher>,
    buffer: usize,
) -> io::Result<JoinHandle<Ended>> {
    let (device, dispatcher) = (Arc::clone(device), Arc::clone(dispatcher));
    thread::Builder::new()
        .name(name)
        .spawn(move || device::serve_device(&device, buffer, &dispatcher))
}

/// Keeps the calling thread on `cpu`: the kernel queues a request on its caller's CPU and
/// completes it in the entry's thread, so an entry's thread on the same CPU answers without
/// a cross-CPU wake-up. A failure only costs that.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::debug!(cpu, "cannot pin a ring thread");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn possible_cpus_counts_ranges_and_singles() {
        assert_eq!(possible_cpus("0-1\n"), Some(2));
        assert_eq!(possible_cpus("0-3,8-11"), Some(8));
        assert_eq!(possible_cpus("0"), Some(1));
        assert_eq!(possible_cpus("3-1"), None);
        assert_eq!(possible_cpus("x"), None);
    }

    #[test]
    fn the_request_threads_are_shared_out_over_the_queues() {
        assert_eq!(entries_per_queue(8, 2), 4);
        assert_eq!(entries_per_queue(8, 3), 3);
        assert_eq!(entries_per_queue(8, 32), 1);
        assert_eq!(entries_per_queue(0, 0), 1);
    }

    #[test]
    fn requests_are_as_large_as_the_kernel_allows_within_1_to_16_mib() {
        assert_eq!(request_bytes(Some(256)), 1 << 20); // the kernel's default limit
        assert_eq!(request_bytes(Some(1024)), 4 << 20);
        assert_eq!(request_bytes(Some(65536)), 16 << 20);
        assert_eq!(request_bytes(Some(1)), 1 << 20);
        assert_eq!(request_bytes(None), 1 << 20);
    }
}
