//! GPUDirect Storage through cuFile: finding and loading `libcufile`, opening its driver in the
//! mode asked for, and reading chunks straight into device memory.
//!
//! # Loading the library ourselves
//!
//! cudarc's `cufile` module loads `libcufile` by bare names (`libcufile.so`, `.so.12`, `.so.11`, …)
//! and panics when none loads; the library often exists only as `libcufile.so.0` (the
//! `nvidia-cufile` / CUDA 13 Python wheels ship it so, under `site-packages/nvidia/*/lib/`), where
//! the dynamic loader does not look. So this module finds the library itself ([`candidates`]:
//! `$TIERFS_CUFILE_LIB`, then the loader's own search by name, then CUDA and Python package
//! directories) and resolves the few functions it needs with `libloading`, using cudarc's cuFile
//! type definitions (`CUfileDescr_t`, `CUfileHandle_t`). Status values come
//! back as two raw `u32`s rather than cudarc's `#[repr(u32)]` enums, because a newer cuFile may
//! return codes the bindings do not list, and an unknown discriminant in a Rust enum is undefined
//! behaviour.
//!
//! # Modes
//!
//! cuFile reads either by peer-to-peer DMA from the storage into GPU memory ("GDS proper", which
//! needs the `nvidia-fs` module or the kernel's PCI P2PDMA and a supported filesystem) or, in its
//! *compat mode*, with POSIX reads into its own bounce buffers plus copies. [`CufileMode::Direct`]
//! disallows compat mode before the driver opens (`cuFileSetParameterBool`, cuFile ≥ 1.13 /
//! CUDA 12.8), so that registering a file fails exactly when GDS proper cannot serve it — which is
//! what `--gds on` must detect. [`CufileMode::Compat`] forces compat mode (measured by
//! `tierfs-gpu bench`). The driver is process-wide and its parameters are fixed once it is open:
//! the first mode used in a process is the only one ([`GdsError::ModeLocked`] otherwise).
//!
//! # Never without libcuda
//!
//! `cuFileDriverOpen` of libcufile 1.17 (the CUDA 13 wheel), on a machine where `libcuda.so.1`
//! cannot be loaded, logs "forcing cufile into compatible mode" and then spins on one core
//! without returning (seen here). [`CufileLib::open_driver`] therefore refuses to call it unless
//! the CUDA driver library loads.
//!
//! # The descriptor-0 guard
//!
//! `cuFileDriverOpen` on machines without `/dev/nvidia-fs*` has been reported to close file
//! descriptor 0. The call is wrapped so that a closed descriptor 0 is restored from a duplicate
//! taken before.

use std::ffi::{c_int, c_void, OsStr, OsString};
use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use cudarc::cufile::sys::{
    CUfileDescr_t, CUfileDescr_t__bindgen_ty_1, CUfileFileHandleType, CUfileHandle_t,
};

use crate::cuda::{CudaError, Gpu};
use crate::plan::LoadPlan;

/// Environment variable naming the `libcufile` to load, when the search does not find it.
pub const LIB_ENV: &str = "TIERFS_CUFILE_LIB";

/// How cuFile may move the bytes; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CufileMode {
    /// Peer-to-peer DMA only; compat mode disallowed.
    Direct,
    /// cuFile's compat mode: POSIX reads and copies inside cuFile.
    Compat,
}

