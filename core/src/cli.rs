//! The command-line pieces both front ends share: the Linux `tierfs` (`fs/`) and the Windows
//! `tierfs.exe` (`winfs/`) flatten these into their own `clap` definitions, so an option both
//! have is spelt, parsed and documented once.
//!
//! Behind the `cli` feature (it brings `clap`); nothing here touches the filesystem.

use std::path::PathBuf;

use clap::Args;

use crate::size::parse_size;

/// Parses a size argument (`512MiB`, `8GiB`, `8G`, bytes) for `clap`.
pub fn parse_size_arg(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
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
    /// The command as the control file takes it: the words joined by single spaces.
    pub fn command_line(&self) -> String {
        self.command.join(" ")
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
