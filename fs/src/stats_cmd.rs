//! `tierfs stats MOUNTPOINT [--watch] [--json]`: a readable view of `.tierfs/stats`.
//!
//! The command reads the same JSON any program can read, so it doubles as a check that the
//! document parses; the human view adds rates computed between two `--watch` refreshes.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tierfs_core::size::format_size;

use crate::stats_read::{BudgetRead, SourceDeviceRead, StatsRead, OPS};

/// How `tierfs stats` shows the document.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatsOptions {
    /// Refresh every `interval` seconds instead of showing it once.
    pub watch: bool,
    pub interval: f64,
    /// Print the raw JSON document instead of the human view.
    pub json: bool,
}

impl StatsOptions {
    /// The human view, shown once.
    pub fn once() -> StatsOptions {
        StatsOptions {
            watch: false,
            interval: 1.0,
            json: false,
        }
    }
}

pub fn run(mountpoint: &Path, options: StatsOptions) -> Result<()> {
    let StatsOptions {
        watch,
        interval,
        json,
    } = options;
    let path = mountpoint.join(".tierfs/stats");
    let mut previous: Option<(Instant, StatsRead)> = None;
    loop {
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {} (is {} a tierfs mount?)",
                path.display(),
                mountpoint.display()
            )
        })?;
        let not_json = || format!("{} is not valid JSON", path.display());
        if json {
            // Printed as any JSON reader sees it, every key kept.
            let doc: serde_json::Value = serde_json::from_str(&text).with_context(not_json)?;
            println!("{}", serde_json::to_string_pretty(&doc)?);
            if !watch {
                return Ok(());
            }
        } else {
            let doc: StatsRead = serde_json::from_str(&text).with_context(not_json)?;
            if watch {
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", render(&doc, previous.as_ref()));
            if !watch {
                return Ok(());
            }
            previous = Some((Instant::now(), doc));
        }
        thread::sleep(Duration::from_secs_f64(interval.max(0.1)));
    }
}

/// The `budget` lines: what is in force and what memory pressure did.
fn render_budget(budget: &BudgetRead) -> String {
    let limit = match budget.pressure_limit_bytes {
        Some(limit) => format!("pressure limit {}", format_size(limit)),
        None => "no memory pressure".to_string(),
    };
    format!(
        "budget    {} in force of {} configured, floor {}, other tiers {}; {limit}\n\
         pressure  {} events, {} given back, {} regrowth steps; oom_score_adj {}\n",
        format_size(budget.effective_bytes),
        format_size(budget.configured_bytes.unwrap_or(0)),
        format_size(budget.floor_bytes),
        format_size(budget.other_tiers_bytes),
        budget.pressure_events,
        format_size(budget.given_back_bytes),
        budget.regrow_steps,
        budget
            .oom_score_adj
            .map_or("?".to_string(), |adj| adj.to_string()),
    )
}

/// The human view of one stats document.
pub fn render_document(doc: &StatsRead) -> String {
    render(doc, None)
}

