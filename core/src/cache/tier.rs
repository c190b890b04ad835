//! The compressed RAM tier: resident chunks kept as compressed frames, invisible to readers.
//!
//! **Contract.**
//! - **Readers get the raw bytes, always.** A lookup that finds a chunk held as a frame alone
//!   decodes it ([`ChunkCache::readable`]) outside every lock, into a buffer of its own, before
//!   the reader sees it. A frame that does not decode (damaged: the decoder checks the header,
//!   every plane's length and the xxh3 of the original bytes, [`crate::compress`]) is dropped
//!   from the cache, counted (`compress.decode_errors`) and the request becomes a miss: the
//!   source is read again. Wrong bytes are never served. Decodes are single flight: readers of
//!   a frame being decoded wait for that decode.
//! - **Decoded windows, bounded.** The decoded bytes stay with the frame as the chunk's
//!   *window* ([`super::body::Body::Window`]) while readers are in it, so that the kernel's
//!   128 KiB–1 MiB requests inside a 4 MiB chunk decode it once. Windows are kept in the order
//!   readers last got them and at most [`TierConfig::max_window_bytes`] (and a
//!   [`TierConfig::window_share`] of the budget) of them: past it the window read least recently
//!   goes back to its frame; and a window no reader got for [`TierConfig::window_idle`] goes
//!   back too (the compressor closes it). With the default, at most 64 MiB of decoded windows,
//!   sixteen 4 MiB chunks: one per thread of an 8-thread reader, twice.
//! - **The budget counts what RAM holds**: raw chunks, frames and windows, page-rounded (frames
//!   are mappings of their own). A window is room like any chunk: making one may evict, and
//!   when no room can be had the reader gets its decoded bytes uncached.
//! - **Encoding never holds the lock.** The compressor (`compressor.rs`, one background
//!   thread) takes a batch of raw chunks under the lock ([`ChunkCache::compress_candidates`]),
//!   encodes them with no lock held, and swaps each one's body under the lock only if the chunk
//!   is still resident in the form it encoded ([`ChunkCache::demote`]); a chunk that does not
//!   gain [`crate::compress::MIN_SAVING_PERCENT`] stays raw and is not tried again.
//! - **Which chunks, when** ([`CompressMode`]): `on` compresses every resident chunk, those
//!   needed furthest in the future first (the eviction rank of `evict.rs`); `auto` does the same
//!   only while the budget is under pressure ([`TierConfig::pressure_percent`]) and only when a
//!   decode is several times faster than the source ([`TierConfig::auto_margin`],
//!   `compressor.rs`); `off` never.
//!
//! **Locks.** Everything here that touches the resident set or the table of decodes in flight
//! runs under the cache's `state` lock, briefly (no encode, decode or unmap under it); a reader
//! waiting for another's decode waits on that decode's `Loading` with no lock held, and the
//! decoder publishes after releasing `state`, as a read in flight does (`inflight.rs`). The
//! thread-local decoder and the compressor's encoder are plain values.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::body::Body;
use super::evict::Turn;
use super::inflight::Loading;
use super::{CacheError, Chunk, ChunkCache, ChunkKey, Evicted, State};
use crate::compress::{CompressConfig, Decoder, Encoded, Encoder};
use crate::source::AlignedBytes;
use crate::stats::Counters;

/// When the compressed tier compresses (`--compress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompressMode {
    /// Compress under budget pressure when a decode is several times faster than the source (see
    /// `compressor.rs`). The default: on a source within a few times the decoder's speed (local
    /// flash, files in the page cache, a 1 GB/s link) it does nothing, so no loader gets slower
    /// than without the tier; on a disk-class source, every byte the budget keeps compressed is
    /// a byte not read again ([measured](../../../docs/PERFORMANCE.md#compressed-ram-tier-in-the-cache)).
    #[default]
    Auto,
    /// Compress every resident chunk, whatever the source.
    On,
    /// Never compress.
    Off,
}

