//! The read path: where every read of a model file is served, and what it triggers.
//!
//! **Contract.** A read returns exactly the bytes of `[offset, offset + len)` of the version the
//! handle opened (fewer only at end of file), copied as little as possible ([`ReadBytes`]). A
//! file's bytes fall in three regions, each served its own way:
//! - the header: from memory ([`ModelFile`]'s header, with the tail after it);
//! - the data region: cut into tensor-aligned chunks served through the mount-wide
//!   [`ChunkCache`](crate::cache::ChunkCache) ([`ModelStore::chunk_slice`]), unless the
//!   request is a probe or a spill ([`super::classify`]), or an `O_DIRECT` read of a file
//!   larger than the cache ([`ModelStore::read_direct`]): those are served exactly and
//!   uncached (but the touches of a model that fits, on a source that charges per request,
//!   warm it and are served through the cache: [`WARM_AFTER_TOUCHES`]);
//! - anything after the last tensor, and a raw file: from the source, uncached.
//!
//! **What a read triggers.** A read of a chunk records the reader's block
//! ([`ModelStore::touch`]); entering a block hands the prefetcher the blocks that follow, in
//! other shards of its model too ([`ModelStore::prefetch_on_block_entry`]), and every read of a
//! chunk lets sequential read-ahead go on, into the next shard at a shard's end
//! ([`ModelStore::after_read`]). A file's first stream since its open records it in the
//! sequence of models ([`ModelStore::first_stream`]). Probes and spills trigger none of this.
//! Counters are updated per file and mount-wide as the bytes are served. The read path holds
//! no lock of its own across I/O; the cache's locks are taken inside
//! [`ChunkCache`](crate::cache::ChunkCache).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::classify::Request;
use super::read_bytes::{Gathered, ReadBytes};
use super::shards::ShardedModel;
use super::store::OpenedBy;
#[cfg(doc)]
use super::ModelsConfig;
use super::{ModelFile, ModelStore};
use crate::cache::plan::ChunkSpan;
use crate::cache::{CacheError, Chunk, Outcome, Want};
use crate::prefetch::{Pacing, PrefetchTarget};
use crate::reader::Step;
use crate::source::SourceError;
use crate::stats::Counters;

/// Touches of a model since it was opened after which, on a source read in order, the model
/// is warmed if it fits the cache: more than a loader reading a few tensors sends, fewer than
/// the tensors of any diffusion model (hundreds), whose load touches them all
/// ([measured](../../../docs/PERFORMANCE.md#touches-of-a-model-that-fits)).
pub const WARM_AFTER_TOUCHES: u64 = 8;

/// How long a touch waits for the warm's read of its chunk when the mount has no source
/// deadline (`--source-timeout 0`).
const TOUCH_WAIT_UNBOUNDED: Duration = Duration::from_secs(30);

/// How often a touch waiting for the warm looks again: a small part of one request's time on
/// any source that charges per request (tens of milliseconds and more).
const TOUCH_WAIT_POLL: Duration = Duration::from_millis(1);

/// Who asked for a read: the reader itself, or the kernel's readahead into the mounted file's
/// page cache (an `mmap` reader's fault), whose part past a block's end may be a spill
/// ([`ModelFile::is_spill`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    Reader,
    Readahead,
}

/// A read could not be served (becomes EIO for that read only).
#[derive(Debug, Error)]
pub enum ReadError {
    #[error("internal error: chunk plan and offset disagree")]
    NoChunk,
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Cache(#[from] CacheError),
}

impl ModelStore {
    /// Reads up to `len` bytes at `offset` (fewer only at end of file).
    pub fn read(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        len: u32,
    ) -> Result<ReadBytes, ReadError> {
        self.read_as(file, offset, len, ReadKind::Reader)
    }

    /// [`Self::read`] for the kernel's readahead into the mounted file's page cache (an `mmap`
    /// reader's fault): the part past the end of a block, in a block the reader is not heading
    /// for, is served exactly and uncached ([`ModelFile::is_spill`]).
    pub fn read_readahead(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        len: u32,
    ) -> Result<ReadBytes, ReadError> {
        self.read_as(file, offset, len, ReadKind::Readahead)
    }

