//! Loading a planned selection of a file into device (or host) memory, by the route that fits.
//!
//! # Routes
//!
//! - **GDS** ([`Route::Gds`]): cuFile reads each chunk from storage straight into device memory
//!   (peer-to-peer DMA, compat mode disallowed; see [`crate::cufile`]).
//! - **cuFile compat** ([`Route::Compat`]): cuFile's own POSIX fallback, measured by `bench`.
//! - **Bounce buffers** ([`Route::Bounce`]): the [`crate::pipeline`], reading into pinned buffers
//!   and copying asynchronously.
//! - **Plain** ([`Route::Plain`]): one thread reads into ordinary memory and copies synchronously —
//!   what a naive loader does; the baseline of `bench`.
//!
//! `--gds` picks: `off` → bounce buffers; `on` → GDS or a hard error that says how to turn it off;
//! `compat` → cuFile compat; `auto` → bounce buffers from the page cache when the file is mostly
//! cached (GDS reads with `O_DIRECT` and would go to the disk again; RAM is faster), else GDS,
//! falling back to bounce buffers, per file, with the reason in the report.
//!
//! # Defaults
//!
//! - [`DEFAULT_THREADS`] = 8 readers: enough requests in flight to saturate an NVMe drive (its
//!   throughput stops growing past a queue depth of a few large requests) and, for a warm file,
//!   enough memcpy streams out of the page cache to approach the host-to-device link, while
//!   leaving cores to the program that loads.
//! - [`crate::plan::DEFAULT_CHUNK_BYTES`] = 8 MiB per read: large requests keep per-request
//!   overhead (syscall, DMA setup, copy launch — a few µs) under 1% at tens of GB/s, and small
//!   enough that 16 staging buffers are 128 MiB of pinned memory. KvikIO uses 4 MiB tasks;
//!   fastsafetensors and ServerlessLLM use chunks of the same order.
//! - [`BUFFERS_PER_THREAD`] = 2: every reader can fill a buffer while one full set is being copied.

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use crate::cuda::{CudaError, DeviceBuffer, DeviceSink, Gpu};
use crate::cufile::{self, BufRegistration, CufileHandle, CufileMode, GdsError};
use crate::io::{self, ReadMode, WARM_FRACTION};
use crate::pipeline::{self, HostSink, NullSink, PipelineConfig, PipelineError, Sink, SinkError};
use crate::plan::{LoadPlan, PlanError, DEFAULT_CHUNK_BYTES, IO_ALIGN};
use crate::resolve::{ResolveError, Source};
use crate::staging::{StagingError, StagingPool};

/// Reader threads by default (see the module docs).
pub const DEFAULT_THREADS: usize = 8;
/// Staging buffers per reader thread (see the module docs).
pub const BUFFERS_PER_THREAD: usize = 2;
/// Piece size of the plain route: a typical read size of a simple loader.
pub const PLAIN_PIECE: usize = 64 << 20;

/// What `--gds` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GdsMode {
    /// GDS where it works and the file is not cached, bounce buffers otherwise.
    #[default]
    Auto,
    /// GDS or an error.
    On,
    /// Never GDS.
    Off,
    /// cuFile's compat mode (for measurements).
    Compat,
}

impl FromStr for GdsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<GdsMode, String> {
        match s {
            "auto" => Ok(GdsMode::Auto),
            "on" => Ok(GdsMode::On),
            "off" => Ok(GdsMode::Off),
            "compat" => Ok(GdsMode::Compat),
            other => Err(format!(
                "unknown GDS mode '{other}' (expected auto, on, off or compat)"
            )),
        }
    }
}

/// How the bytes went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    Gds,
    Compat,
    Bounce,
    Plain,
    /// Disk only, no destination (`bench`'s read-speed row).
    Disk,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Route::Gds => "GPUDirect Storage (cuFile)",
            Route::Compat => "cuFile compat mode",
            Route::Bounce => "bounce buffers",
            Route::Plain => "plain read + copy",
            Route::Disk => "disk read only",
        })
    }
}