/// Tuning of the compressed tier; [`Default`] is what the daemon runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierConfig {
    pub mode: CompressMode,
    /// The codec's tuning ([`crate::compress::CompressConfig`]).
    pub codec: CompressConfig,
    /// Decoded windows kept at most: 64 MiB, sixteen 4 MiB chunks, one per thread of an
    /// 8-thread reader, twice
    /// ([measured](../../../docs/PERFORMANCE.md#compressed-ram-tier-in-the-cache)).
    pub max_window_bytes: u64,
    /// Windows never hold more than `budget / window_share`: an eighth, so a small budget is
    /// not taken by decoded copies of what it keeps compressed.
    pub window_share: u64,
    /// `auto` compresses only when the decoder is at least this many times faster than the
    /// source: 4. Compressing makes every hit on the compressed bytes pay a decode, to save the
    /// reads of the part that did not fit; with a working set 1.2-1.3 times the budget that part
    /// is a fifth to a quarter of what is decoded. Measured: with a margin of 1, `auto`
    /// compressed on the fast local source and slowed repeated passes 1.3-2 times; with 2, it
    /// compressed on the 1 GB/s source (measured 1.1-1.2 GB/s) and slowed them 2.2-2.7 times;
    /// with 4, it stays off there and makes them 2.4-2.7 times faster on the 200 MB/s disk
    /// ([measured](../../../docs/PERFORMANCE.md#compressed-ram-tier-in-the-cache)).
    pub auto_margin: u32,
    /// `auto` compresses while the cache holds more than this percentage of its budget: 75,
    /// so a model that fits raw is served raw, and the tier starts before evictions do.
    pub pressure_percent: u64,
    /// Chunks the compressor takes per hold of the lock: 8, 32 MiB of 4 MiB chunks, about 70 ms
    /// of encoding, so its ranking is never long out of date.
    pub batch_chunks: usize,
    /// How often the compressor looks for work when it found none: 20 ms, a tenth of a 4 MiB
    /// chunk's source read on a 200 MB/s disk.
    pub poll: Duration,
    /// A window no reader got for this long is closed (back to its frame): 1 s, fifty times
    /// what a reader takes to go through a 4 MiB chunk at 200 MB/s, so a reader inside a chunk
    /// keeps its window and one that left gives its memory back.
    pub window_idle: Duration,
    /// Chunks smaller than this stay raw: 64 KiB; packs of biases and norms are few bytes of a
    /// model and their frames would be mostly header and page rounding.
    pub min_chunk_bytes: u64,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            mode: CompressMode::default(),
            codec: CompressConfig::default(),
            max_window_bytes: 64 << 20,
            window_share: 8,
            auto_margin: 4,
            pressure_percent: 75,
            batch_chunks: 8,
            poll: Duration::from_millis(20),
            window_idle: Duration::from_secs(1),
            min_chunk_bytes: 64 << 10,
        }
    }
}

/// The tier's part of the cache's state (under its lock).
#[derive(Default)]
pub(super) struct TierState {
    /// Decodes in flight, by chunk (single flight, [`ChunkCache::readable`]).
    decoding: HashMap<ChunkKey, Arc<Loading>>,
    /// Chunks holding a decoded window, the one a reader got least recently first.
    windows: VecDeque<ChunkKey>,
    /// Memory of the windows' decoded bytes.
    pub(super) window_bytes: u64,
    /// Memory of the frames (of frame and window chunks).
    pub(super) frame_bytes: u64,
    /// File bytes of the chunks that have a frame.
    pub(super) frame_raw_bytes: u64,
}

/// A decode in flight (single flight, [`ChunkCache::readable`]): however it ends, its entry
/// leaves the table and its waiters are woken (with an error if the decode panicked).
struct DecodeFlight<'a> {
    cache: &'a ChunkCache,
    key: ChunkKey,
    decode: Arc<Loading>,
    finished: bool,
}

impl DecodeFlight<'_> {
    fn finish(&mut self, result: Result<Arc<Chunk>, CacheError>) {
        self.finished = true;
        {
            let mut state = self.cache.lock();
            if state
                .tier
                .decoding
                .get(&self.key)
                .is_some_and(|d| Arc::ptr_eq(d, &self.decode))
            {
                state.tier.decoding.remove(&self.key);
            }
        }
        // After the lock: `Loading::result` is never taken with `state` held.
        self.decode.finish(result);
    }
}

