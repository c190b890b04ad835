//! Whether a reader computes between blocks, and when the prefetch of the block ahead runs.
//!
//! **Contract.** At each block start ([`ReaderPace::note_block_start`]), the *pause* is the time
//! since the last read of the file ended and the *reading time* is how long the reader took
//! over the block it left; the reader *computes* if the pause is at least
//! [`PaceConfig::min_pause`] and at least `1 / min_pause_share` of the reading time. Only a
//! computing reader gets a whole transformer block held ahead
//! ([`crate::prefetch::Prefetcher::queue_after_block_entry_in`]), and for it the prefetch of
//! that block waits until the reader pauses ([`ReaderPace::wait_until_paused`]: no read ended
//! for [`PaceConfig::idle`], at most [`PaceConfig::max_defer`]), so the source is read while
//! the reader computes rather than while it reads. One file has one pace, shared by all its
//! readers (as it has one current block): two readers interleaving on one file look like one
//! that does not pause, and get the ordinary lead.
//!
//! Why: a block held ahead pays only when the reader spends time away from the file (a
//! block-swapping pipeline running the block it just read); for a reader that never pauses
//! (a loader, `cat`, a repeated pass) it is a block less of the resident set. Deferring the read
//! to the pause keeps the two from competing for the CPU where reading the source costs CPU
//! ([measured](../../../docs/PERFORMANCE.md#reader-pace-and-the-background-pool)).
//!
//! No locks: times are nanoseconds since the pace was created, in atomics; 0 means "never".
//! The `_at` methods take the time from the caller, which is how tests drive it without
//! sleeping.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a reader's pace is judged; [`Default`] is what the daemon runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaceConfig {
    /// Shortest pause between blocks that counts as compute: 5 ms is 5 MB of disk time at
    /// 1 GB/s, far above the gap between two requests of a reader that does not compute, and
    /// far below the 70 ms a reader computing on 50 MB blocks pauses.
    pub min_pause: Duration,
    /// The pause must also be at least `1 / min_pause_share` (a quarter) of the time the reader
    /// took to read the block it left: compute worth a lead is comparable to the reading.
    pub min_pause_share: u64,
    /// A computing reader counts as paused once no read of its file has ended for this long
    /// (2 ms: its reads end every few hundred microseconds while it reads).
    pub idle: Duration,
    /// Longest a prefetch of a block ahead waits for a computing reader to pause: 50 ms is a
    /// quarter of a 200 MB block's disk time at 1 GB/s.
    pub max_defer: Duration,
}

impl Default for PaceConfig {
    fn default() -> Self {
        PaceConfig {
            min_pause: Duration::from_millis(5),
            min_pause_share: 4,
            idle: Duration::from_millis(2),
            max_defer: Duration::from_millis(50),
        }
    }
}

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
    config: PaceConfig,
}

impl Default for ReaderPace {
    fn default() -> Self {
        ReaderPace::with_config(PaceConfig::default())
    }
}

impl ReaderPace {
    /// A pace judged by `config`.
    pub fn with_config(config: PaceConfig) -> ReaderPace {
        ReaderPace {
            born: Instant::now(),
            last_read_end: AtomicU64::new(0),
            block_entered: AtomicU64::new(0),
            computing: AtomicBool::new(false),
            config,
        }
    }

    /// A read of the file ended now.
    pub fn read_done(&self) {
        self.read_done_at(self.now());
    }

    /// A read of the file ended at `at` (ns since the pace was created).
    pub fn read_done_at(&self, at: u64) {
        self.last_read_end.fetch_max(at, Ordering::Relaxed);
    }

    /// The reader started a block now: judges the pause that led into it.
    pub fn note_block_start(&self) {
        self.note_block_start_at(self.now());
    }

