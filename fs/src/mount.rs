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
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use crossbeam::channel::{unbounded, Receiver};
use fuser::{BackgroundSession, Config, INodeNo, MountOption, Notifier, SessionACL};
use tierfs_core::access::{ServedDevice, Sharing};
use tierfs_core::budget::{self, watch, BudgetTarget, Governor, Probe};
use tierfs_core::kernel_cache::{
    headroom_for_readahead, window_for_budget, InodeRange, KernelCacheWindow,
};
use tierfs_core::models::ModelStore;
use tierfs_core::prefetch::saved::SavedOrders;
use tierfs_core::size::format_size;
use tierfs_core::stats::Counters;

use crate::fuse::{FuseAdapter, MountSettings};
use crate::fuse_uring::{self, Handshake, Transport, TransportMode};
use crate::metrics;
use crate::metrics::server::{MetricsServer, Page};
use crate::privilege;
use crate::stats_doc::DaemonStats;

/// The most readahead asked of the kernel in the FUSE handshake. The kernel caps it at the
/// mount's BDI readahead, which is raised after mounting (see [`set_bdi_readahead`]).
pub const KERNEL_READAHEAD_BYTES: u32 = 4 << 20;

/// What `tierfs mount` was asked to do.
#[derive(Debug, Clone)]
pub struct MountRequest {
    pub source: PathBuf,
    pub mountpoint: PathBuf,
    pub budget: u64,
    /// `--ram-cache-min` (`None`: [`tierfs_core::budget::default_floor`]).
    pub floor: Option<u64>,
    pub threads: usize,
    /// Which transport carries the kernel's requests (`--io-uring`).
    pub transport: TransportMode,
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
    /// Where to serve the metrics over HTTP (`--metrics-addr`; `None`: only in the mount).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How source reads are bounded in time and retried (`--source-timeout`).
    pub source_io: tierfs_core::source::deadline::SourceIoConfig,
    /// `--source-pacing`.
    pub source_pacing: tierfs_core::prefetch::PacingMode,
    /// `--compress`.
    pub compress: tierfs_core::cache::CompressMode,
    /// `--disk-cache DIR --disk-cache-size SIZE`.
    pub disk_tier: Option<tierfs_core::disk_tier::DiskTierConfig>,
    /// How to reach an `s3://` SOURCE (`--endpoint`, `--region`, `--profile`,
    /// `--listing-ttl`).
    pub object: tierfs_core::object::ObjectStoreConfig,
}

/// The default cache budget: a quarter of physical RAM (or of the memory cgroup's limit),
/// leaving the rest to the loader, the model's own copy in RAM or VRAM staging, and the OS.
pub fn default_budget() -> u64 {
    let ceiling = match Probe::discover() {
        Ok(probe) => probe.ceiling().0,
        Err(_) => {
            // SAFETY: sysconf only reads system configuration.
            let (pages, page_size) = unsafe {
                (
                    libc::sysconf(libc::_SC_PHYS_PAGES),
                    libc::sysconf(libc::_SC_PAGESIZE),
                )
            };
            u64::try_from(pages).unwrap_or(0) * u64::try_from(page_size).unwrap_or(0)
        }
    };
    (ceiling / 4).max(256 << 20)
}

/// `budget`, or the largest budget this machine (or memory cgroup) can hold if it is more,
/// saying so in one sentence.
pub fn clamp_budget(budget: u64) -> u64 {
    let Ok(probe) = Probe::discover() else {
        return budget;
    };
    let (ceiling, what) = probe.ceiling();
    let (budget, note) = budget::clamp_budget(budget, ceiling, what);
    if let Some(note) = note {
        say!("tierfs: {note}");
    }
    budget
}

