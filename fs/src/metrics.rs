//! The stats as Prometheus metrics: `MOUNTPOINT/.tierfs/metrics` and, with `--metrics-addr`,
//! `http://ADDR/metrics` ([`server`]); names and meanings in docs/STATS.md ("Metrics").
//!
//! **Contract.** The text exposition format 0.0.4 (what node_exporter's textfile collector and
//! every Prometheus-compatible scraper read), rendered by `prometheus-client` from the same
//! figures as the stats document at the moment of the open or the scrape. Names carry their
//! unit (`_bytes`, `_seconds`); monotonic figures are counters (`_total`), levels are gauges;
//! per-operation latency is a histogram (`tierfs_op_duration_seconds`, the coarse buckets of
//! [`tierfs_core::stats::ops::HISTOGRAM_BOUNDS_NS`]), and so is the source's read latency
//! (`tierfs_source_read_duration_seconds`), whose series carry a `device` label as every
//! `tierfs_source_*` series does. Per-file series carry a `path` label and
//! are limited to the [`MetricsConfig::max_labelled_files`] most recently opened files
//! ([`MAX_LABELLED_FILES`] by default), so a mount that saw
//! thousands of files does not give the scraper thousands of series.
//!
//! Rendering takes no lock the read path waits on beyond the stats document's own (one hold of
//! the chunk cache's lock per file for its residency).

pub mod server;

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tierfs_core::source::meter::SourceDeviceSnapshot;
use tierfs_core::stats::ops::{Op, OpHistogram, OpStats};
use tierfs_core::stats::residency;
use tierfs_core::stats::FileSnapshot;

use crate::stats_doc::DaemonStats;

/// Most files given per-file series: the most recently opened ones.
pub const MAX_LABELLED_FILES: usize = 64;

/// Tuning of the metrics; [`Default`] is what a mount uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Most files given per-file series ([`MAX_LABELLED_FILES`]).
    pub max_labelled_files: usize,
}

impl Default for MetricsConfig {
    fn default() -> MetricsConfig {
        MetricsConfig {
            max_labelled_files: MAX_LABELLED_FILES,
        }
    }
}

/// `Content-Type` of what [`render`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A per-file family: name, help, type, and its value for a file.
type FileFamily = (
    &'static str,
    &'static str,
    MetricType,
    fn(&FileSnapshot) -> f64,
);

/// A per-device family of the source: name, help, type, and its value for a device (`None`:
/// not measured yet, no series).
type SourceFamily = (
    &'static str,
    &'static str,
    MetricType,
    fn(&SourceDeviceSnapshot) -> Option<f64>,
);

/// The figures of one scrape.
#[derive(Debug)]
struct Scrape {
    doc: DaemonStats,
    config: MetricsConfig,
    latency: Vec<(Op, OpHistogram)>,
}

/// The metrics of `doc` and of the operation latencies `ops`, as exposition text.
pub fn render(doc: DaemonStats, ops: &OpStats) -> Vec<u8> {
    render_with_config(doc, ops, MetricsConfig::default())
}

/// [`render`], tuned by `config`.
pub fn render_with_config(doc: DaemonStats, ops: &OpStats, config: MetricsConfig) -> Vec<u8> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        doc,
        config,
        latency: ops.histograms(),
    }));
    let mut text = String::new();
    match prometheus_client::encoding::prometheus_text::encode(&mut text, &registry) {
        Ok(()) => text.into_bytes(),
        Err(e) => {
            tracing::error!(error = %e, "cannot render the metrics");
            format!("# cannot render the metrics: {e}\n").into_bytes()
        }
    }
}

/// Writes one family after another into a scrape.
struct Families<'a>(DescriptorEncoder<'a>);

