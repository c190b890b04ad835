//! The read side of `.tierfs/stats` (schema in docs/STATS.md), for the commands that show it
//! (`tierfs stats`, `tierfs top`): the figures they print, typed.
//!
//! **Contract.** Every field is optional on the wire: a section or key that a daemon of another
//! version leaves out reads as its default (zero, empty, `None`), as unknown keys are ignored,
//! so one command can show mounts of several versions. Fields whose absence the views tell
//! apart from zero (an unknown path, "no memory pressure", a strip with no reader) are
//! `Option`s.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The operations of `ops`, in the order the views list them.
pub const OPS: [&str; 5] = ["lookup", "getattr", "open", "read", "readdir"];

/// The whole document, as far as the views read it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StatsRead {
    pub mount: MountRead,
    pub cache: CacheRead,
    pub disk: DiskRead,
    pub source: SourceRead,
    pub prefetch: PrefetchRead,
    pub kernel_page_cache: KernelCacheRead,
    pub passthrough: PassthroughRead,
    pub modes: ModesRead,
    /// `None` where the daemon runs no budget governor (or predates the section).
    pub budget: Option<BudgetRead>,
    /// Per operation name (`lookup`, `getattr`, …).
    pub ops: BTreeMap<String, OpRead>,
    pub files: Vec<FileRead>,
    pub models: Vec<ModelRead>,
    /// `None` without `--disk-cache`.
    pub disk_tier: Option<DiskTierRead>,
}

/// The `disk_tier` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct DiskTierRead {
    pub dir: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub hit_bytes: u64,
    pub written_bytes: u64,
    pub evicted_bytes: u64,
    pub damaged: u64,
    pub write_errors: u64,
    pub whole_copies: u64,
}

impl DiskTierRead {
    /// One line of figures, as `tierfs stats` and `tierfs top` show them.
    pub fn summary(&self) -> String {
        format!(
            "{} of {} in {}; read back {}, written {}, evicted {}; {} whole copies passed through; {} damaged, {} write errors",
            tierfs_core::size::format_size(self.used_bytes),
            tierfs_core::size::format_size(self.capacity_bytes),
            self.dir,
            tierfs_core::size::format_size(self.hit_bytes),
            tierfs_core::size::format_size(self.written_bytes),
            tierfs_core::size::format_size(self.evicted_bytes),
            self.whole_copies,
            self.damaged,
            self.write_errors,
        )
    }
}

impl StatsRead {
    /// The figures of operation `op` (zero if the document has none).
    pub fn op(&self, op: &str) -> OpRead {
        self.ops.get(op).cloned().unwrap_or_default()
    }