    fn read_as(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        len: u32,
        kind: ReadKind,
    ) -> Result<ReadBytes, ReadError> {
        let end = file.size().min(offset.saturating_add(u64::from(len)));
        if file.header_end().is_some_and(|h| offset < h) && end <= file.header.len() as u64 {
            // A header read, perhaps running a little into the data: all from memory.
            return Ok(ReadBytes::Owned(
                file.header[offset as usize..end as usize].to_vec(),
            ));
        }
        let in_data = file.header_end().is_some_and(|h| offset >= h);
        // The first chunk the request reads data from (a request may start in the header).
        let first_data_chunk = file.header_end().and_then(|h| {
            let plan = file.plan()?;
            (end > h).then(|| plan.chunk_at(offset.max(h))).flatten()
        });
        if let Some(first) = first_data_chunk {
            match file.classify(first, (offset, end), kind, &self.config) {
                Request::Probe { starts_run } => {
                    return self.read_probe(file, (offset, end), starts_run);
                }
                Request::Stream if file.remote => file.touch_ahead.note_continued(),
                Request::Stream => {}
            }
            // A load first: the swap writes, and every stream request of the file comes here.
            if !file.streamed.load(Ordering::Relaxed)
                && !file.streamed.swap(true, Ordering::Relaxed)
            {
                self.first_stream(file);
            }
        }
        let chunk = file
            .plan()
            .filter(|_| in_data)
            .and_then(|plan| plan.chunk_at(offset));
        if let Some(chunk) = chunk {
            // The common case, a kernel request inside one chunk: no copy here at all.
            let (bytes, range, stop) = self.chunk_slice(file, chunk, offset, end)?;
            if stop == end {
                self.after_read(file, chunk);
                return Ok(ReadBytes::Chunk { bytes, range });
            }
        }
        self.read_gathered(file, offset, end, kind)
    }

    /// A read that spans regions or chunks: its pieces in order, each chunk's borrowed.
    fn read_gathered(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        end: u64,
        kind: ReadKind,
    ) -> Result<ReadBytes, ReadError> {
        let mut out = Gathered::new();
        let mut pos = offset;
        let mut last_chunk = None;
        while pos < end {
            pos = if let Some(header_end) = file.header_end().filter(|&h| pos < h) {
                let stop = end.min(header_end);
                out.push_copy(&file.header[pos as usize..stop as usize]);
                stop
            } else if let Some(chunk) = file.plan().and_then(|plan| plan.chunk_at(pos)) {
                if kind == ReadKind::Readahead
                    && pos > offset
                    && file.is_spill(chunk, pos, self.config.spill_bytes)
                {
                    // The request runs past its block into one the reader is not heading for.
                    let stop = file
                        .plan()
                        .and_then(|p| p.get(chunk))
                        .map_or(end, |s| s.end.min(end));
                    out.push(self.read_probe(file, (pos, stop), false)?);
                    stop
                } else {
                    last_chunk = Some(chunk);
                    let (bytes, range, stop) = self.chunk_slice(file, chunk, pos, end)?;
                    out.push(ReadBytes::Chunk { bytes, range });
                    stop
                }
            } else {
                let (bytes, stop) = self.copy_uncached(file, pos, end)?;
                out.push(ReadBytes::Owned(bytes));
                stop
            };
        }
        if let Some(chunk) = last_chunk {
            self.after_read(file, chunk);
        }
        Ok(out.finish())
    }

