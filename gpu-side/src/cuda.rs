//! The CUDA driver, through `cudarc` with dynamic loading: a GPU's context and stream, device
//! memory, pinned staging memory, and the [`DeviceSink`] the pipeline copies through.
//!
//! # No GPU
//!
//! `cudarc` loads `libcuda` on first use and *panics* when it cannot. Every entry point here
//! therefore checks [`driver_present`] first and returns [`CudaError::NoDriver`], so that a
//! machine without a GPU gets one sentence, never a panic. Nothing is loaded until a GPU is
//! actually asked for: the crate builds and its tests run without CUDA installed.
//!
//! # Contexts and streams
//!
//! [`Gpu::open`] retains the device's *primary* context, the one the CUDA runtime (and so PyTorch)
//! uses, so device pointers handed in by PyTorch are valid here and ours are valid there. Copies
//! run on a stream of our own; cudarc's per-allocation event tracking is switched off (we manage
//! no `CudaSlice`s), which also keeps `new_stream` from synchronizing the whole context — a
//! PyTorch program's kernels in flight are not waited for.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUdeviceptr, CUevent, CUresult, CUstream};
use cudarc::driver::{CudaContext, CudaStream};

use crate::pipeline::{Sink, SinkError};
use crate::plan::IO_ALIGN;
use crate::staging::{Backing, StagingPool};

/// A CUDA failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    #[error("no NVIDIA driver found (libcuda.so.1 cannot be loaded): this needs an NVIDIA GPU and its driver")]
    NoDriver,
    #[error("the NVIDIA driver reports no usable GPU ({0})")]
    NoDevice(String),
    #[error("there is no GPU {ordinal}: this machine has {count}")]
    BadOrdinal { ordinal: usize, count: usize },
    #[error("CUDA {op} failed: {code}")]
    Driver { op: &'static str, code: String },
}

/// `CUDA_ERROR_NAME: description` of a driver error.
fn describe(e: &DriverError) -> String {
    match e.error_string() {
        Ok(text) => format!("{:?}: {}", e.0, text.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
}

/// Maps a driver error of operation `op`.
fn driver(op: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        op,
        code: describe(&e),
    }
}

/// Whether `libcuda` can be loaded (checked before any call that would make cudarc panic).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its known names.
    unsafe { sys::is_culib_present() }
}

/// One GPU: its primary context and a stream for our copies.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal())
            .field("name", &self.name)
            .finish()
    }
}

impl Gpu {
    /// Opens GPU `ordinal`, or says in one sentence why there is none.
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        let count = match CudaContext::device_count() {
            Ok(n) => usize::try_from(n).unwrap_or(0),
            Err(e) if is_no_device(&e) => return Err(CudaError::NoDevice(describe(&e))),
            Err(e) => return Err(driver("initialisation")(e)),
        };
        if count == 0 {
            return Err(CudaError::NoDevice("0 devices".into()));
        }
        if ordinal >= count {
            return Err(CudaError::BadOrdinal { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("context creation"))?;
        // SAFETY: we allocate no CudaSlice, whose cross-stream use event tracking guards.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("stream creation"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        Ok(Gpu { ctx, stream, name })
    }

    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes the context current on the calling thread (needed once per thread before any call).
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(driver("context binding"))
    }

    /// Our stream.
    pub fn stream(&self) -> CUstream {
        self.stream.cu_stream()
    }

