//! What tierfs can do without root, and what it says when something needs more.
//!
//! As an ordinary user (a desktop), mounting goes through `fusermount3`, the setuid helper of the
//! fuse3 package: fuser first tries `mount(2)`, which fails with `EPERM` for a user, and then
//! runs `fusermount3` (fuser's default pure-Rust mount; no crate feature needed), which mounts
//! and hands the `/dev/fuse` descriptor back. fuser opens `/dev/fuse` itself first, so the
//! user must be able to open it (mode 0666 is what fuse3 installs; some machines keep it 0600).
//! Unmounting is the mirror image: `umount2` is refused to a user, so [`fusermount_unmount`]
//! runs `fusermount3 -u`, which lets a user unmount the FUSE mounts they made.
//!
//! Two modes need root and fall back without it, saying so in the log and in the `modes`
//! section of the stats ([`ModesSnapshot`]):
//! - **FUSE passthrough** (non-model files, and model files that fit the budget): the kernel
//!   requires `CAP_SYS_ADMIN` to register a backing file, so without it every file is served by
//!   the daemon (non-model files with `pread`, model files from the chunk cache).
//! - **Mount readahead** (`--readahead`): raised through `/sys/class/bdi/*/read_ahead_kb`, which
//!   only root may write; without it the kernel's 128 KiB stays (smaller requests for `mmap` and
//!   page-cache readers; correct, somewhat slower).
//!
//! The modes are a process-wide record: a tierfs process serves exactly one mount (the
//! `mount` command, its `--daemon` child, or `demo`), and the adapter then needs no new plumbing.

use std::io::{self, ErrorKind};
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};
use serde::Serialize;
use tierfs_core::size::format_size;
use tierfs_core::sync::{lock_static, StaticMutex};

/// The FUSE device every mount opens.
const DEV_FUSE: &str = "/dev/fuse";

/// Capability bit of `CAP_SYS_ADMIN` in `/proc/self/status`'s `CapEff`.
const CAP_SYS_ADMIN: u32 = 21;