    /// The part of chunk `chunk` that serves `[pos, end)`: the chunk, the byte range within it,
    /// and the file offset where that part stops.
    fn chunk_slice(
        &self,
        file: &Arc<ModelFile>,
        chunk: usize,
        pos: u64,
        end: u64,
    ) -> Result<(Arc<Chunk>, Range<usize>, u64), ReadError> {
        let span = file
            .plan()
            .and_then(|p| p.get(chunk))
            .copied()
            .ok_or(ReadError::NoChunk)?;
        self.touch(file, span.block);
        let started = Instant::now();
        let (bytes, outcome) = self
            .fetch_for_reader(file, chunk)?
            .ok_or(ReadError::NoChunk)?;
        let stop = end.min(span.end);
        if let Some(tracker) = file.tracker() {
            tracker.pace.read_done();
            let served = match outcome {
                Outcome::Hit => &tracker.counters.hit_bytes,
                Outcome::Miss => &tracker.counters.miss_bytes,
            };
            Counters::add(served, stop - pos);
            if outcome == Outcome::Miss {
                let waited = started.elapsed().as_nanos() as u64;
                Counters::add(&tracker.counters.stall_ns, waited);
                if tracker.is_first(span.block) {
                    Counters::add(&tracker.counters.start_stall_ns, waited);
                }
            }
        }
        let counter = match outcome {
            Outcome::Hit => &self.counters().hit_bytes,
            Outcome::Miss => &self.counters().miss_bytes,
        };
        Counters::add(counter, stop - pos);
        let range = (pos - span.start) as usize..(stop - span.start) as usize;
        bytes.served(&range);
        Ok((bytes, range, stop))
    }

    /// Chunk `chunk` for a reader. On a source read in order ([`Pacing::Ordered`]), a miss
    /// takes the next pass of the source's gate ([`crate::prefetch::gate`]: after the request
    /// in flight, before any read-ahead waiting) and is read with the chunks queued to be read
    /// ahead right after it, as one request: a reader faster than the source catches up with
    /// the read-ahead, and its misses read alone, beside the lane's request, would be requests
    /// at other offsets (a seek each, or a round trip and the store's own chunks fetched again)
    /// ([measured](../../../docs/PERFORMANCE.md#slow-and-network-sources)). Only chunks already
    /// queued join: the stream's next part, which the source would be asked for anyway.
    fn fetch_for_reader(
        &self,
        file: &ModelFile,
        chunk: usize,
    ) -> Result<Option<(Arc<Chunk>, Outcome)>, CacheError> {
        let ordered = match file.pacing(&self.prefetcher.config().pacing) {
            Pacing::Ordered { request_bytes, .. } => Some(request_bytes),
            Pacing::Parallel => None,
        };
        match ordered {
            Some(request_bytes) if !file.chunk_present(&self.cache, chunk) => {
                let pass = self.prefetcher.reader_pass();
                let mut queued = |next: usize| self.prefetcher.take_queued(file.chunk_key(next));
                let wanted = (chunk, Want::Read);
                file.fetch_run(&self.cache, wanted, request_bytes, &mut queued, pass)
            }
            _ => file.fetch_chunk(&self.cache, chunk, Want::Read),
        }
    }

    /// Serves a probe ([`super::runs`]): exactly `[offset, end)`, with no chunk cached, no prefetch
    /// and no visit of the block recorded. From resident chunks when they hold all of it
    /// ([`ChunkCache::peek`]), else read from the source bypassing the page cache.
    ///
    /// A probe never enters a block, even one whose chunks are resident: touches of a
    /// reload's tensor views entering the next block as predicted would sweep prefetch through
    /// the whole file ahead of the copies
    /// ([measured](../../../docs/PERFORMANCE.md#a-reloads-touches-are-probes)).
    ///
    /// Except for a model that fits the chunk cache on a source that charges per request (one
    /// read in order, or an object store): once a load has touched [`WARM_AFTER_TOUCHES`] tensors since the file was
    /// opened, it is about to read all of it, so the file is warmed into the cache in file
    /// order ([`crate::prefetch::Prefetcher::warm_in_file_order`]) and the touches are served
    /// through the cache, waiting for the warm ([`Self::wait_for_the_warm`]). The source then
    /// serves the file once, in large ordered requests, instead of a round trip for each touch
    /// (a whole chunk of its own, for a store's client) and the file again for the copies
    /// ([measured](../../../docs/PERFORMANCE.md#touches-of-a-model-that-fits)).
    ///
    /// A model larger than the budget in an object store has its next touches read ahead
    /// instead, in parallel, and they are served from there ([`super::touch_ahead`]).
    fn read_probe(
        &self,
        file: &Arc<ModelFile>,
        (offset, end): (u64, u64),
        starts_run: bool,
    ) -> Result<ReadBytes, ReadError> {
        if self.touches_warm(file) {
            if let Some(bytes) = self.read_probe_through_cache(file, offset, end)? {
                Counters::add(&self.counters().hit_bytes, end - offset);
                Counters::add(&self.counters().probe_cached_bytes, end - offset);
                return Ok(bytes);
            }
        }
        if let Some(bytes) = self.exact_from_cache(file, offset, end) {
            return Ok(bytes);
        }
        if let Some(bytes) = self.read_touch_ahead(file, (offset, end), starts_run) {
            return Ok(bytes);
        }
        self.read_exact_below(file, offset, end, &self.counters().probe_bytes)
    }