fn render(doc: &StatsRead, previous: Option<&(Instant, StatsRead)>) -> String {
    let (cache, disk, prefetch) = (&doc.cache, &doc.disk, &doc.prefetch);
    let hits = cache.hits;
    let lookups = hits + cache.misses;
    let hit_rate = if lookups == 0 {
        0.0
    } else {
        100.0 * hits as f64 / lookups as f64
    };
    let mut out = format!(
        "tierfs {} -> {}\n\
         cache     {} used of {} budget, {} chunks, hit rate {hit_rate:.1}% ({hits} of {lookups})\n\
         served    {} from cache, {} waited on disk, {} uncached; evicted {}\n\
         compress  {}: {}, decoded windows {}, {} decode errors\n\
         disk      {} read in {} requests, {} errors, readers stalled {:.2} s\n\
         {}\
         prefetch  {} issued, {} used, {} wasted\n\
         page cache of mounted files: window {}, {} invalidated\n\
         passthrough {}\n\
         modes     passthrough {}; readahead {} ({}){}\n",
        doc.mount.source.as_deref().unwrap_or("?"),
        doc.mount.mountpoint.as_deref().unwrap_or("?"),
        format_size(cache.used_bytes),
        format_size(cache.budget_bytes),
        cache.chunks,
        format_size(cache.hit_bytes),
        format_size(cache.miss_bytes),
        format_size(cache.uncached_bytes),
        format_size(cache.evicted_bytes),
        cache.compress.mode.as_deref().unwrap_or("?"),
        cache
            .compress
            .held()
            .unwrap_or_else(|| "nothing held compressed".to_string()),
        format_size(cache.compress.window_bytes),
        cache.compress.decode_errors,
        format_size(disk.read_bytes),
        disk.reads,
        disk.errors,
        cache.stall_seconds,
        render_source(doc),
        format_size(prefetch.issued_bytes),
        format_size(prefetch.used_bytes),
        format_size(prefetch.wasted_bytes),
        format_size(doc.kernel_page_cache.window_bytes),
        format_size(doc.kernel_page_cache.invalidated_bytes),
        passthrough_line(doc),
        doc.modes.passthrough_note.as_deref().unwrap_or("?"),
        format_size(doc.modes.readahead_bytes),
        doc.modes.readahead_note.as_deref().unwrap_or("?"),
        if doc.modes.root == Some(false) {
            "; not root (see docs/CONFIGURATION.md, \"Without root\")"
        } else {
            ""
        },
    );
    if let Some(remote) = &doc.source.remote {
        out += &format!("store     {}\n", remote.summary());
    }
    if let Some(tier) = &doc.disk_tier {
        out += &format!("disk tier {}\n", tier.summary());
    }
    if let Some(budget) = &doc.budget {
        out += &render_budget(budget);
    }
    if let Some((then, before)) = previous {
        let secs = then.elapsed().as_secs_f64().max(1e-3);
        let rate = |now: u64, before: u64| {
            format_size(((now.saturating_sub(before)) as f64 / secs) as u64)
        };
        out += &format!(
            "rates     disk {}/s, served from cache {}/s\n",
            rate(doc.disk.read_bytes, before.disk.read_bytes),
            rate(doc.cache.hit_bytes, before.cache.hit_bytes)
        );
    }
    out += &render_ops(doc);
    out += &format!(
        "\n  {:<50} {:>12} {:>8} {:>7} {:>12} {:>11}  note\n",
        "file", "size", "tensors", "blocks", "cached", "mode"
    );
    for file in &doc.files {
        let note = match (
            file.malformed_reason.as_deref(),
            file.model.as_deref(),
            file.standalone_reason.as_deref(),
        ) {
            (Some(reason), _, _) => format!("malformed: {reason}"),
            (None, Some(model), _) => format!("shard of {model}"),
            (None, None, Some(reason)) => format!("not a shard: {reason}"),
            (None, None, None) => String::new(),
        };
        out += &format!(
            "  {:<50} {:>12} {:>8} {:>7} {:>12} {:>11}  {}\n",
            file.path.as_deref().unwrap_or("?"),
            format_size(file.strip.size),
            file.tensors,
            file.blocks,
            format_size(file.strip.cached_bytes),
            file.mode.as_deref().unwrap_or("?"),
            note
        );
    }
    out += &render_models(doc);
    out
}