/// The budget governor of a mount, with its pressure watcher running (if the machine's memory
/// figures can be read; without them the budget is simply fixed).
fn start_governor(request: &MountRequest, store: &Arc<ModelStore>) -> Arc<Governor> {
    let floor = request
        .floor
        .unwrap_or_else(|| budget::default_floor(request.budget));
    let target: Arc<dyn BudgetTarget> = store.clone();
    let governor = Arc::new(Governor::new(target, request.budget, floor));
    match Probe::discover() {
        Ok(probe) => {
            if let Err(e) = watch::start(&governor, probe) {
                tracing::warn!(error = %e, "cannot start the memory pressure watcher");
            }
        }
        Err(e) => tracing::warn!(error = %e, "memory figures unreadable: the budget stays fixed"),
    }
    watch::protect_daemon();
    governor
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
            bail!("the mount refused {command:?} (commands: ram-cache SIZE, drop, prefetch PATH, plan PATH...; the daemon's log says why)")
        }
        Err(e) => Err(e).with_context(|| format!("cannot write to {}", path.display())),
    }
}

/// What serves a live mount's requests.
enum Serving {
    /// `fuser`'s session over `/dev/fuse`.
    Device(BackgroundSession),
    /// The io_uring transport; the handshake's session is kept for unmounting.
    Uring(fuse_uring::Serving, fuser::Session<Handshake>),
}

impl Serving {
    fn join(self) -> io::Result<()> {
        match self {
            Serving::Device(session) => session.join(),
            Serving::Uring(serving, session) => {
                let ended = serving.join();
                // The connection has ended, so the mount is gone: dropping the session would
                // try to unmount it again and log the failure. Its descriptor goes with the
                // process.
                std::mem::forget(session);
                ended
            }
        }
    }
}

/// A live mount.
pub struct Mounted {
    session: Serving,
    pub mountpoint: PathBuf,
    /// The `--metrics-addr` endpoint, stopped when the mount goes.
    metrics: Option<MetricsServer>,
}

/// Opens the disk tier of `config`, refusing a folder inside SOURCE (its files would show in
/// the mount) or inside the mount point (its writes would go through the mount itself).
fn open_disk_tier(
    config: &tierfs_core::disk_tier::DiskTierConfig,
    source: &Path,
    mountpoint: &Path,
) -> Result<Arc<tierfs_core::disk_tier::DiskTier>> {
    let dir = resolve_to_be(&config.dir).with_context(|| {
        format!(
            "cannot resolve the disk cache folder {}",
            config.dir.display()
        )
    })?;
    for (inside, what) in [(source, "SOURCE"), (mountpoint, "the mount point")] {
        if dir.starts_with(inside) {
            bail!(
                "the disk cache folder {} is inside {what} ({}): give it a folder elsewhere",
                dir.display(),
                inside.display()
            );
        }
    }
    let config = tierfs_core::disk_tier::DiskTierConfig {
        dir,
        ..config.clone()
    };
    Ok(tierfs_core::disk_tier::DiskTier::open(&config)?)
}

/// `path` with its existing part resolved (symlinks followed) and the rest, still to be
/// created, appended: where a folder made at `path` would be.
fn resolve_to_be(path: &Path) -> std::io::Result<PathBuf> {
    let path = std::path::absolute(path)?;
    let mut missing = Vec::new();
    let mut existing = path.as_path();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(resolved) => {
                return Ok(missing.iter().rev().fold(resolved, |p, part| p.join(part)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                    return Err(e);
                };
                missing.push(name.to_owned());
                existing = parent;
            }
            Err(e) => return Err(e),
        }
    }
}

