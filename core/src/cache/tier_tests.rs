//! Tests of the compressed tier against real (temporary) source files: readers get the source's
//! bytes bit for bit whatever the dtype, length and phase; a damaged frame is a miss; the
//! budget counts frames and windows; `auto` compresses only when it pays.

use std::io::Write;
use std::sync::Arc;

use super::*;
use crate::compress::{Encoder, PlaneLayout};
use crate::reader::ReaderTracker;
use crate::source::{aligned_footprint, SourceFile};
use crate::weights::{WeightDtype, WeightGen};

/// A source file of synthetic weights cut into chunks of the given lengths, each with its codec.
struct Weights {
    _file: tempfile::NamedTempFile,
    source: SourceFile,
    data: Vec<u8>,
    /// `(start, end, codec)` of each chunk.
    chunks: Vec<(u64, u64, ChunkCodec)>,
    tracker: Arc<ReaderTracker>,
    marks: Arc<ChunkMarks>,
}

/// `pieces`: `(dtype, bytes, chunk_len, first_offset)`: a tensor of `bytes` bytes of `dtype`
/// cut into chunks of `chunk_len` starting `first_offset` bytes into the tensor (the bytes before
/// are a chunk of their own), so that chunks may start mid-element.
fn weights(pieces: &[(WeightDtype, usize, usize, usize)]) -> Weights {
    let mut gen = WeightGen::new(7);
    let mut data = Vec::new();
    let mut chunks = Vec::new();
    for &(dtype, bytes, chunk_len, first) in pieces {
        let tensor = gen.tensors(dtype, bytes, bytes);
        let base = data.len() as u64;
        let mut cuts = vec![0usize];
        let mut at = first;
        while at < bytes {
            if at > 0 {
                cuts.push(at);
            }
            at += chunk_len;
        }
        cuts.push(bytes);
        cuts.dedup();
        for pair in cuts.windows(2) {
            let codec = ChunkCodec::of(dtype.safetensors_name(), pair[0] as u64);
            chunks.push((base + pair[0] as u64, base + pair[1] as u64, codec));
        }
        data.extend_from_slice(&tensor);
    }
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&data).unwrap();
    file.flush().unwrap();
    let source = SourceFile::open(file.path()).unwrap();
    let n = chunks.len();
    Weights {
        _file: file,
        source,
        data,
        chunks,
        tracker: Arc::new(ReaderTracker::new(1, None)),
        marks: Arc::new(ChunkMarks::new(n)),
    }
}

impl Weights {
    fn get(&self, cache: &ChunkCache, chunk: usize) -> Result<(Arc<Chunk>, Outcome), CacheError> {
        let (start, end, codec) = self.chunks[chunk];
        let owner = ChunkOwner {
            tracker: Arc::clone(&self.tracker),
            block: 0,
            marks: Arc::clone(&self.marks),
            codec,
            lower: None,
        };
        cache.get_or_load(
            ChunkKey {
                file: 1,
                chunk: chunk as u32,
            },
            aligned_footprint(start, end),
            Want::Read,
            Some(&owner),
            || self.source.read_aligned(start, end),
        )
    }

    fn expect(&self, chunk: usize) -> &[u8] {
        let (start, end, _) = self.chunks[chunk];
        &self.data[start as usize..end as usize]
    }

    fn len(&self) -> usize {
        self.chunks.len()
    }
}

fn tier(mode: CompressMode) -> CacheConfig {
    CacheConfig {
        // Chunks got a moment ago are candidates at once.
        recently_read: std::time::Duration::ZERO,
        tier: TierConfig {
            mode,
            min_chunk_bytes: 1,
            ..TierConfig::default()
        },
        ..CacheConfig::default()
    }
}

/// Compresses every raw chunk it can, as the compressor thread would.
fn compress_all(cache: &ChunkCache) {
    let mut encoder = Encoder::new(Default::default()).unwrap();
    let mut out = Vec::new();
    while cache.compress_round(&mut encoder, &mut out, true) > 0 {}
}