    /// The `budget` section, or zeros where there is none.
    pub fn budget_or_default(&self) -> BudgetRead {
        self.budget.clone().unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MountRead {
    pub source: Option<String>,
    pub mountpoint: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct CacheRead {
    pub budget_bytes: u64,
    pub chunk_budget_bytes: u64,
    pub used_bytes: u64,
    pub chunks: u64,
    pub hits: u64,
    pub misses: u64,
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    pub evicted_bytes: u64,
    pub uncached_bytes: u64,
    pub stall_seconds: f64,
    pub compress: CompressRead,
}

/// `cache.compress` (and the `compressed` figures of a file or model row).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct CompressRead {
    pub mode: Option<String>,
    pub raw_bytes: u64,
    pub frame_bytes: u64,
    pub ratio: Option<f64>,
    pub window_bytes: u64,
    pub decode_errors: u64,
}

impl CompressRead {
    /// `compressed RAW in FRAME (RATIO)`, or `None` when nothing is held compressed.
    pub fn held(&self) -> Option<String> {
        (self.raw_bytes > 0).then(|| {
            format!(
                "compressed {} in {} ({:.2})",
                tierfs_core::size::format_size(self.raw_bytes),
                tierfs_core::size::format_size(self.frame_bytes),
                self.ratio.unwrap_or(1.0)
            )
        })
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct DiskRead {
    pub read_bytes: u64,
    pub reads: u64,
    pub errors: u64,
}

/// `source`: the measured speed of each source device.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SourceRead {
    pub devices: Vec<SourceDeviceRead>,
    /// The client of a remote source (`s3://`); `None` for a folder.
    pub remote: Option<RemoteRead>,
}

/// `source.remote`: what the client of a remote source sent and how the store answered.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RemoteRead {
    pub kind: String,
    pub endpoint: String,
    pub requests: u64,
    pub listings: u64,
    pub retries: u64,
    pub throttled: u64,
    pub errors: u64,
    pub bytes: u64,
    pub mean_first_byte_secs: f64,
    pub part_bytes: u64,
}

impl RemoteRead {
    /// One line of figures, as `tierfs stats` and `tierfs top` show them.
    pub fn summary(&self) -> String {
        format!(
            "{} at {}: {} requests, {} listings, received {}; first byte {:.1} ms, parts of {}; {} retries, {} throttled, {} errors",
            self.kind,
            self.endpoint,
            self.requests,
            self.listings,
            tierfs_core::size::format_size(self.bytes),
            self.mean_first_byte_secs * 1e3,
            tierfs_core::size::format_size(self.part_bytes),
            self.retries,
            self.throttled,
            self.errors,
        )
    }
}

/// One entry of `source.devices`; figures not measured yet are `None`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SourceDeviceRead {
    pub device: Option<String>,
    /// What the file system says the device is (`flash`, `spinning disk`, `nfs`, `fuse`, …).
    pub storage: Option<String>,
    pub reads: u64,
    pub bytes: u64,
    pub busy_seconds: f64,
    pub latency_mean_us: Option<f64>,
    pub latency_smoothed_us: Option<f64>,
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: Option<f64>,
    pub throughput_bytes_per_second: Option<f64>,
    pub in_flight: u64,
    pub in_flight_peak: u64,
    pub bandwidth_delay_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PrefetchRead {
    pub issued_bytes: u64,
    pub used_bytes: u64,
    pub wasted_bytes: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct KernelCacheRead {
    pub window_bytes: u64,
    pub invalidated_bytes: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PassthroughRead {
    pub available: bool,
    pub open_files: u64,
    pub open_bytes: u64,
    pub parked_files: u64,
    pub parked_bytes: u64,
    pub admitted: u64,
    pub refused: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ModesRead {
    pub root: Option<bool>,
    pub passthrough_note: Option<String>,
    pub readahead_bytes: u64,
    pub readahead_note: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct BudgetRead {
    pub configured_bytes: Option<u64>,
    pub effective_bytes: u64,
    pub floor_bytes: u64,
    pub other_tiers_bytes: u64,
    pub pressure_limit_bytes: Option<u64>,
    pub pressure_events: u64,
    pub given_back_bytes: u64,
    pub regrow_steps: u64,
    pub oom_score_adj: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct OpRead {
    pub count: u64,
    pub errors: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// What a file row and a model row both carry: their size, what is cached, and the residency
/// strip.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StripRead {
    pub size: u64,
    pub cached_bytes: u64,
    pub compressed: CompressRead,
    pub stall_seconds: f64,
    pub residency: Option<String>,
    pub residency_current: Option<u64>,
    pub residency_prefetch_front: Option<u64>,
}

/// One entry of `files`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct FileRead {
    pub path: Option<String>,
    pub mode: Option<String>,
    pub tensors: u64,
    pub blocks: u64,
    pub malformed_reason: Option<String>,
    pub model: Option<String>,
    pub standalone_reason: Option<String>,
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    pub disk_read_bytes: u64,
    pub start_stall_seconds: f64,
    #[serde(flatten)]
    pub strip: StripRead,
}

/// One entry of `models` (a sharded model).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ModelRead {
    pub name: Option<String>,
    pub blocks: u64,
    pub found_by: Option<String>,
    pub order_learned: Option<bool>,
    pub prefetch: PrefetchRead,
    /// `None` only where the document has no `shards` key.
    pub shards: Option<Vec<ShardRead>>,
    #[serde(flatten)]
    pub strip: StripRead,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ShardRead {
    pub path: Option<String>,
    pub size: u64,
    pub cached_bytes: u64,
    pub indexed: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_sections_and_keys_read_as_defaults() {
        let doc: StatsRead = serde_json::from_str(
            r##"{"cache": {"hits": 3, "newer_key": 1}, "files": [{"path": "a", "residency": "#."}],
               "models": [{"name": "m", "size": 9}]}"##,
        )
        .expect("parses");
        assert_eq!(doc.cache.hits, 3);
        assert_eq!(doc.cache.misses, 0);
        assert!(doc.budget.is_none());
        assert_eq!(doc.op("read").count, 0);
        assert_eq!(doc.files[0].path.as_deref(), Some("a"));
        assert_eq!(doc.files[0].strip.residency.as_deref(), Some("#."));
        assert_eq!(doc.files[0].strip.residency_current, None);
        assert_eq!(doc.models[0].strip.size, 9);
        assert!(doc.models[0].shards.is_none());
        assert!(doc.source.devices.is_empty());
        let doc: StatsRead = serde_json::from_str(
            r#"{"source": {"devices": [{"device": "8:1", "reads": 4, "latency_p50_us": null}]}}"#,
        )
        .expect("parses");
        let device = &doc.source.devices[0];
        assert_eq!((device.device.as_deref(), device.reads), (Some("8:1"), 4));
        assert_eq!(
            (device.latency_p50_us, device.bandwidth_delay_bytes),
            (None, None)
        );
    }
}
