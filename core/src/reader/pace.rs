//! Whether a reader computes between blocks, and when the prefetch of the block ahead runs.
//!
//! Contract: at each block entry, the *pause* is the time since the last read of the file
//! ended and the *reading time* is how long the reader took over the block it left; the reader
//! *computes* if the pause is at least [`MIN_PAUSE`] and at least [`MIN_PAUSE_SHARE`] of the
//! reading time. Only a computing reader gets a whole transformer block held ahead
//! ([`super::Prefetcher::entered_block_in`]), and for it the prefetch of that block waits until
//! the reader pauses ([`ReaderPace::wait_until_paused`]: no read ended for [`IDLE`], at most
//! [`MAX_DEFER`]), so the source is read while the reader computes rather than while it reads.
//! One file has one pace, shared by all its readers (as it has one current block): two readers
//! interleaving on one file look like one that does not pause, and get the ordinary lead.
//!
//! Why: a block held ahead pays only when the reader spends time away from the file (a
//! block-swapping pipeline running the block it just read). A reader that never pauses (a
//! loader copying weights, `cat`, a repeated pass) is held back by the disk alone, and a block
//! held ahead is a block less of the resident set its later passes keep. Deferring the read to
//! the reader's pause keeps the two from competing for the CPU where reading the source costs
//! CPU (a RAM-backed device, a small machine).
//!
//! The thresholds: a streaming reader computing 1.2–1.5× a block's disk time pauses 70–280 ms
//! per 53–210 MB block at 1 GB/s; a reader that does not compute pauses tens of microseconds
//! between requests (a few milliseconds on a loaded machine). Measured with the acceptance
//! benchmark (parts 3 and 5, `tests/bench/acceptance-results.md`): repeated passes read 1.13 ×
//! (model − budget) per later pass without the lead for non-computing readers, 1.14–1.16 with
//! it; the cold streaming pass stalled 3.2 points above the pass from RAM with the deferral and
//! 5.7 without (53 MB blocks, 2 GiB budget, 2 cores).
//!
//! Times are nanoseconds since the pace was created, so they fit atomics; 0 means "never". The
//! `_at` methods take the time from the caller, which is how tests drive it without sleeping.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shortest pause between blocks that counts as compute: 5 ms is 5 MB of disk time at 1 GB/s,
/// far above the gap between two requests of a reader that does not compute, and far below the
/// 70 ms a reader computing on 50 MB blocks pauses.
pub const MIN_PAUSE: Duration = Duration::from_millis(5);

/// The pause must also be at least this share (1/4) of the time the reader took to read the
/// block it left: compute worth a lead is comparable to the reading, not a small fraction of it.
pub const MIN_PAUSE_SHARE: u64 = 4;

/// A computing reader counts as paused once no read of its file has ended for 2 ms (its reads
/// end every few hundred microseconds while it reads).
pub const IDLE: Duration = Duration::from_millis(2);

/// Longest a prefetch of a block ahead waits for a computing reader to pause: 50 ms is a quarter
/// of a 200 MB block's disk time at 1 GB/s, and a reader that reads longer than that without
/// pausing is not waited for.
pub const MAX_DEFER: Duration = Duration::from_millis(50);

/// How one file's reader is paced.
#[derive(Debug)]
pub struct ReaderPace {
    born: Instant,
    /// When the last read of the file ended (ns since `born`, 0: never).
    last_read_end: AtomicU64,
    /// When the reader entered its current block (ns since `born`, 0: never).
    block_entered: AtomicU64,
    /// Whether the reader paused to compute before entering its current block.
    computing: AtomicBool,
}

impl Default for ReaderPace {
    fn default() -> Self {
        ReaderPace {
            born: Instant::now(),
            last_read_end: AtomicU64::new(0),
            block_entered: AtomicU64::new(0),
            computing: AtomicBool::new(false),
        }
    }
}

impl ReaderPace {
    /// A read of the file ended now.
    pub fn read_done(&self) {
        self.read_done_at(self.now());
    }

    /// A read of the file ended at `at` (ns since the pace was created).
    pub fn read_done_at(&self, at: u64) {
        self.last_read_end.fetch_max(at, Ordering::Relaxed);
    }

    /// The reader entered a block now.
    pub fn entered_block(&self) {
        self.entered_block_at(self.now());
    }

