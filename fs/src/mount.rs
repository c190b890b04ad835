//! `tierfs mount`: setting up a mount, running it, and tearing it down cleanly.
//!
//! Order of events: check paths (recovering a dead mount left by a crashed daemon), size the
//! budget, mount and complete the FUSE handshake (`fuser::Session::new` returns once the kernel
//! has initialised the connection, so the mount answers from then on), raise the mount's
//! readahead, start the request threads and the page-cache notifier, then wait. SIGINT and
//! SIGTERM unmount; so does `tierfs unmount` or `umount` from outside. Either way the session
//! threads see the end of the connection and `wait` returns.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;

use anyhow::{bail, Context, Result};
use crossbeam::channel::{unbounded, Receiver};
use fuser::{BackgroundSession, Config, INodeNo, MountOption, Notifier, SessionACL};
use tierfs_core::access::Sharing;
use tierfs_core::kernel_cache::{window_for_budget, InodeRange, KernelCacheWindow};
use tierfs_core::models::ModelStore;
use tierfs_core::prefetch::saved::SavedOrders;
use tierfs_core::size::format_size;
use tierfs_core::stats::Counters;

use crate::fuse::{MountSettings, TierFs};

/// The most readahead asked of the kernel in the FUSE handshake. The kernel caps it at the
/// mount's BDI readahead, which is raised after mounting (see [`set_bdi_readahead`]).
pub const KERNEL_READAHEAD_BYTES: u32 = 4 << 20;

/// What `tierfs mount` was asked to do.
#[derive(Debug, Clone)]
pub struct MountRequest {
    pub source: PathBuf,
    pub mountpoint: PathBuf,
    pub budget: u64,
    pub threads: usize,
    pub readahead: u64,
    pub passthrough: bool,
    /// Model files that fit the budget are served by passthrough too (see
    /// `tierfs_core::passthrough`).
    pub model_passthrough: bool,
    pub allow_other: bool,
    /// Cap on the memory of model headers and indexes (`--index-cache`).
    pub index_cap: u64,
    /// Where learned block orders are kept across remounts (`None`: not kept).
    pub state_file: Option<PathBuf>,
}

/// The default cache budget: a quarter of physical RAM, leaving the rest to the loader, the
/// model's own copy in RAM or VRAM staging, and the OS.
pub fn default_budget() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let ram = u64::try_from(pages).unwrap_or(0) * u64::try_from(page_size).unwrap_or(0);
    (ram / 4).max(256 << 20)
}

/// Where learned block orders live by default: `/var/lib/tierfs` for root (a system daemon),
/// else `$XDG_STATE_HOME/tierfs` or `~/.local/state/tierfs`.
pub fn default_state_dir() -> PathBuf {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/tierfs");
    }
    std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("tierfs")
}

/// `tierfs ctl`: writes one command to the mount's control file.
pub fn send_control(mountpoint: &Path, command: &str) -> Result<()> {
    use std::io::Write;
    let path = mountpoint.join(".tierfs/control");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .with_context(|| {
            format!(
                "cannot open {} (is {} a tierfs mount?)",
                path.display(),
                mountpoint.display()
            )
        })?;
    match file.write(command.as_bytes()) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            bail!("the mount refused {command:?} (commands: ram-cache SIZE, drop, prefetch PATH; the daemon's log says why)")
        }
        Err(e) => Err(e).with_context(|| format!("cannot write to {}", path.display())),
    }
}

/// A live mount.
pub struct Mounted {
    session: BackgroundSession,
    pub mountpoint: PathBuf,
}