impl Families<'_> {
    fn counter(&mut self, name: &str, help: &str, value: impl EncodeCounterValue) -> fmt::Result {
        self.0
            .encode_descriptor(name, help, None, MetricType::Counter)?
            .encode_counter::<NoLabelSet, _, u64>(&value, None)
    }

    fn gauge(&mut self, name: &str, help: &str, value: impl EncodeGaugeValue) -> fmt::Result {
        self.0
            .encode_descriptor(name, help, None, MetricType::Gauge)?
            .encode_gauge(&value)
    }

    /// One series per `(label value, value)` of `rows`, labelled `label`.
    fn labelled<V>(
        &mut self,
        (name, help, kind): (&str, &str, MetricType),
        label: &str,
        rows: impl IntoIterator<Item = (String, V)>,
    ) -> fmt::Result
    where
        V: EncodeCounterValue + EncodeGaugeValue,
    {
        let mut family = self.0.encode_descriptor(name, help, None, kind)?;
        for (value_of_label, value) in rows {
            let labels = [(label, value_of_label.as_str())];
            let mut series = family.encode_family(&labels)?;
            match kind {
                MetricType::Counter => series.encode_counter::<NoLabelSet, _, u64>(&value, None)?,
                _ => series.encode_gauge(&value)?,
            }
        }
        Ok(())
    }
}

impl Collector for Scrape {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let mut f = Families(encoder);
        self.cache(&mut f)?;
        self.disk_and_prefetch(&mut f)?;
        self.source(&mut f)?;
        self.remote_source(&mut f)?;
        self.disk_tier(&mut f)?;
        self.budget(&mut f)?;
        self.files(&mut f)?;
        self.latency(f)
    }
}

impl Scrape {
    /// The remote source's client (`source.remote`; none for a folder).
    fn remote_source(&self, f: &mut Families) -> fmt::Result {
        let Some(r) = &self.doc.common.source.remote else {
            return Ok(());
        };
        f.counter(
            "tierfs_remote_requests",
            "Requests sent to the remote source for reads and lookups (first tries).",
            r.requests,
        )?;
        f.counter(
            "tierfs_remote_listings",
            "Listings of the remote source's prefix.",
            r.listings,
        )?;
        f.counter(
            "tierfs_remote_retries",
            "Requests to the remote source tried again (throttling, 5xx, cut or refused connections, timeouts).",
            r.retries,
        )?;
        f.counter(
            "tierfs_remote_throttled",
            "Answers of the remote source asking to slow down (503 SlowDown, 429).",
            r.throttled,
        )?;
        f.counter(
            "tierfs_remote_errors",
            "Calls to the remote source that failed after their retries.",
            r.errors,
        )?;
        f.counter(
            "tierfs_remote_received_bytes",
            "Object bytes received from the remote source.",
            r.bytes,
        )?;
        f.gauge(
            "tierfs_remote_first_byte_seconds",
            "Mean time from a read request to its first byte.",
            r.mean_first_byte_secs,
        )?;
        f.gauge(
            "tierfs_remote_part_bytes",
            "Size of the ranged reads a large read is cut into now.",
            r.part_bytes,
        )
    }

    /// The local disk tier's figures (none without `--disk-cache`).
    fn disk_tier(&self, f: &mut Families) -> fmt::Result {
        let Some(t) = &self.doc.common.disk_tier else {
            return Ok(());
        };
        f.gauge(
            "tierfs_disk_tier_capacity_bytes",
            "Bytes of chunks the local disk tier may hold now.",
            t.capacity_bytes,
        )?;
        f.gauge(
            "tierfs_disk_tier_used_bytes",
            "Bytes of chunks the local disk tier holds or is writing.",
            t.used_bytes,
        )?;
        f.counter(
            "tierfs_disk_tier_hit_bytes",
            "Bytes of chunks read back from the local disk tier instead of the source.",
            t.hit_bytes,
        )?;
        f.counter(
            "tierfs_disk_tier_written_bytes",
            "Bytes of chunks written to the local disk tier.",
            t.written_bytes,
        )?;
        f.counter(
            "tierfs_disk_tier_evicted_bytes",
            "Bytes of chunks dropped from the local disk tier to make room.",
            t.evicted_bytes,
        )?;
        f.counter(
            "tierfs_disk_tier_damaged",
            "Chunks of the local disk tier that failed their checksum (read from the source).",
            t.damaged,
        )?;
        f.counter(
            "tierfs_disk_tier_write_errors",
            "Chunks not written to the local disk tier because of a write error.",
            t.write_errors,
        )?;
        f.counter(
            "tierfs_disk_tier_whole_copies",
            "Model files handed to the kernel by passthrough from their whole copy in the local disk tier.",
            t.whole_copies,
        )
    }