    /// The reader entered a block at `at`: judges the pause that led into it.
    pub fn entered_block_at(&self, at: u64) {
        let entered = self.block_entered.swap(at, Ordering::Relaxed);
        let last_end = self.last_read_end.load(Ordering::Relaxed);
        let computing = entered != 0 && last_end > entered && {
            let pause = at.saturating_sub(last_end);
            let reading = last_end - entered;
            pause >= MIN_PAUSE.as_nanos() as u64 && pause.saturating_mul(MIN_PAUSE_SHARE) >= reading
        };
        self.computing.store(computing, Ordering::Relaxed);
    }

    /// Whether the reader paused to compute before entering its current block.
    pub fn computing(&self) -> bool {
        self.computing.load(Ordering::Relaxed)
    }

    /// Returns once no read of the file has ended for [`IDLE`], or after [`MAX_DEFER`]; returns
    /// how many times it slept (tests).
    pub fn wait_until_paused(&self) -> u32 {
        let deadline = Instant::now() + MAX_DEFER;
        let idle = IDLE.as_nanos() as u64;
        let mut naps = 0;
        let reading = || {
            let last_end = self.last_read_end.load(Ordering::Relaxed);
            last_end != 0 && self.now().saturating_sub(last_end) < idle
        };
        while reading() && Instant::now() < deadline {
            std::thread::sleep(IDLE / 2);
            naps += 1;
        }
        naps
    }

    /// Now, in ns since the pace was created (at least 1, since 0 means "never").
    fn now(&self) -> u64 {
        (self.born.elapsed().as_nanos() as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Enters `blocks` blocks, each read for `reading` ms (reads ending every ms) then followed
    /// by a pause of `pause` ms; returns what the pace said at each entry after the first.
    fn walk(pace: &ReaderPace, blocks: usize, reading: u64, pause: u64) -> Vec<bool> {
        let mut t = 10 * MS;
        let mut seen = Vec::new();
        for i in 0..blocks {
            pace.entered_block_at(t);
            if i > 0 {
                seen.push(pace.computing());
            }
            for _ in 0..reading {
                t += MS;
                pace.read_done_at(t);
            }
            t += pause * MS;
        }
        seen
    }

    #[test]
    fn a_reader_pausing_between_blocks_computes() {
        // Part 3 of the acceptance benchmark: 210 MB read in 210 ms from disk, computed for 280 ms.
        assert_eq!(walk(&ReaderPace::default(), 4, 210, 280), [true; 3]);
        // The same blocks found in memory: read in 70 ms.
        assert_eq!(walk(&ReaderPace::default(), 4, 70, 280), [true; 3]);
    }

    #[test]
    fn a_reader_without_pauses_does_not_compute() {
        assert_eq!(walk(&ReaderPace::default(), 4, 200, 0), [false; 3]);
        // Pauses shorter than MIN_PAUSE (a loaded machine) are not compute.
        assert_eq!(walk(&ReaderPace::default(), 4, 10, 4), [false; 3]);
    }

    #[test]
    fn a_pause_short_next_to_the_reading_is_not_compute() {
        // 8 ms of pause after 100 ms of reading: above MIN_PAUSE, below a quarter.
        assert_eq!(walk(&ReaderPace::default(), 3, 100, 8), [false; 2]);
        assert_eq!(walk(&ReaderPace::default(), 3, 100, 25), [true; 2]);
    }

    #[test]
    fn nothing_is_known_before_a_block_was_read() {
        let pace = ReaderPace::default();
        pace.entered_block_at(MS);
        assert!(!pace.computing(), "first block");
        pace.entered_block_at(500 * MS);
        assert!(!pace.computing(), "no read in the block left");
    }

    #[test]
    fn a_paused_reader_is_not_waited_for() {
        let pace = ReaderPace::default();
        assert_eq!(pace.wait_until_paused(), 0, "no read yet");
        std::thread::sleep(IDLE);
        pace.read_done_at(1);
        assert_eq!(pace.wait_until_paused(), 0, "last read long ago");
    }

    #[test]
    fn a_reader_that_keeps_reading_is_waited_for_at_most_max_defer() {
        let pace = ReaderPace::default();
        pace.read_done_at(u64::MAX / 2); // a read that ends "now" forever
        let started = Instant::now();
        assert!(pace.wait_until_paused() > 0);
        assert!(started.elapsed() >= MAX_DEFER);
    }

    #[test]
    fn a_reader_that_stops_pausing_loses_the_flag() {
        let pace = ReaderPace::default();
        assert_eq!(walk(&pace, 3, 50, 100), [true; 2]);
        // Reads went on right into the next block.
        let t = 10 * MS + 3 * 150 * MS;
        pace.entered_block_at(t);
        pace.read_done_at(t + 50 * MS);
        pace.entered_block_at(t + 50 * MS);
        assert!(!pace.computing());
    }
}
