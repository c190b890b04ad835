//! The C ABI of `libtierfs_gpu.so`, for `python/tierfs_gpu.py` (ctypes) and any other caller.
//! `include/tierfs_gpu.h` declares it.
//!
//! # Protocol
//!
//! 1. `tierfs_gpu_open(path, selection_json, chunk_bytes, err, err_len)` resolves the path,
//!    parses the header and plans the selection; it returns an opaque handle (null on error, with
//!    the message in `err`).
//! 2. `tierfs_gpu_plan(handle)` returns the plan as JSON (owned by the handle): the arena size
//!    and each tensor's name, dtype, shape, offset and length in the arena.
//! 3. The caller allocates the arena — device memory from its own allocator (PyTorch's), or host
//!    memory — at a 4096-byte-aligned address, and calls `tierfs_gpu_load(handle, ptr, len,
//!    device, gds, threads, wait_stream, out, out_len)`; `out` receives the report as JSON, or
//!    the error message.
//! 4. `tierfs_gpu_close(handle)`.
//!
//! Letting the caller allocate keeps memory ownership on one side: PyTorch frees the arena when
//! the last tensor viewing it dies, and nothing here outlives a call. `wait_stream` (a
//! `cudaStream_t` of the caller, or 0) is synchronized before writing: the caller's allocator may
//! hand out memory that kernels queued earlier on that stream still read.
//!
//! Return codes: 0 success, -1 failure (message in the buffer). No call panics across the
//! boundary: every body runs under `catch_unwind`, and a panic becomes an error message.
//! One [`Loader`] per GPU is kept for the life of the process (its pinned staging buffers and
//! the cuFile driver are reused), each behind its own mutex (`GpuSlots`): concurrent loads to
//! one GPU take turns, loads to different GPUs run side by side (the table of GPUs is locked
//! only to find a GPU's slot, never during a load).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::load::{self, GdsMode, LoadOptions, Loader};
use crate::plan::{LoadPlan, Selection, DEFAULT_CHUNK_BYTES};
use crate::resolve::{self, Source};

/// An opened, planned file.
pub struct Handle {
    source: Source,
    plan: LoadPlan,
    plan_json: CString,
}

/// One slot per GPU ordinal, each with its own lock, created on first use: `T` is a
/// [`Loader`] in the library, anything in the tests (which need no GPU).
struct GpuSlots<T> {
    slots: Mutex<Option<HashMap<usize, Slot<T>>>>,
}

/// One GPU's value, created on first use.
type Slot<T> = Arc<Mutex<Option<T>>>;

impl<T> GpuSlots<T> {
    const fn new() -> Self {
        GpuSlots {
            slots: Mutex::new(None),
        }
    }