    fn cache(&self, f: &mut Families) -> fmt::Result {
        let c = &self.doc.common.cache;
        f.gauge(
            "tierfs_budget_bytes",
            "The mount's budget in force: chunk cache and passthrough files together.",
            c.budget_bytes,
        )?;
        f.gauge(
            "tierfs_cache_budget_bytes",
            "The chunk cache's share of the budget (what passthrough files do not hold).",
            c.chunk_budget_bytes,
        )?;
        f.gauge(
            "tierfs_cache_used_bytes",
            "Bytes the chunk cache holds, reads in flight included.",
            c.used_bytes,
        )?;
        f.gauge("tierfs_cache_chunks", "Resident chunks.", c.chunks)?;
        f.counter(
            "tierfs_cache_hits",
            "Chunk lookups by readers answered from memory.",
            c.hits,
        )?;
        f.counter(
            "tierfs_cache_misses",
            "Chunk lookups by readers that waited for the disk.",
            c.misses,
        )?;
        f.counter(
            "tierfs_cache_hit_bytes",
            "Bytes served to readers from memory.",
            c.hit_bytes,
        )?;
        f.counter(
            "tierfs_cache_miss_bytes",
            "Bytes served to readers that waited for the disk.",
            c.miss_bytes,
        )?;
        f.counter(
            "tierfs_cache_evicted_bytes",
            "Bytes dropped from the chunk cache to stay within the budget.",
            c.evicted_bytes,
        )?;
        f.counter(
            "tierfs_cache_uncached_bytes",
            "Bytes served without caching.",
            c.uncached_bytes,
        )?;
        let z = &c.compress;
        f.gauge(
            "tierfs_cache_compressed_raw_bytes",
            "File bytes of the resident chunks held compressed.",
            z.held.raw_bytes,
        )?;
        f.gauge(
            "tierfs_cache_compressed_frame_bytes",
            "Memory of the compressed chunks' frames.",
            z.held.frame_bytes,
        )?;
        f.gauge(
            "tierfs_cache_compress_ratio",
            "Frame bytes per file byte of the chunks held compressed (1: none).",
            z.held.ratio,
        )?;
        f.gauge(
            "tierfs_cache_compress_window_bytes",
            "Memory of the decoded windows kept for readers.",
            z.window_bytes,
        )?;
        f.counter(
            "tierfs_cache_decoded_bytes",
            "Bytes of compressed chunks decoded for readers.",
            z.decoded_bytes,
        )?;
        f.counter(
            "tierfs_cache_decode_errors",
            "Compressed chunks that did not decode (read from the source again).",
            z.decode_errors,
        )?;
        f.counter(
            "tierfs_stall_seconds",
            "Time readers waited for the disk, summed over reader threads.",
            c.stall_seconds,
        )?;
        f.gauge(
            "tierfs_index_bytes",
            "Estimated memory of the known model files' headers and indexes.",
            c.index.index_bytes,
        )?;
        f.gauge(
            "tierfs_known_files",
            "Model files the mount knows.",
            c.index.index_entries,
        )
    }

    fn disk_and_prefetch(&self, f: &mut Families) -> fmt::Result {
        let d = &self.doc.common.disk;
        f.counter(
            "tierfs_disk_read_bytes",
            "Bytes the daemon read from source model files.",
            d.read_bytes,
        )?;
        f.counter("tierfs_disk_reads", "Reads of source model files.", d.reads)?;
        f.counter(
            "tierfs_disk_errors",
            "Reads of source model files that failed.",
            d.errors,
        )?;
        let p = &self.doc.common.prefetch;
        f.counter(
            "tierfs_prefetch_issued_bytes",
            "Bytes read ahead of readers.",
            p.issued_bytes,
        )?;
        f.counter(
            "tierfs_prefetch_used_bytes",
            "Prefetched bytes a reader later asked for.",
            p.used_bytes,
        )?;
        f.counter(
            "tierfs_prefetch_wasted_bytes",
            "Prefetched bytes evicted before any reader asked for them.",
            p.wasted_bytes,
        )?;
        f.counter(
            "tierfs_kernel_page_cache_invalidated_bytes",
            "Page cache of the mounted files that tierfs asked the kernel to drop.",
            self.doc.common.kernel_page_cache.invalidated_bytes,
        )
    }

