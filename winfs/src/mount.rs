//! Running the WinFsp host (Windows only): checks SOURCE, builds the core's [`ModelStore`]
//! and budget [`Governor`], mounts [`TierWinFs`] at the drive letter or folder, and serves until Ctrl-C.
//!
//! Volume parameters, and why:
//! - `file_info_timeout` 500 ms (not `u32::MAX`): `u32::MAX` would turn on WinFsp's use of the
//!   Windows cache manager, which keeps a second copy of every byte read in the system cache:
//!   the double caching tierfs exists to avoid. 500 ms is the FUSE adapter's `ATTR_TTL`, the
//!   same promise that a change in SOURCE shows within a second.
//! - `sector_size` 4096: what `tierfs_core::source` aligns to; also the allocation unit shown.
//! - Case-insensitive, case-preserving names, as NTFS: SOURCE is an NTFS folder.
//! - No persistent ACLs, reparse points, named streams or extended attributes: the mount
//!   presents file bytes, nothing else.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use thiserror::Error;
use tierfs_core::budget::{self, BudgetTarget, Governor};
use tierfs_core::models::ModelStore;
use tierfs_core::prefetch::saved::SavedOrders;
use tierfs_core::size::format_size;
use windows_sys::core::BOOL;
use windows_sys::Win32::Foundation::TRUE;
use windows_sys::Win32::System::Console::SetConsoleCtrlHandler;
use windows_sys::Win32::System::SystemInformation::{GlobalMemoryStatusEx, MEMORYSTATUSEX};
use winfsp::host::{FileSystemHost, FineGuard, VolumeParams};
use winfsp::FspError;

use crate::winfsp_fs::TierWinFs;

/// What `tierfs mount` asked for.
pub struct MountRequest {
    pub source: PathBuf,
    pub mountpoint: String,
    pub budget: u64,
    pub threads: u32,
    pub state_file: Option<PathBuf>,
    /// `--compress`.
    pub compress: tierfs_core::cache::CompressMode,
}

#[derive(Debug, Error)]
pub enum MountError {
    #[error("SOURCE {}: {source}", path.display())]
    Source { path: PathBuf, source: io::Error },
    #[error("SOURCE {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("WinFsp cannot be loaded (is WinFsp 2.x installed?): NTSTATUS {0:#010x}")]
    Init(u32),
    /// Host creation and mounting report an HRESULT (WinFsp's NTSTATUS wrapped by `windows`).
    #[error("cannot create the WinFsp file system: HRESULT {0:#010x}")]
    Create(u32),
    #[error("cannot mount at {mountpoint} (a drive letter must be free, a folder must not exist yet): HRESULT {status:#010x}")]
    Mount { mountpoint: String, status: u32 },
    #[error("cannot start serving requests: HRESULT {0:#010x}")]
    Start(u32),
    #[error("cannot install the Ctrl-C handler: {0}")]
    CtrlC(io::Error),
}

fn code(err: &FspError) -> u32 {
    err.to_ntstatus() as u32
}

/// Set by the console control handler (Ctrl-C, Ctrl-Break, console closed, logoff, shutdown).
static STOP: AtomicBool = AtomicBool::new(false);

unsafe extern "system" fn on_console_event(_event: u32) -> BOOL {
    STOP.store(true, Ordering::SeqCst);
    TRUE
}

/// How often the main thread looks at [`STOP`]: unmounting within a quarter second of Ctrl-C.
const STOP_POLL: Duration = Duration::from_millis(250);

