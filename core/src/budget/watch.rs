//! The watcher thread and the daemon's standing with the OOM killer.
//!
//! The thread sleeps in `poll(2)` for at most [`super::GovernorConfig::poll`] on eventfds the kernel signals
//! (cgroup v1: `memory.usage_in_bytes` crossing the limit minus the reserve, and
//! `memory.pressure_level` at "medium", both registered through `cgroup.event_control`), then
//! reads the sources and hands the reading to the governor. The threshold event is what makes
//! the cgroup case fast: the kernel checks thresholds every 128 page charges (512 KiB), so the
//! watcher wakes within microseconds of a program allocating into the reserve, not at the next
//! poll. Cgroup v2 has no such event short of PSI triggers (2 s windows for unprivileged
//! users), so there the poll period and the reserve carry the load.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use super::probe::{reserve_for, CgroupVersion, Probe};
use super::Governor;

/// The daemon's `oom_score_adj` when it runs as root.
///
/// The OOM killer picks the task with the highest `rss + swap + page tables + adj × limit /
/// 1000` (the limit being RAM, or the cgroup's limit in a cgroup OOM). With the cache shrunk to
/// its floor under pressure, the daemon is rarely the largest task, but it may be close to a
/// loader that is the one growing; −500 takes half the limit off the daemon's score, so it is
/// chosen only if it holds half the memory more than any other candidate, which a cache at its
/// floor never does. Not −1000 (never kill): a daemon that leaks would then have the kernel kill
/// every other program first and finally panic; a killed daemon leaves a dead mount that
/// `tierfs mount` cleans up and remounts. Lowering the score needs `CAP_SYS_RESOURCE`, so an
/// unprivileged daemon keeps the score it inherited.
pub const DAEMON_OOM_SCORE_ADJ: i32 = -500;