/// Load settings; [`Default`] is the constants of the module docs.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub gds: GdsMode,
    /// Reader threads ([`DEFAULT_THREADS`]).
    pub threads: usize,
    /// Bytes per read ([`DEFAULT_CHUNK_BYTES`]).
    pub chunk_bytes: u64,
    /// Force direct or buffered reads; `None` chooses by page-cache residency.
    pub read_mode: Option<ReadMode>,
    /// Staging buffers per reader thread ([`BUFFERS_PER_THREAD`]).
    pub buffers_per_thread: usize,
    /// Share of the plan's bytes in the page cache from which reads go through it
    /// ([`WARM_FRACTION`]).
    pub warm_fraction: f64,
    /// Piece size of the plain route ([`PLAIN_PIECE`]).
    pub plain_piece: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            gds: GdsMode::Auto,
            threads: DEFAULT_THREADS,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            read_mode: None,
            buffers_per_thread: BUFFERS_PER_THREAD,
            warm_fraction: WARM_FRACTION,
            plain_piece: PLAIN_PIECE,
        }
    }
}

/// Why a load failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error(transparent)]
    Staging(#[from] StagingError),
    #[error("GPUDirect Storage is not usable for {path}: {source}; load without it with --gds off (gds=\"off\" in Python), or --gds auto to fall back automatically")]
    GdsRequired {
        path: std::path::PathBuf,
        source: GdsError,
    },
    #[error(transparent)]
    Gds(#[from] GdsError),
    #[error("the destination holds {have} bytes but the selected tensors need {need}")]
    DestinationTooSmall { need: u64, have: u64 },
    #[error("the destination address {ptr:#x} is not a multiple of {IO_ALIGN}")]
    Misaligned { ptr: u64 },
}

impl From<SinkError> for LoadError {
    fn from(e: SinkError) -> LoadError {
        LoadError::Pipeline(PipelineError::Sink(e))
    }
}

/// What a load did, for people (`Display`) and programs (JSON).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadReport {
    pub route: Route,
    /// The path given and the file read.
    pub requested: std::path::PathBuf,
    pub source: std::path::PathBuf,
    /// "cuda:N" or "cpu" (or "none" for disk-only).
    pub destination: String,
    pub tensors: usize,
    pub tensor_bytes: u64,
    pub read_bytes: u64,
    /// How the bounce/disk routes read (`None` for cuFile and plain).
    pub read_mode: Option<ReadMode>,
    /// Whether reads bypassed the page cache.
    pub direct_io: bool,
    /// Page-cache residency of the selected range before the load.
    pub resident_fraction: Option<f64>,
    /// Why GDS was not used in `auto` mode.
    pub fallback: Option<String>,
    pub threads: usize,
    pub chunk_bytes: u64,
    /// Seconds spent before the first byte moved (staging allocation, cuFile setup).
    pub setup_seconds: f64,
    /// Seconds moving bytes (first read to last copy finished).
    pub transfer_seconds: f64,
    /// `tensor_bytes / transfer_seconds`, in GB/s (10^9 bytes).
    pub gb_per_s: f64,
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loaded {} tensors ({}) from {} into {} in {:.3} s (+{:.3} s setup): {:.2} GB/s via {}",
            self.tensors,
            tierfs_core::size::format_size(self.tensor_bytes),
            self.source.display(),
            self.destination,
            self.transfer_seconds,
            self.setup_seconds,
            self.gb_per_s,
            self.route
        )?;
        if let Some(mode) = self.read_mode {
            let how = match (mode, self.direct_io) {
                (ReadMode::Direct, true) => "O_DIRECT",
                (ReadMode::Direct, false) => "page cache (O_DIRECT refused)",
                (ReadMode::Buffered, _) => "page cache",
            };
            write!(
                f,
                " ({how}, {} threads × {} chunks)",
                self.threads,
                tierfs_core::size::format_size(self.chunk_bytes)
            )?;
        }
        if let Some(why) = &self.fallback {
            write!(f, "; GDS not used: {why}")?;
        }
        Ok(())
    }
}