fn key(chunk: usize) -> ChunkKey {
    ChunkKey {
        file: 1,
        chunk: chunk as u32,
    }
}

/// Every dtype, odd tensor sizes, chunks starting mid-element: what a reader gets from a
/// compressed chunk (decoded into a window, then from the window) is the source's bytes, bit
/// for bit; bf16 chunks are held compressed at about two thirds of their size.
#[test]
fn readers_get_the_source_bytes_from_compressed_chunks_of_every_dtype() {
    let w = weights(&[
        (WeightDtype::BF16, 300_001 * 2, 65_536, 0),
        (WeightDtype::BF16, 200_000 * 2, 65_537, 3), // odd cuts: chunks start mid-element
        (WeightDtype::F16, 150_003 * 2, 65_536, 1),
        (WeightDtype::F32, 70_001 * 4, 100_003, 2),
        (WeightDtype::F8E4M3, 200_003, 65_536, 0),
        (WeightDtype::F8E5M2, 200_001, 77_777, 5),
    ]);
    assert!(w.chunks.iter().any(|c| c.2.phase != 0));
    let cache = ChunkCache::with_config(
        64 << 20,
        Arc::new(Counters::default()),
        tier(CompressMode::On),
    );
    for c in 0..w.len() {
        assert_eq!(
            w.get(&cache, c).unwrap().0.as_slice(),
            w.expect(c),
            "chunk {c}"
        );
    }
    compress_all(&cache);
    let held = cache.tier_snapshot();
    assert!(held.frame_raw_bytes > w.data.len() as u64 / 2, "{held:?}");
    cache.check_accounting();
    for round in 0..2 {
        for c in 0..w.len() {
            let (chunk, outcome) = w.get(&cache, c).unwrap();
            assert_eq!(outcome, Outcome::Hit);
            assert_eq!(chunk.as_slice(), w.expect(c), "round {round}, chunk {c}");
        }
        cache.check_accounting();
    }
    assert_eq!(Counters::get(&cache.counters().decode_errors), 0);
    assert!(Counters::get(&cache.counters().decoded_bytes) > 0);
}

/// bf16 weights are held at most 0.72 of their size (frames, page-rounded, counted in the
/// budget) once compressed.
#[test]
fn bf16_chunks_are_held_in_under_072_of_their_size() {
    let w = weights(&[(WeightDtype::BF16, 16 << 20, 4 << 20, 0)]);
    let cache = ChunkCache::with_config(
        64 << 20,
        Arc::new(Counters::default()),
        tier(CompressMode::On),
    );
    for c in 0..w.len() {
        w.get(&cache, c).unwrap();
    }
    let raw = cache.snapshot().used_bytes;
    compress_all(&cache);
    let held = cache.snapshot().used_bytes;
    assert!(held * 100 <= raw * 72, "held {held} of {raw}");
    assert_eq!(cache.tier_snapshot().frame_bytes, held);
}

/// A damaged frame is never served: the hit becomes a miss, the source is read again, the
/// reader gets the right bytes, and the error is counted.
#[test]
fn a_damaged_frame_is_a_miss_never_wrong_bytes() {
    let w = weights(&[(WeightDtype::BF16, 4 << 20, 1 << 20, 0)]);
    let cache = ChunkCache::with_config(
        64 << 20,
        Arc::new(Counters::default()),
        tier(CompressMode::On),
    );
    for c in 0..w.len() {
        w.get(&cache, c).unwrap();
    }
    compress_all(&cache);
    assert!(cache.damage_frame(key(1)));
    let misses = cache.snapshot().misses;
    let (chunk, outcome) = w.get(&cache, 1).unwrap();
    assert_eq!(outcome, Outcome::Miss);
    assert_eq!(chunk.as_slice(), w.expect(1));
    assert_eq!(Counters::get(&cache.counters().decode_errors), 1);
    assert_eq!(cache.snapshot().misses, misses + 1);
    cache.check_accounting();
    // The others still decode.
    for c in [0, 2, 3] {
        assert_eq!(w.get(&cache, c).unwrap().0.as_slice(), w.expect(c));
    }
}

