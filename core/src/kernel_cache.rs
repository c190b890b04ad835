//! Keeping the kernel's page cache of the *mounted* files bounded.
//!
//! **Contract.** The adapter records here each range it serves ([`KernelCacheWindow::record`]);
//! `record` returns the oldest ranges once more than the window is recorded, for the adapter to
//! invalidate (FUSE `NOTIFY_INVAL_INODE`; invalidating a range the kernel does not hold costs
//! next to nothing). The recorded total, and so the mounted files' page cache, never exceeds
//! [`KernelCacheWindow::hard_limit`] (window + headroom): with the tierfs cache it stays within
//! 1.1 × budget + 64 MiB. One mutex (the ranges), a leaf taken through [`crate::sync`].
//!
//! Why: what an `mmap` reader faults in through the mount lands in the kernel page cache of the
//! FUSE file (model files are opened with `FOPEN_DIRECT_IO`, so plain `read()`s bypass it, but
//! mmap cannot; on kernels without `FUSE_DIRECT_IO_ALLOW_MMAP` every read goes through it). Left
//! alone, that second copy of the model grows like the source's page cache would, which defeats
//! the byte budget. Pages a reader touches again are refetched from the tierfs cache, not the
//! disk.
//!
//! The window is [`window_for_budget`]: a tenth of the budget, at least 8 MiB (a few readahead
//! windows) and at most 64 MiB.
//!
//! **Fresh ranges are spared.** A range served in the last [`FRESH`] is not invalidated while
//! the recorded total stays under the window plus a headroom: pages the kernel has just read for
//! an `mmap` fault may not be mapped yet, and dropping them made many `mmap` readers livelock
//! ([measured](../../docs/PERFORMANCE.md#page-cache-of-the-mounted-files)). The headroom follows
//! the mount's readahead ([`headroom_for_readahead`]): what must be spared is the read-around of
//! the faults in flight, one readahead window each; a fixed headroom sized for 4 MiB windows
//! overshot the memory bound at the 128 KiB default
//! ([measured](../../docs/PERFORMANCE.md#page-cache-of-the-mounted-files)). All of these are a
//! [`KernelCacheConfig`].

use crate::sync::{lock, Mutex};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A byte range of one inode of the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeRange {
    pub ino: u64,
    pub offset: u64,
    pub len: u64,
}

/// How long a served range is spared (see the module docs): far longer than a fault takes to
/// map pages once they are read (microseconds to a few milliseconds, tens under heavy load),
/// short enough that a reader streaming at 1 GB/s keeps at most a few hundred MiB "fresh",
/// which the headroom then caps.
pub const FRESH: Duration = Duration::from_millis(500);

/// The most fresh ranges may take the recorded total past the window: a dozen 4 MiB readahead
/// windows in flight at once. It keeps window + headroom under the 64 MiB of page cache the
/// memory bound allows on top of a tenth of the budget, with 16 MiB left for the daemon's own
/// memory beside its cache.
pub const MAX_FRESH_HEADROOM: u64 = 48 << 20;

/// The least headroom: 64 faults of 128 KiB (the default readahead) in flight, four per reader
/// of the stress test's sixteen.
pub const MIN_FRESH_HEADROOM: u64 = 8 << 20;

/// Readahead windows of fresh ranges spared past the window: two per reader of the stress test
/// (a fault being mapped and the next one's read-around).
pub const FRESH_WINDOWS: u64 = 32;

/// How far past the window fresh ranges may take the recorded total for a mount whose kernel
/// readahead is `readahead` bytes (see the module docs).
pub fn headroom_for_readahead(readahead: u64) -> u64 {
    KernelCacheConfig::default().headroom_for_readahead(readahead)
}

/// A served range and when it was (last) extended.
#[derive(Debug, Clone, Copy)]
struct Served {
    range: InodeRange,
    at: Instant,
}

/// Adjacent reads are merged into one range up to this length: large enough that a sequential
/// reader produces few entries, small enough that invalidating the oldest range never drops more
/// than a sliver of the window.
pub const MAX_RANGE_BYTES: u64 = 2 << 20;

/// The window is this share of the cache budget (a tenth)...
pub const WINDOW_SHARE: u64 = 10;

/// ...at least a few readahead windows...
pub const MIN_WINDOW: u64 = 8 << 20;

/// ...and at most 64 MiB.
pub const MAX_WINDOW: u64 = 64 << 20;

/// The window for a cache budget (see the module docs), by the default [`KernelCacheConfig`].
pub fn window_for_budget(budget: u64) -> u64 {
    KernelCacheConfig::default().window_for_budget(budget)
}