impl Mounted {
    /// Mounts and starts serving; returns once the mount answers.
    pub fn start(request: &MountRequest) -> Result<Mounted> {
        let remote = open_object_source(&request.source, &request.object)?;
        let source = match &remote {
            Some(tree) => tierfs_core::fs::RemoteTree::root(tree.as_ref()).to_owned(),
            None => check_source(&request.source)?,
        };
        let mountpoint = check_mountpoint(&request.mountpoint, &source)?;
        match tierfs_core::source::limits::raise_descriptor_limit() {
            Ok(limit) => tracing::debug!(limit, "descriptor limit"),
            Err(e) => tracing::warn!(error = %e, "cannot raise the descriptor limit"),
        }
        // Before any thread: the arenas are capped for a mount that asks for the rings.
        if request.transport != TransportMode::Off && tierfs_core::allocator::limit_arenas() {
            tracing::debug!(
                arenas = tierfs_core::allocator::MAX_ARENAS,
                "malloc arenas capped for the io_uring transport"
            );
        }
        let disk_tier = match &request.disk_tier {
            Some(config) => Some(open_disk_tier(config, &source, &mountpoint)?),
            None => None,
        };
        let mut store = ModelStore::new(
            request.budget,
            SavedOrders::load(request.state_file.clone()),
        )
        .with_index_cap(request.index_cap)
        .with_source_io(request.source_io)
        .with_source_pacing(request.source_pacing)
        .with_compress(request.compress);
        if let Some(tier) = disk_tier {
            store = store.with_disk_tier(tier);
        }
        let store = Arc::new(store);
        let governor = start_governor(request, &store);
        let window = Arc::new(KernelCacheWindow::with_headroom(
            window_for_budget(request.budget),
            headroom_for_readahead(request.readahead),
        ));
        let (invalidations, invalidation_queue) = unbounded();
        let settings = MountSettings {
            source: source.clone(),
            mountpoint: mountpoint.clone(),
            passthrough: privilege::passthrough_mode(request.passthrough),
            // SAFETY: geteuid cannot fail.
            sharing: Sharing::for_mount(request.allow_other, unsafe { libc::geteuid() }),
            model_passthrough: request.model_passthrough,
            governor,
            remote: remote.map(|tree| tree as Arc<dyn tierfs_core::fs::RemoteTree>),
        };
        let metrics = match request.metrics_addr {
            Some(addr) => Some(MetricsServer::start(
                addr,
                render_metrics(&settings, &store, &window),
            )?),
            None => None,
        };
        let uring = request.transport != TransportMode::Off
            && match fuse_uring::kernel_allows() {
                Ok(()) => true,
                Err(reason) if request.transport == TransportMode::On => {
                    bail!("--io-uring on: {reason}")
                }
                Err(reason) => {
                    tracing::info!(%reason, "serving through /dev/fuse");
                    fuse_uring::set_transport(Transport::Device {
                        reason: Some(reason),
                    });
                    false
                }
            };
        let config = session_config(request, &source);
        let session = if uring {
            start_uring(
                request,
                settings,
                (&store, window),
                (invalidations, invalidation_queue),
                &mountpoint,
                &config,
            )?
        } else {
            let fs = FuseAdapter::new(settings, Arc::clone(&store), window, invalidations)
                .with_context(|| format!("cannot open the source {}", source.display()))?;
            let served_device = fs.served_device();
            let session = mount_session(fs, served_device, &source, &mountpoint, &config)?;
            start_notifier(session.notifier(), invalidation_queue, store)?;
            Serving::Device(session.spawn().context("cannot start the FUSE session")?)
        };
        // Only now: finding the mount's device stats the mount, which needs the session running.
        set_bdi_readahead(&mountpoint, request.readahead);
        Ok(Mounted {
            session,
            mountpoint,
            metrics,
        })
    }