impl Drop for DecodeFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            tracing::error!(chunk = ?self.key, "a chunk's decode panicked; its readers read the source");
            self.finish(Err(CacheError::LoadPanicked));
        }
    }
}

/// What the tier holds now, for the stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierSnapshot {
    pub window_bytes: u64,
    pub frame_bytes: u64,
    pub frame_raw_bytes: u64,
}

thread_local! {
    /// One decoder per thread that decodes (readers' threads): it keeps its zstd context.
    static DECODER: std::cell::RefCell<Option<Decoder>> = const { std::cell::RefCell::new(None) };
}

/// Decodes `frame` into a new buffer of `len` bytes; `None` if it does not decode to exactly
/// that (a damaged frame) or no buffer could be had.
fn decode(frame: &[u8], len: usize) -> Result<AlignedBytes, String> {
    let mut out = AlignedBytes::writable(len).map_err(|e| e.to_string())?;
    DECODER.with(|cell| {
        let mut decoder = cell.borrow_mut();
        if decoder.is_none() {
            *decoder = Some(Decoder::new().map_err(|e| e.to_string())?);
        }
        match decoder.as_mut() {
            Some(d) => d
                .decode(frame, out.as_mut_slice())
                .map_err(|e| e.to_string()),
            None => Err("no decoder".to_owned()),
        }
    })?;
    Ok(out)
}

impl ChunkCache {
    /// `chunk`, resident as `key`, in a form a reader can read: as it is if it holds its raw
    /// bytes, else decoded (a window, or uncached bytes if no room). `None` if its frame is
    /// damaged: it was dropped from the cache and counted; the caller reads the source.
    ///
    /// Decodes are single flight: readers of a frame another reader is decoding wait for that
    /// decode (the threads of one loader often start in the same chunk) instead of decoding it
    /// again.
    pub(super) fn readable(&self, key: ChunkKey, chunk: Arc<Chunk>) -> Option<Arc<Chunk>> {
        if chunk.body.raw().is_some() {
            return Some(chunk);
        }
        let role = {
            let mut state = self.lock();
            match state.resident.peek(&key) {
                // Another reader made its window meanwhile.
                Some(now) if now.body.raw().is_some() => Ok(now),
                _ => match state.tier.decoding.get(&key) {
                    Some(decode) => Err(Err(Arc::clone(decode))),
                    None => {
                        let decode = Arc::new(Loading::new());
                        state.tier.decoding.insert(key, Arc::clone(&decode));
                        Err(Ok(decode))
                    }
                },
            }
        };
        match role {
            Ok(window) => Some(window),
            // A failed decode dropped the chunk: the caller reads the source.
            Err(Err(decode)) => decode.wait().ok(),
            Err(Ok(decode)) => {
                let mut flight = DecodeFlight {
                    cache: self,
                    key,
                    decode,
                    finished: false,
                };
                let got = self.decode_chunk(key, chunk);
                flight.finish(got.clone().ok_or(CacheError::NoRoom));
                got
            }
        }
    }

    /// Decodes the frame chunk `chunk` (resident as `key`) into its window; `None` (the chunk
    /// dropped and the error counted) if the frame is damaged.
    fn decode_chunk(&self, key: ChunkKey, chunk: Arc<Chunk>) -> Option<Arc<Chunk>> {
        let Body::Frame(frame) = &chunk.body else {
            return Some(chunk);
        };
        let started = Instant::now();
        match decode(frame.as_slice(), chunk.len() as usize) {
            Ok(raw) => {
                Counters::add(&self.counters.decoded_bytes, chunk.len());
                Counters::add(
                    &self.counters.decode_ns,
                    started.elapsed().as_nanos() as u64,
                );
                let frame = Arc::clone(frame);
                Some(self.install_window(key, &chunk, raw, frame))
            }
            Err(reason) => {
                tracing::warn!(chunk = ?key, %reason, "a compressed chunk did not decode; reading it from the source again");
                Counters::add(&self.counters.decode_errors, 1);
                self.drop_if_same(key, &chunk);
                None
            }
        }
    }

