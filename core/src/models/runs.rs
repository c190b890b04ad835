//! Telling a reader that streams through a region from one that probes it.
//!
//! A loader built on `mmap` (safetensors, transformers, ComfyUI) first touches the first page
//! of every tensor, in name order, and only then copies the weights in module order. Served
//! through the chunk cache, each touch would load a whole chunk and start prefetching its block,
//! reading most of a file larger than the budget before a single weight is copied
//! ([measured](../../../docs/PERFORMANCE.md#probes-and-streams)).
//!
//! So each file remembers its recent *runs*: ranges that successive requests extended. A
//! request that starts a new run, or continues one still shorter than [`STREAM_AFTER`], is a
//! probe: if its chunk is not already in memory it is read uncached, just the requested
//! bytes, without prefetch and without counting as a visit of the block. Once a run reaches
//! [`STREAM_AFTER`], it is a stream and goes through the cache with prefetch as before. A
//! sequential reader pays for this once per run (its first megabyte is read in requests of
//! its own size instead of whole chunks), which is nothing next to a block.

use super::ModelsConfig;
use crate::sync::{lock, Mutex, MutexGuard};

/// Runs remembered per file: a multi-threaded reader (8 threads reading 2 MiB pieces) keeps
/// one run per thread, and kernel readahead adds one more; sixteen covers both twice.
pub const RUNS: usize = 16;

/// A run has become a stream once it covers this much: more than one `mmap` fault's
/// read-around, which spans the mount's readahead window (`--readahead`, 128 KiB by default),
/// so that touching one page of a tensor never looks like a stream. A megabyte is eight 128 KiB
/// requests; a sequential `read()` reader pays for it once per run (its first megabyte is read
/// as probes, in requests of its own size, and read again when the stream's chunks load).
/// A readahead raised to 1 MiB or more makes each fault's read-around a run of that size:
/// touches then look like streams ([measured](../../../docs/PERFORMANCE.md#probes-and-streams)).
pub const STREAM_AFTER: u64 = 1 << 20;

/// A request continues a run if it starts at most this far behind the run's start: mmap
/// read-around centres its window on the faulting page, so the first request of a sequential
/// mmap reader starts up to half the readahead window (at most 8 MiB here) before it.
pub const BACK_SLACK: u64 = 8 << 20;

/// A request continues a run if it starts at most this far past the run's end: readers skip
/// small gaps (alignment padding between tensors, a page the page cache already had).
pub const FORWARD_GAP: u64 = 256 << 10;

#[derive(Debug, Clone, Copy, Default)]
struct Run {
    start: u64,
    end: u64,
}

/// The recent runs of one file version.
#[derive(Debug, Default)]
pub struct Runs {
    state: Mutex<(Vec<Run>, usize)>,
}

impl Runs {
    /// Records the request `[offset, end)` and returns how long the run it continues was
    /// before it (0 for a new run). `config` gives how many runs are kept
    /// ([`ModelsConfig::runs_per_file`]) and how close a request must be to continue one
    /// ([`ModelsConfig::run_back_slack`], [`ModelsConfig::run_forward_gap`]).
    pub fn record(&self, offset: u64, end: u64, config: &ModelsConfig) -> u64 {
        let mut guard = self.lock();
        let (runs, next) = &mut *guard;
        let continues = runs.iter_mut().find(|r| {
            offset >= r.start.saturating_sub(config.run_back_slack)
                && offset <= r.end.saturating_add(config.run_forward_gap)
        });
        if let Some(run) = continues {
            let before = run.end - run.start;
            run.start = run.start.min(offset);
            run.end = run.end.max(end);
            return before;
        }
        let run = Run { start: offset, end };
        let kept = config.runs_per_file.max(1);
        if runs.len() < kept {
            runs.push(run);
        } else {
            let slot = *next % runs.len();
            runs[slot] = run;
            *next = (*next + 1) % kept;
        }
        0
    }

    /// Forgets every run (a new open: see `ModelFile::opened`).
    pub fn clear(&self) {
        *self.lock() = Default::default();
    }

    fn lock(&self) -> MutexGuard<'_, (Vec<Run>, usize)> {
        lock(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const KIB: u64 = 1 << 10;
    const DEFAULTS: ModelsConfig = ModelsConfig::DEFAULT;

    #[test]
    fn a_sequential_reader_becomes_a_stream_after_stream_after_bytes() {
        let runs = Runs::default();
        let requests = STREAM_AFTER / (128 * KIB);
        let before: Vec<u64> = (0..requests + 2)
            .map(|i| runs.record(i * 128 * KIB, (i + 1) * 128 * KIB, &DEFAULTS))
            .collect();
        assert_eq!(before[0], 0);
        assert!(before[..requests as usize]
            .iter()
            .all(|&b| b < STREAM_AFTER));
        assert!(before[requests as usize..]
            .iter()
            .all(|&b| b >= STREAM_AFTER));
    }

    #[test]
    fn touches_of_distant_tensors_stay_probes() {
        let runs = Runs::default();
        for i in 0..100 {
            let at = i * 40 * MIB;
            assert_eq!(runs.record(at, at + 4 * KIB, &DEFAULTS), 0, "touch {i}");
        }
    }

    #[test]
    fn mmap_read_around_before_the_fault_continues_the_run() {
        let runs = Runs::default();
        runs.record(100 * MIB, 102 * MIB, &DEFAULTS); // read-around of a fault at 101 MiB
        assert_eq!(runs.record(98 * MIB, 100 * MIB, &DEFAULTS), 2 * MIB);
        assert_eq!(runs.record(102 * MIB, 104 * MIB, &DEFAULTS), 4 * MIB);
    }

    #[test]
    fn threads_keep_their_own_runs() {
        let runs = Runs::default();
        let starts: Vec<u64> = (0..8).map(|t| t * 512 * MIB).collect();
        for &s in &starts {
            runs.record(s, s + 2 * MIB, &DEFAULTS);
        }
        for &s in &starts {
            assert_eq!(runs.record(s + 2 * MIB, s + 4 * MIB, &DEFAULTS), 2 * MIB);
        }
    }

    #[test]
    fn fewer_remembered_runs_forget_a_thread_sooner() {
        let starts: Vec<u64> = (0..8).map(|t| t * 512 * MIB).collect();
        let few = ModelsConfig {
            runs_per_file: 4,
            ..DEFAULTS
        };
        for (config, continued) in [(DEFAULTS, 8), (few, 0)] {
            let runs = Runs::default();
            for &s in &starts {
                runs.record(s, s + 2 * MIB, &config);
            }
            let still = starts
                .iter()
                .filter(|&&s| runs.record(s + 2 * MIB, s + 4 * MIB, &config) > 0)
                .count();
            assert_eq!(still, continued, "{} runs kept", config.runs_per_file);
        }
    }

    #[test]
    fn a_smaller_forward_gap_ends_a_run_at_a_gap() {
        let tight = ModelsConfig {
            run_forward_gap: 64 * KIB,
            ..DEFAULTS
        };
        for (config, before) in [(DEFAULTS, MIB), (tight, 0)] {
            let runs = Runs::default();
            runs.record(0, MIB, &config);
            assert_eq!(runs.record(MIB + 128 * KIB, 2 * MIB, &config), before);
        }
    }
}