/// Residency of the plan's byte range in the page cache.
fn residency(source: &Source, plan: &LoadPlan) -> Option<f64> {
    let (start, end) = match (plan.extents.first(), plan.extents.last()) {
        (Some(first), Some(last)) => (first.data_start, last.data_end),
        _ => return Some(1.0),
    };
    io::resident_fraction(source.reader.file(), start, end)
}

fn read_mode(options: &LoadOptions, resident: Option<f64>) -> ReadMode {
    options.read_mode.unwrap_or(match resident {
        Some(r) if r >= options.warm_fraction => ReadMode::Buffered,
        _ => ReadMode::Direct,
    })
}

/// Builds reports; one per load.
struct Reporter<'a> {
    source: &'a Source,
    plan: &'a LoadPlan,
    options: LoadOptions,
    destination: String,
    started: Instant,
    resident: Option<f64>,
}

impl Reporter<'_> {
    fn finish(
        &self,
        route: Route,
        transfer_seconds: f64,
        read_mode: Option<ReadMode>,
        direct_io: bool,
        fallback: Option<String>,
    ) -> LoadReport {
        let total = self.started.elapsed().as_secs_f64();
        let transfer = transfer_seconds.max(1e-9);
        LoadReport {
            route,
            requested: self.source.requested.clone(),
            source: self.source.path.clone(),
            destination: self.destination.clone(),
            tensors: self.plan.tensors.len(),
            tensor_bytes: self.plan.tensor_bytes,
            read_bytes: self.plan.read_bytes,
            read_mode,
            direct_io,
            resident_fraction: self.resident,
            fallback,
            threads: self.options.threads,
            chunk_bytes: self.plan.chunk_bytes,
            setup_seconds: (total - transfer_seconds).max(0.0),
            transfer_seconds,
            gb_per_s: self.plan.tensor_bytes as f64 / transfer / 1e9,
        }
    }
}

/// Loads into host memory `dst` (at least `plan.arena_bytes` long) through the pipeline.
pub fn load_host(
    source: &Source,
    plan: &LoadPlan,
    dst: &mut [u8],
    options: LoadOptions,
) -> Result<LoadReport, LoadError> {
    if (dst.len() as u64) < plan.arena_bytes {
        return Err(LoadError::DestinationTooSmall {
            need: plan.arena_bytes,
            have: dst.len() as u64,
        });
    }
    let sink = &mut HostSink::new(dst);
    run_on_host(source, plan, options, "cpu", sink, Route::Bounce)
}

/// Reads the plan and throws the bytes away: how fast the file can be read.
pub fn measure_disk(
    source: &Source,
    plan: &LoadPlan,
    options: LoadOptions,
) -> Result<LoadReport, LoadError> {
    let sink = &mut NullSink::default();
    run_on_host(source, plan, options, "none", sink, Route::Disk)
}

/// One pipeline run through host staging buffers into `sink`, reported as `route`.
fn run_on_host(
    source: &Source,
    plan: &LoadPlan,
    options: LoadOptions,
    destination: &str,
    sink: &mut dyn Sink,
    route: Route,
) -> Result<LoadReport, LoadError> {
    let reporter = reporter(source, plan, options, destination.into());
    let mode = read_mode(&options, reporter.resident);
    let mut pool = host_pool(options, plan)?;
    let stats = pipeline::run(plan, &source.reader, &mut pool, sink, config(options, mode))?;
    Ok(reporter.finish(route, stats.seconds, Some(mode), stats.direct_io, None))
}

fn reporter<'a>(
    source: &'a Source,
    plan: &'a LoadPlan,
    options: LoadOptions,
    destination: String,
) -> Reporter<'a> {
    let started = Instant::now();
    Reporter {
        source,
        plan,
        options,
        destination,
        started,
        resident: residency(source, plan),
    }
}

fn host_pool(options: LoadOptions, plan: &LoadPlan) -> Result<StagingPool, StagingError> {
    let count = buffer_count(options, plan);
    StagingPool::host(count, plan.chunk_bytes as usize)
}

fn buffer_count(options: LoadOptions, plan: &LoadPlan) -> usize {
    (options.threads.max(1) * options.buffers_per_thread.max(1)).min(plan.chunks.len().max(1))
}