    /// Counts a touch of `file` and tells whether its touches are served through the cache:
    /// its source charges per request (read in order, or an object store, read in parallel),
    /// its model (the file, or all of a sharded model's shards)
    /// fits the chunk cache, and [`WARM_AFTER_TOUCHES`] touches came since it was opened (the
    /// one that reaches it starts the warm).
    fn touches_warm(&self, file: &Arc<ModelFile>) -> bool {
        if !file.pacing(&self.prefetcher.config().pacing).is_ordered() && !file.is_remote() {
            return false;
        }
        if file.model_size() > self.cache.budget() {
            return false;
        }
        if file.touches_since_open.fetch_add(1, Ordering::Relaxed) + 1 < WARM_AFTER_TOUCHES {
            return false;
        }
        if !file.warmed_by_touches.swap(true, Ordering::Relaxed) {
            tracing::debug!(file = %file.path.display(), "a load's touches: warming the model");
            self.prefetcher.warm_in_file_order(file);
        }
        true
    }

    /// `[offset, end)` through the chunk cache, each chunk fetched as a reader's miss is
    /// ([`Self::fetch_for_reader`]: with the chunks queued after it, as one request) or waited
    /// for while it is being read. No block is entered. `None` where the range is not all in
    /// chunks (the tail after the last tensor): the caller reads the source exactly.
    fn read_probe_through_cache(
        &self,
        file: &ModelFile,
        offset: u64,
        end: u64,
    ) -> Result<Option<ReadBytes>, ReadError> {
        let (Some(plan), Some(header_end)) = (file.plan(), file.header_end()) else {
            return Ok(None);
        };
        let mut out = Gathered::new();
        let mut pos = offset;
        while pos < end {
            if pos < header_end {
                let stop = end.min(header_end);
                let Some(head) = file.header.get(pos as usize..stop as usize) else {
                    return Ok(None);
                };
                out.push_copy(head);
                pos = stop;
                continue;
            }
            let Some((chunk, span)) = plan.chunk_at(pos).and_then(|c| Some((c, *plan.get(c)?)))
            else {
                return Ok(None);
            };
            self.wait_for_the_warm(file, chunk);
            let Some((bytes, _)) = self.fetch_for_reader(file, chunk)? else {
                return Ok(None);
            };
            let stop = end.min(span.end);
            let range = (pos - span.start) as usize..(stop - span.start) as usize;
            if bytes.as_slice().get(range.clone()).is_none() {
                return Ok(None);
            }
            out.push(ReadBytes::Chunk { bytes, range });
            pos = stop;
        }
        Ok(Some(out.finish()))
    }

    /// Waits, at most the source's deadline (or [`TOUCH_WAIT_UNBOUNDED`]), while chunk `chunk`
    /// is queued by the warm and not started: the warm reads the file in order, as the touches
    /// come, and a touch read ahead of it would be a request at another offset, which a store's
    /// client takes for random reading (fetching ranges, its own chunks again) and a disk for
    /// a seek. The queue has no signal of its own, so the wait polls it every
    /// [`TOUCH_WAIT_POLL`].
    fn wait_for_the_warm(&self, file: &ModelFile, chunk: usize) {
        let key = file.chunk_key(chunk);
        let limit = self
            .source_io
            .config()
            .timeout
            .unwrap_or(TOUCH_WAIT_UNBOUNDED);
        let deadline = Instant::now() + limit;
        while !file.chunk_present(&self.cache, chunk)
            && self.prefetcher.is_queued(key)
            && Instant::now() < deadline
        {
            std::thread::sleep(TOUCH_WAIT_POLL);
        }
    }