    /// Removes `key` from the cache if it is still `chunk` (same body).
    fn drop_if_same(&self, key: ChunkKey, chunk: &Arc<Chunk>) {
        let mut state = self.lock();
        let mut evicted = Evicted::new();
        if state
            .resident
            .peek(&key)
            .is_some_and(|c| Arc::ptr_eq(&c, chunk))
        {
            if let Some(old) = state.resident.pop(&key) {
                self.release(&mut state, key, &old);
                evicted.push(old);
            }
        }
        drop(state);
        drop(evicted);
    }

    /// Makes `raw`, decoded from `frame` of the frame chunk `chunk`, its window if `chunk` is
    /// still resident as it was and room can be had; else hands `raw` to the reader uncached.
    fn install_window(
        &self,
        key: ChunkKey,
        chunk: &Arc<Chunk>,
        raw: AlignedBytes,
        frame: Arc<AlignedBytes>,
    ) -> Arc<Chunk> {
        let window = Arc::new(chunk.with_body(Body::Window { raw, frame }));
        let extra = window.body.raw_footprint();
        let mut evicted = Evicted::new();
        let mut state = self.lock();
        let cap = self
            .config
            .tier
            .max_window_bytes
            .min(state.budget / self.config.tier.window_share.max(1));
        let same = |state: &State| {
            state
                .resident
                .peek(&key)
                .is_some_and(|c| Arc::ptr_eq(&c, chunk))
        };
        let mut installed = false;
        if extra <= cap && same(&state) {
            while state.tier.window_bytes + extra > cap {
                if !self.close_oldest_window(&mut state, &mut evicted) {
                    break;
                }
            }
            if state.tier.window_bytes + extra <= cap
                && self.evict_until_fits(&mut state, extra, None, &mut evicted)
                && same(&state)
            {
                if let Some(old) = state.resident.replace(key, Arc::clone(&window)) {
                    self.body_out(&mut state, key, &old);
                    state.used -= old.footprint();
                    evicted.push(old);
                }
                state.used += window.footprint();
                self.body_in(&mut state, key, &window);
                installed = true;
            }
        }
        drop(state);
        drop(evicted);
        if installed {
            return window;
        }
        // No room: the reader gets the decoded bytes alone, uncached.
        Counters::add(&self.counters.uncached_bytes, extra);
        match Arc::try_unwrap(window) {
            Ok(Chunk {
                body: Body::Window { raw, .. },
                meta,
            }) => Arc::new(Chunk {
                body: Body::Raw(raw),
                meta,
            }),
            Ok(other) => Arc::new(other),
            Err(shared) => shared,
        }
    }

    /// Turns the windows no reader got for [`TierConfig::window_idle`] back into their frames
    /// (their readers have left them). Returns how many it closed.
    pub(super) fn close_idle_windows(&self) -> usize {
        let idle = self.config.tier.window_idle.as_nanos() as u64;
        let cutoff = self.now().saturating_sub(idle);
        let mut evicted = Evicted::new();
        let mut state = self.lock();
        let idle: Vec<ChunkKey> = state
            .tier
            .windows
            .iter()
            .copied()
            .filter(|key| {
                state
                    .resident
                    .peek(key)
                    .is_some_and(|c| c.last_read.load(Ordering::Relaxed) < cutoff)
            })
            .collect();
        for &key in &idle {
            let Some(chunk) = state.resident.peek(&key) else {
                continue;
            };
            if let Body::Window { frame, .. } = &chunk.body {
                let closed = Arc::new(chunk.with_body(Body::Frame(Arc::clone(frame))));
                self.swap_body(&mut state, key, closed, &mut evicted);
            }
        }
        drop(state);
        drop(evicted);
        idle.len()
    }

