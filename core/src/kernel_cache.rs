//! Keeping the kernel's page cache of the *mounted* files bounded.
//!
//! What an `mmap` reader faults in through the mount lands in the kernel page cache of the FUSE
//! file (model files are opened with `FOPEN_DIRECT_IO`, so plain `read()`s bypass it, but mmap
//! cannot; on kernels without `FUSE_DIRECT_IO_ALLOW_MMAP` every read goes through it). Left
//! alone, that second copy of the model grows like the source's page cache would, which defeats
//! the byte budget. So the adapter records each range it serves here, and once more than a
//! window's worth is recorded, the oldest ranges are handed back to be invalidated (FUSE
//! `NOTIFY_INVAL_INODE`; invalidating a range the kernel does not hold costs next to nothing).
//! Pages a reader touches again are refetched from the tierfs cache, not the disk.
//!
//! The window is [`window_for_budget`]: a tenth of the budget, at least 8 MiB (a few readahead
//! windows, so pages are not dropped before the reader copied them) and at most 64 MiB, so the
//! mounted files' page cache plus the tierfs cache stay within 1.1 × budget + 64 MiB.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

/// A byte range of one inode of the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeRange {
    pub ino: u64,
    pub offset: u64,
    pub len: u64,
}

/// Adjacent reads are merged into one range up to this length: large enough that a sequential
/// reader produces few entries, small enough that invalidating the oldest range never drops more
/// than a sliver of the window.
const MAX_RANGE_BYTES: u64 = 2 << 20;

/// The window for a cache budget (see the module docs).
pub fn window_for_budget(budget: u64) -> u64 {
    (budget / 10).clamp(8 << 20, 64 << 20)
}

/// Served ranges, oldest first, and what to invalidate to stay within the window.
#[derive(Debug)]
pub struct KernelCacheWindow {
    limit: u64,
    ranges: Mutex<(VecDeque<InodeRange>, u64)>,
}

impl KernelCacheWindow {
    pub fn new(limit: u64) -> KernelCacheWindow {
        KernelCacheWindow {
            limit,
            ranges: Mutex::new((VecDeque::new(), 0)),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Records that `len` bytes at `offset` of `ino` were served; returns the ranges that now
    /// fall out of the window and should be dropped from the kernel's cache.
    pub fn record(&self, ino: u64, offset: u64, len: u64) -> Vec<InodeRange> {
        let mut guard = self.ranges.lock().unwrap_or_else(PoisonError::into_inner);
        let (ranges, total) = &mut *guard;
        match ranges.back_mut() {
            Some(last)
                if last.ino == ino
                    && last.offset + last.len == offset
                    && last.len + len <= MAX_RANGE_BYTES =>
            {
                last.len += len
            }
            _ => ranges.push_back(InodeRange { ino, offset, len }),
        }
        *total += len;
        let mut expired = Vec::new();
        while *total > self.limit && ranges.len() > 1 {
            let Some(oldest) = ranges.pop_front() else {
                break;
            };
            *total -= oldest.len;
            expired.push(oldest);
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_reads_merge_and_expire_oldest_first() {
        let window = KernelCacheWindow::new(8 << 20);
        let mut expired = Vec::new();
        for i in 0..128u64 {
            expired.extend(window.record(7, i * (128 << 10), 128 << 10));
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
        assert!(window.record(1, 0, 512 << 10).is_empty());
        assert!(window.record(2, 512 << 10, 512 << 10).is_empty());
        let expired = window.record(1, 512 << 10, 512 << 10);
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
    fn window_scales_with_budget_within_bounds() {
        assert_eq!(window_for_budget(0), 8 << 20);
        assert_eq!(window_for_budget(256 << 20), (256 << 20) / 10);
        assert_eq!(window_for_budget(16 << 30), 64 << 20);
    }
}