    /// Runs `f` on GPU `ordinal`'s value (made by `make` the first time), holding that GPU's
    /// lock only: the table lock is released before `make` or `f` run.
    fn with<R>(
        &self,
        ordinal: usize,
        make: impl FnOnce() -> Result<T, String>,
        f: impl FnOnce(&mut T) -> Result<R, String>,
    ) -> Result<R, String> {
        let slot = {
            let mut table = lock(&self.slots);
            Arc::clone(
                table
                    .get_or_insert_with(HashMap::new)
                    .entry(ordinal)
                    .or_default(),
            )
        };
        let mut value = lock(&slot);
        if value.is_none() {
            *value = Some(make()?);
        }
        match value.as_mut() {
            Some(value) => f(value),
            None => Err("internal error: GPU slot empty after creation".into()),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

static LOADERS: GpuSlots<Loader> = GpuSlots::new();

/// Writes `text` into the caller's buffer, truncated at a character boundary, NUL-terminated.
fn write_text(buf: *mut c_char, len: usize, text: &str) {
    if buf.is_null() || len == 0 {
        return;
    }
    let mut n = text.len().min(len - 1);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: the caller provides `len` writable bytes at `buf`; we write `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
}

/// Runs `f`, turning errors and panics into -1 plus a message.
fn guarded(err: *mut c_char, err_len: usize, f: impl FnOnce() -> Result<String, String>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(text)) => {
            write_text(err, err_len, &text);
            0
        }
        Ok(Err(message)) => {
            write_text(err, err_len, &message);
            -1
        }
        Err(_) => {
            write_text(
                err,
                err_len,
                "internal error in tierfs_gpu (a bug: please report it)",
            );
            -1
        }
    }
}

fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, String> {
    if p.is_null() {
        return Err(format!("{what} is null"));
    }
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| format!("{what} is not UTF-8"))
}

fn open_handle(path: &str, selection: Option<&str>, chunk_bytes: u64) -> Result<Handle, String> {
    let selection: Selection = match selection {
        None | Some("") => Selection::All,
        Some(json) => serde_json::from_str(json)
            .map_err(|e| format!("bad selection {json}: {e} (expected \"all\", {{\"tensors\": [..]}} or {{\"blocks\": [..]}})"))?,
    };
    let source = resolve::open(Path::new(path)).map_err(|e| e.to_string())?;
    let chunk = if chunk_bytes == 0 {
        DEFAULT_CHUNK_BYTES
    } else {
        chunk_bytes
    };
    let plan = LoadPlan::new(&source.index, &selection, chunk).map_err(|e| e.to_string())?;
    let doc = serde_json::json!({
        "requested": source.requested,
        "source": source.path,
        "arena_bytes": plan.arena_bytes,
        "tensor_bytes": plan.tensor_bytes,
        "metadata": source.index.metadata,
        "tensors": plan.tensors.iter().map(|t| serde_json::json!({
            "name": t.name, "dtype": t.dtype, "shape": t.shape, "offset": t.offset, "len": t.len,
        })).collect::<Vec<_>>(),
    });
    let plan_json = CString::new(doc.to_string()).map_err(|e| e.to_string())?;
    Ok(Handle {
        source,
        plan,
        plan_json,
    })
}

/// Opens and plans `path`. `selection_json` may be null (all tensors). `chunk_bytes` 0 means the
/// default. Returns null on error, with the message in `err`.
///
/// # Safety
/// Strings must be NUL-terminated; `err` must have `err_len` writable bytes (or be null).
#[no_mangle]
pub unsafe extern "C" fn tierfs_gpu_open(
    path: *const c_char,
    selection_json: *const c_char,
    chunk_bytes: u64,
    err: *mut c_char,
    err_len: usize,
) -> *mut Handle {
    let mut handle = None;
    let rc = guarded(err, err_len, || {
        let path = c_str(path, "path")?;
        let selection = if selection_json.is_null() {
            None
        } else {
            Some(c_str(selection_json, "selection")?)
        };
        handle = Some(open_handle(path, selection, chunk_bytes)?);
        Ok(String::new())
    });
    match (rc, handle) {
        (0, Some(h)) => Box::into_raw(Box::new(h)),
        _ => std::ptr::null_mut(),
    }
}

/// The plan of `handle` as JSON, valid until `tierfs_gpu_close`.
///
/// # Safety
/// `handle` must come from `tierfs_gpu_open` and not be closed.
#[no_mangle]
pub unsafe extern "C" fn tierfs_gpu_plan(handle: *const Handle) -> *const c_char {
    match handle.as_ref() {
        Some(h) => h.plan_json.as_ptr(),
        None => std::ptr::null(),
    }
}

/// Checks that GPU `device` can be used (0) or says why not (-1, message in `err`), before the
/// caller allocates anything on it.
///
/// # Safety
/// `err` must have `err_len` writable bytes (or be null).
#[no_mangle]
pub unsafe extern "C" fn tierfs_gpu_check_device(
    device: c_int,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    guarded(err, err_len, || {
        let ordinal = usize::try_from(device).map_err(|_| format!("bad device {device}"))?;
        with_loader(ordinal, LoadOptions::default(), |_| Ok(String::new()))
    })
}

fn with_loader(
    ordinal: usize,
    options: LoadOptions,
    f: impl FnOnce(&mut Loader) -> Result<String, String>,
) -> Result<String, String> {
    LOADERS.with(
        ordinal,
        || Loader::new(ordinal, options).map_err(|e| e.to_string()),
        |loader| {
            loader.set_options(options);
            f(loader)
        },
    )
}

/// Loads the planned tensors into `dst` (`dst_len` bytes, 4096-aligned): device memory of GPU
/// `device`, or host memory when `device` is -1. `gds` is "auto", "on", "off" or "compat" (null:
/// auto); `threads` 0 means the default; `wait_stream` is a CUDA stream to synchronize first (0:
/// none). On success `out` receives the report as JSON; on failure, the message.
///
/// # Safety
/// `handle` must be open; `dst` must be valid for `dst_len` bytes of the stated memory and not
/// used elsewhere during the call; `wait_stream` must be a stream of that GPU or 0; `out` must
/// have `out_len` writable bytes (or be null).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tierfs_gpu_load(
    handle: *mut Handle,
    dst: *mut u8,
    dst_len: u64,
    device: c_int,
    gds: *const c_char,
    threads: u32,
    wait_stream: u64,
    out: *mut c_char,
    out_len: usize,
) -> c_int {
    guarded(out, out_len, || {
        let h = handle.as_ref().ok_or("handle is null")?;
        let gds: GdsMode = if gds.is_null() {
            GdsMode::Auto
        } else {
            c_str(gds, "gds")?.parse()?
        };
        let defaults = LoadOptions::default();
        let options = LoadOptions {
            gds,
            threads: if threads == 0 {
                defaults.threads
            } else {
                threads as usize
            },
            chunk_bytes: h.plan.chunk_bytes,
            read_mode: None,
            ..defaults
        };
        let report = if device < 0 {
            load_host(h, dst, dst_len, options)?
        } else {
            with_loader(device as usize, options, |loader| {
                // SAFETY: the caller guarantees the stream and the destination.
                unsafe { load_device(loader, h, dst, dst_len, wait_stream) }
            })?
        };
        Ok(report)
    })
}

unsafe fn load_host(
    h: &Handle,
    dst: *mut u8,
    dst_len: u64,
    options: LoadOptions,
) -> Result<String, String> {
    if h.plan.arena_bytes == 0 {
        return report_json(load::load_host(&h.source, &h.plan, &mut [], options));
    }
    if dst.is_null() {
        return Err("destination is null".into());
    }
    let len = usize::try_from(dst_len).map_err(|_| "destination too large".to_string())?;
    // SAFETY: the caller guarantees `len` writable bytes at `dst`, used by no one else.
    let dst = std::slice::from_raw_parts_mut(dst, len);
    report_json(load::load_host(&h.source, &h.plan, dst, options))
}

unsafe fn load_device(
    loader: &mut Loader,
    h: &Handle,
    dst: *mut u8,
    dst_len: u64,
    wait_stream: u64,
) -> Result<String, String> {
    if wait_stream != 0 {
        loader
            .gpu()
            .wait_for_stream(wait_stream as cudarc::driver::sys::CUstream)
            .map_err(|e| e.to_string())?;
    }
    report_json(loader.load_into(&h.source, &h.plan, dst as u64, dst_len))
}

fn report_json(report: Result<load::LoadReport, load::LoadError>) -> Result<String, String> {
    let report = report.map_err(|e| e.to_string())?;
    serde_json::to_string(&report).map_err(|e| e.to_string())
}

/// Frees a handle from `tierfs_gpu_open` (null is fine).
///
/// # Safety
/// `handle` must come from `tierfs_gpu_open` and not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn tierfs_gpu_close(handle: *mut Handle) {
    if !handle.is_null() {
        drop(Box::from_raw(handle));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{file_bytes, temp_file};
    use std::ffi::CString;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Barrier};
    use std::time::Duration;

    fn buf() -> Vec<c_char> {
        vec![0; 4096]
    }

    fn text(b: &[c_char]) -> String {
        // SAFETY: write_text always NUL-terminates.
        unsafe { CStr::from_ptr(b.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn the_c_abi_loads_a_selection_into_host_memory_bit_exact() {
        let bytes = file_bytes(
            &[
                ("a", "F32", &[5000]),
                ("odd", "BF16", &[3]),
                ("b", "F32", &[7]),
            ],
            None,
            1,
        );
        let f = temp_file(&bytes);
        let path = CString::new(f.path().to_str().unwrap()).unwrap();
        let sel = CString::new(r#"{"tensors": ["odd", "b"]}"#).unwrap();
        let mut err = buf();
        // SAFETY: valid strings and buffers throughout.
        unsafe {
            let h = tierfs_gpu_open(path.as_ptr(), sel.as_ptr(), 0, err.as_mut_ptr(), err.len());
            assert!(!h.is_null(), "{}", text(&err));
            let plan: serde_json::Value =
                serde_json::from_str(CStr::from_ptr(tierfs_gpu_plan(h)).to_str().unwrap()).unwrap();
            let arena_bytes = plan["arena_bytes"].as_u64().unwrap();
            let mut arena = vec![0u8; arena_bytes as usize];
            let gds = CString::new("off").unwrap();
            let mut out = buf();
            let rc = tierfs_gpu_load(
                h,
                arena.as_mut_ptr(),
                arena_bytes,
                -1,
                gds.as_ptr(),
                2,
                0,
                out.as_mut_ptr(),
                out.len(),
            );
            assert_eq!(rc, 0, "{}", text(&out));
            let report: serde_json::Value = serde_json::from_str(&text(&out)).unwrap();
            assert_eq!(report["destination"], "cpu");
            assert_eq!(report["tensors"], 2);
            let index = crate::testutil::index_of(&bytes);
            for t in plan["tensors"].as_array().unwrap() {
                let info = index.tensors.iter().find(|i| i.name == t["name"]).unwrap();
                let (off, len) = (
                    t["offset"].as_u64().unwrap() as usize,
                    t["len"].as_u64().unwrap() as usize,
                );
                assert_eq!(
                    &arena[off..off + len],
                    &bytes[info.start as usize..info.end as usize]
                );
            }
            let rc = tierfs_gpu_load(
                h,
                arena.as_mut_ptr(),
                3,
                -1,
                gds.as_ptr(),
                2,
                0,
                out.as_mut_ptr(),
                out.len(),
            );
            assert_eq!(rc, -1);
            assert!(text(&out).contains("need"), "{}", text(&out));
            tierfs_gpu_close(h);
        }
    }

    #[test]
    fn errors_come_back_as_messages() {
        let mut err = buf();
        let missing = CString::new("/nonexistent/x.safetensors").unwrap();
        let bad_sel = CString::new("{\"layers\": 3}").unwrap();
        // SAFETY: valid strings and buffers.
        unsafe {
            let h = tierfs_gpu_open(
                missing.as_ptr(),
                std::ptr::null(),
                0,
                err.as_mut_ptr(),
                err.len(),
            );
            assert!(h.is_null());
            assert!(
                text(&err).contains("/nonexistent/x.safetensors"),
                "{}",
                text(&err)
            );
            let h = tierfs_gpu_open(
                missing.as_ptr(),
                bad_sel.as_ptr(),
                0,
                err.as_mut_ptr(),
                err.len(),
            );
            assert!(h.is_null());
            assert!(text(&err).starts_with("bad selection"), "{}", text(&err));
            let h = tierfs_gpu_open(
                std::ptr::null(),
                std::ptr::null(),
                0,
                err.as_mut_ptr(),
                err.len(),
            );
            assert!(h.is_null());
            assert_eq!(text(&err), "path is null");
            assert!(tierfs_gpu_plan(std::ptr::null()).is_null());
            tierfs_gpu_close(std::ptr::null_mut());
        }
    }

    #[test]
    fn messages_are_truncated_at_character_boundaries() {
        let mut small = vec![1 as c_char; 6];
        write_text(small.as_mut_ptr(), small.len(), "abcé€xyz");
        assert_eq!(text(&small), "abcé");
        write_text(small.as_mut_ptr(), 1, "abc");
        assert_eq!(text(&small), "");
    }

    /// A load to GPU 1 runs to completion while a load to GPU 0 is in progress (a process-wide
    /// lock would make it wait); loads to one GPU still take turns.
    #[test]
    fn loads_to_different_gpus_do_not_wait_for_each_other() {
        let slots: Arc<GpuSlots<u32>> = Arc::new(GpuSlots::new());
        let (inside, other_done) = (Arc::new(Barrier::new(2)), mpsc::channel::<()>());
        let (done_tx, done_rx) = other_done;
        let first = {
            let (slots, inside) = (Arc::clone(&slots), Arc::clone(&inside));
            std::thread::spawn(move || {
                slots.with(
                    0,
                    || Ok(0),
                    |_| {
                        inside.wait();
                        // Holds GPU 0 until the load to GPU 1 has finished (or gives up, failing).
                        done_rx
                            .recv_timeout(Duration::from_secs(30))
                            .map_err(|_| "the load to GPU 1 waited for GPU 0's".to_string())
                    },
                )
            })
        };
        inside.wait();
        slots
            .with(
                1,
                || Ok(0),
                |n| {
                    *n += 1;
                    Ok(())
                },
            )
            .unwrap();
        done_tx.send(()).unwrap();
        first.join().unwrap().unwrap();

        // Same GPU: never two at once.
        let busy = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (slots, busy) = (Arc::clone(&slots), Arc::clone(&busy));
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        slots
                            .with(
                                0,
                                || Ok(0),
                                |n| {
                                    assert!(
                                        !busy.swap(true, Ordering::SeqCst),
                                        "two loads at once"
                                    );
                                    *n += 1;
                                    busy.store(false, Ordering::SeqCst);
                                    Ok(())
                                },
                            )
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(slots.with(0, || Ok(0), |n| Ok(*n)).unwrap(), 400);
    }

    /// A slot whose creation failed is retried on the next use.
    #[test]
    fn a_failed_creation_is_retried() {
        let slots: GpuSlots<u32> = GpuSlots::new();
        assert!(slots.with(3, || Err("no GPU".into()), |_| Ok(())).is_err());
        assert_eq!(slots.with(3, || Ok(7), |n| Ok(*n)).unwrap(), 7);
    }
}