impl Mounted {
    /// Mounts and starts serving; returns once the mount answers.
    pub fn start(request: &MountRequest) -> Result<Mounted> {
        let source = check_source(&request.source)?;
        let mountpoint = check_mountpoint(&request.mountpoint, &source)?;
        let store = Arc::new(
            ModelStore::new(
                request.budget,
                SavedOrders::load(request.state_file.clone()),
            )
            .with_index_cap(request.index_cap),
        );
        let window = Arc::new(KernelCacheWindow::new(window_for_budget(request.budget)));
        let (invalidations, invalidation_queue) = unbounded();
        let settings = MountSettings {
            source: source.clone(),
            mountpoint: mountpoint.clone(),
            passthrough: request.passthrough,
            // SAFETY: geteuid cannot fail.
            sharing: Sharing::for_mount(request.allow_other, unsafe { libc::geteuid() }),
            model_passthrough: request.model_passthrough,
        };
        let fs = TierFs::new(settings, Arc::clone(&store), window, invalidations);
        let session = fuser::Session::new(fs, &mountpoint, &session_config(request, &source))
            .with_context(|| {
                format!(
                    "cannot mount {} at {}",
                    source.display(),
                    mountpoint.display()
                )
            })?;
        let notifier = session.notifier();
        thread::Builder::new()
            .name("tierfs-invalidate".into())
            .spawn(move || run_invalidations(&notifier, &invalidation_queue, &store))
            .context("cannot start the page-cache notifier thread")?;
        let session = session.spawn().context("cannot start the FUSE session")?;
        // Only now: finding the mount's device stats the mount, which needs the session running.
        set_bdi_readahead(&mountpoint, request.readahead);
        Ok(Mounted {
            session,
            mountpoint,
        })
    }

    /// Blocks until the mount goes away (unmounted by a signal, `tierfs unmount` or `umount`).
    pub fn wait(self) -> Result<()> {
        match self.session.join() {
            // How the kernel ends a connection once the file system is gone: ENODEV, or
            // ECONNABORTED when it aborts the connection as the last user of a lazily detached
            // mount goes away (threads of one session can see either).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ECONNABORTED)) => Ok(()),
            result => result.context("FUSE session ended with an error"),
        }
    }

    /// Unmounts and waits for the session to end.
    pub fn unmount(self) -> Result<()> {
        unmount(&self.mountpoint, false)?;
        self.wait()
    }
}

/// Runs `tierfs mount` in the foreground until unmounted; SIGINT/SIGTERM unmount.
pub fn run_foreground(request: &MountRequest) -> Result<()> {
    // Handlers first: a signal that arrives while mounting is kept and acted on once the mount
    // is up, instead of killing the process and leaving the mount behind.
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])
        .context("cannot install signal handlers")?;
    let mounted = Mounted::start(request)?;
    let mountpoint = mounted.mountpoint.clone();
    thread::Builder::new()
        .name("tierfs-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                tracing::info!(signal, "signal received: unmounting");
                if let Err(e) = unmount(&mountpoint, false).or_else(|_| unmount(&mountpoint, true))
                {
                    tracing::error!(error = %e, "cannot unmount");
                }
            }
        })
        .context("cannot start the signal thread")?;
    eprintln!(
        "tierfs: mounted {} at {} with a {} RAM cache; stats: {}",
        request.source.display(),
        mounted.mountpoint.display(),
        format_size(request.budget),
        mounted.mountpoint.join(".tierfs/stats").display()
    );
    mounted.wait()?;
    eprintln!("tierfs: unmounted {}", request.mountpoint.display());
    Ok(())
}

/// `tierfs mount --daemon`: runs the mount in a detached child process (a new session, so the
/// terminal's signals do not reach it) and returns once the mount answers, or with the child's
/// error if it could not mount.
pub fn daemonize(request: &MountRequest, log_file: Option<&Path>) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the tierfs executable")?;
    let log = match log_file {
        Some(path) => std::process::Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open log file {}", path.display()))?,
        ),
        None => std::process::Stdio::null(),
    };
    let mut command = std::process::Command::new(exe);
    command
        .arg("mount")
        .arg(&request.source)
        .arg(&request.mountpoint)
        .arg(format!("--ram-cache={}", request.budget))
        .arg(format!("--threads={}", request.threads))
        .arg(format!("--readahead={}", request.readahead))
        .arg(format!("--index-cache={}", request.index_cap))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    if !request.passthrough {
        command.arg("--no-passthrough");
    }
    if !request.model_passthrough {
        command.arg("--no-model-passthrough");
    }
    if request.allow_other {
        command.arg("--allow-other");
    }
    match &request.state_file {
        Some(file) => command
            .arg("--state-dir")
            .arg(file.parent().unwrap_or(Path::new("."))),
        None => command.arg("--no-state"),
    };
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command.spawn().context("cannot start the daemon")?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().context("cannot watch the daemon")? {
            bail!(
                "the daemon exited before the mount was ready ({status}); see its log (--log-file)"
            );
        }
        if is_tierfs_mount(&request.mountpoint) {
            eprintln!(
                "tierfs: daemon {} serving {} at {}",
                child.id(),
                request.source.display(),
                request.mountpoint.display()
            );
            return Ok(());
        }
        thread::sleep(std::time::Duration::from_millis(50));
    }
    bail!(
        "the mount was not ready after 30 s; daemon {} is still running",
        child.id()
    )
}

