//! The tuning of the model store ([`ModelsConfig`]): sizes and thresholds of the header read,
//! the probe and spill checks and `O_DIRECT` serving. [`ModelsConfig::default`] is what the
//! daemon runs with; tests vary the fields through [`super::ModelStore::with_config`].

use super::table::{DEFAULT_INDEX_CAP, TRIM_AFTER_EVICTED_BYTES};
use super::{runs, sequence};

/// Tuning of a [`super::ModelStore`]. Each field's default is the value the daemon runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelsConfig {
    /// The smallest `O_DIRECT` request served exactly when its file is larger than the chunk
    /// cache ([`super::ModelStore::read_direct`]): 256 KiB, the pieces that carried 99.9 % of
    /// runai-model-streamer's bytes, while smaller pieces gain from whole chunks and prefetch
    /// ([measured](../../../docs/PERFORMANCE.md#o_direct-requests-served-exactly)).
    pub direct_exact_min: u64,
    /// Bytes read at first open in the hope that they hold the whole header: 256 KiB, as most
    /// checkpoint headers are 10–200 KiB; a larger one is read exactly in a second request.
    pub header_probe_bytes: u64,
    /// Bytes just past the header kept in memory with it (from the same probe read): 64 KiB,
    /// so that a buffered header reader, which reads a little past the header, is served
    /// without a chunk fetch and without starting prefetch.
    pub header_tail_bytes: usize,
    /// How far into a block kernel readahead past the end of the previous one reaches, at
    /// most ([`super::ModelFile::is_spill`]): 512 KiB, room for an `mmap` fault's read-around
    /// and the async window ahead of it (one or two readahead sizes, 128 KiB by default), with
    /// margin ([measured](../../../docs/PERFORMANCE.md#readahead-spilling-into-a-block-not-next)).
    pub spill_bytes: u64,
    /// A run of requests becomes a stream once it covers this many bytes ([`super::runs`]):
    /// 1 MiB, more than one `mmap` fault's read-around, so that touching one page of a tensor
    /// never looks like a stream ([measured](../../../docs/PERFORMANCE.md#probes-and-streams)).
    pub stream_after: u64,
    /// Cap on the memory of known files' headers and indexes (`--index-cache`;
    /// [`DEFAULT_INDEX_CAP`], see [`super::table`]).
    pub index_cap: u64,
    /// Evicted header bytes after which the allocator is asked to return free memory
    /// (`malloc_trim`): 16 MiB, one walk of the arenas per 16 MiB of headers indexed
    /// ([measured](../../../docs/PERFORMANCE.md#heap-trimming-after-index-evictions)).
    pub trim_after_evicted_bytes: u64,
    /// The share of the budget warmed of the model that followed the one just closed
    /// (`budget / next_model_head_share`, see [`super::sequence`]): an eighth, enough for its
    /// first blocks without pushing out much of what the budget keeps of the others.
    pub next_model_head_share: u64,
    /// Runs of requests remembered per file ([`super::runs`]): 16, one per thread of a
    /// multi-threaded reader (8 threads of 2 MiB `pread`s) and one for kernel readahead, twice.
    pub runs_per_file: usize,
    /// How far behind a run's start a request may begin and still continue it: 8 MiB, as an
    /// `mmap` fault's read-around centres on the faulting page (half a window of at most 8 MiB).
    pub run_back_slack: u64,
    /// How far past a run's end a request may begin and still continue it: 256 KiB, the small
    /// gaps readers skip (alignment padding between tensors, a page the page cache had).
    pub run_forward_gap: u64,
}

impl ModelsConfig {
    /// What the daemon runs with ([`Default`]), usable in constants.
    pub const DEFAULT: ModelsConfig = ModelsConfig {
        direct_exact_min: 256 << 10,
        header_probe_bytes: 256 << 10,
        header_tail_bytes: 64 << 10,
        spill_bytes: 512 << 10,
        stream_after: runs::STREAM_AFTER,
        index_cap: DEFAULT_INDEX_CAP,
        trim_after_evicted_bytes: TRIM_AFTER_EVICTED_BYTES,
        next_model_head_share: sequence::HEAD_SHARE,
        runs_per_file: runs::RUNS,
        run_back_slack: runs::BACK_SLACK,
        run_forward_gap: runs::FORWARD_GAP,
    };
}

impl Default for ModelsConfig {
    fn default() -> ModelsConfig {
        ModelsConfig::DEFAULT
    }
}