/// Whether the process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether the kernel will let this process register passthrough backing files.
pub fn can_passthrough() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return is_root();
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .map_or_else(is_root, |caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// Checks that `/dev/fuse` can be opened; if not, one sentence says why and what to do.
pub fn check_dev_fuse() -> Result<()> {
    let error = match std::fs::File::options()
        .read(true)
        .write(true)
        .open(DEV_FUSE)
    {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    match error.kind() {
        ErrorKind::PermissionDenied => bail!(
            "this user may not open {DEV_FUSE} (permission denied), so it cannot mount with FUSE: \
             ask an administrator to run `chmod 0666 {DEV_FUSE}` (the mode the fuse3 package \
             installs) or to add the user to the group that owns it, or run tierfs as root"
        ),
        ErrorKind::NotFound => bail!(
            "{DEV_FUSE} does not exist, so nothing can mount with FUSE: load the kernel module \
             (`sudo modprobe fuse`) and install the fuse3 package"
        ),
        _ => Err(anyhow::Error::new(error).context(format!("cannot open {DEV_FUSE}"))),
    }
}

/// Adds what to do to a failed mount, where the cause is the missing helper of a user mount.
pub fn explain_mount_error(error: io::Error) -> anyhow::Error {
    if !is_root() && error.kind() == ErrorKind::NotFound {
        return anyhow::Error::new(error).context(
            "mounting as an ordinary user needs fusermount3, which was not found: install the \
             fuse3 package (or run tierfs as root)",
        );
    }
    if error.to_string().contains("user_allow_other") {
        return anyhow::Error::new(error).context(
            "--allow-other as an ordinary user needs `user_allow_other` in /etc/fuse.conf",
        );
    }
    anyhow::Error::new(error)
}

/// Unmounts with `fusermount3 -u` (`-z`: lazily), the way a user unmounts their FUSE mounts.
pub fn fusermount_unmount(mountpoint: &Path, lazy: bool) -> Result<()> {
    let mut last_error = None;
    for helper in ["fusermount3", "fusermount"] {
        let mut command = Command::new(helper);
        command
            .arg(if lazy { "-uz" } else { "-u" })
            .arg("--")
            .arg(mountpoint);
        let output = match command.output() {
            Ok(output) => output,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                last_error = Some(e);
                continue;
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot run {helper}"))),
        };
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr = stderr.trim();
        if stderr.contains("busy") {
            bail!(
                "{} is busy (files are open there); close them or use --lazy",
                mountpoint.display()
            );
        }
        if stderr.contains("not found in") || stderr.contains("not mounted") {
            bail!("{} is not a mount point", mountpoint.display());
        }
        bail!("cannot unmount {}: {stderr}", mountpoint.display());
    }
    let cause = last_error.map_or_else(String::new, |e| format!(" ({e})"));
    bail!(
        "cannot unmount {} as an ordinary user: fusermount3 was not found{cause}; install the \
         fuse3 package",
        mountpoint.display()
    )
}

/// What was asked of the modes that need root, and what the mount got.
#[derive(Debug, Default)]
struct Modes {
    passthrough_requested: bool,
    readahead_requested: u64,
    /// The mount's readahead as read back from sysfs, and why it differs from the request.
    readahead: Option<(u64, Option<String>)>,
}

static MODES: StaticMutex<Modes> = StaticMutex::new(Modes {
    passthrough_requested: false,
    readahead_requested: 0,
    readahead: None,
});

fn modes() -> std::sync::MutexGuard<'static, Modes> {
    lock_static(&MODES)
}

/// Decides whether to ask for passthrough, recording the request; logs the fallback.
pub fn passthrough_mode(requested: bool) -> bool {
    modes().passthrough_requested = requested;
    if requested && !can_passthrough() {
        tracing::info!(
            "FUSE passthrough needs root (CAP_SYS_ADMIN): every file is served by the daemon (non-model files with pread, models from the cache)"
        );
        return false;
    }
    requested
}

/// Records the readahead asked for, what the mount has, and why they differ.
pub fn record_readahead(requested: u64, actual: Option<u64>, failure: Option<String>) {
    let mut modes = modes();
    modes.readahead_requested = requested;
    modes.readahead = actual.map(|bytes| (bytes, failure));
}

/// `modes` section of the stats document: which modes that need root are in force, and why not.
#[derive(Debug, Clone, Serialize)]
pub struct ModesSnapshot {
    /// Whether the daemon runs as root.
    pub root: bool,
    /// Whether FUSE passthrough is in use (non-model files; model files that fit the budget),
    /// and if not, why.
    pub passthrough: bool,
    pub passthrough_note: String,
    /// The mount's kernel readahead, and if it is not what `--readahead` asked, why.
    pub readahead_bytes: u64,
    pub readahead_note: String,
}

/// The modes in force; `passthrough` is whether the mount ended up using passthrough.
pub fn snapshot(passthrough: bool) -> ModesSnapshot {
    let modes = modes();
    let passthrough_note = if passthrough {
        "on".to_string()
    } else if !modes.passthrough_requested {
        "off: --no-passthrough".to_string()
    } else if !can_passthrough() {
        "off: needs root (CAP_SYS_ADMIN); every file is served by the daemon".to_string()
    } else {
        "off: the kernel does not offer FUSE passthrough (Linux 6.9 or later)".to_string()
    };
    let (readahead_bytes, readahead_note) = match &modes.readahead {
        Some((bytes, None)) => (*bytes, "as asked".to_string()),
        Some((bytes, Some(why))) => (
            *bytes,
            format!(
                "{} asked, kept the kernel's: {why}",
                format_size(modes.readahead_requested)
            ),
        ),
        None => (
            0,
            "unknown: the mount's readahead could not be read".to_string(),
        ),
    };
    ModesSnapshot {
        root: is_root(),
        passthrough,
        passthrough_note,
        readahead_bytes,
        readahead_note,
    }
}
