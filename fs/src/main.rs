//! `tierfs`: a read-only FUSE mount that streams `.safetensors` checkpoints through a
//! byte-bounded, tensor-aware RAM cache. See README.md and docs/ for the user's view; this file only
//! parses the command line and dispatches.

/// A line for the user on standard error, like `eprintln!` except that it never panics: a
/// mount whose standard error is a full disk, or a pipe whose reader went away (the daemon
/// ignores SIGPIPE), keeps serving and only loses the line, where `eprintln!` would panic on
/// the failed write and end the mount.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod comfyui;
mod daemon;
mod demo;
mod fuse;
mod fuse_uring;
mod inspect;
mod inspect_shards;
mod metrics;
mod mount;
mod object_args;
mod object_check;
mod privilege;
mod stats_cmd;
mod stats_doc;
mod stats_read;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use tierfs_core::cli::{
    parse_size_arg, BudgetArgs, CompressArgs, CtlArgs, DiskCacheArgs, SourceArgs, StateArgs,
};
use tierfs_core::size::format_size;

#[derive(Parser)]
#[command(
    name = "tierfs",
    version,
    about = "Stream ML checkpoints through a byte-bounded, tensor-aware RAM cache"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// The command line is parsed once: a large `Mount` variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Mount SOURCE read-only at MOUNTPOINT; stays in the foreground until unmounted.
    Mount {
        /// A local folder, or the objects under a prefix of an S3 bucket: s3://BUCKET/PREFIX.
        source: PathBuf,
        mountpoint: PathBuf,
        #[command(flatten)]
        budget: BudgetArgs,
        /// Floor the cache never shrinks below under memory pressure
        /// [default: an eighth of --ram-cache, at least 256MiB].
        #[arg(long, value_parser = parse_size_arg)]
        ram_cache_min: Option<u64>,
        /// Detach once the mount is ready (logs go to --log-file).
        #[arg(long)]
        daemon: bool,
        /// With --daemon: where the daemon writes its log [default: discarded].
        #[arg(long)]
        log_file: Option<PathBuf>,
        /// Threads serving kernel requests.
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// How the kernel's requests reach the daemon: `off`, through /dev/fuse; `on`, through
        /// io_uring (Linux 6.14 or later with the fuse module's enable_uring set), or no mount;
        /// `auto`, io_uring where the kernel allows it (see docs/CONFIGURATION.md).
        #[arg(long, value_enum, env = "TIERFS_IO_URING", default_value_t = fuse_uring::TransportMode::Off)]
        io_uring: fuse_uring::TransportMode,
        /// Kernel readahead of the mount: the size of the requests an `mmap` reader of a
        /// cache-mode model file (and a reader of a non-passthrough file) sends. Small, so that
        /// a loader's touch of each tensor does not read megabytes around it (see
        /// docs/PERFORMANCE.md, "Kernel readahead of the mount"). Raising it needs root.
        #[arg(long, default_value = "128KiB", value_parser = parse_size_arg)]
        readahead: u64,
        /// Serve non-model files through the daemon instead of FUSE passthrough.
        #[arg(long)]
        no_passthrough: bool,
        /// Serve every model file from the chunk cache, even one that fits the budget (which is
        /// otherwise handed to the kernel with FUSE passthrough when running as root).
        #[arg(long)]
        no_model_passthrough: bool,
        /// Let other users use the mount: each one reads only what they could read in SOURCE
        /// themselves (see docs/SECURITY.md).
        #[arg(long)]
        allow_other: bool,
        /// Cap on the memory of model headers and indexes (least recently opened files are
        /// forgotten past it).
        #[arg(long, default_value = "256MiB", value_parser = parse_size_arg)]
        index_cache: u64,
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        source_io: SourceArgs,
        #[command(flatten)]
        compress: CompressArgs,
        #[command(flatten)]
        disk_cache: DiskCacheArgs,
        #[command(flatten)]
        object: object_args::ObjectArgs,
        /// Serve the metrics (as in MOUNTPOINT/.tierfs/metrics) at http://ADDR/metrics for a
        /// Prometheus scraper: PORT (on 127.0.0.1) or HOST:PORT.
        #[arg(long, value_name = "ADDR", value_parser = metrics::server::parse_addr)]
        metrics_addr: Option<std::net::SocketAddr>,
    },
    /// Send a command to a mount's control file: ram-cache SIZE | drop | prefetch PATH |
    /// plan PATH... (the model files a client will load, in order).
    Ctl(CtlArgs),
    /// Unmount a tierfs mount (also cleans up a dead one).
    Unmount {
        mountpoint: PathBuf,
        /// Detach now even if files are open there.
        #[arg(long)]
        lazy: bool,
    },
    /// Show a mount's live cache statistics.
    Stats {
        mountpoint: PathBuf,
        /// Refresh every --interval seconds.
        #[arg(long)]
        watch: bool,
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Print the raw JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Live terminal view of a mount: every model's blocks, throughput, latency; keys act on
    /// the mount (q quits, d drops the cache, +/- resize the budget). Without a terminal, the
    /// text view of `tierfs stats`.
    Top {
        mountpoint: PathBuf,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// Show the tensor index of a .safetensors file and its grouping into blocks.
    Inspect {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Check an object-store source (s3://BUCKET/PREFIX): connect, list, measure the latency,
    /// read one object whole; exit 1 if it differs from --compare FILE, 2 if the store fails.
    ObjectCheck(object_check::ObjectCheckArgs),
    /// Print an extra_model_paths.yaml section pointing ComfyUI's model folders at MOUNTPOINT.
    ComfyuiConfig {
        mountpoint: PathBuf,
        /// Name of the section (ComfyUI only uses it as a label).
        #[arg(long, default_value = "tierfs")]
        name: String,
    },
    /// Write a synthetic checkpoint, mount it with a small budget, stream it, show the stats.
    Demo {
        /// Size of the synthetic checkpoint.
        #[arg(long, default_value = "768MiB", value_parser = parse_size_arg)]
        size: u64,
        /// Cache budget for the demo mount.
        #[arg(long, default_value = "256MiB", value_parser = parse_size_arg)]
        ram_cache: u64,
    },
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Mount { .. } | Command::Demo { .. }) {
        // Commands that print (`inspect FILE | head`) end quietly when the reader goes away,
        // like other Unix tools, instead of failing on EPIPE. The daemon keeps ignoring SIGPIPE.
        // SAFETY: restoring a default signal disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say!("tierfs: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Mount {
            source,
            mountpoint,
            budget: BudgetArgs { ram_cache },
            ram_cache_min,
            daemon,
            log_file,
            threads,
            io_uring,
            readahead,
            no_passthrough,
            no_model_passthrough,
            allow_other,
            index_cache,
            state,
            source_io,
            compress,
            disk_cache,
            object,
            metrics_addr,
        } => {
            let budget = ram_cache.unwrap_or_else(|| {
                let budget = mount::default_budget();
                say!(
                    "tierfs: RAM cache budget {} (a quarter of RAM; set it with --ram-cache)",
                    format_size(budget)
                );
                budget
            });
            let budget = mount::clamp_budget(budget);
            let request = mount::MountRequest {
                source,
                mountpoint,
                budget,
                floor: ram_cache_min,
                threads,
                transport: io_uring,
                readahead,
                passthrough: !no_passthrough,
                model_passthrough: !no_model_passthrough,
                allow_other,
                index_cap: index_cache,
                state_file: state.orders_file(mount::default_state_dir),
                metrics_addr,
                source_io: source_io.config(),
                source_pacing: source_io.pacing(),
                compress: compress.mode(),
                disk_tier: disk_cache.config(),
                object: object.config(),
            };
            if daemon {
                return daemon::run(&request, log_file.as_deref());
            }
            mount::run_foreground(&request)
        }
        Command::Unmount { mountpoint, lazy } => mount::unmount(&mountpoint, lazy),
        Command::Ctl(ctl) => mount::send_control(&ctl.mountpoint, &ctl.command_line()),
        Command::Stats {
            mountpoint,
            watch,
            interval,
            json,
        } => stats_cmd::run(
            &mountpoint,
            stats_cmd::StatsOptions {
                watch,
                interval,
                json,
            },
        ),
        Command::Top {
            mountpoint,
            interval,
        } => top::run(&mountpoint, interval),
        Command::Inspect { file, json } => inspect::run(&file, json),
        Command::Demo { size, ram_cache } => demo::run(size, ram_cache),
        Command::ComfyuiConfig { mountpoint, name } => comfyui::run(&mountpoint, &name),
        Command::ObjectCheck(args) => object_check::run(&args),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIERFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,fuser=error"));
    // An event that cannot be written is lost, not reported: the report goes through
    // `eprintln!`, whose panic on the same unwritable stderr would end the mount (see `say!`).
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .init();
}