/// Sets [`DAEMON_OOM_SCORE_ADJ`] if the daemon may (root with `CAP_SYS_RESOURCE`). Errors
/// are logged: a daemon without the adjustment still works.
pub fn protect_daemon() {
    let write = OpenOptions::new()
        .write(true)
        .open("/proc/self/oom_score_adj")
        .and_then(|mut f| f.write_all(DAEMON_OOM_SCORE_ADJ.to_string().as_bytes()));
    match write {
        Ok(()) => tracing::debug!(adj = DAEMON_OOM_SCORE_ADJ, "oom_score_adj set"),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => tracing::info!(
            adj = oom_score_adj(),
            "lowering oom_score_adj needs CAP_SYS_RESOURCE: keeping the inherited one"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot set the daemon's oom_score_adj"),
    }
}

/// The daemon's `oom_score_adj`, if it can be read.
pub fn oom_score_adj() -> Option<i32> {
    std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// An eventfd registered with a v1 cgroup, and what its signal means.
struct Registration {
    event: OwnedFd,
    /// Kept open: closing it would not unregister, but the kernel holds a reference anyway.
    _watched: File,
    pressure: bool,
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a freshly created descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Registers an eventfd for `file` of cgroup `dir` with `arguments` (v1 `cgroup.event_control`).
fn register(dir: &Path, file: &str, arguments: &str, pressure: bool) -> io::Result<Registration> {
    let event = eventfd()?;
    let watched = File::open(dir.join(file))?;
    let line = format!("{} {} {arguments}", event.as_raw_fd(), watched.as_raw_fd());
    OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.event_control"))?
        .write_all(line.as_bytes())?;
    Ok(Registration {
        event,
        _watched: watched,
        pressure,
    })
}

/// The v1 registrations for every limited level of the daemon's cgroup.
fn register_v1(probe: &Probe) -> Vec<Registration> {
    let Some(cgroup) = probe
        .cgroup
        .as_ref()
        .filter(|c| c.version == CgroupVersion::V1)
    else {
        return Vec::new();
    };
    let mut registrations = Vec::new();
    for dir in &cgroup.levels {
        let Some(level) = cgroup.level(dir) else {
            continue;
        };
        let threshold = level.limit.saturating_sub(reserve_for(level.limit));
        let attempts = [
            register(dir, "memory.usage_in_bytes", &threshold.to_string(), false),
            register(dir, "memory.pressure_level", "medium", true),
        ];
        for attempt in attempts {
            match attempt {
                Ok(registration) => registrations.push(registration),
                Err(e) => {
                    tracing::info!(dir = %dir.display(), error = %e, "cannot register a cgroup memory event; polling only")
                }
            }
        }
    }
    registrations
}

/// What the watcher watches, for the stats.
fn describe(probe: &Probe) -> Vec<String> {
    let mut watching = vec!["system".to_string()];
    if let Some(cgroup) = &probe.cgroup {
        let version = match cgroup.version {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        };
        watching.push(format!("cgroup {version} {}", cgroup.dir().display()));
    }
    watching
}

/// Starts the watcher for `governor`; it ends when the governor is dropped.
pub fn start(governor: &Arc<Governor>, probe: Probe) -> io::Result<JoinHandle<()>> {
    governor.set_watching(describe(&probe));
    let registrations = register_v1(&probe);
    let governor = Arc::downgrade(governor);
    thread::Builder::new()
        .name("tierfs-pressure".into())
        .spawn(move || run(&governor, probe, &registrations))
}

/// The watcher's nice value. Memory runs short when the machine is busiest, and a watcher
/// waiting for a CPU behind a loaded run queue lets programs allocate past the reserve (see
/// [`super::probe::reserve_for`]); it runs about 50 µs per wake-up, so raising it costs nobody
/// anything. Needs `CAP_SYS_NICE`; without it the thread keeps the default.
const WATCHER_NICE: libc::c_int = -10;

fn run(governor: &Weak<Governor>, mut probe: Probe, registrations: &[Registration]) {
    // SAFETY: gettid cannot fail; setpriority on this thread's id only changes its own nice
    // value, and a failure (no CAP_SYS_NICE) is harmless.
    unsafe {
        let tid = libc::gettid();
        if libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, WATCHER_NICE) != 0 {
            tracing::debug!("cannot raise the pressure watcher's priority");
        }
    }
    let poll = governor
        .upgrade()
        .map_or(super::POLL, |governor| governor.config().poll);
    let mut warned = false;
    loop {
        let kernel_event = wait(registrations, poll);
        let Some(governor) = governor.upgrade() else {
            return;
        };
        match probe.read() {
            Ok(mut reading) => {
                let alone = probe.cgroup.as_ref().is_some_and(|c| c.alone());
                reading.kernel_event |= kernel_event && !alone;
                governor.observe(&reading, Instant::now());
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(error = %e, "cannot read memory figures; the budget stays as it is");
            }
            Err(_) => {}
        }
    }
}

/// Waits for a kernel event or `poll`; returns whether a pressure-level event came.
fn wait(registrations: &[Registration], poll: std::time::Duration) -> bool {
    let mut fds: Vec<libc::pollfd> = registrations
        .iter()
        .map(|r| libc::pollfd {
            fd: r.event.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout = poll.as_millis() as libc::c_int;
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures. With no descriptors,
    // poll just sleeps for the timeout.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
    if ready <= 0 {
        return false;
    }
    let mut pressure = false;
    for (fd, registration) in fds.iter().zip(registrations) {
        if fd.revents & libc::POLLIN != 0 {
            drain(registration.event.as_raw_fd());
            pressure |= registration.pressure;
        }
    }
    pressure
}

/// Reads an eventfd's counter so that it stops being readable.
fn drain(fd: RawFd) {
    let mut counter = [0u8; 8];
    // SAFETY: `fd` is an open eventfd and `counter` has room for the 8 bytes it returns. A
    // failure (EAGAIN: already drained) leaves nothing to do.
    unsafe { libc::read(fd, counter.as_mut_ptr().cast(), counter.len()) };
}