    /// Exactly `[offset, end)`, from resident chunks when they hold all of it, else from the
    /// source (bypassing the page cache) with its bytes also counted in `kind`.
    fn read_exact_uncached(
        &self,
        file: &ModelFile,
        offset: u64,
        end: u64,
        kind: &AtomicU64,
    ) -> Result<ReadBytes, ReadError> {
        if let Some(bytes) = self.exact_from_cache(file, offset, end) {
            return Ok(bytes);
        }
        self.read_exact_below(file, offset, end, kind)
    }

    /// [`Self::probe_from_cache`], its bytes counted as hits.
    fn exact_from_cache(&self, file: &ModelFile, offset: u64, end: u64) -> Option<ReadBytes> {
        let bytes = self.probe_from_cache(file, offset, end)?;
        Counters::add(&self.counters().hit_bytes, end - offset);
        Some(bytes)
    }

    /// [`Self::read_exact_uncached`] of a range the chunk cache does not hold: from the disk
    /// tier when it holds all of it, else from the source.
    fn read_exact_below(
        &self,
        file: &ModelFile,
        offset: u64,
        end: u64,
        kind: &AtomicU64,
    ) -> Result<ReadBytes, ReadError> {
        if let Some(bytes) = self.probe_from_disk_tier(file, offset, end) {
            return Ok(bytes);
        }
        tracing::trace!(start = offset, len = end - offset, "source read, uncached");
        let counters = self.counters();
        let bytes = match whole_chunks_for_tier(file, offset, end) {
            // The tier takes whole chunks: the read is widened to them, kept there, and cut.
            Some((from, to, chunks)) => {
                let read = file.source.read_aligned(from, to)?;
                if let (Some(tier), Some(plan)) = (file.disk_tier.as_ref(), file.plan()) {
                    let spans = chunks.filter_map(|c| plan.get(c)).map(|s| (s.start, s.end));
                    tier.offer_run(from, read.as_slice(), spans);
                }
                Counters::add(&counters.disk_read_bytes, to - from);
                read.piece(from, offset, end)
                    .ok_or(ReadError::NoChunk)?
                    .map_err(|source| SourceError::Alloc {
                        len: (end - offset) as usize,
                        source,
                    })?
            }
            None => {
                Counters::add(&counters.disk_read_bytes, end - offset);
                file.source.read_aligned(offset, end)?
            }
        };
        Counters::add(&counters.disk_reads, 1);
        Counters::add(&counters.uncached_bytes, end - offset);
        Counters::add(kind, end - offset);
        Ok(ReadBytes::Source(bytes))
    }

    /// Reads for an `O_DIRECT` open (the front end tells them from the request's flags). Such a
    /// reader asks to bypass caches and schedules its own I/O. When the file is larger than the
    /// chunk cache, which could not keep it for a next pass anyway, its `O_DIRECT` reads are
    /// served like probes: exactly the bytes asked for (from resident chunks when they hold
    /// them, else from the source), no chunk loaded, no prefetch, no visit recorded
    /// (`disk.direct_bytes`); loading whole chunks for them read more than the file and slowed
    /// the loader ([measured](../../../docs/PERFORMANCE.md#o_direct-requests-served-exactly)).
    /// A file the cache can hold goes through it as usual, so its next load comes from RAM.
    ///
    /// Only requests of at least [`ModelsConfig::direct_exact_min`], and the smaller ones of a
    /// version that had such a request since it was last opened: a reader of small `O_DIRECT`
    /// pieces only gains from whole chunks and prefetch, while the small pieces of a reader that
    /// schedules large ones (a range's unaligned head and tail) are no stream, in whatever
    /// order the transport hands them over.
    pub fn read_direct(
        &self,
        file: &Arc<ModelFile>,
        offset: u64,
        len: u32,
    ) -> Result<ReadBytes, ReadError> {
        let end = file.size().min(offset.saturating_add(u64::from(len)));
        let large = u64::from(len) >= self.config.direct_exact_min;
        if large {
            file.direct_reader_schedules.store(true, Ordering::Relaxed);
        }
        let exact = file.plan().is_some()
            && file.size() > self.cache.budget()
            && (large || file.direct_reader_schedules.load(Ordering::Relaxed))
            && offset < end;
        if !exact {
            return self.read(file, offset, len);
        }
        self.read_exact_uncached(file, offset, end, &self.counters().direct_bytes)
    }