    /// The reader started a block at `at`: judges the pause that led into it.
    pub fn note_block_start_at(&self, at: u64) {
        let entered = self.block_entered.swap(at, Ordering::Relaxed);
        let last_end = self.last_read_end.load(Ordering::Relaxed);
        let computing = entered != 0 && last_end > entered && {
            let pause = at.saturating_sub(last_end);
            let reading = last_end - entered;
            let config = &self.config;
            pause >= config.min_pause.as_nanos() as u64
                && pause.saturating_mul(config.min_pause_share) >= reading
        };
        self.computing.store(computing, Ordering::Relaxed);
    }

    /// Whether the reader paused to compute before entering its current block.
    pub fn computing(&self) -> bool {
        self.computing.load(Ordering::Relaxed)
    }

    /// Returns once no read of the file has ended for [`PaceConfig::idle`], or after
    /// [`PaceConfig::max_defer`]; returns
    /// how many times it slept (tests).
    pub fn wait_until_paused(&self) -> u32 {
        let deadline = Instant::now() + self.config.max_defer;
        let idle = self.config.idle.as_nanos() as u64;
        let mut naps = 0;
        let reading = || {
            let last_end = self.last_read_end.load(Ordering::Relaxed);
            last_end != 0 && self.now().saturating_sub(last_end) < idle
        };
        while reading() && Instant::now() < deadline {
            std::thread::sleep(self.config.idle / 2);
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
            pace.note_block_start_at(t);
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
        // Pauses shorter than `min_pause` (a loaded machine) are not compute.
        assert_eq!(walk(&ReaderPace::default(), 4, 10, 4), [false; 3]);
    }

    #[test]
    fn a_pause_short_next_to_the_reading_is_not_compute() {
        // 8 ms of pause after 100 ms of reading: above `min_pause`, below a quarter.
        assert_eq!(walk(&ReaderPace::default(), 3, 100, 8), [false; 2]);
        assert_eq!(walk(&ReaderPace::default(), 3, 100, 25), [true; 2]);
    }

    #[test]
    fn nothing_is_known_before_a_block_was_read() {
        let pace = ReaderPace::default();
        pace.note_block_start_at(MS);
        assert!(!pace.computing(), "first block");
        pace.note_block_start_at(500 * MS);
        assert!(!pace.computing(), "no read in the block left");
    }

    #[test]
    fn a_paused_reader_is_not_waited_for() {
        let pace = ReaderPace::default();
        assert_eq!(pace.wait_until_paused(), 0, "no read yet");
        std::thread::sleep(PaceConfig::default().idle);
        pace.read_done_at(1);
        assert_eq!(pace.wait_until_paused(), 0, "last read long ago");
    }

    #[test]
    fn a_reader_that_keeps_reading_is_waited_for_at_most_max_defer() {
        let pace = ReaderPace::default();
        pace.read_done_at(u64::MAX / 2); // a read that ends "now" forever
        let started = Instant::now();
        assert!(pace.wait_until_paused() > 0);
        assert!(started.elapsed() >= PaceConfig::default().max_defer);
    }

    #[test]
    fn a_reader_that_stops_pausing_loses_the_flag() {
        let pace = ReaderPace::default();
        assert_eq!(walk(&pace, 3, 50, 100), [true; 2]);
        // Reads went on right into the next block.
        let t = 10 * MS + 3 * 150 * MS;
        pace.note_block_start_at(t);
        pace.read_done_at(t + 50 * MS);
        pace.note_block_start_at(t + 50 * MS);
        assert!(!pace.computing());
    }

    /// [`PaceConfig::min_pause`] decides which pauses count as compute.
    #[test]
    fn the_shortest_pause_is_configurable() {
        // 8 ms of pause after 20 ms of reading: compute by default (above 5 ms and a quarter).
        assert_eq!(walk(&ReaderPace::default(), 3, 20, 8), [true; 2]);
        let strict = ReaderPace::with_config(PaceConfig {
            min_pause: Duration::from_millis(10),
            ..PaceConfig::default()
        });
        assert_eq!(walk(&strict, 3, 20, 8), [false; 2]);
    }
}