/// Eight readers starting in one compressed chunk at once decode it once (single flight) and
/// all get its bytes.
#[test]
fn readers_of_one_frame_decode_it_once() {
    let w = Arc::new(weights(&[(WeightDtype::BF16, 4 << 20, 4 << 20, 0)]));
    let cache = Arc::new(ChunkCache::with_config(
        64 << 20,
        Arc::new(Counters::default()),
        tier(CompressMode::On),
    ));
    w.get(&cache, 0).unwrap();
    compress_all(&cache);
    assert!(cache.tier_snapshot().frame_raw_bytes > 0);
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let (w, cache, barrier) = (Arc::clone(&w), Arc::clone(&cache), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let (chunk, _) = w.get(&cache, 0).unwrap();
                assert_eq!(chunk.as_slice(), w.expect(0));
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(Counters::get(&cache.counters().decoded_bytes), 4 << 20);
    cache.check_accounting();
}

/// Decoded windows are bounded (bytes and share of the budget) and counted in the budget: a
/// reader going through many compressed chunks leaves at most the bound of windows, and the
/// cache never holds more than its budget.
#[test]
fn windows_are_bounded_and_counted_in_the_budget() {
    let w = weights(&[(WeightDtype::BF16, 48 << 20, 1 << 20, 0)]);
    let config = CacheConfig {
        tier: TierConfig {
            max_window_bytes: 4 << 20,
            ..tier(CompressMode::On).tier
        },
        ..tier(CompressMode::On)
    };
    let budget = 40 << 20;
    let cache = ChunkCache::with_config(budget, Arc::new(Counters::default()), config);
    for c in 0..w.len() {
        w.get(&cache, c).unwrap();
        compress_all(&cache);
    }
    for c in 0..w.len() {
        assert_eq!(w.get(&cache, c).unwrap().0.as_slice(), w.expect(c));
        let held = cache.tier_snapshot();
        assert!(held.window_bytes <= 4 << 20, "{held:?}");
        cache.check_accounting();
    }
    // 48 MiB of bf16 fit a 40 MiB budget once compressed: a second pass reads nothing.
    let misses = cache.snapshot().misses;
    for c in 0..w.len() {
        w.get(&cache, c).unwrap();
        compress_all(&cache);
    }
    assert_eq!(cache.snapshot().misses, misses);
}

/// A window no reader got for `window_idle` goes back to its frame at the next round.
#[test]
fn idle_windows_close() {
    let w = weights(&[(WeightDtype::BF16, 2 << 20, 1 << 20, 0)]);
    let mut config = tier(CompressMode::On);
    config.tier.window_idle = std::time::Duration::from_millis(30);
    let cache = ChunkCache::with_config(64 << 20, Arc::new(Counters::default()), config);
    for c in 0..w.len() {
        w.get(&cache, c).unwrap();
    }
    compress_all(&cache);
    let frames = cache.snapshot().used_bytes;
    assert_eq!(w.get(&cache, 0).unwrap().0.as_slice(), w.expect(0));
    assert!(cache.tier_snapshot().window_bytes > 0);
    std::thread::sleep(std::time::Duration::from_millis(60));
    compress_all(&cache);
    assert_eq!(cache.tier_snapshot().window_bytes, 0);
    assert_eq!(cache.snapshot().used_bytes, frames);
    cache.check_accounting();
}

/// `off` never compresses; `on` always; `auto` only under pressure and when the decoder is
/// faster than the source.
#[test]
fn auto_compresses_only_under_pressure_and_when_decoding_beats_the_source() {
    let w = weights(&[(WeightDtype::BF16, 8 << 20, 1 << 20, 0)]);
    let cache = ChunkCache::with_config(
        10 << 20,
        Arc::new(Counters::default()),
        tier(CompressMode::Auto),
    );
    let (decode, slow, fast) = (Some(2e9), Some(2e8), Some(8e9));
    // Within the margin (the decoder not four times as fast): not worth it.
    let close = Some(1e9);
    assert!(!cache.compressing(decode, slow), "no pressure yet");
    for c in 0..w.len() {
        w.get(&cache, c).unwrap();
    }
    assert!(cache.compressing(decode, slow));
    assert!(!cache.compressing(decode, fast));
    assert!(!cache.compressing(decode, close));
    assert!(
        !cache.compressing(decode, None),
        "an unmeasured source counts as fast"
    );
    assert!(!cache.compressing(None, slow));
    cache.set_compress_mode(CompressMode::Off);
    assert!(!cache.compressing(decode, slow));
    cache.set_compress_mode(CompressMode::On);
    assert!(cache.compressing(decode, fast));
    // `auto` stops once under the pressure mark again.
    cache.set_compress_mode(CompressMode::Auto);
    let mut encoder = Encoder::new(Default::default()).unwrap();
    let mut out = Vec::new();
    while cache.compressing(decode, slow) && cache.compress_round(&mut encoder, &mut out, true) > 0
    {
    }
    assert!(!cache.under_pressure());
    assert!(
        cache.tier_snapshot().frame_raw_bytes < 8 << 20,
        "not every chunk needed compressing"
    );
}

/// Bytes that do not compress (random) stay raw, are not tried again, and read back exact.
#[test]
fn incompressible_chunks_stay_raw() {
    let mut w = weights(&[(WeightDtype::BF16, 2 << 20, 1 << 20, 0)]);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for b in &mut w.data {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *b = state as u8;
    }
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&w.data).unwrap();
    w.source = SourceFile::open(file.path()).unwrap();
    w._file = file;
    let cache = ChunkCache::with_config(
        64 << 20,
        Arc::new(Counters::default()),
        tier(CompressMode::On),
    );
    for c in 0..w.len() {
        w.get(&cache, c).unwrap();
    }
    compress_all(&cache);
    assert_eq!(cache.tier_snapshot().frame_raw_bytes, 0);
    assert_eq!(Counters::get(&cache.counters().kept_raw_bytes), 2 << 20);
    let mut encoder = Encoder::new(Default::default()).unwrap();
    assert_eq!(cache.compress_round(&mut encoder, &mut Vec::new(), true), 0);
    for c in 0..w.len() {
        assert_eq!(w.get(&cache, c).unwrap().0.as_slice(), w.expect(c));
    }
}