/// Whether `mountpoint` is a live tierfs mount (its stats file answers).
pub fn is_tierfs_mount(mountpoint: &Path) -> bool {
    std::fs::metadata(mountpoint.join(".tierfs/stats")).is_ok_and(|m| m.is_file())
}

fn session_config(request: &MountRequest, source: &Path) -> Config {
    let mut config = Config::default();
    // No `ro`: `.tierfs/control` must take writes; the file system refuses every other write.
    config.mount_options = vec![
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::FSName(format!("tierfs:{}", source.display())),
        MountOption::Subtype("tierfs".into()),
    ];
    if request.allow_other {
        // Other users may enter; the kernel then checks the source's permission bits.
        config.acl = SessionACL::All;
        config.mount_options.push(MountOption::DefaultPermissions);
    }
    config.n_threads = Some(request.threads.max(1));
    config.clone_fd = true;
    config
}

fn check_source(source: &Path) -> Result<PathBuf> {
    let canonical = source
        .canonicalize()
        .with_context(|| format!("source {} is not accessible", source.display()))?;
    if !canonical.is_dir() {
        bail!("source {} is not a directory", source.display());
    }
    Ok(canonical)
}

fn check_mountpoint(mountpoint: &Path, source: &Path) -> Result<PathBuf> {
    if let Err(e) = std::fs::metadata(mountpoint) {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            tracing::warn!(mountpoint = %mountpoint.display(), "found a dead tierfs mount (its daemon is gone): unmounting it first");
            unmount(mountpoint, true).context("cannot clean up the dead mount")?;
        }
    }
    let canonical = mountpoint
        .canonicalize()
        .with_context(|| format!("mountpoint {} is not accessible", mountpoint.display()))?;
    if !canonical.is_dir() {
        bail!("mountpoint {} is not a directory", mountpoint.display());
    }
    if canonical.starts_with(source) {
        bail!(
            "mountpoint {} is inside the source {}: tierfs would serve itself",
            mountpoint.display(),
            source.display()
        );
    }
    Ok(canonical)
}

/// Unmounts `mountpoint`; `lazy` detaches it even while files are open (`umount -l`).
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<()> {
    let path = CString::new(mountpoint.as_os_str().as_bytes())
        .context("mountpoint path contains a NUL byte")?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `path` is a valid NUL-terminated string.
    if unsafe { libc::umount2(path.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EBUSY) => bail!(
            "{} is busy (files are open there); close them or use --lazy",
            mountpoint.display()
        ),
        Some(libc::EINVAL) => bail!("{} is not a mount point", mountpoint.display()),
        _ => Err(err).with_context(|| format!("cannot unmount {}", mountpoint.display())),
    }
}

/// Raises the readahead of the mount's backing device info (`/sys/class/bdi/0:N/read_ahead_kb`).
/// FUSE starts every mount at 128 KiB, which caps sequential and mmap reads at 128 KiB requests;
/// larger windows give the daemon 1 MiB requests and several in flight. Needs root; without it
/// the kernel default stays, which is slower but correct.
fn set_bdi_readahead(mountpoint: &Path, bytes: u64) {
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    match std::fs::write(&path, (bytes / 1024).to_string()) {
        Ok(()) => tracing::debug!(%path, kib = bytes / 1024, "mount readahead set"),
        Err(e) => {
            tracing::info!(%path, error = %e, "cannot raise the mount's readahead; keeping the kernel default")
        }
    }
}

fn run_invalidations(notifier: &Notifier, queue: &Receiver<InodeRange>, store: &ModelStore) {
    for range in queue {
        let (Ok(offset), Ok(len)) = (i64::try_from(range.offset), i64::try_from(range.len)) else {
            continue;
        };
        match notifier.inval_inode(INodeNo(range.ino), offset, len) {
            Ok(()) => Counters::add(&store.counters().kernel_cache_invalidated_bytes, range.len),
            // ENOENT: the kernel already forgot the inode, so it caches nothing of it. The loop
            // ends when the file system (holding the sender) is dropped at unmount.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => {
                tracing::debug!(error = %e, ino = range.ino, "page-cache invalidation failed")
            }
        }
    }
}
