//! The metrics rendered from stats documents made for the purpose, checked line by line.

use std::path::Path;
use std::time::SystemTime;

use tierfs_core::kernel_cache::KernelCacheWindow;
use tierfs_core::models::ModelStore;
use tierfs_core::stats::PrefetchSnapshot;

use super::*;

fn file(path: &str, recency: usize) -> FileSnapshot {
    FileSnapshot {
        path: path.to_string(),
        mode: "cache",
        size: 10,
        tensors: 1,
        blocks: 1,
        cached_bytes: 0,
        malformed: false,
        malformed_reason: None,
        direct_io: false,
        order_learned: false,
        learned_blocks: 0,
        prefetch: PrefetchSnapshot {
            issued_bytes: 0,
            used_bytes: 0,
            wasted_bytes: 0,
        },
        hit_bytes: 0,
        miss_bytes: 0,
        disk_read_bytes: 0,
        compressed: Default::default(),
        stall_seconds: 0.0,
        start_stall_seconds: 0.0,
        model: None,
        standalone_reason: None,
        mode_reason: None,
        page_cache_kept_bytes: 0,
        residency: String::new(),
        residency_current: None,
        residency_prefetch_front: None,
        recency,
    }
}

/// The stats document of `store`, mounted from `source` at `/mnt`, as the daemon makes it.
fn stats_of(store: &ModelStore, source: &str) -> DaemonStats {
    let window = KernelCacheWindow::new(0);
    DaemonStats::collect(
        store,
        &window,
        Path::new(source),
        Path::new("/mnt"),
        false,
        SystemTime::now(),
    )
}

/// The paths given a `tierfs_file_size_bytes` series.
fn labelled(config: MetricsConfig) -> Vec<String> {
    let store = ModelStore::new(64 << 20, Default::default());
    let mut doc = stats_of(&store, "/src");
    doc.common.files = (0..5).map(|i| file(&format!("m{i}"), i)).collect();
    let text =
        String::from_utf8(render_with_config(doc, &store.counters().ops, config)).expect("utf-8");
    text.lines()
        .filter(|l| l.starts_with("tierfs_file_size_bytes{"))
        .filter_map(|l| l.split('"').nth(1).map(str::to_string))
        .collect()
}

#[test]
fn the_source_meter_is_served_per_device() {
    use std::sync::Arc;
    use std::time::Duration;
    use tierfs_core::source::meter::{ManualClock, MeterConfig, SourceMeters};

    let clock = Arc::new(ManualClock::default());
    let meters = Arc::new(SourceMeters::new(MeterConfig::default(), clock.clone()));
    let store = ModelStore::new(64 << 20, Default::default()).with_source_meters(meters);
    let meter = store.source_meters().for_dev(2049);
    for _ in 0..16 {
        let read = meter.start();
        clock.advance(Duration::from_millis(10));
        read.finish(4 << 20);
    }
    let _stuck = meter.start();
    let doc = stats_of(&store, "/src");
    let text = String::from_utf8(render(doc, &store.counters().ops)).expect("utf-8");
    let sample = |name: &str| -> f64 {
        let prefix = format!("{name}{{device=\"8:1\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .parse()
            .expect("a number")
    };
    assert_eq!(sample("tierfs_source_reads_total"), 16.0);
    assert_eq!(sample("tierfs_source_read_bytes_total"), 64.0 * 1048576.0);
    assert!((sample("tierfs_source_busy_seconds_total") - 0.16).abs() < 1e-9);
    assert_eq!(sample("tierfs_source_latency_smoothed_seconds"), 0.01);
    assert!((0.01..=0.0125).contains(&sample("tierfs_source_latency_p99_seconds")));
    assert_eq!(sample("tierfs_source_reads_in_flight"), 1.0);
    assert_eq!(sample("tierfs_source_reads_in_flight_peak"), 1.0);
    let bdp = sample("tierfs_source_bandwidth_delay_bytes");
    assert!((4.0 * 1048576.0..=5.0 * 1048576.0).contains(&bdp), "{bdp}");
    assert_eq!(sample("tierfs_source_read_duration_seconds_count"), 16.0);
    // 10 ms each: in the bucket up to 16.8 ms, none in the one below.
    for (le, count) in [("0.004194304", 0), ("0.016777216", 16)] {
        let line = format!(
            "tierfs_source_read_duration_seconds_bucket{{device=\"8:1\",le=\"{le}\"}} {count}\n"
        );
        assert!(text.contains(&line), "no {line} in\n{text}");
    }
    assert!(
        text.contains("# TYPE tierfs_source_reads_total counter"),
        "{text}"
    );
    assert!(text.contains("# TYPE tierfs_source_read_duration_seconds histogram"));
    let storage = store.source_meters().snapshot()[0].storage;
    let info = format!("tierfs_source_storage_info{{device=\"8:1\",storage=\"{storage}\"}} 1\n");
    assert!(text.contains(&info), "no {info} in\n{text}");
}

#[test]
fn a_remote_source_client_is_served_and_a_folder_has_none_of_its_families() {
    let store = ModelStore::new(64 << 20, Default::default());
    let collect = || stats_of(&store, "s3://models/wan");
    let folder = String::from_utf8(render(collect(), &store.counters().ops)).expect("utf-8");
    assert!(!folder.contains("tierfs_remote_"), "{folder}");
    let remote = tierfs_core::stats::RemoteSourceSnapshot {
        kind: "s3".into(),
        requests: 40,
        listings: 2,
        retries: 7,
        throttled: 3,
        errors: 1,
        bytes: 5 << 20,
        mean_first_byte_secs: 0.02,
        part_bytes: 4 << 20,
        ..Default::default()
    };
    let doc = collect().with_remote_source(Some(remote));
    let text = String::from_utf8(render(doc, &store.counters().ops)).expect("utf-8");
    for line in [
        "tierfs_remote_requests_total 40\n",
        "tierfs_remote_listings_total 2\n",
        "tierfs_remote_retries_total 7\n",
        "tierfs_remote_throttled_total 3\n",
        "tierfs_remote_errors_total 1\n",
        "tierfs_remote_received_bytes_total 5242880\n",
        "tierfs_remote_first_byte_seconds 0.02\n",
        "tierfs_remote_part_bytes 4194304\n",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
}

#[test]
fn only_the_most_recently_opened_files_are_labelled() {
    assert_eq!(labelled(MetricsConfig::default()).len(), 5);
    let two = MetricsConfig {
        max_labelled_files: 2,
    };
    assert_eq!(labelled(two), ["m0", "m1"]);
}