    /// Waits for our stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(driver("stream synchronize"))
    }

    /// Waits for another stream of this context (a PyTorch stream whose earlier work may still
    /// use the memory we are about to fill).
    ///
    /// # Safety
    /// `stream` must be a live stream of this GPU's primary context (or null, the legacy stream).
    pub unsafe fn wait_for_stream(&self, stream: CUstream) -> Result<(), CudaError> {
        self.bind()?;
        result::stream::synchronize(stream).map_err(driver("stream synchronize"))
    }

    /// Allocates `len` bytes of device memory.
    pub fn alloc(&self, len: u64) -> Result<DeviceBuffer, CudaError> {
        self.bind()?;
        let ptr = if len == 0 {
            0
        } else {
            let bytes = usize::try_from(len).map_err(|_| CudaError::Driver {
                op: "allocation",
                code: format!("{len} bytes do not fit in memory"),
            })?;
            // SAFETY: plain allocation in the current context.
            unsafe { result::malloc_sync(bytes) }.map_err(driver("device allocation"))?
        };
        Ok(DeviceBuffer {
            ctx: self.ctx.clone(),
            ptr,
            len,
        })
    }

    /// A staging pool of `count` pinned buffers of `len` bytes (one pinned allocation).
    pub fn pinned_pool(&self, count: usize, len: usize) -> Result<StagingPool, CudaError> {
        let pinned = Pinned::new(&self.ctx, count * len + IO_ALIGN as usize)?;
        let backing = PinnedSlices { pinned, len };
        Ok(StagingPool::with_backing(Box::new(backing), count, len))
    }

    /// One pinned host allocation of `len` bytes (the host-to-device ceiling measurement).
    pub fn pinned(&self, len: usize) -> Result<Pinned, CudaError> {
        Pinned::new(&self.ctx, len)
    }

    /// Synchronous copy from (pageable or pinned) host memory.
    ///
    /// # Safety
    /// `dst..dst + src.len()` must be device memory of this context.
    pub unsafe fn copy_sync(&self, dst: CUdeviceptr, src: &[u8]) -> Result<(), CudaError> {
        result::memcpy_htod_sync(dst, src).map_err(driver("host-to-device copy"))
    }

    /// Asynchronous copy on our stream.
    ///
    /// # Safety
    /// As [`Gpu::copy_sync`], and `src` must stay valid until the stream has passed the copy.
    pub unsafe fn copy_async(&self, dst: CUdeviceptr, src: &[u8]) -> Result<(), CudaError> {
        result::memcpy_htod_async(dst, src, self.stream()).map_err(driver("host-to-device copy"))
    }
}

fn is_no_device(e: &DriverError) -> bool {
    matches!(e.0, CUresult::CUDA_ERROR_NO_DEVICE)
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
    len: u64,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceBuffer {
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `len` bytes at `offset` back to the host (tests and checks).
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, CudaError> {
        let mut out = vec![0u8; len];
        if len > 0 {
            self.ctx
                .bind_to_thread()
                .map_err(driver("context binding"))?;
            // SAFETY: the range lies in this allocation (checked by the caller's plan) and the
            // synchronous copy completes before returning.
            unsafe { result::memcpy_dtoh_sync(&mut out, self.ptr + offset) }
                .map_err(driver("device-to-host copy"))?;
        }
        Ok(out)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context; every copy into it was synchronized.
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::warn!(error = %describe(&e), "cannot free device memory");
            }
        }
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
pub struct Pinned {
    ctx: Arc<CudaContext>,
    ptr: NonNull<c_void>,
    len: usize,
}

// SAFETY: plain host memory; whoever holds the `Pinned` owns it.
unsafe impl Send for Pinned {}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Pinned, CudaError> {
        ctx.bind_to_thread().map_err(driver("context binding"))?;
        // SAFETY: allocation only; flags 0 = pinned memory of the current context.
        let raw =
            unsafe { result::malloc_host(len.max(1), 0) }.map_err(driver("pinned allocation"))?;
        let ptr = NonNull::new(raw).ok_or(CudaError::Driver {
            op: "pinned allocation",
            code: "returned a null pointer".into(),
        })?;
        Ok(Pinned {
            ctx: ctx.clone(),
            ptr,
            len,
        })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes allocated by cuMemHostAlloc, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc; users finished their copies (the pipeline
            // synchronizes before returning its leases).
            if let Err(e) = unsafe { result::free_host(self.ptr.as_ptr()) } {
                tracing::warn!(error = %describe(&e), "cannot free pinned memory");
            }
        }
    }
}

/// One pinned allocation cut into aligned buffers of `len` bytes.
struct PinnedSlices {
    pinned: Pinned,
    len: usize,
}