fn config(options: LoadOptions, mode: ReadMode) -> PipelineConfig {
    PipelineConfig {
        threads: options.threads.max(1),
        mode,
    }
}

/// Loads into one GPU. Keeps the pinned staging buffers between loads.
pub struct Loader {
    gpu: Gpu,
    options: LoadOptions,
    pool: Option<StagingPool>,
}

impl fmt::Debug for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loader")
            .field("gpu", &self.gpu)
            .field("options", &self.options)
            .finish()
    }
}

impl Loader {
    /// A loader for GPU `ordinal`; fails in one sentence when there is none.
    pub fn new(ordinal: usize, options: LoadOptions) -> Result<Loader, LoadError> {
        Ok(Loader {
            gpu: Gpu::open(ordinal)?,
            options,
            pool: None,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn options(&self) -> LoadOptions {
        self.options
    }

    pub fn set_options(&mut self, options: LoadOptions) {
        self.options = options;
    }

    /// Allocates device memory for the plan and loads into it.
    pub fn load(
        &mut self,
        source: &Source,
        plan: &LoadPlan,
    ) -> Result<(DeviceBuffer, LoadReport), LoadError> {
        let arena = self.gpu.alloc(plan.arena_bytes)?;
        // SAFETY: `arena` is device memory of this GPU, `arena_bytes` long, alive for the call.
        let report = unsafe { self.load_into(source, plan, arena.ptr(), arena.len()) }?;
        Ok((arena, report))
    }

    /// Loads into `capacity` bytes of device memory at `base` (4 KiB-aligned).
    ///
    /// # Safety
    /// `base..base + capacity` must be device memory of this GPU's primary context, not used by
    /// anything else until this returns.
    pub unsafe fn load_into(
        &mut self,
        source: &Source,
        plan: &LoadPlan,
        base: u64,
        capacity: u64,
    ) -> Result<LoadReport, LoadError> {
        if capacity < plan.arena_bytes {
            return Err(LoadError::DestinationTooSmall {
                need: plan.arena_bytes,
                have: capacity,
            });
        }
        if !base.is_multiple_of(IO_ALIGN) {
            return Err(LoadError::Misaligned { ptr: base });
        }
        self.gpu.bind()?;
        let options = self.options;
        let destination = format!("cuda:{}", self.gpu.ordinal());
        let reporter = reporter(source, plan, options, destination);
        match options.gds {
            GdsMode::Off => self.bounce(&reporter, base, capacity, None),
            GdsMode::Compat => self.cufile(&reporter, CufileMode::Compat, base, capacity),
            GdsMode::On => self
                .cufile(&reporter, CufileMode::Direct, base, capacity)
                .map_err(|e| required(source, e)),
            GdsMode::Auto => self.auto(&reporter, base, capacity),
        }
    }

    fn auto(
        &mut self,
        reporter: &Reporter,
        base: u64,
        capacity: u64,
    ) -> Result<LoadReport, LoadError> {
        if reporter.resident.is_some_and(|r| r >= WARM_FRACTION) {
            let why =
                "the file is in the page cache, which is faster to copy from than GDS's disk reads";
            return self.bounce(reporter, base, capacity, Some(why.into()));
        }
        match self.cufile(reporter, CufileMode::Direct, base, capacity) {
            Err(LoadError::Gds(e)) if is_setup_failure(&e) => {
                tracing::info!(file = %reporter.source.path.display(), reason = %e, "GDS not usable; using bounce buffers");
                self.bounce(reporter, base, capacity, Some(e.to_string()))
            }
            other => other,
        }
    }

    /// The bounce-buffer pipeline into device memory.
    fn bounce(
        &mut self,
        reporter: &Reporter,
        base: u64,
        capacity: u64,
        fallback: Option<String>,
    ) -> Result<LoadReport, LoadError> {
        let plan = reporter.plan;
        let mode = read_mode(&self.options, reporter.resident);
        let count = self.options.threads.max(1) * BUFFERS_PER_THREAD;
        let pool = match self.pool.take() {
            Some(p) if p.count() >= count && p.buffer_len() as u64 >= plan.chunk_bytes => p,
            _ => self.gpu.pinned_pool(count, plan.chunk_bytes as usize)?,
        };
        let pool = self.pool.insert(pool);
        // SAFETY: the caller of `load_into` guarantees the destination.
        let mut sink = unsafe { DeviceSink::new(&self.gpu, base, capacity, pool.count())? };
        let stats = pipeline::run(
            plan,
            &reporter.source.reader,
            pool,
            &mut sink,
            config(self.options, mode),
        )?;
        Ok(reporter.finish(
            Route::Bounce,
            stats.seconds,
            Some(mode),
            stats.direct_io,
            fallback,
        ))
    }

    /// cuFile reads in `mode`, then the relocations on our stream.
    fn cufile(
        &mut self,
        reporter: &Reporter,
        mode: CufileMode,
        base: u64,
        capacity: u64,
    ) -> Result<LoadReport, LoadError> {
        let lib = cufile::library()?;
        lib.open_driver(mode)?;
        let handle = CufileHandle::register(lib, &reporter.source.path)?;
        let plan = reporter.plan;
        let len = usize::try_from(plan.arena_bytes).unwrap_or(usize::MAX);
        // SAFETY: the destination is device memory of this context for the whole load.
        let _registration = (mode == CufileMode::Direct && len > 0)
            .then(|| unsafe { BufRegistration::new(lib, base, len) });
        let started = Instant::now();
        // SAFETY: as above; every chunk lies inside the arena.
        unsafe { cufile::read_plan(&self.gpu, &handle, plan, base, self.options.threads) }?;
        // SAFETY: as above.
        let mut sink = unsafe { DeviceSink::new(&self.gpu, base, capacity, 0)? };
        for r in &plan.relocations {
            sink.relocate(r.from, r.to, r.len)?;
        }
        sink.finish()?;
        let route = match mode {
            CufileMode::Direct => Route::Gds,
            CufileMode::Compat => Route::Compat,
        };
        Ok(reporter.finish(route, started.elapsed().as_secs_f64(), None, true, None))
    }

    /// The naive route: one thread, pageable memory, synchronous copies.
    pub fn load_plain(
        &mut self,
        source: &Source,
        plan: &LoadPlan,
    ) -> Result<(DeviceBuffer, LoadReport), LoadError> {
        let arena = self.gpu.alloc(plan.arena_bytes)?;
        let reporter = reporter(
            source,
            plan,
            self.options,
            format!("cuda:{}", self.gpu.ordinal()),
        );
        let started = Instant::now();
        let plain_piece = self.options.plain_piece.max(1);
        let mut piece = vec![0u8; plain_piece];
        for e in &plan.extents {
            let mut offset = e.data_start;
            while offset < e.data_end {
                let n = plain_piece.min((e.data_end - offset) as usize);
                source
                    .reader
                    .read_at_least(&mut piece[..n], offset, n as u64, ReadMode::Buffered)
                    .map_err(PipelineError::from)?;
                let dst = arena.ptr() + e.arena_offset + (offset - e.file_start);
                // SAFETY: inside the arena just allocated (plan invariant).
                unsafe { self.gpu.copy_sync(dst, &piece[..n]) }?;
                offset += n as u64;
            }
        }
        // SAFETY: the arena is this GPU's memory and outlives the sink.
        let mut sink = unsafe { DeviceSink::new(&self.gpu, arena.ptr(), arena.len(), 0)? };
        for r in &plan.relocations {
            sink.relocate(r.from, r.to, r.len)?;
        }
        sink.finish()?;
        drop(sink);
        let report = reporter.finish(
            Route::Plain,
            started.elapsed().as_secs_f64(),
            Some(ReadMode::Buffered),
            false,
            None,
        );
        Ok((arena, report))
    }
}

/// Failures that mean "GDS cannot be set up here" (auto falls back), as opposed to I/O errors
/// in the middle of reading.
fn is_setup_failure(e: &GdsError) -> bool {
    !matches!(e, GdsError::Read { .. } | GdsError::Cuda(_))
}

/// `--gds on`: any cuFile failure becomes the hard, explicit error.
fn required(source: &Source, e: LoadError) -> LoadError {
    match e {
        LoadError::Gds(g) => LoadError::GdsRequired {
            path: source.path.clone(),
            source: g,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Selection;
    use crate::testutil::{file_bytes, temp_file};

    #[test]
    fn host_loads_report_what_they_did() {
        let bytes = file_bytes(
            &[
                ("a", "F32", &[70_000]),
                ("b", "BF16", &[3]),
                ("c", "F32", &[9]),
            ],
            None,
            1,
        );
        let f = temp_file(&bytes);
        let source = crate::resolve::open(f.path()).unwrap();
        let plan = LoadPlan::new(&source.index, &Selection::All, 64 << 10).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes as usize];
        let report = load_host(&source, &plan, &mut arena, LoadOptions::default()).unwrap();
        assert_eq!(report.route, Route::Bounce);
        assert_eq!(report.tensors, 3);
        assert_eq!(report.destination, "cpu");
        // Just written, so in the page cache: the auto read mode must have chosen buffered reads.
        assert_eq!(report.read_mode, Some(ReadMode::Buffered));
        assert!(report.resident_fraction.is_some_and(|r| r > WARM_FRACTION));
        for t in &plan.tensors {
            let want = &bytes[t.file_start as usize..(t.file_start + t.len) as usize];
            assert_eq!(&arena[t.offset as usize..(t.offset + t.len) as usize], want);
        }
        let text = report.to_string();
        assert!(
            text.contains("GB/s via bounce buffers (page cache"),
            "{text}"
        );

        let mut small = vec![0u8; 10];
        assert!(matches!(
            load_host(&source, &plan, &mut small, LoadOptions::default()),
            Err(LoadError::DestinationTooSmall { have: 10, .. })
        ));
    }

    #[test]
    fn a_cold_file_is_read_with_o_direct() {
        let bytes = file_bytes(&[("a", "F32", &[300_000])], None, 2);
        let f = temp_file(&bytes);
        let source = crate::resolve::open(f.path()).unwrap();
        assert!(io::evict(source.reader.file()));
        let plan = LoadPlan::new(&source.index, &Selection::All, 64 << 10).unwrap();
        let report = measure_disk(&source, &plan, LoadOptions::default()).unwrap();
        assert_eq!(
            (report.route, report.read_mode),
            (Route::Disk, Some(ReadMode::Direct))
        );
        assert!(report.direct_io);
        assert_eq!(report.read_bytes, plan.read_bytes);
    }

    #[test]
    fn the_options_set_the_read_mode_threshold_and_the_buffer_count() {
        let bytes = file_bytes(&[("a", "F32", &[300_000])], None, 3);
        let f = temp_file(&bytes);
        let source = crate::resolve::open(f.path()).unwrap();
        let plan = LoadPlan::new(&source.index, &Selection::All, 64 << 10).unwrap();
        assert!(plan.chunks.len() > 8);
        // Just written, so cached; a threshold above 1 reads it with O_DIRECT all the same.
        let never_warm = LoadOptions {
            warm_fraction: 1.5,
            ..LoadOptions::default()
        };
        let mut arena = vec![0u8; plan.arena_bytes as usize];
        let report = load_host(&source, &plan, &mut arena, never_warm).unwrap();
        assert_eq!(report.read_mode, Some(ReadMode::Direct));
        let options = |threads, buffers_per_thread| LoadOptions {
            threads,
            buffers_per_thread,
            ..LoadOptions::default()
        };
        assert_eq!(buffer_count(options(2, 2), &plan), 4);
        assert_eq!(buffer_count(options(2, 3), &plan), 6);
    }

    #[test]
    fn gds_modes_parse() {
        for (text, mode) in [
            ("auto", GdsMode::Auto),
            ("on", GdsMode::On),
            ("off", GdsMode::Off),
            ("compat", GdsMode::Compat),
        ] {
            assert_eq!(text.parse::<GdsMode>(), Ok(mode));
        }
        assert!("yes"
            .parse::<GdsMode>()
            .unwrap_err()
            .contains("expected auto, on, off or compat"));
    }
}