/// A probe never decodes a whole chunk for a page: a compressed chunk is not peeked.
#[test]
fn probes_do_not_decode() {
    let w = weights(&[(WeightDtype::BF16, 1 << 20, 1 << 20, 0)]);
    let cache = ChunkCache::with_config(
        64 << 20,
        Arc::new(Counters::default()),
        tier(CompressMode::On),
    );
    w.get(&cache, 0).unwrap();
    assert!(cache.peek(key(0)).is_some());
    compress_all(&cache);
    assert!(cache.peek(key(0)).is_none());
    assert_eq!(Counters::get(&cache.counters().decoded_bytes), 0);
}

/// A chunk's codec follows its tensor: dtype layout and phase; mixed packs are bytes.
#[test]
fn codecs_follow_dtype_and_phase() {
    assert_eq!(ChunkCodec::of("BF16", 4 << 20).layout, PlaneLayout::BF16);
    assert_eq!(ChunkCodec::of("BF16", (4 << 20) + 1).phase, 1);
    assert_eq!(ChunkCodec::of("F32", 6).phase, 2);
    assert_eq!(ChunkCodec::of("Q4_K", 3), ChunkCodec::default());
    assert_eq!(ChunkCodec::of("F8_E4M3", 3).phase, 0);
}

/// The decoder's calibration gives a speed.
#[test]
fn decode_calibrates() {
    assert!(calibrate_decode().is_some_and(|s| s > 1e6));
}
