//! Telling a reader's requests apart: a *probe* (a touch of a tensor, a header scan, a
//! multi-threaded reader's first request after a jump) from a *stream* ([`super::runs`]), and a
//! *spill* (kernel readahead running past the end of a block into one the reader is not
//! heading for) from a reader's own read.
//!
//! **Contract.** Probes and spills are served exactly and uncached by the read path
//! ([`super::read`]): they load no chunk, start no prefetch and record no visit of a block. A
//! stream goes through the chunk cache with prefetch. The state these checks keep is per file
//! version (its recent runs, the block its last stream was in, whether it was streamed since
//! its last open), in atomics and the runs' own lock, and is reset at every reader's open
//! ([`ModelFile::opened`]).

use std::sync::atomic::Ordering;

use super::read::ReadKind;
use super::{ModelFile, ModelsConfig};

/// What a reader's request is ([`ModelFile::classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Request {
    /// Part of a stream: through the chunk cache, with prefetch.
    Stream,
    /// A probe, served exactly; `starts_run`: it continues no recent run (a tensor's touch,
    /// not a reader going on through one).
    Probe { starts_run: bool },
}

impl ModelFile {
    /// A process opened this version: its recent runs and stream are over as far as new
    /// readers go.
    ///
    /// Without this, a loader opening the file again (a second process, or the same one after
    /// unloading it) would inherit the previous load's last stream: its tensor touches would be
    /// served as stream reads, and prefetch would sweep the file ahead of them
    /// ([measured](../../../docs/PERFORMANCE.md#a-reloads-touches-are-probes)). A stream still
    /// running in another process pays one [`ModelsConfig::stream_after`] of probes to become
    /// a stream again.
    pub(super) fn opened(&self) {
        self.runs.clear();
        self.stream_block.store(usize::MAX, Ordering::Relaxed);
        self.streamed.store(false, Ordering::Relaxed);
        self.touches_since_open.store(0, Ordering::Relaxed);
        self.warmed_by_touches.store(false, Ordering::Relaxed);
        self.touch_ahead.reset();
        self.direct_reader_schedules.store(false, Ordering::Relaxed);
        if let Some(tracker) = self.tracker() {
            tracker.begin_session();
        }
    }

    /// Whether the request `[offset, end)`, whose data starts in chunk `chunk`, is a probe
    /// ([`super::runs`]): it does not continue a run of [`ModelsConfig::stream_after`] bytes,
    /// and its block is neither the one a stream of this file is in nor the next one in the
    /// order (other threads of a reader streaming that block, or a reader following a learned
    /// order, are no probes).
    pub(super) fn classify(
        &self,
        chunk: usize,
        (offset, end): (u64, u64),
        kind: ReadKind,
        config: &ModelsConfig,
    ) -> Request {
        let run_before = self.runs.record(offset, end, config);
        let probe = Request::Probe {
            starts_run: run_before == 0,
        };
        let (Some(tracker), Some(span)) = (self.tracker(), self.plan().and_then(|p| p.get(chunk)))
        else {
            return Request::Stream;
        };
        if run_before >= config.stream_after {
            if kind == ReadKind::Readahead && self.is_spill(chunk, offset, config.spill_bytes) {
                return probe;
            }
            self.stream_block.store(span.block, Ordering::Relaxed);
            return Request::Stream;
        }
        let streaming = self.stream_block.load(Ordering::Relaxed);
        if streaming == usize::MAX
            || (span.block != streaming && !tracker.follows(streaming, span.block))
        {
            return probe;
        }
        Request::Stream
    }

    /// Whether byte `offset`, in chunk `chunk`, is where a stream runs on in *file* order past
    /// the end of its block into one the reader is not heading for: within the first
    /// `spill_bytes` ([`super::ModelsConfig::spill_bytes`]) of a stretch of another block that
    /// is neither the stream's nor the next one in the order.
    ///
    /// Kernel readahead does that at the end of every tensor an `mmap` reader copies, and a
    /// checkpoint whose file order is not its loading order has a block boundary of that kind
    /// at nearly every block: loading the chunk there would read a block needed only later,
    /// evicted before its turn through a small budget
    /// ([measured](../../../docs/PERFORMANCE.md#readahead-spilling-into-a-block-not-next)).
    /// Such bytes are served like probes, exactly and uncached; a reader that really goes on
    /// into that block becomes its stream once past the first `spill_bytes`. Only readahead is
    /// judged so ([`super::ModelStore::read_readahead`]): a `read()` past a block's end is the
    /// reader's own and goes on into that block.
    pub(super) fn is_spill(&self, chunk: usize, offset: u64, spill_bytes: u64) -> bool {
        let (Some(tracker), Some(plan)) = (self.tracker(), self.plan()) else {
            return false;
        };
        let Some(span) = plan.get(chunk) else {
            return false;
        };
        let streaming = self.stream_block.load(Ordering::Relaxed);
        if streaming == usize::MAX
            || span.block == streaming
            || tracker.follows(streaming, span.block)
        {
            return false;
        }
        // Where this stretch of the block starts: back over the chunks of the same block that
        // touch each other, no further than `spill_bytes`.
        let mut start = span.start;
        let mut before = chunk;
        while offset.saturating_sub(start) < spill_bytes && before > 0 {
            match plan.get(before - 1) {
                Some(prev) if prev.block == span.block && prev.end == start => {
                    start = prev.start;
                    before -= 1;
                }
                _ => break,
            }
        }
        offset.saturating_sub(start) < spill_bytes
    }
}