impl Backing for PinnedSlices {
    fn ptr(&mut self, i: usize) -> NonNull<u8> {
        let base = self.pinned.ptr.as_ptr() as usize;
        let aligned = base.next_multiple_of(IO_ALIGN as usize);
        NonNull::new((aligned + i * self.len) as *mut u8).unwrap_or(NonNull::dangling())
    }
}

/// Copies chunks to device memory asynchronously on the GPU's stream, one event per staging
/// buffer telling when its copy has finished.
pub struct DeviceSink<'g> {
    gpu: &'g Gpu,
    base: CUdeviceptr,
    capacity: u64,
    events: Vec<CUevent>,
    queue: VecDeque<usize>,
}

impl<'g> DeviceSink<'g> {
    /// A sink into `capacity` bytes at `base` for a pool of `buffers` staging buffers.
    ///
    /// # Safety
    /// `base..base + capacity` must be device memory of `gpu`'s context that stays allocated
    /// until the sink has finished.
    pub unsafe fn new(
        gpu: &'g Gpu,
        base: CUdeviceptr,
        capacity: u64,
        buffers: usize,
    ) -> Result<DeviceSink<'g>, CudaError> {
        gpu.bind()?;
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let mut sink = DeviceSink {
            gpu,
            base,
            capacity,
            events: Vec::with_capacity(buffers),
            queue: VecDeque::new(),
        };
        for _ in 0..buffers {
            sink.events
                .push(result::event::create(flags).map_err(driver("event creation"))?);
        }
        Ok(sink)
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), SinkError> {
        let end = offset.saturating_add(len);
        if end > self.capacity {
            return Err(SinkError::OutOfBounds {
                offset,
                end,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    fn event(&self, id: usize) -> Result<CUevent, SinkError> {
        self.events.get(id).copied().ok_or(SinkError::OutOfBounds {
            offset: id as u64,
            end: id as u64 + 1,
            capacity: self.events.len() as u64,
        })
    }
}

impl Sink for DeviceSink<'_> {
    unsafe fn submit(&mut self, id: usize, src: &[u8], arena_offset: u64) -> Result<(), SinkError> {
        self.check(arena_offset, src.len() as u64)?;
        let event = self.event(id)?;
        self.gpu.copy_async(self.base + arena_offset, src)?;
        result::event::record(event, self.gpu.stream()).map_err(driver("event record"))?;
        self.queue.push_back(id);
        Ok(())
    }

    fn reclaim(&mut self, wait: bool) -> Result<Vec<usize>, SinkError> {
        let mut done = Vec::new();
        if let (true, Some(&front)) = (wait, self.queue.front()) {
            // SAFETY: events are live until drop.
            unsafe { result::event::synchronize(self.event(front)?) }
                .map_err(driver("event synchronize"))?;
        }
        while let Some(&front) = self.queue.front() {
            // SAFETY: as above.
            match unsafe { result::event::query(self.event(front)?) } {
                Ok(()) => {
                    self.queue.pop_front();
                    done.push(front);
                }
                Err(e) if matches!(e.0, CUresult::CUDA_ERROR_NOT_READY) => break,
                Err(e) => return Err(driver("event query")(e).into()),
            }
        }
        Ok(done)
    }

    fn relocate(&mut self, from: u64, to: u64, len: u64) -> Result<(), SinkError> {
        self.check(from, len)?;
        self.check(to, len)?;
        let bytes = usize::try_from(len).unwrap_or(usize::MAX);
        // SAFETY: both ranges are inside the destination (checked); stream order puts the copy
        // after every chunk copy submitted before it.
        unsafe {
            result::memcpy_dtod_async(self.base + to, self.base + from, bytes, self.gpu.stream())
        }
        .map_err(driver("device-to-device copy"))?;
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.gpu.synchronize()?;
        self.queue.clear();
        Ok(())
    }
}

impl Drop for DeviceSink<'_> {
    fn drop(&mut self) {
        // Outstanding copies must not outlive their source buffers: finish before going.
        if !self.queue.is_empty() {
            let _ = self.gpu.synchronize();
        }
        for &event in &self.events {
            // SAFETY: created in `new`, destroyed once.
            let _ = unsafe { result::event::destroy(event) };
        }
    }
}
