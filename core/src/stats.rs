//! Counters behind `MOUNTPOINT/.tierfs/stats`.
//!
//! Counters are plain relaxed atomics bumped on the read path; a snapshot reads them without
//! stopping readers, so figures taken together may be a few operations apart, never wrong by
//! more. The JSON shape is the public contract documented in docs/STATS.md.

pub mod ops;
pub mod residency;

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Monotonic event counters shared by the cache, the prefetcher and the read path.
#[derive(Debug, Default)]
pub struct Counters {
    /// Bytes of chunks decoded from the compressed tier for readers, and the time it took.
    pub decoded_bytes: AtomicU64,
    pub decode_ns: AtomicU64,
    /// Compressed chunks that did not decode (damaged frames, read from the source again).
    pub decode_errors: AtomicU64,
    /// Bytes of chunks the compressed tier encoded into frames it kept.
    pub encoded_bytes: AtomicU64,
    /// Bytes of chunks the compressed tier left raw (they did not gain enough).
    pub kept_raw_bytes: AtomicU64,
    /// Chunk lookups answered from memory.
    pub hits: AtomicU64,
    /// Chunk lookups that had to wait for the disk (their own read or one already in flight).
    pub misses: AtomicU64,
    /// Bytes served to readers from chunks that were already cached.
    pub hit_bytes: AtomicU64,
    /// Bytes served to readers from chunks they waited for.
    pub miss_bytes: AtomicU64,
    /// Bytes dropped from the cache to stay within budget.
    pub evicted_bytes: AtomicU64,
    /// Bytes served without caching: header copies aside, the tail after the last tensor,
    /// malformed files and reads of chunks larger than the whole budget.
    pub uncached_bytes: AtomicU64,
    /// Bytes read from source files.
    pub disk_read_bytes: AtomicU64,
    /// Bytes of probe reads: requests that did not continue a run, served uncached (see
    /// `models::runs`).
    pub probe_bytes: AtomicU64,
    /// Bytes of `O_DIRECT` reads of files larger than the chunk cache, served exactly and
    /// uncached (see `ModelStore::read_direct`).
    pub direct_bytes: AtomicU64,
    /// Bytes of probes of a model that fits the cache on a source read in order, served from
    /// chunks read into the cache for them (see `ModelStore::read_probe`).
    pub probe_cached_bytes: AtomicU64,
    /// Bytes read ahead for a load's next touches of a model larger than the budget in an
    /// object store (see `models::touch_ahead`).
    pub touch_ahead_bytes: AtomicU64,
    /// Bytes of probes served from ranges read ahead for them.
    pub touch_ahead_served_bytes: AtomicU64,
    /// Read requests issued to source files.
    pub disk_reads: AtomicU64,
    /// Source reads that failed (each one surfaced to a reader as EIO, or dropped if a prefetch).
    pub disk_errors: AtomicU64,
    /// Time readers spent waiting for the disk, in nanoseconds.
    pub stall_ns: AtomicU64,
    /// Bytes read ahead of readers.
    pub prefetch_issued_bytes: AtomicU64,
    /// Prefetched bytes a reader later asked for.
    pub prefetch_used_bytes: AtomicU64,
    /// Prefetched bytes evicted (or discarded) before any reader asked for them.
    pub prefetch_wasted_bytes: AtomicU64,
    /// Bytes of the mounted files' kernel page cache that tierfs asked the kernel to drop.
    pub kernel_cache_invalidated_bytes: AtomicU64,
    /// Per-operation counts, errors and latency of the front end's requests.
    pub ops: ops::OpStats,
}

