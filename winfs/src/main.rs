//! `tierfs` on Windows: SOURCE presented read-only at a drive letter or an empty folder through
//! WinFsp, every model file read through the tierfs core's byte-bounded cache.
//!
//! This crate is the Windows counterpart of `fs/` (the FUSE adapter) and, like it, only
//! translates: [`path`] names what a WinFsp file name points at, [`status`] turns every error
//! into an `NTSTATUS` in one place, [`tree`] turns paths and access masks into calls of the
//! core filesystem type the FUSE adapter uses too (`tierfs_core::fs::TierFs`), `winfsp_fs`
//! answers WinFsp's requests through it, and `mount` runs the WinFsp host. The first three are
//! plain Rust, tested on any platform; the last two exist only on Windows.
//!
//! What this front end was checked against is stated in docs/WINDOWS.md: it compiles
//! and passes clippy for `x86_64-pc-windows-gnu`; it has not been run against a real WinFsp.

#[cfg(windows)]
mod mount;
// Off Windows only the tests use the name and error mapping and the translation.
#[cfg_attr(not(windows), allow(dead_code))]
mod path;
#[cfg_attr(not(windows), allow(dead_code))]
mod status;
#[cfg_attr(not(windows), allow(dead_code))]
mod tree;
#[cfg(windows)]
mod winfsp_fs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tierfs_core::cli::{BudgetArgs, CompressArgs, CtlArgs, StateArgs};

#[derive(Parser, Debug)]
#[command(
    name = "tierfs",
    version,
    about = "Stream ML checkpoints through a byte-bounded, tensor-aware RAM cache (WinFsp)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Mount SOURCE read-only at MOUNTPOINT (a free drive letter such as M: or an empty folder
    /// that does not exist yet); stays in the foreground until Ctrl-C.
    Mount {
        source: PathBuf,
        mountpoint: String,
        #[command(flatten)]
        budget: BudgetArgs,
        /// Threads serving WinFsp requests.
        #[arg(long, default_value_t = 8)]
        threads: u32,
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        compress: CompressArgs,
    },
    /// Send a command to a mount's control file: ram-cache SIZE | drop | prefetch PATH | plan PATH...
    Ctl(CtlArgs),
    /// Print a mount's live statistics (the JSON of MOUNTPOINT\.tierfs\stats).
    Stats { mountpoint: PathBuf },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tierfs: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Mount {
            source,
            mountpoint,
            budget: BudgetArgs { ram_cache },
            threads,
            state,
            compress,
        } => mount_command(source, mountpoint, ram_cache, threads, state, compress),
        Command::Ctl(ctl) => {
            let file = ctl.mountpoint.join(path::CONTROL_DIR).join("control");
            std::fs::write(&file, ctl.command_line())
                .map_err(|e| format!("{}: {e}", file.display()))
        }
        Command::Stats { mountpoint } => {
            let file = mountpoint.join(path::CONTROL_DIR).join("stats");
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            print!("{text}");
            Ok(())
        }
    }
}

#[cfg(windows)]
fn mount_command(
    source: PathBuf,
    mountpoint: String,
    ram_cache: Option<u64>,
    threads: u32,
    state: StateArgs,
    compress: CompressArgs,
) -> Result<(), String> {
    let state_file = state.orders_file(mount::default_state_dir);
    mount::run(mount::MountRequest {
        source,
        mountpoint,
        budget: ram_cache.unwrap_or_else(mount::default_budget),
        threads,
        state_file,
        compress: compress.mode(),
    })
    .map_err(|e| e.to_string())
}

#[cfg(not(windows))]
fn mount_command(
    _: PathBuf,
    _: String,
    _: Option<u64>,
    _: u32,
    _: StateArgs,
    _: CompressArgs,
) -> Result<(), String> {
    Err("this is the Windows (WinFsp) front end; on Linux use the `tierfs` of fs/".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_mount_command_parses() {
        let cli = Cli::try_parse_from([
            "tierfs",
            "mount",
            "D:\\models",
            "M:",
            "--ram-cache",
            "16GiB",
        ])
        .unwrap();
        match cli.command {
            Command::Mount {
                source,
                mountpoint,
                budget: BudgetArgs { ram_cache },
                ..
            } => {
                assert_eq!(source, PathBuf::from("D:\\models"));
                assert_eq!(mountpoint, "M:");
                assert_eq!(ram_cache, Some(16 << 30));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            Cli::try_parse_from(["tierfs", "mount", "D:\\m", "M:", "--ram-cache", "lots"]).is_err()
        );
    }
}