    /// Turns the window read least recently back into its frame; false if there is none.
    fn close_oldest_window(&self, state: &mut State, evicted: &mut Evicted) -> bool {
        while let Some(key) = state.tier.windows.pop_front() {
            let Some(chunk) = state.resident.peek(&key) else {
                continue;
            };
            let Body::Window { frame, .. } = &chunk.body else {
                continue;
            };
            let closed = Arc::new(chunk.with_body(Body::Frame(Arc::clone(frame))));
            self.swap_body(state, key, closed, evicted);
            return true;
        }
        false
    }

    /// Puts `chunk` in place of the resident `key` (another body of the same chunk), its
    /// accounting moved over; the old body goes to `evicted`.
    fn swap_body(
        &self,
        state: &mut State,
        key: ChunkKey,
        chunk: Arc<Chunk>,
        evicted: &mut Evicted,
    ) {
        state.used += chunk.footprint();
        self.body_in(state, key, &chunk);
        if let Some(old) = state.resident.replace(key, chunk) {
            state.used -= old.footprint();
            self.body_out(state, key, &old);
            evicted.push(old);
        }
    }

    /// A hit on a window: it is now the one read most recently.
    pub(super) fn touch_window(state: &mut State, key: ChunkKey, chunk: &Chunk) {
        if chunk.body.is_window() {
            if let Some(at) = state.tier.windows.iter().position(|k| *k == key) {
                state.tier.windows.remove(at);
            }
            state.tier.windows.push_back(key);
        }
    }

    /// The tier's figures for a body entering the resident set as `key`.
    pub(super) fn body_in(&self, state: &mut State, key: ChunkKey, chunk: &Chunk) {
        let body = &chunk.body;
        if body.is_window() {
            state.tier.window_bytes += body.raw_footprint();
            state.tier.windows.push_back(key);
        }
        if body.frame().is_some() {
            state.tier.frame_bytes += body.frame_footprint();
            state.tier.frame_raw_bytes += chunk.len();
            if let Some(file) = chunk.file_counters() {
                file.frame_bytes
                    .fetch_add(body.frame_footprint(), Ordering::Relaxed);
                file.frame_raw_bytes
                    .fetch_add(chunk.len(), Ordering::Relaxed);
            }
        }
    }

    /// The tier's figures for a body leaving the resident set as `key`.
    pub(super) fn body_out(&self, state: &mut State, key: ChunkKey, chunk: &Chunk) {
        let body = &chunk.body;
        if body.is_window() {
            state.tier.window_bytes -= body.raw_footprint();
            if let Some(at) = state.tier.windows.iter().position(|k| *k == key) {
                state.tier.windows.remove(at);
            }
        }
        if body.frame().is_some() {
            state.tier.frame_bytes -= body.frame_footprint();
            state.tier.frame_raw_bytes -= chunk.len();
            if let Some(file) = chunk.file_counters() {
                file.frame_bytes
                    .fetch_sub(body.frame_footprint(), Ordering::Relaxed);
                file.frame_raw_bytes
                    .fetch_sub(chunk.len(), Ordering::Relaxed);
            }
        }
    }

    /// Up to `max` raw resident chunks to compress, those needed furthest in the future first
    /// (the eviction rank): chunks at least [`TierConfig::min_chunk_bytes`] long, not found
    /// not worth it before, not got by a reader within [`super::CacheConfig::recently_read`]
    /// (a reader is in them), and not read ahead of the active reader and still unread (it
    /// is about to read them).
    pub(super) fn compress_candidates(&self, max: usize) -> Vec<(ChunkKey, Arc<Chunk>)> {
        let ranking = self.ranking();
        let state = self.lock();
        let mut ranked: Vec<_> = state
            .resident
            .entries()
            .filter(|(_, chunk, _)| {
                matches!(chunk.body, Body::Raw(_))
                    && chunk.len() >= self.config.tier.min_chunk_bytes
                    && !chunk.kept_raw.load(Ordering::Relaxed)
                    && chunk.last_read.load(Ordering::Relaxed) < ranking.recent
            })
            .map(|(key, chunk, stamp)| (chunk.rank(&ranking, stamp), key, Arc::clone(chunk)))
            // Read ahead of the active reader and not read yet: about to be read, raw.
            .filter(|(rank, _, chunk)| {
                !(rank.1 == Turn::Coming && chunk.unread_prefetch.load(Ordering::Relaxed))
            })
            .collect();
        drop(state);
        ranked.sort_by_key(|r| std::cmp::Reverse(r.0));
        ranked
            .into_iter()
            .take(max)
            .map(|(_, key, chunk)| (key, chunk))
            .collect()
    }