impl Counters {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    /// Adds `value` to a mount-wide counter and, where the bytes belong to a file, to that
    /// file's own counter of the same figure (its share, `files[].…` in the stats).
    pub fn add_with_file(global: &AtomicU64, file: Option<&AtomicU64>, value: u64) {
        Counters::add(global, value);
        if let Some(file) = file {
            Counters::add(file, value);
        }
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// `cache` section of the stats document.
#[derive(Debug, Clone, Serialize)]
pub struct CacheSnapshot {
    /// The mount's budget (`--ram-cache`), chunk cache and passthrough files together.
    pub budget_bytes: u64,
    /// The part of it the chunk cache may use now: what passthrough files do not hold.
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
    /// The compressed RAM tier.
    pub compress: CompressSnapshot,
    /// Header and index memory of the known model files (`index_bytes`, …), filled in by the
    /// model store (the chunk cache does not hold it).
    #[serde(flatten)]
    pub index: IndexSnapshot,
}

/// The `cache.index_*` figures of the stats.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct IndexSnapshot {
    /// Estimated memory of every known file's header and index.
    pub index_bytes: u64,
    /// The cap it is held to (`--index-cache`).
    pub index_cap_bytes: u64,
    /// Known model files.
    pub index_entries: u64,
    /// Files forgotten to stay within the cap.
    pub index_evictions: u64,
    /// Opens served as plain bytes because the file's header and index did not fit the cap
    /// beside those of open files.
    pub index_refusals: u64,
}

/// `disk` section.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiskSnapshot {
    pub read_bytes: u64,
    pub reads: u64,
    pub errors: u64,
    /// Part of `read_bytes` read for probes (uncached, no prefetch).
    pub probe_bytes: u64,
    /// Part of `read_bytes` read for `O_DIRECT` readers of files larger than the chunk cache
    /// (exactly what they asked for, uncached, no prefetch).
    pub direct_bytes: u64,
    /// Bytes of probes of a model that fits the cache on a source read in order, served from
    /// chunks read into the cache for them (not part of `probe_bytes`).
    pub probe_cached_bytes: u64,
    /// Part of `read_bytes` read ahead for a load's next touches of a model larger than the
    /// budget in an object store.
    pub touch_ahead_bytes: u64,
    /// Bytes of probes served from ranges read ahead for them (not part of `probe_bytes`).
    pub touch_ahead_served_bytes: u64,
    /// Tries of source reads that failed with an error (retried or not; timeouts apart).
    pub source_errors: u64,
    /// Tries started again after a transient error (`crate::source::retry`).
    pub source_retries: u64,
    /// Source reads that gave up at their deadline (`--source-timeout`).
    pub source_timeouts: u64,
    /// Source descriptors opened again after `ENOTCONN` or `ESTALE`.
    pub source_reopens: u64,
    /// Source reads failed at once because every I/O thread was stuck.
    pub source_refused: u64,
    /// Source descriptors closed and opened again so that an ordered stream reads through a
    /// fresh handle of a network source's client (`crate::source::slot`).
    pub source_fresh_handles: u64,
    /// Source reads abandoned at their deadline whose thread is still blocked (now).
    pub source_stuck: u64,
}

impl DiskSnapshot {
    /// The `source_*` figures from the mount's source reads.
    pub fn with_source_faults(mut self, s: &crate::source::deadline::SourceIoSnapshot) -> Self {
        self.source_errors = s.errors;
        self.source_retries = s.retries;
        self.source_timeouts = s.timeouts;
        self.source_reopens = s.reopens;
        self.source_refused = s.refused;
        self.source_fresh_handles = s.fresh_handles;
        self.source_stuck = s.stuck;
        self
    }
}

/// `prefetch` section.
#[derive(Debug, Clone, Serialize)]
pub struct PrefetchSnapshot {
    pub issued_bytes: u64,
    pub used_bytes: u64,
    pub wasted_bytes: u64,
}

impl PrefetchSnapshot {
    /// The section read from its three counters (issued, used, wasted bytes): the one place
    /// it is built from counters, mount-wide and per file alike.
    pub fn from_counters(issued: &AtomicU64, used: &AtomicU64, wasted: &AtomicU64) -> Self {
        PrefetchSnapshot {
            issued_bytes: Counters::get(issued),
            used_bytes: Counters::get(used),
            wasted_bytes: Counters::get(wasted),
        }
    }
}

/// `kernel_page_cache` section: the mounted files' page cache tierfs keeps bounded.
#[derive(Debug, Clone, Serialize)]
pub struct KernelCacheSnapshot {
    pub window_bytes: u64,
    pub invalidated_bytes: u64,
}

/// What the compressed RAM tier holds of a file, a model or the whole cache (`compressed`
/// in `files[]`, `models[]` and `cache.compress`).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct CompressedFigures {
    /// File bytes of the resident chunks held compressed.
    pub raw_bytes: u64,
    /// Memory of their frames (page-rounded: what the budget is charged for them).
    pub frame_bytes: u64,
    /// `frame_bytes / raw_bytes` (1 when nothing is compressed).
    pub ratio: f64,
}

impl CompressedFigures {
    pub fn new(raw_bytes: u64, frame_bytes: u64) -> CompressedFigures {
        CompressedFigures {
            raw_bytes,
            frame_bytes,
            ratio: if raw_bytes == 0 {
                1.0
            } else {
                frame_bytes as f64 / raw_bytes as f64
            },
        }
    }

    /// A file's figures from its counters.
    pub fn of_file(c: &crate::reader::FileCounters) -> CompressedFigures {
        CompressedFigures::new(
            Counters::get(&c.frame_raw_bytes),
            Counters::get(&c.frame_bytes),
        )
    }
}