    /// The per-device families of the source's meter (`source.devices[]`).
    fn source(&self, f: &mut Families) -> fmt::Result {
        let devices = &self.doc.common.source.devices;
        let families: [SourceFamily; 10] = [
            (
                "tierfs_source_reads",
                "Reads of the source device completed.",
                MetricType::Counter,
                |d| Some(d.reads as f64),
            ),
            (
                "tierfs_source_read_bytes",
                "Bytes read from the source device.",
                MetricType::Counter,
                |d| Some(d.bytes as f64),
            ),
            (
                "tierfs_source_busy_seconds",
                "Time with at least one read of the source device in flight.",
                MetricType::Counter,
                |d| Some(d.busy_seconds),
            ),
            (
                "tierfs_source_latency_smoothed_seconds",
                "Smoothed latency of the source device's reads.",
                MetricType::Gauge,
                |d| d.latency_smoothed_us.map(|us| us / 1e6),
            ),
            (
                "tierfs_source_latency_p50_seconds",
                "Median latency of the source device's recent reads.",
                MetricType::Gauge,
                |d| d.latency_p50_us.map(|us| us / 1e6),
            ),
            (
                "tierfs_source_latency_p99_seconds",
                "99th percentile latency of the source device's recent reads.",
                MetricType::Gauge,
                |d| d.latency_p99_us.map(|us| us / 1e6),
            ),
            (
                "tierfs_source_throughput_bytes_per_second",
                "Bytes per second of busy time of the source device's recent reads.",
                MetricType::Gauge,
                |d| d.throughput_bytes_per_second,
            ),
            (
                "tierfs_source_reads_in_flight",
                "Reads of the source device in flight now.",
                MetricType::Gauge,
                |d| Some(d.in_flight as f64),
            ),
            (
                "tierfs_source_reads_in_flight_peak",
                "Most reads of the source device in flight at once.",
                MetricType::Gauge,
                |d| Some(d.in_flight_peak as f64),
            ),
            (
                "tierfs_source_bandwidth_delay_bytes",
                "Bytes in flight that keep the source device busy: bandwidth times unqueued latency.",
                MetricType::Gauge,
                |d| d.bandwidth_delay_bytes.map(|b| b as f64),
            ),
        ];
        for (name, help, kind, value) in families {
            let rows = devices
                .iter()
                .filter_map(|d| Some((d.device.clone(), value(d)?)));
            f.labelled((name, help, kind), "device", rows)?;
        }
        let mut family = f.0.encode_descriptor(
            "tierfs_source_storage_info",
            "What each source device is (label storage: flash, spinning disk, nfs, fuse.rclone, s3, ...); always 1.",
            None,
            MetricType::Gauge,
        )?;
        for device in devices {
            let labels = [
                ("device", device.device.as_str()),
                ("storage", device.storage),
            ];
            family.encode_family(&labels)?.encode_gauge(&1u64)?;
        }
        let mut family = f.0.encode_descriptor(
            "tierfs_source_read_duration_seconds",
            "Latency of the source device's reads, from issue to completion.",
            None,
            MetricType::Histogram,
        )?;
        for device in devices {
            let labels = [("device", device.device.as_str())];
            family
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(
                    device.histogram.sum_seconds,
                    device.histogram.count,
                    &device.histogram.buckets,
                    None,
                )?;
        }
        Ok(())
    }

