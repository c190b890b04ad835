//! The JSON document served at `MOUNTPOINT/.tierfs/stats` (schema in docs/STATS.md), by
//! both front ends (FUSE, WinFsp). A front end adds its own sections next to these (the FUSE
//! front end: `modes` and `budget`) by flattening this document into its own.

use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::kernel_cache::KernelCacheWindow;
use crate::models::shards::ModelSnapshot;
use crate::models::ModelStore;
use crate::passthrough::PassthroughSnapshot;
use crate::source::meter::SourceDeviceSnapshot;
use crate::stats::ops::OpsSnapshot;
use crate::stats::{
    CacheSnapshot, Counters, DiskSnapshot, FileSnapshot, KernelCacheSnapshot, PrefetchSnapshot,
    RemoteSourceSnapshot,
};

/// `doc` as pretty-printed JSON; if it cannot be rendered, a one-key JSON object saying why
/// (the text every front end serves in its place).
pub fn render_json<T: Serialize>(doc: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(doc)
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot render stats: {e}\"}}").into_bytes())
}

/// Version of the document's schema; bumped when a key changes meaning or disappears.
pub const SCHEMA_VERSION: u32 = 2;

/// The sections of the stats document that every front end serves; a front end flattens this
/// into its own document (the FUSE daemon's `DaemonStats`) or serves it as it is (WinFsp).
#[derive(Debug, Serialize)]
pub struct CommonStats {
    /// [`SCHEMA_VERSION`] under its old name, kept for scripts that read it.
    pub version: u32,
    pub schema_version: u32,
    pub mount: MountInfo,
    pub cache: CacheSnapshot,
    pub disk: DiskSnapshot,
    /// The source's measured speed, per device ([`crate::source::meter`]).
    pub source: SourceSection,
    pub prefetch: PrefetchSnapshot,
    pub kernel_page_cache: KernelCacheSnapshot,
    /// Per-operation counts, errors and latency of the front end's requests.
    pub ops: OpsSnapshot,
    pub passthrough: PassthroughSection,
    pub files: Vec<FileSnapshot>,
    /// Sharded models: their shards as one model (`crate::models::shards`).
    pub models: Vec<ModelSnapshot>,
    /// The files a client said it will load next (`plan` on the control file).
    pub plan: PlanSection,
    /// The local disk tier (`--disk-cache`; `null` without one, [`crate::disk_tier`]).
    pub disk_tier: Option<crate::disk_tier::DiskTierStats>,
}

/// `plan` section: the plan's files, as the mount shows them, in order, and the index of the
/// one the reader is at or that is warmed for it (files before it are done).
#[derive(Debug, Serialize)]
pub struct PlanSection {
    pub files: Vec<String>,
    pub current: usize,
}

/// `passthrough` section: model files that fit the budget, served by the kernel from their
/// source ([`crate::passthrough`]). `available` is false when the daemon is not root or the
/// kernel lacks FUSE passthrough (and always on Windows): every model file is then served from
/// the cache.
#[derive(Debug, Serialize)]
pub struct PassthroughSection {
    pub available: bool,
    #[serde(flatten)]
    pub tier: PassthroughSnapshot,
}

/// `source` section: the measured latency, throughput and reads in flight of each source
/// device the mount read from ([`crate::source::meter`]), by device number.
#[derive(Debug, Serialize)]
pub struct SourceSection {
    pub devices: Vec<SourceDeviceSnapshot>,
    /// The client of a remote source (`s3://`): its requests and how the store answered;
    /// `null` for a folder.
    pub remote: Option<RemoteSourceSnapshot>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MountInfo {
    pub source: String,
    pub mountpoint: String,
    pub pid: u32,
    pub uptime_seconds: f64,
    pub passthrough: bool,
    /// The mount's budget: the chunk cache (`cache.chunk_budget_bytes`) gets what passthrough
    /// files do not hold (`passthrough.open_bytes + passthrough.parked_bytes`).
    #[serde(default)]
    pub budget_bytes: u64,
}

impl CommonStats {
    pub fn collect(
        store: &ModelStore,
        window: &KernelCacheWindow,
        (source, mountpoint): (&Path, &Path),
        passthrough: bool,
        started: SystemTime,
    ) -> CommonStats {
        let c = store.counters();
        CommonStats {
            version: SCHEMA_VERSION,
            schema_version: SCHEMA_VERSION,
            mount: MountInfo {
                source: source.display().to_string(),
                mountpoint: mountpoint.display().to_string(),
                pid: std::process::id(),
                uptime_seconds: started.elapsed().map_or(0.0, |d| d.as_secs_f64()),
                passthrough,
                budget_bytes: store.budget(),
            },
            cache: store.cache_snapshot(),
            disk: DiskSnapshot {
                read_bytes: Counters::get(&c.disk_read_bytes),
                reads: Counters::get(&c.disk_reads),
                errors: Counters::get(&c.disk_errors),
                probe_bytes: Counters::get(&c.probe_bytes),
                direct_bytes: Counters::get(&c.direct_bytes),
                probe_cached_bytes: Counters::get(&c.probe_cached_bytes),
                touch_ahead_bytes: Counters::get(&c.touch_ahead_bytes),
                touch_ahead_served_bytes: Counters::get(&c.touch_ahead_served_bytes),
                ..DiskSnapshot::default()
            }
            .with_source_faults(&store.source_io().snapshot()),
            source: SourceSection {
                devices: store.source_meters().snapshot(),
                remote: None,
            },
            prefetch: PrefetchSnapshot::from_counters(
                &c.prefetch_issued_bytes,
                &c.prefetch_used_bytes,
                &c.prefetch_wasted_bytes,
            ),
            kernel_page_cache: KernelCacheSnapshot {
                window_bytes: window.limit(),
                invalidated_bytes: Counters::get(&c.kernel_cache_invalidated_bytes),
            },
            ops: c.ops.snapshot(),
            passthrough: PassthroughSection {
                available: passthrough,
                tier: store.passthrough_snapshot(),
            },
            files: store.files_snapshot(),
            models: store.models_snapshot(),
            plan: {
                let (files, current) = store.plan_snapshot();
                PlanSection { files, current }
            },
            disk_tier: store.disk_tier().map(|tier| tier.stats()),
        }
    }