/// `cache.compress`: the compressed RAM tier (`--compress`).
#[derive(Debug, Clone, Serialize)]
pub struct CompressSnapshot {
    /// `auto`, `on` or `off`.
    pub mode: &'static str,
    #[serde(flatten)]
    pub held: CompressedFigures,
    /// Memory of the decoded windows kept for readers.
    pub window_bytes: u64,
    /// Chunk bytes decoded for readers, and the time it took (summed over reader threads).
    pub decoded_bytes: u64,
    pub decode_seconds: f64,
    /// Compressed chunks that did not decode (read from the source again).
    pub decode_errors: u64,
    /// Chunk bytes encoded into kept frames / left raw (they did not gain enough).
    pub encoded_bytes: u64,
    pub kept_raw_bytes: u64,
}

/// One entry of `files`.
#[derive(Debug, Clone, Serialize)]
pub struct FileSnapshot {
    pub path: String,
    /// How the file is served: `passthrough` (the kernel reads the source directly, see
    /// `passthrough` section), `cache` (the chunk cache) or `uncached` (malformed).
    pub mode: &'static str,
    pub size: u64,
    pub tensors: usize,
    pub blocks: usize,
    pub cached_bytes: u64,
    pub malformed: bool,
    pub malformed_reason: Option<String>,
    pub direct_io: bool,
    /// Whether a whole pass over the file's blocks was seen, and how many blocks it touched.
    pub order_learned: bool,
    pub learned_blocks: usize,
    /// This file's share of the prefetch figures.
    pub prefetch: PrefetchSnapshot,
    /// Bytes served to readers of this file through the chunk cache from resident chunks /
    /// from chunks they waited for, and bytes of its chunks read from the source.
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    pub disk_read_bytes: u64,
    /// What the compressed RAM tier holds of the file (of its model, for a shard).
    pub compressed: CompressedFigures,
    /// Time readers of this file waited for the disk.
    pub stall_seconds: f64,
    /// The part of it spent in the first block of the order: the wait of a reader starting
    /// the model (a workflow's switch to it), which the next-model warm is there to remove.
    pub start_stall_seconds: f64,
    /// The sharded model (`models[].name`) this file is a shard of; its `order_learned`,
    /// `learned_blocks`, `prefetch` and `stall_seconds` are then the model's.
    pub model: Option<String>,
    /// Why a file that looks like a shard is served on its own (broken index.json, missing
    /// shard, …).
    pub standalone_reason: Option<String>,
    /// Why the file is served in its `mode`: it fits the budget (passthrough), its model is
    /// larger than the budget, it competes with other models that take turns (a model whose
    /// page cache was dropped to make room for another is served from the chunk cache), …
    pub mode_reason: Option<&'static str>,
    /// Page cache of the closed file the passthrough tier keeps for its next open.
    pub page_cache_kept_bytes: u64,
    /// One character per block in the file's order: which of them the chunk cache holds
    /// ([`residency`]); empty for a malformed file.
    pub residency: String,
    /// Index in `residency` of the block the reader is in, or was in last.
    pub residency_current: Option<usize>,
    /// Index in `residency` of the block furthest ahead of the reader that prefetch read into
    /// (`None`: none ahead of it).
    pub residency_prefetch_front: Option<usize>,
    /// Rank by last use, 0 the most recently opened file (not in the JSON: how the metrics
    /// choose the files they label).
    #[serde(skip)]
    pub recency: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_with_file_bumps_both_or_the_global_alone() {
        let (global, file) = (AtomicU64::new(0), AtomicU64::new(0));
        Counters::add_with_file(&global, Some(&file), 5);
        Counters::add_with_file(&global, None, 2);
        assert_eq!((Counters::get(&global), Counters::get(&file)), (7, 5));
    }
}

/// The `source.remote` section of the stats: a remote source's client, its requests and how
/// the store answered them (docs/STATS.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RemoteSourceSnapshot {
    /// The kind of store (`s3`).
    pub kind: String,
    /// The source's URL (`s3://bucket/prefix/`).
    pub url: String,
    /// Where the client sends its requests.
    pub endpoint: String,
    /// Requests sent for reads and lookups (first tries; see `retries`).
    pub requests: u64,
    /// Listings of the prefix made (each one request per 1000 keys).
    pub listings: u64,
    /// Requests tried again: throttling, 5xx answers, refused or cut connections (a body cut
    /// short is asked again from where it stopped), timeouts.
    pub retries: u64,
    /// Answers asking the client to slow down (503 `SlowDown`, 429), retried or not.
    pub throttled: u64,
    /// Calls that failed after their retries (each an error a reader or a lookup got).
    pub errors: u64,
    /// Object bytes received.
    pub bytes: u64,
    /// Mean time from sending a read to its first byte, in seconds.
    pub mean_first_byte_secs: f64,
    /// Throughput of whole reads of at least one part, in bytes per second.
    pub read_bytes_per_sec: f64,
    /// The size of the ranged reads the client cuts a large read into now, in bytes.
    pub part_bytes: u64,
}