/// The window's sizes and clocks; [`Default`] is the constants above, which give each a reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCacheConfig {
    /// How long a served range is spared ([`FRESH`]).
    pub fresh: Duration,
    /// Adjacent reads merge into one range up to this length ([`MAX_RANGE_BYTES`]).
    pub max_range_bytes: u64,
    /// The window is `1 / window_share` of the budget ([`WINDOW_SHARE`])...
    pub window_share: u64,
    /// ...at least this ([`MIN_WINDOW`])...
    pub min_window: u64,
    /// ...and at most this ([`MAX_WINDOW`]).
    pub max_window: u64,
    /// Readahead windows of fresh ranges spared past the window ([`FRESH_WINDOWS`])...
    pub fresh_windows: u64,
    /// ...at least this many bytes ([`MIN_FRESH_HEADROOM`])...
    pub min_fresh_headroom: u64,
    /// ...and at most this many ([`MAX_FRESH_HEADROOM`]).
    pub max_fresh_headroom: u64,
}

impl Default for KernelCacheConfig {
    fn default() -> Self {
        KernelCacheConfig {
            fresh: FRESH,
            max_range_bytes: MAX_RANGE_BYTES,
            window_share: WINDOW_SHARE,
            min_window: MIN_WINDOW,
            max_window: MAX_WINDOW,
            fresh_windows: FRESH_WINDOWS,
            min_fresh_headroom: MIN_FRESH_HEADROOM,
            max_fresh_headroom: MAX_FRESH_HEADROOM,
        }
    }
}

impl KernelCacheConfig {
    /// The window for a cache budget (see the module docs).
    pub fn window_for_budget(&self, budget: u64) -> u64 {
        (budget / self.window_share.max(1))
            .clamp(self.min_window, self.max_window.max(self.min_window))
    }

    /// How far past the window fresh ranges may take the recorded total for a mount whose
    /// kernel readahead is `readahead` bytes (see the module docs).
    pub fn headroom_for_readahead(&self, readahead: u64) -> u64 {
        readahead.saturating_mul(self.fresh_windows).clamp(
            self.min_fresh_headroom,
            self.max_fresh_headroom.max(self.min_fresh_headroom),
        )
    }
}

/// Served ranges, oldest first, and what to invalidate to stay within the window.
#[derive(Debug)]
pub struct KernelCacheWindow {
    limit: u64,
    headroom: u64,
    /// [`KernelCacheConfig::fresh`].
    fresh: Duration,
    /// [`KernelCacheConfig::max_range_bytes`].
    max_range_bytes: u64,
    ranges: Mutex<(VecDeque<Served>, u64)>,
}

impl KernelCacheWindow {
    /// A window of `limit` bytes with the largest headroom (any readahead).
    pub fn new(limit: u64) -> KernelCacheWindow {
        KernelCacheWindow::with_headroom(limit, MAX_FRESH_HEADROOM)
    }

    /// A window of `limit` bytes whose fresh ranges may take it `headroom` bytes further.
    pub fn with_headroom(limit: u64, headroom: u64) -> KernelCacheWindow {
        KernelCacheWindow::with_config(limit, headroom, &KernelCacheConfig::default())
    }