/// Why cuFile cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GdsError {
    #[error("libcufile was not found (looked at ${LIB_ENV}, the dynamic loader's path, CUDA's lib64 directories and Python packages' nvidia/*/lib); set {LIB_ENV} to its path")]
    LibraryNotFound,
    #[error("cannot load {path}: {reason}")]
    LoadFailed { path: PathBuf, reason: String },
    #[error("{path} lacks the cuFile function {name}")]
    MissingSymbol { path: PathBuf, name: &'static str },
    #[error("{path} is too old to turn its compat mode off (cuFile 1.13 from CUDA 12.8 or newer is needed)")]
    TooOld { path: PathBuf },
    #[error("cuFile is already open in this process in {open:?} mode and cannot switch to {wanted:?} mode")]
    ModeLocked {
        open: CufileMode,
        wanted: CufileMode,
    },
    #[error("cuFile refused its {name} setting: {status}")]
    Parameter { name: &'static str, status: Status },
    #[error("cuFileDriverOpen failed: {status}")]
    DriverOpen { status: Status },
    #[error("cuFile cannot read {path} directly into GPU memory: {status}{hint}")]
    Register {
        path: PathBuf,
        status: Status,
        hint: String,
    },
    #[error("cannot open {path} with O_DIRECT, which cuFile requires: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cuFileRead of {path} at offset {offset} failed: {reason}")]
    Read {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// A `CUfileError_t` as two raw integers (see the module docs).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub err: u32,
    pub cu_err: u32,
}

impl Status {
    fn ok(self) -> Result<(), Status> {
        if self.err == 0 {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", error_name(self.err), self.err)?;
        if self.cu_err != 0 {
            write!(f, ", CUDA error {}", self.cu_err)?;
        }
        Ok(())
    }
}

/// Names of cuFile status codes (`CUfileOpError`), as in `cufile.h`.
fn error_name(code: u32) -> &'static str {
    match code {
        0 => "CU_FILE_SUCCESS",
        5001 => "CU_FILE_DRIVER_NOT_INITIALIZED",
        5002 => "CU_FILE_DRIVER_INVALID_PROPS",
        5003 => "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        5004 => "CU_FILE_DRIVER_VERSION_MISMATCH",
        5005 => "CU_FILE_DRIVER_VERSION_READ_ERROR",
        5006 => "CU_FILE_DRIVER_CLOSING",
        5007 => "CU_FILE_PLATFORM_NOT_SUPPORTED",
        5008 => "CU_FILE_IO_NOT_SUPPORTED",
        5009 => "CU_FILE_DEVICE_NOT_SUPPORTED",
        5010 => "CU_FILE_NVFS_DRIVER_ERROR",
        5011 => "CU_FILE_CUDA_DRIVER_ERROR",
        5012 => "CU_FILE_CUDA_POINTER_INVALID",
        5013 => "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        5014 => "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        5015 => "CU_FILE_CUDA_CONTEXT_MISMATCH",
        5016 => "CU_FILE_INVALID_MAPPING_SIZE",
        5017 => "CU_FILE_INVALID_MAPPING_RANGE",
        5018 => "CU_FILE_INVALID_FILE_TYPE",
        5019 => "CU_FILE_INVALID_FILE_OPEN_FLAG",
        5020 => "CU_FILE_DIO_NOT_SET",
        5022 => "CU_FILE_INVALID_VALUE",
        5023 => "CU_FILE_MEMORY_ALREADY_REGISTERED",
        5024 => "CU_FILE_MEMORY_NOT_REGISTERED",
        5025 => "CU_FILE_PERMISSION_DENIED",
        5026 => "CU_FILE_DRIVER_ALREADY_OPEN",
        5027 => "CU_FILE_HANDLE_NOT_REGISTERED",
        5028 => "CU_FILE_HANDLE_ALREADY_REGISTERED",
        5029 => "CU_FILE_DEVICE_NOT_FOUND",
        5030 => "CU_FILE_INTERNAL_ERROR",
        5031 => "CU_FILE_GETNEWFD_FAILED",
        5033 => "CU_FILE_NVFS_SETUP_ERROR",
        5034 => "CU_FILE_IO_DISABLED",
        _ => "cuFile error",
    }
}

type DriverFn = unsafe extern "C" fn() -> Status;
type HandleRegisterFn = unsafe extern "C" fn(*mut CUfileHandle_t, *mut CUfileDescr_t) -> Status;
type HandleDeregisterFn = unsafe extern "C" fn(CUfileHandle_t);
type ReadFn =
    unsafe extern "C" fn(CUfileHandle_t, *mut c_void, usize, libc::off_t, libc::off_t) -> isize;
type BufRegisterFn = unsafe extern "C" fn(*const c_void, usize, c_int) -> Status;
type BufDeregisterFn = unsafe extern "C" fn(*const c_void) -> Status;
type SetBoolFn = unsafe extern "C" fn(u32, bool) -> Status;

/// `CUFileBoolConfigParameter_t` values from `cufile.h` (cuFile ≥ 1.13). cudarc binds the enum only
/// for CUDA ≥ 12.9, and this crate builds against its 12.8 driver bindings for the widest driver
/// support, so the two values used are spelled out here.
const PARAM_ALLOW_COMPAT_MODE: u32 = 1;
const PARAM_FORCE_COMPAT_MODE: u32 = 2;
type VersionFn = unsafe extern "C" fn(*mut c_int) -> Status;

/// The loaded library and the functions used. Never unloaded: cuFile keeps process-wide state
/// and threads.
pub struct CufileLib {
    path: PathBuf,
    driver_open: DriverFn,
    handle_register: HandleRegisterFn,
    handle_deregister: HandleDeregisterFn,
    read: ReadFn,
    buf_register: BufRegisterFn,
    buf_deregister: BufDeregisterFn,
    set_bool: Option<SetBoolFn>,
    version: Option<VersionFn>,
    _lib: libloading::Library,
}

impl std::fmt::Debug for CufileLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CufileLib")
            .field("path", &self.path)
            .finish()
    }
}