    /// `[offset, end)` from the header and resident chunks, or `None` if part of it is in
    /// neither (a chunk not resident, or bytes outside every chunk). Inside one chunk, the
    /// common case, it is borrowed, not copied: a probe is a whole kernel request (up to 1 MiB),
    /// and a multi-threaded reader's requests start new runs often (8 threads × 2 MiB `pread`s:
    /// each thread's first request after a jump).
    fn probe_from_cache(&self, file: &ModelFile, offset: u64, end: u64) -> Option<ReadBytes> {
        gather_probe(file, offset, end, |chunk, _, range| {
            let bytes = self.cache.peek(file.key(chunk))?;
            bytes.as_slice().get(range.clone())?;
            Some(ReadBytes::Chunk { bytes, range })
        })
    }

    /// Exactly `[offset, end)` from the header and the chunks the disk tier holds, when they
    /// hold all of it. Each chunk is read back whole (its checksum covers the whole chunk) into
    /// the chunk cache, as a reader's miss is: a loader's next touches of the same chunk (a
    /// mapping faults 128 KiB at a time) are hits instead of reading it back again.
    fn probe_from_disk_tier(&self, file: &ModelFile, offset: u64, end: u64) -> Option<ReadBytes> {
        let tier = file.disk_tier.as_ref()?;
        gather_probe(file, offset, end, |chunk, span, range| {
            if !tier.holds(span.start, span.end) && !file.chunk_present(&self.cache, chunk) {
                return None;
            }
            match file.fetch_chunk(&self.cache, chunk, Want::Read) {
                Ok(Some((bytes, _))) => {
                    bytes.as_slice().get(range.clone())?;
                    Some(ReadBytes::Chunk { bytes, range })
                }
                // No room in the cache now: read back for this read alone.
                _ => {
                    let back = tier.read(span.start, span.end)?;
                    Some(ReadBytes::Owned(back.as_slice().get(range)?.to_vec()))
                }
            }
        })
    }

    /// Serves `[pos, stop)` straight from the source, where `stop` is `end` or the start of the
    /// next chunk (only the tail after the last tensor, or a malformed file, gets here).
    fn copy_uncached(
        &self,
        file: &ModelFile,
        pos: u64,
        end: u64,
    ) -> Result<(Vec<u8>, u64), ReadError> {
        let stop = match file.plan() {
            Some(plan) => plan
                .chunks()
                .iter()
                .find(|c| c.start > pos)
                .map_or(end, |c| end.min(c.start)),
            None => end,
        };
        let mut out = vec![0; (stop - pos) as usize];
        let got = file.source.read_at(&mut out, pos)?;
        let counters = self.counters();
        Counters::add(&counters.disk_reads, 1);
        Counters::add(&counters.disk_read_bytes, got as u64);
        Counters::add(&counters.uncached_bytes, got as u64);
        if (got as u64) < stop - pos {
            // The source is shorter than when it was opened: serve what it has, like a plain
            // file would, and end this read there.
            out.truncate(got);
            return Ok((out, end));
        }
        Ok((out, stop))
    }

    /// Records that a reader touched `block`, and prefetches what follows when it entered it.
    pub(super) fn touch(&self, file: &Arc<ModelFile>, block: usize) {
        let Some(tracker) = file.tracker() else {
            return;
        };
        if let Step::Entered {
            predicted,
            new_pass,
        } = tracker.touch(block)
        {
            if new_pass {
                let (learned, _) = tracker.learned();
                if learned {
                    self.saved
                        .put(file.order_key.clone(), tracker.saved_order());
                }
            }
            self.prefetch_on_block_entry(file, block, predicted);
        }
    }