    /// [`Self::with_headroom`], sparing fresh ranges and merging reads as `config` says.
    pub fn with_config(limit: u64, headroom: u64, config: &KernelCacheConfig) -> KernelCacheWindow {
        KernelCacheWindow {
            limit,
            headroom,
            fresh: config.fresh,
            max_range_bytes: config.max_range_bytes,
            ranges: Mutex::new((VecDeque::new(), 0)),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The most the recorded ranges (and so the mounted files' page cache) can total.
    pub fn hard_limit(&self) -> u64 {
        self.limit + self.headroom
    }

    /// Records that `len` bytes at `offset` of `ino` were served; returns the ranges that now
    /// fall out of the window and should be dropped from the kernel's cache.
    pub fn record(&self, ino: u64, offset: u64, len: u64) -> Vec<InodeRange> {
        self.record_at(ino, offset, len, Instant::now())
    }

    fn record_at(&self, ino: u64, offset: u64, len: u64, now: Instant) -> Vec<InodeRange> {
        let mut guard = lock(&self.ranges);
        let (ranges, total) = &mut *guard;
        match ranges.back_mut() {
            Some(last)
                if last.range.ino == ino
                    && last.range.offset + last.range.len == offset
                    && last.range.len + len <= self.max_range_bytes =>
            {
                last.range.len += len;
                last.at = now;
            }
            _ => ranges.push_back(Served {
                range: InodeRange { ino, offset, len },
                at: now,
            }),
        }
        *total += len;
        let mut expired = Vec::new();
        while *total > self.limit && ranges.len() > 1 {
            let Some(oldest) = ranges.front() else {
                break;
            };
            let fresh = now.saturating_duration_since(oldest.at) < self.fresh;
            if fresh && *total <= self.hard_limit() {
                break;
            }
            *total -= oldest.range.len;
            expired.push(oldest.range);
            ranges.pop_front();
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each range a second after the previous one, so earlier ones are never fresh.
    struct Clock(Instant);

    impl Clock {
        fn record(
            &mut self,
            window: &KernelCacheWindow,
            ino: u64,
            offset: u64,
            len: u64,
        ) -> Vec<InodeRange> {
            self.0 += Duration::from_secs(1);
            window.record_at(ino, offset, len, self.0)
        }
    }

    #[test]
    fn sequential_reads_merge_and_expire_oldest_first() {
        let window = KernelCacheWindow::new(8 << 20);
        let mut clock = Clock(Instant::now());
        let mut expired = Vec::new();
        for i in 0..128u64 {
            expired.extend(clock.record(&window, 7, i * (128 << 10), 128 << 10));
        }
        // 16 MiB read through an 8 MiB window: about 8 MiB expired, in 2 MiB merged ranges,
        // starting at the beginning of the file, in order.
        let bytes: u64 = expired.iter().map(|r| r.len).sum();
        assert!((6 << 20..=8 << 20).contains(&bytes), "{bytes}");
        assert_eq!(
            expired[0],
            InodeRange {
                ino: 7,
                offset: 0,
                len: 2 << 20
            }
        );
        assert!(expired
            .windows(2)
            .all(|w| w[0].offset + w[0].len == w[1].offset));
    }

    #[test]
    fn interleaved_files_do_not_merge() {
        let window = KernelCacheWindow::new(1 << 20);
        let mut clock = Clock(Instant::now());
        assert!(clock.record(&window, 1, 0, 512 << 10).is_empty());
        assert!(clock.record(&window, 2, 512 << 10, 512 << 10).is_empty());
        let expired = clock.record(&window, 1, 512 << 10, 512 << 10);
        assert_eq!(
            expired,
            vec![InodeRange {
                ino: 1,
                offset: 0,
                len: 512 << 10
            }]
        );
    }

    #[test]
    fn fresh_ranges_are_spared_up_to_the_hard_limit() {
        let window = KernelCacheWindow::new(8 << 20);
        let now = Instant::now();
        // 40 MiB served at once, in 1 MiB pieces of different files: all fresh, all kept.
        for i in 0..40u64 {
            assert!(window.record_at(i, 0, 1 << 20, now).is_empty(), "piece {i}");
        }
        // Past window + headroom, the oldest go even though fresh, down to the hard limit.
        let mut expired = Vec::new();
        for i in 40..64u64 {
            expired.extend(window.record_at(i, 0, 1 << 20, now));
        }
        assert_eq!(expired.len(), 64 - 56);
        assert_eq!(expired[0].ino, 0);
        // Once they age, the next record trims everything beyond the window.
        let later = now + FRESH + Duration::from_millis(1);
        let expired = window.record_at(99, 0, 1 << 20, later);
        assert_eq!(expired.len(), 56 + 1 - 8);
        assert_eq!(window.hard_limit(), 56 << 20);
    }

    #[test]
    fn the_config_sets_merging_sparing_and_sizes() {
        let config = KernelCacheConfig {
            fresh: Duration::ZERO,
            max_range_bytes: 512 << 10,
            window_share: 4,
            fresh_windows: 8,
            ..KernelCacheConfig::default()
        };
        assert_eq!(config.window_for_budget(128 << 20), 32 << 20);
        assert_eq!(config.headroom_for_readahead(2 << 20), 16 << 20);
        let window = KernelCacheWindow::with_config(1 << 20, 48 << 20, &config);
        let now = Instant::now();
        let mut expired = Vec::new();
        for i in 0..12u64 {
            expired.extend(window.record_at(7, i * (128 << 10), 128 << 10, now));
        }
        // Nothing is fresh, so the headroom spares nothing: 1.5 MiB read through a 1 MiB
        // window expires its oldest 512 KiB merged range.
        assert_eq!(
            expired,
            vec![InodeRange {
                ino: 7,
                offset: 0,
                len: 512 << 10
            }]
        );
    }

    #[test]
    fn window_scales_with_budget_within_bounds() {
        assert_eq!(window_for_budget(0), 8 << 20);
        assert_eq!(window_for_budget(256 << 20), (256 << 20) / 10);
        assert_eq!(window_for_budget(16 << 30), 64 << 20);
    }

    #[test]
    fn headroom_follows_the_readahead_within_bounds() {
        assert_eq!(headroom_for_readahead(128 << 10), MIN_FRESH_HEADROOM);
        assert_eq!(headroom_for_readahead(512 << 10), 16 << 20);
        assert_eq!(headroom_for_readahead(4 << 20), MAX_FRESH_HEADROOM);
        assert_eq!(headroom_for_readahead(u64::MAX), MAX_FRESH_HEADROOM);
        let window = KernelCacheWindow::with_headroom(8 << 20, headroom_for_readahead(128 << 10));
        assert_eq!(window.hard_limit(), 16 << 20);
        let now = Instant::now();
        let expired: usize = (0..20u64)
            .map(|i| window.record_at(i, 0, 1 << 20, now).len())
            .sum();
        assert_eq!(expired, 4, "fresh ranges past window + headroom go");
    }
}