/// Sharded models: one line per model, one per shard.
fn render_models(doc: &StatsRead) -> String {
    let mut out = String::new();
    for model in &doc.models {
        let shards = model.shards.as_deref().unwrap_or(&[]);
        out += &format!(
            "\n  model {} ({} shards, {} blocks, found by {}): {}, {} cached, order {}, prefetch {} issued\n",
            model.name.as_deref().unwrap_or("?"),
            shards.len(),
            model.blocks,
            model.found_by.as_deref().unwrap_or("?"),
            format_size(model.strip.size),
            format_size(model.strip.cached_bytes),
            if model.order_learned == Some(true) {
                "learned"
            } else {
                "default"
            },
            format_size(model.prefetch.issued_bytes),
        );
        for shard in shards {
            out += &format!(
                "    {:<50} {:>12} {:>12} cached{}\n",
                shard.path.as_deref().unwrap_or("?"),
                format_size(shard.size),
                format_size(shard.cached_bytes),
                if shard.indexed == Some(true) {
                    ""
                } else {
                    " (not opened yet)"
                },
            );
        }
    }
    out
}

/// The `source` lines: each source device's measured latency, throughput and reads in flight.
fn render_source(doc: &StatsRead) -> String {
    if doc.source.devices.is_empty() {
        return "source    no reads yet\n".to_string();
    }
    doc.source
        .devices
        .iter()
        .map(|device| format!("source    {}\n", source_summary(device)))
        .collect()
}

/// One source device's figures on one line (`tierfs stats` and `tierfs top`).
pub fn source_summary(device: &SourceDeviceRead) -> String {
    let latency = |us: Option<f64>| match us {
        Some(us) if us >= 1000.0 => format!("{:.2} ms", us / 1000.0),
        Some(us) => format!("{us:.0} µs"),
        None => "-".to_string(),
    };
    let throughput = device
        .throughput_bytes_per_second
        .map_or("-".to_string(), |t| format!("{}/s", format_size(t as u64)));
    let storage = device
        .storage
        .as_deref()
        .map_or(String::new(), |s| format!(" ({s})"));
    format!(
        "{}{storage}: latency {} (p50 {}, p99 {}), {throughput} while reading, {} in flight (peak {}), BDP {}; {} reads, {}",
        device.device.as_deref().unwrap_or("?"),
        latency(device.latency_smoothed_us),
        latency(device.latency_p50_us),
        latency(device.latency_p99_us),
        device.in_flight,
        device.in_flight_peak,
        device
            .bandwidth_delay_bytes
            .map_or("-".to_string(), format_size),
        device.reads,
        format_size(device.bytes),
    )
}

/// The `passthrough` line of the summary: what the tier holds, or why it is off.
fn passthrough_line(doc: &StatsRead) -> String {
    let pt = &doc.passthrough;
    if !pt.available {
        return "unavailable (needs root and Linux 6.9+): every model file is served from the cache"
            .to_owned();
    }
    format!(
        "{} files open ({}), {} parked ({}); {} admitted, {} too large for the budget",
        pt.open_files,
        format_size(pt.open_bytes),
        pt.parked_files,
        format_size(pt.parked_bytes),
        pt.admitted,
        pt.refused,
    )
}