pub fn run(request: MountRequest) -> Result<(), MountError> {
    let source_err = |source| MountError::Source {
        path: request.source.clone(),
        source,
    };
    // The canonical form (`\\?\D:\models`) is what canonicalized model paths are keyed against.
    let source = std::fs::canonicalize(&request.source).map_err(source_err)?;
    if !std::fs::metadata(&source).map_err(source_err)?.is_dir() {
        return Err(MountError::NotADirectory(request.source));
    }
    winfsp::winfsp_init().map_err(|e| MountError::Init(code(&e)))?;
    let store = Arc::new(
        ModelStore::new(
            request.budget,
            SavedOrders::load(request.state_file.clone()),
        )
        .with_source_pacing(tierfs_core::prefetch::PacingMode::Auto)
        .with_compress(request.compress),
    );
    // The budget is fixed on Windows (the memory pressure watcher is Linux only); the governor
    // is what the control file's `ram-cache` goes through.
    let target: Arc<dyn BudgetTarget> = store.clone();
    let floor = budget::default_floor(request.budget);
    let governor = Arc::new(Governor::new(target, request.budget, floor));
    let fs = TierWinFs::new(source.clone(), request.mountpoint.clone(), store, governor)
        .map_err(|e| MountError::Source {
            path: source.clone(),
            source: e,
        })?;
    // Fine-grained guards: reads of different files (and of one file) run concurrently, which
    // the core is built for.
    let mut host: FileSystemHost<TierWinFs, FineGuard> =
        FileSystemHost::new(volume_params(), fs)
            .map_err(|e| MountError::Create(e.code().0 as u32))?;
    host.mount(request.mountpoint.as_str())
        .map_err(|e| MountError::Mount {
            mountpoint: request.mountpoint.clone(),
            status: e.code().0 as u32,
        })?;
    // SAFETY: the handler only stores to an atomic; it stays valid for the process's life.
    if unsafe { SetConsoleCtrlHandler(Some(on_console_event), TRUE) } == 0 {
        host.unmount();
        return Err(MountError::CtrlC(io::Error::last_os_error()));
    }
    host.start_with_threads(request.threads)
        .map_err(|e| MountError::Start(e.code().0 as u32))?;
    tracing::info!(
        source = %source.display(),
        mountpoint = %request.mountpoint,
        budget = %format_size(request.budget),
        "mounted; Ctrl-C unmounts"
    );
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(STOP_POLL);
    }
    host.stop();
    host.unmount();
    tracing::info!(mountpoint = %request.mountpoint, "unmounted");
    Ok(())
}

fn volume_params() -> VolumeParams {
    let mut params = VolumeParams::new();
    params
        .filesystem_name("tierfs")
        .sector_size(4096)
        .sectors_per_allocation_unit(1)
        .max_component_length(255)
        .volume_creation_time(now_filetime())
        .volume_serial_number(now_filetime() as u32)
        .file_info_timeout(500)
        .case_sensitive_search(false)
        .case_preserved_names(true)
        .unicode_on_disk(true)
        .persistent_acls(false)
        .reparse_points(false)
        .named_streams(false)
        .extended_attributes(false)
        .post_cleanup_when_modified_only(true);
    params
}

fn now_filetime() -> u64 {
    const EPOCH_DIFFERENCE_SECS: u64 = 11_644_473_600;
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    (since.as_secs() + EPOCH_DIFFERENCE_SECS) * 10_000_000
}

/// A quarter of physical memory, as on Linux (4 GiB if it cannot be read).
pub fn default_budget() -> u64 {
    // SAFETY: MEMORYSTATUSEX is plain integers; dwLength must be set before the call.
    let mut status: MEMORYSTATUSEX = unsafe { std::mem::zeroed() };
    status.dwLength = std::mem::size_of::<MEMORYSTATUSEX>() as u32;
    // SAFETY: `status` is a valid, writable MEMORYSTATUSEX.
    if unsafe { GlobalMemoryStatusEx(&mut status) } == 0 {
        return 4 << 30;
    }
    status.ullTotalPhys / 4
}

/// `%LOCALAPPDATA%\tierfs`, or `.\tierfs-state` without it.
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("LOCALAPPDATA")
        .map(|dir| PathBuf::from(dir).join("tierfs"))
        .unwrap_or_else(|| PathBuf::from("tierfs-state"))
}