    /// Where `--metrics-addr` serves, if it was given.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::addr)
    }

    /// Blocks until the mount goes away (unmounted by a signal, `tierfs unmount` or `umount`).
    pub fn wait(self) -> Result<()> {
        let ended = self.session.join();
        drop(self.metrics);
        match ended {
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

/// Mounts with the io_uring transport: `fuser` mounts and performs the handshake, this
/// process's rings serve ([`fuse_uring`]).
fn start_uring(
    request: &MountRequest,
    settings: MountSettings,
    (store, window): (&Arc<ModelStore>, Arc<KernelCacheWindow>),
    (invalidations, invalidation_queue): (
        crossbeam::channel::Sender<InodeRange>,
        Receiver<InodeRange>,
    ),
    mountpoint: &Path,
    config: &Config,
) -> Result<Serving> {
    let source = settings.source.clone();
    let passthrough_wanted = settings.passthrough;
    let owner_only = (!request.allow_other).then(|| {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() }
    });
    let mut fs: fuse_uring::dispatch::Fs =
        crate::fuse::tier_fs(settings, Arc::clone(store), window, invalidations)
            .with_context(|| format!("cannot open the source {}", source.display()))?;
    let served_device = fs.served_device();
    let request_bytes = fuse_uring::request_bytes(fuse_uring::max_pages_limit());
    let (handshake, offered) = Handshake::new(passthrough_wanted, request_bytes);
    let session = mount_session(handshake, served_device, &source, mountpoint, config)?;
    let offered = offered
        .lock()
        .ok()
        .and_then(|o| *o)
        .context("internal error: the FUSE handshake left no answer")?;
    fs.kernel_capabilities(offered.capabilities);
    start_notifier(session.notifier(), invalidation_queue, Arc::clone(store))?;
    let required = request.transport == TransportMode::On;
    let serving = fuse_uring::Serving::start(
        Arc::new(fs),
        &session,
        owner_only,
        offered,
        (request.threads, required),
    )
    .context("cannot start the io_uring transport")?;
    Ok(Serving::Uring(serving, session))
}

/// Mounts `fs` at `mountpoint` and completes the FUSE handshake, whichever transport then
/// serves it; records the mount's device in `served_device` before any request is served, so
/// that a path of SOURCE that leads back into the mount is refused from the first request on
/// (its device asks the mount nothing).
fn mount_session<FS: fuser::Filesystem>(
    fs: FS,
    served_device: ServedDevice,
    source: &Path,
    mountpoint: &Path,
    config: &Config,
) -> Result<fuser::Session<FS>> {
    privilege::check_dev_fuse()?;
    let session = fuser::Session::new(fs, mountpoint, config)
        .map_err(privilege::explain_mount_error)
        .with_context(|| {
            format!(
                "cannot mount {} at {}",
                source.display(),
                mountpoint.display()
            )
        })?;
    let device = tierfs_core::access::mount_device(mountpoint)
        .with_context(|| format!("cannot find the device of {}", mountpoint.display()))?;
    served_device.set(device);
    Ok(session)
}

/// Starts the thread that turns the cache's evictions into page-cache invalidations.
fn start_notifier(
    notifier: Notifier,
    queue: Receiver<InodeRange>,
    store: Arc<ModelStore>,
) -> Result<()> {
    thread::Builder::new()
        .name("tierfs-invalidate".into())
        .spawn(move || run_invalidations(&notifier, &queue, &store))
        .context("cannot start the page-cache notifier thread")?;
    Ok(())
}

/// What the `--metrics-addr` endpoint serves: the metrics and the stats of the mount, as
/// `.tierfs/metrics` and `.tierfs/stats` render them (without the `fs` tables, which only the
/// filesystem knows).
fn render_metrics(
    settings: &MountSettings,
    store: &Arc<ModelStore>,
    window: &Arc<KernelCacheWindow>,
) -> impl Fn(Page) -> Vec<u8> + Send + 'static {
    let (store, window) = (Arc::clone(store), Arc::clone(window));
    let governor = Arc::clone(&settings.governor);
    let (source, mountpoint) = (settings.source.clone(), settings.mountpoint.clone());
    let passthrough = settings.passthrough;
    let remote = settings.remote.clone();
    let started = SystemTime::now();
    move |page| {
        let doc = DaemonStats::collect(&store, &window, &source, &mountpoint, passthrough, started)
            .with_budget(governor.snapshot())
            .with_remote_source(remote.as_ref().map(|tree| tree.stats()));
        match page {
            Page::Metrics => metrics::render(doc, &store.counters().ops),
            Page::Stats => tierfs_core::stats_doc::render_json(&doc),
        }
    }
}