static LIB: Mutex<Option<&'static CufileLib>> = Mutex::new(None);
static OPEN_MODE: Mutex<Option<CufileMode>> = Mutex::new(None);

/// The process's `libcufile`, loaded on first use (a failed search is retried next time).
pub fn library() -> Result<&'static CufileLib, GdsError> {
    let mut slot = LIB.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(lib) = *slot {
        return Ok(lib);
    }
    let lib: &'static CufileLib = Box::leak(Box::new(load(&candidates(&SearchEnv::current()))?));
    *slot = Some(lib);
    Ok(lib)
}

impl CufileLib {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cuFileGetVersion`, e.g. 1170 for 1.17.0, where the library has it.
    pub fn version(&self) -> Option<i32> {
        let f = self.version?;
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        unsafe { f(&mut v) }.ok().ok().map(|()| v)
    }

    /// Opens the driver in `mode` (once per process; see the module docs).
    pub fn open_driver(&self, mode: CufileMode) -> Result<(), GdsError> {
        // Without libcuda, cuFileDriverOpen spins forever (see the module docs): check first.
        if !crate::cuda::driver_present() {
            return Err(CudaError::NoDriver.into());
        }
        let mut open = OPEN_MODE.lock().unwrap_or_else(|e| e.into_inner());
        match *open {
            Some(m) if m == mode => return Ok(()),
            Some(m) => {
                return Err(GdsError::ModeLocked {
                    open: m,
                    wanted: mode,
                })
            }
            None => {}
        }
        let set = self.set_bool.ok_or_else(|| GdsError::TooOld {
            path: self.path.clone(),
        })?;
        let compat = mode == CufileMode::Compat;
        for (name, param, value) in [
            ("allow_compat_mode", PARAM_ALLOW_COMPAT_MODE, compat),
            ("force_compat_mode", PARAM_FORCE_COMPAT_MODE, compat),
        ] {
            // SAFETY: plain value call, before the driver opens.
            unsafe { set(param, value) }
                .ok()
                .map_err(|status| GdsError::Parameter { name, status })?;
        }
        let driver_open = self.driver_open;
        // SAFETY: no arguments; guarded against closing descriptor 0.
        guard_fd0(|| unsafe { driver_open() })
            .ok()
            .map_err(|status| GdsError::DriverOpen { status })?;
        tracing::debug!(?mode, lib = %self.path.display(), "cuFile driver open");
        *open = Some(mode);
        Ok(())
    }
}

/// Where the library might be. Bare names go to the dynamic loader's own search.
#[derive(Debug, Default)]
pub struct SearchEnv {
    /// `$TIERFS_CUFILE_LIB`.
    pub explicit: Option<PathBuf>,
    /// Directories of `$LD_LIBRARY_PATH` (read here, since changing it after start does not
    /// reach the dynamic loader) and of CUDA installations.
    pub lib_dirs: Vec<PathBuf>,
    /// Prefixes whose `lib/python3*/{site,dist}-packages/nvidia/*/lib` may hold the wheel's copy.
    pub python_prefixes: Vec<PathBuf>,
}

impl SearchEnv {
    /// From this process's environment.
    pub fn current() -> SearchEnv {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let mut lib_dirs: Vec<PathBuf> = var("LD_LIBRARY_PATH")
            .map(|v| std::env::split_paths(&v).collect())
            .unwrap_or_default();
        for home in ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(|n| var(n)) {
            lib_dirs.push(PathBuf::from(&home).join("lib64"));
        }
        lib_dirs.push("/usr/local/cuda/lib64".into());
        lib_dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
        lib_dirs.push("/usr/local/cuda/targets/sbsa-linux/lib".into());
        let mut python_prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
            .iter()
            .filter_map(|n| var(n).map(PathBuf::from))
            .collect();
        // Every directory on PATH with a python3 in it: its parent is a prefix (a venv's bin/).
        if let Some(path) = var("PATH") {
            for dir in std::env::split_paths(&path) {
                if dir.join("python3").exists() {
                    python_prefixes.extend(dir.parent().map(Path::to_path_buf));
                }
            }
        }
        python_prefixes.push("/usr".into());
        python_prefixes.push("/usr/local".into());
        python_prefixes.extend(var("HOME").map(|h| PathBuf::from(h).join(".local")));
        SearchEnv {
            explicit: var(LIB_ENV).map(PathBuf::from),
            lib_dirs,
            python_prefixes,
        }
    }
}

/// Candidates in the order they are tried: the explicit path, bare names for the loader, then
/// every `libcufile.so*` found in the directories of `env`.
pub fn candidates(env: &SearchEnv) -> Vec<OsString> {
    let mut out: Vec<OsString> = env.explicit.iter().map(|p| p.clone().into()).collect();
    out.extend(
        cudarc::get_lib_name_candidates("cufile")
            .into_iter()
            .map(OsString::from),
    );
    out.push("libcufile.so.0".into());
    let mut dirs = env.lib_dirs.clone();
    for prefix in &env.python_prefixes {
        dirs.extend(wheel_lib_dirs(prefix));
    }
    for dir in dirs {
        out.extend(libs_in(&dir).into_iter().map(OsString::from));
    }
    out
}

/// `PREFIX/lib/python3*/{site,dist}-packages/nvidia/*/lib` (and Debian's `lib/python3/`).
fn wheel_lib_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for python in subdirs(&prefix.join("lib"), |name| name.starts_with("python3")) {
        for packages in ["site-packages", "dist-packages"] {
            for pkg in subdirs(&python.join(packages).join("nvidia"), |_| true) {
                out.push(pkg.join("lib"));
            }
        }
    }
    out
}

/// Subdirectories of `dir` whose names pass `keep`, sorted (so the search is deterministic).
fn subdirs(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(&keep))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

/// Files of `dir` named `libcufile.so` or `libcufile.so.N[.M…]`, sorted.
fn libs_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| is_cufile_name(&e.file_name()))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

fn is_cufile_name(name: &OsStr) -> bool {
    let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("libcufile.so")) else {
        return false;
    };
    rest.is_empty()
        || rest.strip_prefix('.').is_some_and(|v| {
            v.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Loads the first candidate that loads and resolves the functions.
fn load(candidates: &[OsString]) -> Result<CufileLib, GdsError> {
    let mut first_failure = None;
    for candidate in candidates {
        // SAFETY: loading libcufile runs its initialisers, which only set up its own state.
        match unsafe { libloading::Library::new(candidate) } {
            Ok(lib) => {
                tracing::debug!(lib = ?candidate, "libcufile loaded");
                return resolve(lib, PathBuf::from(candidate));
            }
            // A bare name the loader does not know is the normal case; a file that exists (or
            // was named explicitly) and does not load is worth reporting.
            Err(e) if Path::new(candidate).is_absolute() && first_failure.is_none() => {
                first_failure = Some(GdsError::LoadFailed {
                    path: PathBuf::from(candidate),
                    reason: e.to_string(),
                });
            }
            Err(_) => {}
        }
    }
    Err(first_failure.unwrap_or(GdsError::LibraryNotFound))
}

fn resolve(lib: libloading::Library, path: PathBuf) -> Result<CufileLib, GdsError> {
    fn get<T: Copy>(lib: &libloading::Library, name: &'static str) -> Option<T> {
        let symbol = format!("{name}\0");
        // SAFETY: the types above match cufile.h's declarations of these functions.
        unsafe { lib.get::<T>(symbol.as_bytes()).ok().map(|s| *s) }
    }
    let need = |name: &'static str| GdsError::MissingSymbol {
        path: path.clone(),
        name,
    };
    Ok(CufileLib {
        driver_open: get(&lib, "cuFileDriverOpen").ok_or_else(|| need("cuFileDriverOpen"))?,
        handle_register: get(&lib, "cuFileHandleRegister")
            .ok_or_else(|| need("cuFileHandleRegister"))?,
        handle_deregister: get(&lib, "cuFileHandleDeregister")
            .ok_or_else(|| need("cuFileHandleDeregister"))?,
        read: get(&lib, "cuFileRead").ok_or_else(|| need("cuFileRead"))?,
        buf_register: get(&lib, "cuFileBufRegister").ok_or_else(|| need("cuFileBufRegister"))?,
        buf_deregister: get(&lib, "cuFileBufDeregister")
            .ok_or_else(|| need("cuFileBufDeregister"))?,
        set_bool: get(&lib, "cuFileSetParameterBool"),
        version: get(&lib, "cuFileGetVersion"),
        path,
        _lib: lib,
    })
}

/// Runs `f`, restoring descriptor 0 if `f` closed it (see the module docs).
fn guard_fd0<T>(f: impl FnOnce() -> T) -> T {
    guard_fd(0, f)
}

/// Runs `f`, restoring descriptor `fd` from a duplicate if `f` closed it.
fn guard_fd<T>(fd: c_int, f: impl FnOnce() -> T) -> T {
    // SAFETY: fcntl/dup2/close on descriptor numbers; no memory is touched.
    unsafe {
        let saved = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3);
        let out = f();
        if saved >= 0 {
            if libc::fcntl(fd, libc::F_GETFD) == -1 {
                tracing::warn!(
                    fd,
                    "cuFileDriverOpen closed a file descriptor; restoring it"
                );
                libc::dup2(saved, fd);
            }
            libc::close(saved);
        }
        out
    }
}

/// A file registered with cuFile.
pub struct CufileHandle {
    lib: &'static CufileLib,
    handle: CUfileHandle_t,
    path: PathBuf,
    _file: File,
}

// SAFETY: cuFile handles may be used from any thread, concurrently (cuFileRead is thread-safe).
unsafe impl Send for CufileHandle {}
// SAFETY: as above.
unsafe impl Sync for CufileHandle {}

impl CufileHandle {
    /// Opens `path` with `O_DIRECT` and registers it (the driver must be open).
    pub fn register(lib: &'static CufileLib, path: &Path) -> Result<CufileHandle, GdsError> {
        let file = tierfs_core::source::open_direct(path).map_err(|source| GdsError::Open {
            path: path.to_owned(),
            source,
        })?;
        let mut descr = CUfileDescr_t {
            type_: CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: CUfileDescr_t__bindgen_ty_1 {
                fd: file.as_raw_fd(),
            },
            fs_ops: std::ptr::null(),
        };
        let mut handle: CUfileHandle_t = std::ptr::null_mut();
        // SAFETY: both pointers are valid for the call; the descriptor stays open in `_file`.
        unsafe { (lib.handle_register)(&mut handle, &mut descr) }
            .ok()
            .map_err(|status| GdsError::Register {
                path: path.to_owned(),
                status,
                hint: register_hint(),
            })?;
        Ok(CufileHandle {
            lib,
            handle,
            path: path.to_owned(),
            _file: file,
        })
    }

    /// `cuFileRead` of `len` bytes at `file_offset` to `base + dev_offset`; returns bytes read.
    ///
    /// # Safety
    /// `base + dev_offset .. + len` must be device memory of the context current on this thread.
    pub unsafe fn read(
        &self,
        base: u64,
        len: usize,
        file_offset: u64,
        dev_offset: u64,
    ) -> Result<usize, GdsError> {
        let err = |reason: String| GdsError::Read {
            path: self.path.clone(),
            offset: file_offset,
            reason,
        };
        let (Ok(off), Ok(dev)) = (
            libc::off_t::try_from(file_offset),
            libc::off_t::try_from(dev_offset),
        ) else {
            return Err(err("offset out of range".into()));
        };
        let n = (self.lib.read)(self.handle, base as *mut c_void, len, off, dev);
        match n {
            n if n >= 0 => Ok(n as usize),
            -1 => Err(err(std::io::Error::last_os_error().to_string())),
            n => Err(err(format!(
                "{} ({})",
                error_name(n.unsigned_abs() as u32),
                -n
            ))),
        }
    }
}

impl Drop for CufileHandle {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once; no read is in flight (reads are
        // synchronous and their threads have joined).
        unsafe { (self.lib.handle_deregister)(self.handle) }
    }
}

/// A hint for a failed registration in direct mode.
fn register_hint() -> String {
    if Path::new("/proc/driver/nvidia-fs").exists() {
        String::new()
    } else {
        " (the nvidia-fs kernel module is not loaded, and the kernel's PCI P2PDMA path was not usable either)".into()
    }
}

/// Device memory registered with cuFile for the duration of a load. Registration is optional
/// (unregistered memory goes through cuFile's internal GPU bounce buffers); a failure is logged.
pub struct BufRegistration {
    lib: &'static CufileLib,
    base: u64,
    registered: bool,
}

impl BufRegistration {
    /// Registers `len` bytes at `base`.
    ///
    /// # Safety
    /// `base..base + len` must be device memory of the current context that outlives `self`.
    pub unsafe fn new(lib: &'static CufileLib, base: u64, len: usize) -> BufRegistration {
        let status = (lib.buf_register)(base as *const c_void, len, 0);
        if let Err(status) = status.ok() {
            tracing::debug!(%status, "cuFileBufRegister failed; reading through cuFile's bounce buffers");
        }
        BufRegistration {
            lib,
            base,
            registered: status.err == 0,
        }
    }
}

impl Drop for BufRegistration {
    fn drop(&mut self) {
        if self.registered {
            // SAFETY: registered in `new`, deregistered once, after every read has returned.
            let _ = unsafe { (self.lib.buf_deregister)(self.base as *const c_void) };
        }
    }
}

/// Reads every chunk of `plan` into `base` with `threads` threads calling `cuFileRead`.
/// Returns the bytes read. Relocations are the caller's (they are device-to-device copies).
///
/// # Safety
/// `base..base + plan.arena_bytes` must be device memory of `gpu` that outlives the call.
pub unsafe fn read_plan(
    gpu: &Gpu,
    handle: &CufileHandle,
    plan: &LoadPlan,
    base: u64,
    threads: usize,
) -> Result<u64, GdsError> {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let worker = || -> Result<u64, GdsError> {
        gpu.bind()?;
        let mut read = 0;
        while !stop.load(Ordering::Relaxed) {
            let Some(c) = plan.chunks.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            // SAFETY: the chunk lies inside the arena (plan invariant), per the caller's promise.
            let got = unsafe { handle.read(base, c.len as usize, c.file_offset, c.arena_offset) }
                .inspect_err(|_| stop.store(true, Ordering::Relaxed))?;
            if (got as u64) < c.needed() {
                stop.store(true, Ordering::Relaxed);
                return Err(GdsError::Read {
                    path: handle.path.clone(),
                    offset: c.file_offset,
                    reason: format!(
                        "short read: {got} of {} bytes (file truncated?)",
                        c.needed()
                    ),
                });
            }
            read += got as u64;
        }
        Ok(read)
    };
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1).min(plan.chunks.len().max(1)))
            .map(|_| scope.spawn(worker))
            .collect();
        let mut total = 0;
        let mut first_err = None;
        for w in workers {
            match w.join() {
                Ok(Ok(n)) => total += n,
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(GdsError::Read {
                        path: handle.path.clone(),
                        offset: 0,
                        reason: "a reader thread panicked".into(),
                    });
                }
            }
        }
        first_err.map_or(Ok(total), Err)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_match_versioned_sonames_only() {
        for good in [
            "libcufile.so",
            "libcufile.so.0",
            "libcufile.so.1.17.1",
            "libcufile.so.13",
        ] {
            assert!(is_cufile_name(OsStr::new(good)), "{good}");
        }
        for bad in [
            "libcufile_rdma.so.1",
            "libcufile.so.",
            "libcufile.so.x",
            "libcufile.a",
            "libcufile.so.1..2",
        ] {
            assert!(!is_cufile_name(OsStr::new(bad)), "{bad}");
        }
    }

    #[test]
    fn the_search_finds_the_wheel_copy_after_explicit_and_loader_names() {
        let root = tempfile::tempdir().unwrap();
        let wheel = root
            .path()
            .join("venv/lib/python3.12/site-packages/nvidia/cu13/lib");
        fs::create_dir_all(&wheel).unwrap();
        for name in ["libcufile.so.0", "libcufile_rdma.so.1", "libcudart.so.13"] {
            fs::write(wheel.join(name), b"").unwrap();
        }
        let cuda = root.path().join("cuda/lib64");
        fs::create_dir_all(&cuda).unwrap();
        fs::write(cuda.join("libcufile.so.1"), b"").unwrap();
        let env = SearchEnv {
            explicit: Some("/opt/my/libcufile.so".into()),
            lib_dirs: vec![cuda.clone(), root.path().join("missing")],
            python_prefixes: vec![root.path().join("venv"), root.path().join("nope")],
        };
        let found = candidates(&env);
        assert_eq!(found[0], OsString::from("/opt/my/libcufile.so"));
        assert!(
            found.contains(&OsString::from("libcufile.so.0")),
            "bare soname for the loader"
        );
        let files: Vec<&OsString> = found
            .iter()
            .filter(|c| Path::new(c).is_absolute())
            .collect();
        assert_eq!(
            files[1..],
            [
                &cuda.join("libcufile.so.1").into_os_string(),
                &wheel.join("libcufile.so.0").into_os_string()
            ]
        );
    }

    #[test]
    fn a_missing_library_is_an_error_naming_the_variable_to_set() {
        let err = load(&[OsString::from("libcufile-not-a-real-name.so")]).unwrap_err();
        assert!(matches!(err, GdsError::LibraryNotFound));
        assert!(err.to_string().contains(LIB_ENV), "{err}");
        let err = load(&[OsString::from("/nonexistent/libcufile.so.0")]).unwrap_err();
        assert!(
            matches!(err, GdsError::LoadFailed { ref path, .. } if path.ends_with("libcufile.so.0")),
            "{err}"
        );
    }

    #[test]
    fn statuses_print_their_names() {
        let s = Status {
            err: 5007,
            cu_err: 0,
        };
        assert_eq!(s.to_string(), "CU_FILE_PLATFORM_NOT_SUPPORTED (5007)");
        assert_eq!(
            Status {
                err: 5999,
                cu_err: 3
            }
            .to_string(),
            "cuFile error (5999), CUDA error 3"
        );
        assert!(Status { err: 0, cu_err: 0 }.ok().is_ok());
    }

    #[test]
    fn the_descriptor_guard_restores_a_closed_descriptor() {
        // Not fd 0 itself: tests run on parallel threads, and another test opening a file while
        // fd 0 is closed would get it. A high descriptor is never handed out meanwhile.
        let file = File::open("/dev/null").unwrap();
        // SAFETY: descriptor juggling on descriptors this test owns.
        unsafe {
            let fd = libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 900);
            assert!(fd >= 900);
            let before = fstat_ino(fd);
            guard_fd(fd, || libc::close(fd));
            assert_ne!(
                libc::fcntl(fd, libc::F_GETFD),
                -1,
                "the descriptor must be open again"
            );
            assert_eq!(fstat_ino(fd), before, "and refer to the same file");
            guard_fd(fd, || ()); // left open: nothing to restore, nothing closed
            assert_eq!(fstat_ino(fd), before);
            libc::close(fd);
        }
    }

    fn fstat_ino(fd: c_int) -> (u64, u64) {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid stat buffer.
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
        (st.st_dev, st.st_ino)
    }
}
