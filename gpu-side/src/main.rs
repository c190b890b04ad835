//! `tierfs-gpu`: load tensors of a `.safetensors` file (on a tierfs mount or not) into GPU memory
//! and measure how fast each route does it. This file parses the command line and prints; the
//! work is in the library.
//!
//! Errors are one line on stderr, `tierfs-gpu: <sentence>`, and exit status 1 (2 for usage
//! errors, from clap); nothing panics on a machine without a GPU.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tierfs_core::size::{format_size, parse_size};
use tierfs_gpu::bench::{self, CacheState, Probe};
use tierfs_gpu::load::{self, GdsMode, LoadOptions, LoadReport, Loader};
use tierfs_gpu::plan::{LoadPlan, Selection, DEFAULT_CHUNK_BYTES};
use tierfs_gpu::resolve::{self, Source};

#[derive(Parser)]
#[command(
    name = "tierfs-gpu",
    version,
    about = "Load safetensors tensors from the files behind a tierfs mount straight into GPU memory"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Settings shared by the commands that read.
#[derive(clap::Args, Clone, Copy)]
struct Tuning {
    /// Reader threads.
    #[arg(long, default_value_t = load::DEFAULT_THREADS)]
    threads: usize,
    /// Bytes per read (a multiple of 4 KiB): 8MiB, 4MiB, ...
    #[arg(long, default_value = "8MiB", value_parser = parse_size_arg)]
    chunk: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Load all tensors, some tensors or some blocks of FILE into a GPU (or host memory).
    Load {
        file: PathBuf,
        /// Only these tensors (comma-separated or repeated).
        #[arg(long, value_delimiter = ',', conflicts_with = "blocks")]
        tensors: Vec<String>,
        /// Only these blocks, as `tierfs inspect` names them (comma-separated or repeated).
        #[arg(long, value_delimiter = ',')]
        blocks: Vec<String>,
        /// GPUDirect Storage: auto (where usable), on (or fail), off, compat (cuFile's fallback).
        #[arg(long, default_value = "auto", value_parser = parse_gds)]
        gds: GdsMode,
        /// GPU number, or `cpu` for host memory.
        #[arg(long, default_value = "0", value_parser = parse_device)]
        device: Device,
        /// Read the tensors back and compare them with the file, byte for byte.
        #[arg(long)]
        verify: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        tuning: Tuning,
    },
    /// Measure every route (GDS, cuFile compat, bounce buffers, plain read + copy), cold and warm.
    Bench {
        file: PathBuf,
        /// GPU number.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// Print the measurements as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        tuning: Tuning,
    },
    /// Show the source file behind PATH (on a tierfs mount) and its tensor count.
    Resolve {
        path: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// One measurement of `bench` (run by `bench` in a child process).
    #[command(hide = true)]
    Measure {
        file: PathBuf,
        #[arg(long, value_enum)]
        probe: Probe,
        #[arg(long, value_enum)]
        cache: CacheState,
        #[arg(long, default_value_t = 0)]
        device: usize,
        #[command(flatten)]
        tuning: Tuning,
    },
}

/// Where `load` puts the tensors.
#[derive(Clone, Copy, Debug)]
enum Device {
    Cpu,
    Gpu(usize),
}

fn parse_device(text: &str) -> Result<Device, String> {
    if text == "cpu" {
        return Ok(Device::Cpu);
    }
    let number = text.strip_prefix("cuda:").unwrap_or(text);
    number
        .parse()
        .map(Device::Gpu)
        .map_err(|_| format!("'{text}' is neither a GPU number, cuda:N nor cpu"))
}

fn parse_gds(text: &str) -> Result<GdsMode, String> {
    text.parse()
}

fn parse_size_arg(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
}

/// A command's failure: one sentence for stderr.
type Failure = String;

fn main() -> ExitCode {
    init_logging();
    // cuFile writes its log to ./cufile.log unless told otherwise: keep it out of the user's
    // directory. Set before any thread exists.
    if std::env::var_os("CUFILE_LOGFILE_PATH").is_none() {
        std::env::set_var(
            "CUFILE_LOGFILE_PATH",
            std::env::temp_dir().join("tierfs-gpu-cufile.log"),
        );
    }
    // SAFETY: restoring the default SIGPIPE disposition before any thread starts, so
    // `tierfs-gpu resolve … | head` ends quietly.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tierfs-gpu: {}", message.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIERFS_GPU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Load {
            file,
            tensors,
            blocks,
            gds,
            device,
            verify,
            json,
            tuning,
        } => {
            let selection = match (tensors.is_empty(), blocks.is_empty()) {
                (false, _) => Selection::Tensors(tensors),
                (true, false) => Selection::Blocks(blocks),
                (true, true) => Selection::All,
            };
            let options = LoadOptions {
                gds,
                threads: tuning.threads,
                chunk_bytes: tuning.chunk,
                read_mode: None,
                ..LoadOptions::default()
            };
            load_cmd(&file, &selection, device, options, verify, json)
        }
        Command::Bench {
            file,
            device,
            json,
            tuning,
        } => bench_cmd(&file, device, options(tuning), json),
        Command::Resolve { path, json } => resolve_cmd(&path, json),
        Command::Measure {
            file,
            probe,
            cache,
            device,
            tuning,
        } => {
            let report = bench::measure(&file, probe, cache, device, options(tuning))
                .map_err(|e| e.to_string())?;
            println!("{report}");
            Ok(())
        }
    }
}