/// Runs `tierfs mount` in the foreground until unmounted; SIGINT/SIGTERM unmount.
pub fn run_foreground(request: &MountRequest) -> Result<()> {
    serve(request, |mounted| {
        say!(
            "tierfs: mounted {} at {} with a {} RAM cache; stats: {}",
            request.source.display(),
            mounted.mountpoint.display(),
            format_size(request.budget),
            mounted.mountpoint.join(".tierfs/stats").display()
        );
        if let Some(addr) = mounted.metrics_addr() {
            say!("tierfs: metrics: http://{addr}/metrics");
        }
    })?;
    say!("tierfs: unmounted {}", request.mountpoint.display());
    Ok(())
}

/// Mounts, calls `ready` once the mount answers, and serves until unmounted (in the foreground
/// or as the `--daemon` child); SIGINT/SIGTERM unmount.
pub fn serve(request: &MountRequest, ready: impl FnOnce(&Mounted)) -> Result<()> {
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
    ready(&mounted);
    mounted.wait()
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

/// The tree of an `s3://BUCKET/PREFIX` SOURCE, connected and listed once (so that wrong
/// credentials, a missing bucket or an unreachable store stop the mount with a clear error);
/// `None` for a local SOURCE.
fn open_object_source(
    source: &Path,
    config: &tierfs_core::object::ObjectStoreConfig,
) -> Result<Option<Arc<tierfs_core::object::ObjectRemoteTree>>> {
    use tierfs_core::object::{ObjectRemoteTree, ObjectSource, ObjectUrl};
    let Some(text) = source.to_str().filter(|s| ObjectUrl::is_object_url(s)) else {
        return Ok(None);
    };
    let url = ObjectUrl::parse(text)?;
    let client = ObjectSource::connect(&url, config.clone())
        .with_context(|| format!("cannot reach the source {url}"))?;
    let tree = client
        .tree()
        .with_context(|| format!("cannot list the source {url}"))?;
    tracing::info!(
        source = %url,
        endpoint = client.endpoint(),
        objects = tree.objects(),
        bytes = tree.bytes(),
        "object store source"
    );
    let store_id = client.endpoint().to_owned();
    Ok(Some(Arc::new(ObjectRemoteTree::new(client, &store_id))))
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
        // The kernel lets only root unmount; a user unmounts their own FUSE mounts this way.
        Some(libc::EPERM) if !privilege::is_root() => {
            privilege::fusermount_unmount(mountpoint, lazy)
        }
        _ => Err(err).with_context(|| format!("cannot unmount {}", mountpoint.display())),
    }
}

/// Raises the readahead of the mount's backing device info (`/sys/class/bdi/0:N/read_ahead_kb`).
/// FUSE starts every mount at 128 KiB, which caps sequential and mmap reads at 128 KiB requests;
/// larger windows give the daemon 1 MiB requests and several in flight. Needs root; without it
/// the kernel default stays, which is slower but correct (and the stats' `modes` say so).
fn set_bdi_readahead(mountpoint: &Path, bytes: u64) {
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return privilege::record_readahead(bytes, None, None);
    };
    let dev = meta.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    let failure = match std::fs::write(&path, (bytes / 1024).to_string()) {
        Ok(()) => {
            tracing::debug!(%path, kib = bytes / 1024, "mount readahead set");
            None
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            tracing::info!(%path, "raising the mount's readahead needs root: keeping the kernel default");
            Some("raising it needs root".to_string())
        }
        Err(e) => {
            tracing::info!(%path, error = %e, "cannot raise the mount's readahead; keeping the kernel default");
            Some(e.to_string())
        }
    };
    let actual = std::fs::read_to_string(&path)
        .ok()
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024);
    privilege::record_readahead(bytes, actual, failure);
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