    /// Encodes `chunk` (raw, resident as `key`) with no lock held and, if its frame saves
    /// enough and the chunk is still resident as it was, swaps its body for the frame. Returns
    /// the bytes it freed.
    pub(super) fn demote(
        &self,
        encoder: &mut Encoder,
        out: &mut Vec<u8>,
        key: ChunkKey,
        chunk: &Arc<Chunk>,
    ) -> u64 {
        let Some(raw) = chunk.body.raw() else {
            return 0;
        };
        let codec = chunk.owner.as_ref().map(|o| o.codec).unwrap_or_default();
        let frame = match encoder.encode(codec.layout, usize::from(codec.phase), raw, out) {
            Ok(Encoded::Frame(_)) => match AlignedBytes::copy_of(out) {
                Ok(frame) => frame,
                Err(e) => {
                    tracing::debug!(error = %e, "no memory for a frame; the chunk stays raw");
                    return 0;
                }
            },
            Ok(Encoded::Raw) => {
                chunk.kept_raw.store(true, Ordering::Relaxed);
                Counters::add(&self.counters.kept_raw_bytes, chunk.len());
                return 0;
            }
            Err(e) => {
                tracing::debug!(chunk = ?key, error = %e, "a chunk did not encode; it stays raw");
                chunk.kept_raw.store(true, Ordering::Relaxed);
                return 0;
            }
        };
        let framed = Arc::new(chunk.with_body(Body::Frame(Arc::new(frame))));
        let mut evicted = Evicted::new();
        let mut state = self.lock();
        let still = state
            .resident
            .peek(&key)
            .is_some_and(|c| Arc::ptr_eq(&c, chunk));
        let mut freed = 0;
        if still {
            freed = chunk.footprint().saturating_sub(framed.footprint());
            Counters::add(&self.counters.encoded_bytes, chunk.len());
            self.swap_body(&mut state, key, framed, &mut evicted);
            self.room.notify_all();
        }
        drop(state);
        drop(evicted);
        freed
    }

    /// The tier's figures now.
    pub fn tier_snapshot(&self) -> TierSnapshot {
        let state = self.lock();
        TierSnapshot {
            window_bytes: state.tier.window_bytes,
            frame_bytes: state.tier.frame_bytes,
            frame_raw_bytes: state.tier.frame_raw_bytes,
        }
    }

    /// Whether the cache holds more than [`TierConfig::pressure_percent`] of its budget.
    pub(super) fn under_pressure(&self) -> bool {
        let state = self.lock();
        let pressure = self.config.tier.pressure_percent.min(100);
        u128::from(state.used) * 100 > u128::from(state.budget) * u128::from(pressure)
    }

    /// Damages the frame of the resident `key` (tests of the decoder's checks): one byte of
    /// its coded planes flipped. False if `key` is not held as a frame.
    #[cfg(test)]
    pub(crate) fn damage_frame(&self, key: ChunkKey) -> bool {
        let mut evicted = Evicted::new();
        let mut state = self.lock();
        let Some(chunk) = state.resident.peek(&key) else {
            return false;
        };
        let Body::Frame(frame) = &chunk.body else {
            return false;
        };
        let mut bytes = frame.as_slice().to_vec();
        let at = crate::compress::HEADER_BYTES + (bytes.len() - crate::compress::HEADER_BYTES) / 2;
        bytes[at] ^= 0x5a;
        let Ok(damaged) = AlignedBytes::copy_of(&bytes) else {
            return false;
        };
        let damaged = Arc::new(chunk.with_body(Body::Frame(Arc::new(damaged))));
        self.swap_body(&mut state, key, damaged, &mut evicted);
        true
    }
}
