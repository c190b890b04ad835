//! The JSON document served at `MOUNTPOINT/.tierfs/stats` (schema in docs/STATS.md): the
//! front-end-neutral document of [`tierfs_core::stats_doc`] plus what only the Linux daemon
//! knows (which root-only modes are in force, and the budget governor).

use std::path::Path;
use std::time::SystemTime;

use serde::Serialize;
use tierfs_core::budget::BudgetSnapshot;
use tierfs_core::kernel_cache::KernelCacheWindow;
use tierfs_core::models::ModelStore;

use crate::privilege::ModesSnapshot;

/// The Linux daemon's stats document: [`tierfs_core::stats_doc::CommonStats`] flattened, plus
/// the daemon-only sections (`modes`, `budget`, `fs`).
#[derive(Debug, Serialize)]
pub struct DaemonStats {
    #[serde(flatten)]
    pub common: tierfs_core::stats_doc::CommonStats,
    /// Modes that need root, and whether they are in force (see `privilege`).
    pub modes: ModesSnapshot,
    /// The budget governor's figures (`None` only where no governor runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSnapshot>,
    /// How the kernel's requests reach the daemon (`--io-uring`).
    pub transport: crate::fuse_uring::TransportStats,
    /// The filesystem's tables (`None` only where no filesystem renders the document).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsTables>,
}

/// How many inodes and handles the filesystem holds ([`tierfs_core::fs`]): inodes go when the
/// kernel forgets them, handles at release.
#[derive(Debug, Serialize)]
pub struct FsTables {
    pub inodes: usize,
    pub handles: usize,
}

impl DaemonStats {
    pub fn collect(
        store: &ModelStore,
        window: &KernelCacheWindow,
        source: &Path,
        mountpoint: &Path,
        passthrough: bool,
        started: SystemTime,
    ) -> DaemonStats {
        DaemonStats {
            common: tierfs_core::stats_doc::CommonStats::collect(
                store,
                window,
                (source, mountpoint),
                passthrough,
                started,
            ),
            modes: crate::privilege::snapshot(passthrough),
            budget: None,
            transport: crate::fuse_uring::TransportStats::now(),
            fs: None,
        }
    }

    /// Adds the `fs` section.
    pub fn with_tables(mut self, inodes: usize, handles: usize) -> DaemonStats {
        self.fs = Some(FsTables { inodes, handles });
        self
    }

    /// Adds the remote source's client figures (`source.remote`).
    pub fn with_remote_source(
        mut self,
        remote: Option<tierfs_core::stats::RemoteSourceSnapshot>,
    ) -> DaemonStats {
        self.common = self.common.with_remote_source(remote);
        self
    }

    /// Adds the `budget` section.
    pub fn with_budget(mut self, budget: BudgetSnapshot) -> DaemonStats {
        self.budget = Some(budget);
        self
    }
}
