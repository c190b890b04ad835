//! The command-line pieces both front ends share: the Linux `tierfs` (`fs/`) and the Windows
//! `tierfs.exe` (`winfs/`) flatten these into their own `clap` definitions, so an option both
//! have is spelt, parsed and documented once.
//!
//! Behind the `cli` feature (it brings `clap`); nothing here touches the filesystem.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::cache::CompressMode;
use crate::disk_tier::DiskTierConfig;
use crate::prefetch::PacingMode;
use crate::size::parse_size;
use crate::source::deadline::SourceIoConfig;

/// Parses a size argument (`512MiB`, `8GiB`, `8G`, bytes) for `clap`.
pub fn parse_size_arg(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
}

/// Parses a duration argument for `clap`: `30s`, `500ms`, `2m`, or seconds (`30`, `0.5`).
pub fn parse_duration_arg(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("not a duration: {text:?} (30s, 500ms, 2m)"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "s" | "sec" => value,
        "m" | "min" => value * 60.0,
        _ => return Err(format!("unknown unit in {text:?}: use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// `--source-timeout DURATION`: how long a read of SOURCE may take; `--source-pacing`: how
/// reads ahead go to it.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct SourceArgs {
    /// Longest a read of SOURCE may take, its retries included, before the reader gets EIO
    /// (a network filesystem whose server stopped answering): 30s, 500ms, 2m; 0 waits
    /// forever (see docs/RELIABILITY.md).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration_arg)]
    pub source_timeout: Duration,
    /// How reads ahead go to SOURCE: `ordered` (few large requests in file order, and no
    /// passthrough: for hard disks and network or FUSE file systems), `parallel` (many at once:
    /// local flash), or `auto`, which decides from the file system's type and the speed
    /// measured (see docs/PERFORMANCE.md, "Slow and network sources").
    #[arg(long, value_enum, default_value = "auto")]
    pub source_pacing: SourcePacingArg,
}

/// The values of `--source-pacing`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePacingArg {
    Auto,
    Parallel,
    Ordered,
}

impl SourceArgs {
    /// Who decides the pacing of reads ahead.
    pub fn pacing(&self) -> PacingMode {
        match self.source_pacing {
            SourcePacingArg::Auto => PacingMode::Auto,
            SourcePacingArg::Parallel => PacingMode::Parallel,
            SourcePacingArg::Ordered => PacingMode::Ordered,
        }
    }

    /// The source reads' tuning with this timeout (0: none).
    pub fn config(&self) -> SourceIoConfig {
        SourceIoConfig {
            timeout: (!self.source_timeout.is_zero()).then_some(self.source_timeout),
            ..SourceIoConfig::default()
        }
    }
}

/// `--compress auto|on|off`: the compressed RAM tier.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct CompressArgs {
    /// Keep resident chunks of bf16/fp16/fp32 weights compressed (lossless) so the RAM cache
    /// holds more: `auto` (under budget pressure, when decoding is faster than the source:
    /// never on a fast local disk), `on` (always) or `off` (see docs/CONFIGURATION.md).
    #[arg(long, value_enum, default_value = "auto")]
    pub compress: CompressArg,
}

/// The values of `--compress`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressArg {
    Auto,
    On,
    Off,
}

impl CompressArgs {
    /// The compressed tier's mode.
    pub fn mode(&self) -> CompressMode {
        match self.compress {
            CompressArg::Auto => CompressMode::Auto,
            CompressArg::On => CompressMode::On,
            CompressArg::Off => CompressMode::Off,
        }
    }
}

/// `--disk-cache DIR --disk-cache-size SIZE`: the local disk tier below the RAM cache.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct DiskCacheArgs {
    /// Keep the chunks read from SOURCE in DIR too, on a local disk, so that a restart or a
    /// model that does not fit the RAM budget reads them from there instead of a slow or
    /// network source (see docs/CONFIGURATION.md). DIR is this mount's alone.
    #[arg(long, value_name = "DIR", requires = "disk_cache_size")]
    pub disk_cache: Option<PathBuf>,
    /// Bytes of chunks DIR may hold: 100GiB, 500G or bytes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, requires = "disk_cache")]
    pub disk_cache_size: Option<u64>,
}

impl DiskCacheArgs {
    /// The disk tier asked for, if any.
    pub fn config(&self) -> Option<DiskTierConfig> {
        let dir = self.disk_cache.clone()?;
        Some(DiskTierConfig::new(dir, self.disk_cache_size?))
    }
}

/// `--ram-cache SIZE`: the mount's cache budget.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct BudgetArgs {
    /// RAM cache budget: 512MiB, 8GiB, 8G or bytes [default: a quarter of RAM].
    #[arg(long, value_parser = parse_size_arg)]
    pub ram_cache: Option<u64>,
}

#[cfg(windows)]
const STATE_DIR_HELP: &str =
    "Where learned block orders are kept across remounts [default: %LOCALAPPDATA%\\tierfs]";
#[cfg(not(windows))]
const STATE_DIR_HELP: &str = "Where learned block orders are kept across remounts \
     [default: /var/lib/tierfs for root, else $XDG_STATE_HOME/tierfs or ~/.local/state/tierfs]";