    fn budget(&self, f: &mut Families) -> fmt::Result {
        let t = &self.doc.common.passthrough.tier;
        f.gauge(
            "tierfs_passthrough_open_files",
            "Model files open in passthrough mode.",
            t.open_files,
        )?;
        f.gauge(
            "tierfs_passthrough_open_bytes",
            "Bytes the passthrough files reserve.",
            t.open_bytes,
        )?;
        f.gauge(
            "tierfs_passthrough_parked_bytes",
            "Page cache of closed passthrough files kept for a reload.",
            t.parked_bytes,
        )?;
        let Some(b) = &self.doc.budget else {
            return Ok(());
        };
        f.gauge(
            "tierfs_budget_configured_bytes",
            "The budget asked for (--ram-cache, or the last ram-cache command).",
            b.configured_bytes,
        )?;
        f.gauge(
            "tierfs_budget_pressure_limit_bytes",
            "Limit set by memory pressure; the configured budget when there is none.",
            b.pressure_limit_bytes.unwrap_or(b.configured_bytes),
        )?;
        f.counter(
            "tierfs_budget_pressure_events",
            "Times memory pressure lowered the limit.",
            b.pressure_events,
        )?;
        f.counter(
            "tierfs_budget_given_back_bytes",
            "Cache bytes given back under memory pressure.",
            b.given_back_bytes,
        )
    }

    /// The per-file families, for the most recently opened files.
    fn files(&self, f: &mut Families) -> fmt::Result {
        let mut files: Vec<&FileSnapshot> = self.doc.common.files.iter().collect();
        files.sort_by_key(|file| file.recency);
        files.truncate(self.config.max_labelled_files);
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let rows = |value: fn(&FileSnapshot) -> f64| {
            files
                .iter()
                .map(move |file| (file.path.clone(), value(file)))
                .collect::<Vec<_>>()
        };
        let families: [FileFamily; 12] = [
            (
                "tierfs_file_size_bytes",
                "Size of the model file.",
                MetricType::Gauge,
                |file| file.size as f64,
            ),
            (
                "tierfs_file_cached_bytes",
                "Bytes of the file in the chunk cache.",
                MetricType::Gauge,
                |file| file.cached_bytes as f64,
            ),
            (
                "tierfs_file_blocks",
                "Blocks of the file.",
                MetricType::Gauge,
                |file| file.blocks as f64,
            ),
            (
                "tierfs_file_resident_blocks",
                "Blocks of the file wholly in the chunk cache.",
                MetricType::Gauge,
                |file| file.residency.matches(residency::RESIDENT).count() as f64,
            ),
            (
                "tierfs_file_passthrough",
                "1 if the file's last open is served by passthrough, else 0.",
                MetricType::Gauge,
                |file| f64::from(u8::from(file.mode == "passthrough")),
            ),
            (
                "tierfs_file_stall_seconds",
                "Time readers of the file waited for the disk.",
                MetricType::Counter,
                |file| file.stall_seconds,
            ),
            (
                "tierfs_file_hit_bytes",
                "Bytes served to readers of the file from the chunk cache.",
                MetricType::Counter,
                |file| file.hit_bytes as f64,
            ),
            (
                "tierfs_file_miss_bytes",
                "Bytes served to readers of the file that waited for the disk.",
                MetricType::Counter,
                |file| file.miss_bytes as f64,
            ),
            (
                "tierfs_file_disk_read_bytes",
                "Bytes of the file's chunks read from the source.",
                MetricType::Counter,
                |file| file.disk_read_bytes as f64,
            ),
            (
                "tierfs_file_compressed_raw_bytes",
                "File bytes of the file's resident chunks held compressed.",
                MetricType::Gauge,
                |file| file.compressed.raw_bytes as f64,
            ),
            (
                "tierfs_file_compressed_frame_bytes",
                "Memory of the frames of the file's compressed chunks.",
                MetricType::Gauge,
                |file| file.compressed.frame_bytes as f64,
            ),
            (
                "tierfs_file_prefetch_issued_bytes",
                "Bytes of the file read ahead of its readers.",
                MetricType::Counter,
                |file| file.prefetch.issued_bytes as f64,
            ),
        ];
        for (name, help, kind, value) in families {
            f.labelled((name, help, kind), "path", rows(value))?;
        }
        Ok(())
    }

    fn latency(&self, mut f: Families) -> fmt::Result {
        let mut family = f.0.encode_descriptor(
            "tierfs_op_duration_seconds",
            "The daemon's time per kernel request, by request type.",
            None,
            MetricType::Histogram,
        )?;
        for (op, histogram) in &self.latency {
            let labels = [("op", op.name())];
            family
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(
                    histogram.sum_seconds,
                    histogram.count,
                    &histogram.buckets,
                    None,
                )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