    /// Adds the remote source's client figures (`source.remote`).
    pub fn with_remote_source(mut self, remote: Option<RemoteSourceSnapshot>) -> CommonStats {
        self.source.remote = remote;
        self
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::prefetch::saved::SavedOrders;
    use crate::source::SourceIdentity;
    use crate::synth::{write_checkpoint, Layout, SynthDtype, SynthSpec};

    #[test]
    fn the_source_section_measures_every_read_of_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let spec = SynthSpec {
            layout: Layout::Dit,
            target_bytes: 12 << 20,
            dtype: SynthDtype::BF16,
            seed: 3,
        };
        write_checkpoint(&path, &spec).unwrap();
        let expected = std::fs::read(&path).unwrap();
        let store = Arc::new(ModelStore::new(64 << 20, SavedOrders::default()));
        let empty = CommonStats::collect(
            &store,
            &KernelCacheWindow::new(0),
            (dir.path(), Path::new("/mnt")),
            false,
            SystemTime::now(),
        );
        assert!(empty.source.devices.is_empty(), "nothing read yet");

        let file = store.open(Path::new("m.safetensors"), &path).unwrap();
        let mut got = Vec::new();
        loop {
            let bytes = store.read(&file, got.len() as u64, 1 << 20).unwrap();
            if bytes.is_empty() {
                break;
            }
            got.extend_from_slice(&bytes);
        }
        assert!(got == expected, "the bytes read are not the file's");
        store.wait_prefetch_idle();
        let doc = CommonStats::collect(
            &store,
            &KernelCacheWindow::new(0),
            (dir.path(), Path::new("/mnt")),
            false,
            SystemTime::now(),
        );
        let dev = SourceIdentity::of_path(&path).unwrap().dev;
        let [device] = &doc.source.devices[..] else {
            panic!("one device: {:?}", doc.source.devices);
        };
        assert_eq!(device.dev, dev);
        // Every chunk read from the source, the header read too, at their aligned sizes.
        assert!(
            device.bytes >= doc.disk.read_bytes,
            "{device:?} {:?}",
            doc.disk
        );
        assert!(doc.disk.read_bytes >= expected.len() as u64 * 9 / 10);
        assert!(device.reads > doc.disk.reads, "{device:?} {:?}", doc.disk);
        assert!(
            device.latency_mean_us.is_some_and(|us| us > 0.0),
            "{device:?}"
        );
        assert!(device.latency_p99_us >= device.latency_p50_us, "{device:?}");
        assert!(device.throughput_bytes_per_second.is_some_and(|t| t > 0.0));
        assert!(device.busy_seconds > 0.0);
        assert_eq!(device.in_flight, 0);
        assert!(device.in_flight_peak >= 1);

        // In the JSON, under the keys docs/STATS.md names.
        let json: serde_json::Value = serde_json::from_slice(&render_json(&doc)).unwrap();
        let entry = &json["source"]["devices"][0];
        for key in [
            "device",
            "dev",
            "reads",
            "bytes",
            "busy_seconds",
            "latency_mean_us",
            "latency_smoothed_us",
            "latency_p50_us",
            "latency_p99_us",
            "latency_floor_us",
            "throughput_bytes_per_second",
            "bandwidth_bytes_per_second",
            "bandwidth_delay_bytes",
            "in_flight",
            "in_flight_peak",
            "in_flight_mean",
            "window_reads",
        ] {
            assert!(entry.get(key).is_some(), "no {key} in {entry}");
        }
        assert_eq!(entry["bytes"], device.bytes);
        assert!(entry.get("histogram").is_none());
    }
}