/// The per-operation table (`ops` in the document): count, errors and latency.
fn render_ops(doc: &StatsRead) -> String {
    let mut out = format!(
        "\n  {:<10} {:>12} {:>8} {:>10} {:>10} {:>10}\n",
        "operation", "count", "errors", "mean µs", "p50 µs", "p99 µs"
    );
    for op in OPS {
        let figures = doc.op(op);
        out += &format!(
            "  {op:<10} {:>12} {:>8} {:>10.1} {:>10.1} {:>10.1}\n",
            figures.count, figures.errors, figures.mean_us, figures.p50_us, figures.p99_us,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_every_operation_and_the_modes() {
        let doc = serde_json::json!({
            "ops": {
                "lookup": {"count": 12, "errors": 3, "mean_us": 4.5, "p50_us": 2.0, "p99_us": 40.0},
                "read": {"count": 7, "errors": 0, "mean_us": 300.0, "p50_us": 250.0, "p99_us": 900.0},
            },
            "modes": {"root": false, "passthrough_note": "off: needs root", "readahead_bytes": 131072,
                      "readahead_note": "4.00 MiB asked, kept the kernel's: raising it needs root"},
        });
        let text = render_document(&serde_json::from_value(doc).expect("a stats document"));
        let row = |op: &str| {
            text.lines()
                .find(|l| l.split_whitespace().next() == Some(op))
                .unwrap_or_else(|| panic!("no {op} row in\n{text}"))
                .split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
        };
        assert_eq!(row("lookup"), ["12", "3", "4.5", "2.0", "40.0"]);
        assert_eq!(row("read"), ["7", "0", "300.0", "250.0", "900.0"]);
        assert_eq!(row("readdir"), ["0", "0", "0.0", "0.0", "0.0"]);
        assert!(
            text.contains("passthrough off: needs root; readahead 128.00 KiB"),
            "{text}"
        );
        assert!(text.contains("not root"), "{text}");
        assert!(text.contains("\nsource    no reads yet\n"), "{text}");
    }

    #[test]
    fn shows_each_source_device() {
        let doc = serde_json::json!({
            "source": {"devices": [
                {"device": "8:1", "storage": "spinning disk", "reads": 1024, "bytes": 4u64 << 30, "latency_smoothed_us": 12300.0,
                 "latency_p50_us": 12500.0, "latency_p99_us": 640.0, "throughput_bytes_per_second": 367001600.0,
                 "in_flight": 2, "in_flight_peak": 4, "bandwidth_delay_bytes": 4u64 << 20},
                {"device": "0:53", "reads": 0, "bytes": 0, "latency_smoothed_us": null},
            ]},
        });
        let text = render_document(&serde_json::from_value(doc).expect("a stats document"));
        assert!(
            text.contains("\nsource    8:1 (spinning disk): latency 12.30 ms (p50 12.50 ms, p99 640 µs), 350.00 MiB/s while reading, 2 in flight (peak 4), BDP 4.00 MiB; 1024 reads, 4.00 GiB\n"),
            "{text}"
        );
        assert!(
            text.contains("\nsource    0:53: latency - (p50 -, p99 -), - while reading, 0 in flight (peak 0), BDP -; 0 reads, 0 B\n"),
            "{text}"
        );
    }

    #[test]
    fn shows_a_sharded_model_and_its_shards() {
        let doc = serde_json::json!({
            "files": [
                {"path": "m/a-00001-of-00002.safetensors", "size": 10, "model": "m/a.safetensors.index.json"},
                {"path": "m/b-00001-of-00002.safetensors", "size": 10, "standalone_reason": "shard b-00002-of-00002.safetensors of this model is missing"},
            ],
            "models": [{
                "name": "m/a.safetensors.index.json", "found_by": "index_json", "size": 3 << 20,
                "blocks": 7, "cached_bytes": 1 << 20, "order_learned": true,
                "prefetch": {"issued_bytes": 2 << 20},
                "shards": [
                    {"path": "m/a-00001-of-00002.safetensors", "size": 1 << 20, "indexed": true, "cached_bytes": 1 << 20},
                    {"path": "m/a-00002-of-00002.safetensors", "size": 2 << 20, "indexed": false, "cached_bytes": 0},
                ],
            }],
        });
        let text = render_document(&serde_json::from_value(doc).expect("a stats document"));
        assert!(
            text.contains("model m/a.safetensors.index.json (2 shards, 7 blocks, found by index_json): 3.00 MiB, 1.00 MiB cached, order learned, prefetch 2.00 MiB issued"),
            "{text}"
        );
        assert!(
            text.contains("shard of m/a.safetensors.index.json"),
            "{text}"
        );
        assert!(
            text.contains(
                "not a shard: shard b-00002-of-00002.safetensors of this model is missing"
            ),
            "{text}"
        );
        let second = text
            .lines()
            .find(|l| l.contains("a-00002-of-00002"))
            .unwrap_or_default();
        assert!(second.ends_with("cached (not opened yet)"), "{text}");
    }
}