    /// A reader entered `block` of `file`: prefetch what follows, in other shards of its model
    /// too.
    pub(super) fn prefetch_on_block_entry(
        &self,
        file: &Arc<ModelFile>,
        block: usize,
        predicted: bool,
    ) {
        let Some(of) = file.shard_of.as_ref() else {
            self.prefetcher
                .queue_after_block_entry(file, block, predicted);
            return;
        };
        // The rest of the current block is fetched from this shard, and from the next one if
        // that one starts with it (a block cut at the shard boundary), not from the others: the
        // non-block group has tensors in the first shard (embeddings) and the last (output
        // layer), which the reader reaches much later. Blocks ahead are fetched wherever they
        // are.
        let continues = |s: usize| {
            s == of.shard + 1 && of.model.shards.get(s).and_then(|x| x.first_block) == Some(block)
        };
        let holders = |b: usize| -> Vec<Arc<ModelFile>> {
            of.model
                .holders(b)
                .iter()
                .filter(|&&s| b != block || s == of.shard || continues(s))
                .filter_map(|&s| {
                    if s == of.shard {
                        Some(Arc::clone(file))
                    } else {
                        self.open_shard(&of.model, s)
                    }
                })
                .collect()
        };
        self.prefetcher
            .queue_after_block_entry_in(file, block, predicted, holders);
    }

    /// A reader read chunk `chunk` of `file`: read ahead in file order and, for a shard whose
    /// end the read-ahead reaches, on into the next shard (index order), as if the shards were
    /// one file: a loader going through the shards one by one finds the next one's first
    /// chunks in memory when it gets there.
    fn after_read(&self, file: &Arc<ModelFile>, chunk: usize) {
        let Some(left) = self.prefetcher.after_read(file, chunk) else {
            return;
        };
        let Some(of) = file.shard_of.as_ref() else {
            return;
        };
        if left.bytes == 0 || of.shard + 1 >= of.model.shards.len() {
            return;
        }
        if let Some(next) = self.open_shard(&of.model, of.shard + 1) {
            self.prefetcher.read_ahead(&next, 0, left);
        }
    }

    /// Shard `shard` of `model`, opened (indexed) if no reader opened it yet; `None` if it
    /// cannot be, or is no longer a shard of this model version.
    fn open_shard(&self, model: &Arc<ShardedModel>, shard: usize) -> Option<Arc<ModelFile>> {
        let s = model.shards.get(shard)?;
        match self.open_version((&s.rel, &s.abs, None), OpenedBy::Store) {
            Ok((file, _)) => file
                .shard_of
                .as_ref()
                .is_some_and(|of| Arc::ptr_eq(&of.model, model))
                .then_some(file),
            Err(e) => {
                tracing::debug!(file = %s.abs.display(), error = %e, "cannot open a shard for prefetch");
                None
            }
        }
    }
}

/// With a disk tier, the range a read of `[offset, end)` from the source widens to so that it
/// covers whole chunks (which the tier keeps), and those chunks; `None` without a tier, or
/// where the range holds no chunk's bytes.
fn whole_chunks_for_tier(
    file: &ModelFile,
    offset: u64,
    end: u64,
) -> Option<(u64, u64, std::ops::RangeInclusive<usize>)> {
    file.disk_tier.as_ref()?;
    let plan = file.plan()?;
    let data_from = offset.max(file.header_end()?);
    if data_from >= end {
        return None;
    }
    let (first, last) = (plan.chunk_at(data_from)?, plan.chunk_at(end - 1)?);
    let from = offset.min(plan.get(first)?.start);
    let to = end.max(plan.get(last)?.end);
    Some((from, to, first..=last))
}

/// `[offset, end)` gathered from the file's in-memory header and, chunk by chunk, from what
/// `piece(chunk, span, range)` gives for `range` of each chunk; `None` where a piece is `None`
/// or the range leaves the header and the chunks.
fn gather_probe(
    file: &ModelFile,
    offset: u64,
    end: u64,
    mut piece: impl FnMut(usize, &ChunkSpan, std::ops::Range<usize>) -> Option<ReadBytes>,
) -> Option<ReadBytes> {
    let plan = file.plan()?;
    let header_end = file.header_end()?;
    let mut out = Gathered::new();
    let mut pos = offset;
    while pos < end {
        if pos < header_end {
            let stop = end.min(header_end);
            out.push_copy(file.header.get(pos as usize..stop as usize)?);
            pos = stop;
            continue;
        }
        let chunk = plan.chunk_at(pos)?;
        let span = plan.get(chunk)?;
        let stop = end.min(span.end);
        out.push(piece(
            chunk,
            span,
            (pos - span.start) as usize..(stop - span.start) as usize,
        )?);
        pos = stop;
    }
    Some(out.finish())
}
