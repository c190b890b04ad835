//! `tierfs stats MOUNTPOINT [--watch] [--json]`: a readable view of `.tierfs/stats`.
//!
//! The command reads the same JSON any program can read, so it doubles as a check that the
//! document parses; the human view adds rates computed between two `--watch` refreshes.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::Value;
use tierfs_core::size::format_size;

pub fn run(mountpoint: &Path, watch: bool, interval: f64, json: bool) -> Result<()> {
    let path = mountpoint.join(".tierfs/stats");
    let mut previous: Option<(Instant, Value)> = None;
    loop {
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {} (is {} a tierfs mount?)",
                path.display(),
                mountpoint.display()
            )
        })?;
        let doc: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        if json {
            println!("{}", serde_json::to_string_pretty(&doc)?);
        } else {
            if watch {
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", render(&doc, previous.as_ref()));
        }
        if !watch {
            return Ok(());
        }
        previous = Some((Instant::now(), doc));
        thread::sleep(Duration::from_secs_f64(interval.max(0.1)));
    }
}

fn num(doc: &Value, path: &[&str]) -> u64 {
    path.iter()
        .try_fold(doc, |v, key| v.get(key))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The human view of one stats document.
pub fn render_document(doc: &Value) -> String {
    render(doc, None)
}

fn render(doc: &Value, previous: Option<&(Instant, Value)>) -> String {
    let size = |path: &[&str]| format_size(num(doc, path));
    let hits = num(doc, &["cache", "hits"]);
    let lookups = hits + num(doc, &["cache", "misses"]);
    let hit_rate = if lookups == 0 {
        0.0
    } else {
        100.0 * hits as f64 / lookups as f64
    };
    let mut out = format!(
        "tierfs {} -> {}\n\
         cache     {} used of {} budget, {} chunks, hit rate {hit_rate:.1}% ({hits} of {lookups})\n\
         served    {} from cache, {} waited on disk, {} uncached; evicted {}\n\
         disk      {} read in {} requests, {} errors, readers stalled {:.2} s\n\
         prefetch  {} issued, {} used, {} wasted\n\
         page cache of mounted files: window {}, {} invalidated\n\
         passthrough {}\n",
        doc["mount"]["source"].as_str().unwrap_or("?"),
        doc["mount"]["mountpoint"].as_str().unwrap_or("?"),
        size(&["cache", "used_bytes"]),
        size(&["cache", "budget_bytes"]),
        num(doc, &["cache", "chunks"]),
        size(&["cache", "hit_bytes"]),
        size(&["cache", "miss_bytes"]),
        size(&["cache", "uncached_bytes"]),
        size(&["cache", "evicted_bytes"]),
        size(&["disk", "read_bytes"]),
        num(doc, &["disk", "reads"]),
        num(doc, &["disk", "errors"]),
        doc["cache"]["stall_seconds"].as_f64().unwrap_or(0.0),
        size(&["prefetch", "issued_bytes"]),
        size(&["prefetch", "used_bytes"]),
        size(&["prefetch", "wasted_bytes"]),
        size(&["kernel_page_cache", "window_bytes"]),
        size(&["kernel_page_cache", "invalidated_bytes"]),
        passthrough_line(doc),
    );
    if let Some((then, before)) = previous {
        let secs = then.elapsed().as_secs_f64().max(1e-3);
        let rate = |path: &[&str]| {
            format_size(((num(doc, path).saturating_sub(num(before, path))) as f64 / secs) as u64)
        };
        out += &format!(
            "rates     disk {}/s, served from cache {}/s\n",
            rate(&["disk", "read_bytes"]),
            rate(&["cache", "hit_bytes"])
        );
    }
    out += &format!(
        "\n  {:<50} {:>12} {:>8} {:>7} {:>12} {:>11}  note\n",
        "file", "size", "tensors", "blocks", "cached", "mode"
    );
    for file in doc["files"].as_array().into_iter().flatten() {
        let note = match file["malformed_reason"].as_str() {
            Some(reason) => format!("malformed: {reason}"),
            None => String::new(),
        };
        out += &format!(
            "  {:<50} {:>12} {:>8} {:>7} {:>12} {:>11}  {}\n",
            file["path"].as_str().unwrap_or("?"),
            format_size(file["size"].as_u64().unwrap_or(0)),
            file["tensors"].as_u64().unwrap_or(0),
            file["blocks"].as_u64().unwrap_or(0),
            format_size(file["cached_bytes"].as_u64().unwrap_or(0)),
            file["mode"].as_str().unwrap_or("?"),
            note
        );
    }
    out
}

/// The `passthrough` line of the summary: what the tier holds, or why it is off.
fn passthrough_line(doc: &Value) -> String {
    let pt = &doc["passthrough"];
    if !pt["available"].as_bool().unwrap_or(false) {
        return "unavailable (needs root and Linux 6.9+): every model file is served from the cache"
            .to_owned();
    }
    format!(
        "{} files open ({}), {} parked ({}); {} admitted, {} too large for the budget",
        num(doc, &["passthrough", "open_files"]),
        format_size(num(doc, &["passthrough", "open_bytes"])),
        num(doc, &["passthrough", "parked_files"]),
        format_size(num(doc, &["passthrough", "parked_bytes"])),
        num(doc, &["passthrough", "admitted"]),
        num(doc, &["passthrough", "refused"]),
    )
}