fn options(tuning: Tuning) -> LoadOptions {
    LoadOptions {
        threads: tuning.threads,
        chunk_bytes: tuning.chunk,
        ..LoadOptions::default()
    }
}

fn open(file: &Path, selection: &Selection, chunk: u64) -> Result<(Source, LoadPlan), Failure> {
    let source = resolve::open(file).map_err(|e| e.to_string())?;
    let plan = LoadPlan::new(&source.index, selection, chunk).map_err(|e| e.to_string())?;
    Ok((source, plan))
}

fn load_cmd(
    file: &Path,
    selection: &Selection,
    device: Device,
    options: LoadOptions,
    verify: bool,
    json: bool,
) -> Result<(), Failure> {
    // The GPU first: without one, say so before reading anything.
    let mut loader = match device {
        Device::Gpu(n) => Some(Loader::new(n, options).map_err(|e| e.to_string())?),
        Device::Cpu => None,
    };
    let (source, plan) = open(file, selection, options.chunk_bytes)?;
    let (report, arena) = match loader.as_mut() {
        Some(loader) => {
            let (buffer, report) = loader.load(&source, &plan).map_err(|e| e.to_string())?;
            let arena = if verify {
                Some(read_back(&buffer, &plan)?)
            } else {
                None
            };
            (report, arena)
        }
        None => {
            let mut arena = vec![0u8; plan.arena_bytes as usize];
            let report =
                load::load_host(&source, &plan, &mut arena, options).map_err(|e| e.to_string())?;
            (report, Some(arena))
        }
    };
    print_report(&report, json)?;
    if verify {
        let arena = arena.unwrap_or_default();
        let checked = verify_arena(&source, &plan, &arena)?;
        if !json {
            println!(
                "verified: {checked} tensors bit-exact against {}",
                source.path.display()
            );
        }
    }
    Ok(())
}

fn print_report(report: &LoadReport, json: bool) -> Result<(), Failure> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).map_err(|e| e.to_string())?
        );
    } else {
        println!("{report}");
    }
    Ok(())
}

/// The arena copied back from the device.
fn read_back(buffer: &tierfs_gpu::cuda::DeviceBuffer, plan: &LoadPlan) -> Result<Vec<u8>, Failure> {
    let len = usize::try_from(plan.arena_bytes).map_err(|e| e.to_string())?;
    buffer.read(0, len).map_err(|e| e.to_string())
}

/// Compares every tensor in `arena` with a plain read of the file; returns how many matched.
fn verify_arena(source: &Source, plan: &LoadPlan, arena: &[u8]) -> Result<usize, Failure> {
    use std::os::unix::fs::FileExt;
    let mut want = Vec::new();
    for t in &plan.tensors {
        want.resize(t.len as usize, 0);
        source
            .reader
            .file()
            .read_exact_at(&mut want, t.file_start)
            .map_err(|e| {
                format!(
                    "cannot read {} for verification: {e}",
                    source.path.display()
                )
            })?;
        let got = arena.get(t.offset as usize..(t.offset + t.len) as usize);
        if got != Some(&want[..]) {
            return Err(format!(
                "tensor '{}' differs from the file after loading",
                t.name
            ));
        }
    }
    Ok(plan.tensors.len())
}

fn bench_cmd(file: &Path, device: usize, options: LoadOptions, json: bool) -> Result<(), Failure> {
    // Fail in one sentence before spawning anything if there is no GPU or no such file.
    let gpu = tierfs_gpu::cuda::Gpu::open(device).map_err(|e| e.to_string())?;
    let gpu_name = gpu.name().to_string();
    drop(gpu);
    let (source, plan) = open(file, &Selection::All, options.chunk_bytes)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
    let rows = bench::run_all(&exe, &source.path, device, options);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    let title = format!(
        "tierfs-gpu bench: {} ({}, {} tensors) → cuda:{device} ({gpu_name}); {} threads × {} reads",
        source.path.display(),
        format_size(plan.tensor_bytes),
        plan.tensors.len(),
        options.threads,
        format_size(options.chunk_bytes),
    );
    print!("{}", bench::table(&title, &rows));
    Ok(())
}

fn resolve_cmd(path: &Path, json: bool) -> Result<(), Failure> {
    let (source, _) = open(path, &Selection::All, DEFAULT_CHUNK_BYTES)?;
    let index = &source.index;
    if json {
        let doc = serde_json::json!({
            "requested": source.requested,
            "source": source.path,
            "via_mount": source.via_mount(),
            "tensors": index.tensors.len(),
            "blocks": index.blocks.len(),
            "file_size": index.file_size,
        });
        println!("{doc}");
    } else {
        println!(
            "{} → {} ({} tensors in {} blocks, {})",
            source.requested.display(),
            source.path.display(),
            index.tensors.len(),
            index.blocks.len(),
            format_size(index.file_size)
        );
    }
    Ok(())
}