/// `--state-dir DIR` / `--no-state`: where learned block orders are kept.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct StateArgs {
    #[arg(long, help = STATE_DIR_HELP)]
    pub state_dir: Option<PathBuf>,
    /// Do not keep learned block orders across remounts.
    #[arg(long, conflicts_with = "state_dir")]
    pub no_state: bool,
}

impl StateArgs {
    /// The file learned orders are kept in (`DIR/orders.json`), `None` with `--no-state`;
    /// `default_dir` is the front end's default directory.
    pub fn orders_file(self, default_dir: impl FnOnce() -> PathBuf) -> Option<PathBuf> {
        (!self.no_state).then(|| {
            self.state_dir
                .unwrap_or_else(default_dir)
                .join("orders.json")
        })
    }
}

/// `tierfs ctl MOUNTPOINT COMMAND…`: one command for the mount's control file.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct CtlArgs {
    pub mountpoint: PathBuf,
    #[arg(required = true, num_args = 1.., trailing_var_arg = true)]
    pub command: Vec<String>,
}

impl CtlArgs {
    /// The command as the control file takes it: the words joined by single spaces; a `plan`'s
    /// paths one per line (`tierfs ctl MNT plan A B` is `plan\nA\nB`), so that they may hold
    /// spaces.
    pub fn command_line(&self) -> String {
        match self.command.split_first() {
            Some((word, paths)) if word == "plan" => std::iter::once(word.as_str())
                .chain(paths.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => self.command.join(" "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        budget: BudgetArgs,
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        compress: CompressArgs,
    }

    #[test]
    fn compress_is_auto_unless_told() {
        let mode = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.compress.mode());
        assert_eq!(mode(&["t"]).ok(), Some(CompressMode::Auto));
        assert_eq!(
            mode(&["t", "--compress", "on"]).ok(),
            Some(CompressMode::On)
        );
        assert_eq!(
            mode(&["t", "--compress", "off"]).ok(),
            Some(CompressMode::Off)
        );
        assert!(mode(&["t", "--compress", "maybe"]).is_err());
    }

    #[test]
    fn a_plans_paths_go_one_per_line() {
        let ctl = |words: &[&str]| CtlArgs {
            mountpoint: "/m".into(),
            command: words.iter().map(|w| w.to_string()).collect(),
        };
        assert_eq!(
            ctl(&["prefetch", "a b.sft"]).command_line(),
            "prefetch a b.sft"
        );
        assert_eq!(
            ctl(&["plan", "a b.sft", "c.sft"]).command_line(),
            "plan\na b.sft\nc.sft"
        );
        assert_eq!(ctl(&["plan"]).command_line(), "plan");
    }

    #[test]
    fn sizes_state_and_their_conflict_parse() {
        let cli = Cli::try_parse_from(["t", "--ram-cache", "8G", "--state-dir", "/s"]).unwrap();
        assert_eq!(cli.budget.ram_cache, Some(8 << 30));
        assert_eq!(
            cli.state.orders_file(|| PathBuf::from("/d")),
            Some(PathBuf::from("/s/orders.json"))
        );
        let cli = Cli::try_parse_from(["t"]).unwrap();
        assert_eq!(cli.budget.ram_cache, None);
        assert_eq!(
            cli.state.orders_file(|| PathBuf::from("/d")),
            Some(PathBuf::from("/d/orders.json"))
        );
        let cli = Cli::try_parse_from(["t", "--no-state"]).unwrap();
        assert_eq!(cli.state.orders_file(|| PathBuf::from("/d")), None);
        assert!(Cli::try_parse_from(["t", "--no-state", "--state-dir", "/s"]).is_err());
        assert!(Cli::try_parse_from(["t", "--ram-cache", "lots"]).is_err());
    }

    #[test]
    fn source_timeouts_parse_and_zero_means_none() {
        #[derive(Parser, Debug)]
        struct Src {
            #[command(flatten)]
            source: SourceArgs,
        }
        let timeout = |args: &[&str]| {
            let mut all = vec!["t"];
            all.extend_from_slice(args);
            Src::try_parse_from(all).map(|cli| cli.source.config().timeout)
        };
        assert_eq!(timeout(&[]).unwrap(), Some(Duration::from_secs(30)));
        assert_eq!(
            timeout(&["--source-timeout", "500ms"]).unwrap(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            timeout(&["--source-timeout", "2m"]).unwrap(),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            timeout(&["--source-timeout", "1.5"]).unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(timeout(&["--source-timeout", "0"]).unwrap(), None);
        assert!(timeout(&["--source-timeout", "soon"]).is_err());
        assert!(timeout(&["--source-timeout", "5h"]).is_err());
        assert!(timeout(&["--source-timeout", "-1s"]).is_err());
    }

    #[test]
    fn ctl_joins_its_words() {
        #[derive(Parser, Debug)]
        struct Ctl {
            #[command(flatten)]
            ctl: CtlArgs,
        }
        let cli = Ctl::try_parse_from(["t", "/mnt", "ram-cache", "8GiB"]).unwrap();
        assert_eq!(cli.ctl.mountpoint, PathBuf::from("/mnt"));
        assert_eq!(cli.ctl.command_line(), "ram-cache 8GiB");
        assert!(Ctl::try_parse_from(["t", "/mnt"]).is_err());
    }
}
