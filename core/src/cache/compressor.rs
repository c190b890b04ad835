//! The compressed tier's background thread: which chunks it compresses, and when.
//!
//! **Contract.** One thread per cache ([`ChunkCache::start_compressor`]), which ends once the
//! cache is dropped. Each round ([`ChunkCache::compress_round`]) it decides whether to work
//! ([`ChunkCache::compressing`]); if so it takes a batch of raw chunks, needed furthest in the
//! future first, and encodes them one by one with no lock held (`tier.rs`); every round it also
//! closes the decoded windows readers have left ([`super::TierConfig::window_idle`]). It sleeps
//! [`super::TierConfig::poll`] when a round found nothing to do.
//!
//! **When `auto` compresses**: while the cache holds more than
//! [`super::TierConfig::pressure_percent`] of its budget *and* the decoder is at least
//! [`super::TierConfig::auto_margin`] times faster than the source. A hit on a compressed chunk
//! costs the reader a decode (on its own thread) where a miss costs a source read, and every
//! compressed byte read pays it while only the bytes that did not fit raw are saved a read:
//! compressing pays only when the decode is several times faster than the source.
//! The decode speed is the one measured on this machine: the tier's own decodes once they add
//! up to [`DECODE_SAMPLE_BYTES`], before that a calibration (a 4 MiB chunk of synthetic bf16
//! weights, [`crate::weights`], decoded three times, the best kept), made the first time the
//! cache is under pressure with a source measured slower than [`DECODE_CEILING`] / margin;
//! the thread holds no encoder until it compresses.
//! The source speed is the source meters' throughput while reading
//! ([`crate::source::meter::SourceMeter::throughput_since_mount`]), of the slowest device the
//! mount reads; unknown (nothing read yet) counts as fast: no compression. A reader slower
//! than both is served by prefetch either way; a reader faster than the source gains from
//! every hit the compressed budget turns a miss into, at the decoder's speed. So on a fast
//! local source `auto` never compresses, and no loader gets slower than without the tier
//! ([measured](../../../docs/PERFORMANCE.md#compressed-ram-tier-in-the-cache)).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::{ChunkCache, CompressMode};
use crate::compress::{Decoder, Encoded, Encoder, PlaneLayout};
use crate::stats::Counters;
use crate::weights::{WeightDtype, WeightGen};

/// A decode speed per core above any the codec reached (1.2–3.3 GB/s of output,
/// [measured](../../../docs/PERFORMANCE.md#compressed-ram-tier-the-codec)): `auto` measures
/// the decoder only for a source slow enough that such a decoder would clear the margin.
pub const DECODE_CEILING: f64 = 4e9;

/// The source's throughput while reading, in bytes per second (`None`: not measured yet).
pub type SourceSpeed = Arc<dyn Fn() -> Option<f64> + Send + Sync>;

/// Decodes of the tier itself replace the calibration once they add up to this: 64 MiB,
/// sixteen chunks, enough to average out a page fault or a preempted decode.
pub const DECODE_SAMPLE_BYTES: u64 = 64 << 20;

/// The decoder's speed on this machine, in bytes of output per second on one core: the best of
/// three decodes of a 4 MiB chunk of synthetic bf16 weights. `None` if the codec fails.
pub fn calibrate_decode() -> Option<f64> {
    let chunk = WeightGen::new(1).tensors(WeightDtype::BF16, 4 << 20, 4 << 20);
    let mut encoder = Encoder::new(Default::default()).ok()?;
    let mut frame = Vec::new();
    let Ok(Encoded::Frame(_)) = encoder.encode(PlaneLayout::BF16, 0, &chunk, &mut frame) else {
        return None;
    };
    let mut decoder = Decoder::new().ok()?;
    let mut out = vec![0u8; chunk.len()];
    let mut best: Option<f64> = None;
    for _ in 0..3 {
        let started = Instant::now();
        decoder.decode(&frame, &mut out).ok()?;
        let speed = chunk.len() as f64 / started.elapsed().as_secs_f64().max(1e-9);
        best = Some(best.map_or(speed, |b: f64| b.max(speed)));
    }
    best
}

impl ChunkCache {
    /// The compressed tier's mode now.
    pub fn compress_mode(&self) -> CompressMode {
        match self.compress_mode.load(Ordering::Relaxed) {
            1 => CompressMode::On,
            2 => CompressMode::Off,
            _ => CompressMode::Auto,
        }
    }

    /// Changes the compressed tier's mode (chunks compressed already stay so until evicted).
    pub fn set_compress_mode(&self, mode: CompressMode) {
        let value = match mode {
            CompressMode::Auto => 0,
            CompressMode::On => 1,
            CompressMode::Off => 2,
        };
        self.compress_mode.store(value, Ordering::Relaxed);
    }

    /// The decode speed `auto` compares with the source's, per core: the faster of the
    /// calibration and the tier's own decodes once they add up to [`DECODE_SAMPLE_BYTES`]
    /// (readers' decodes are timed on their threads, preemption included, so under load they
    /// read low).
    pub fn decode_speed(&self, calibrated: Option<f64>) -> Option<f64> {
        let bytes = Counters::get(&self.counters.decoded_bytes);
        let ns = Counters::get(&self.counters.decode_ns);
        let live = (bytes >= DECODE_SAMPLE_BYTES && ns > 0).then(|| bytes as f64 * 1e9 / ns as f64);
        match (live, calibrated) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the compressor should work now (see the module docs).
    pub fn compressing(&self, decode_speed: Option<f64>, source_speed: Option<f64>) -> bool {
        match self.compress_mode() {
            CompressMode::Off => false,
            CompressMode::On => true,
            CompressMode::Auto => {
                let margin = f64::from(self.config.tier.auto_margin.max(1));
                let pays =
                    matches!((decode_speed, source_speed), (Some(d), Some(s)) if s * margin <= d);
                pays && self.under_pressure()
            }
        }
    }

    /// One round of the compressor: if `active`, encodes a batch of raw chunks (with `encoder`,
    /// `out` its scratch). Returns how many chunks it looked at (0: nothing to do).
    pub fn compress_round(&self, encoder: &mut Encoder, out: &mut Vec<u8>, active: bool) -> usize {
        self.close_idle_windows();
        if !active {
            return 0;
        }
        let batch = self.compress_candidates(self.config.tier.batch_chunks.max(1));
        for (key, chunk) in &batch {
            // `auto` stops once the pressure is gone, mid-batch too.
            if self.compress_mode() == CompressMode::Auto && !self.under_pressure() {
                break;
            }
            self.demote(encoder, out, *key, chunk);
        }
        batch.len()
    }

    /// Starts the compressor thread of this cache; `source_speed` tells the source's
    /// throughput. The thread ends once the cache is dropped. It holds no encoder and measures
    /// no decoder until it has work: `auto` calibrates the decoder the first time the cache is
    /// under pressure with a source measured slow enough ([`DECODE_CEILING`]), so a mount that
    /// never needs the tier (a fast source, a model that fits) allocates nothing for it
    /// ([measured](../../../docs/PERFORMANCE.md#compressed-ram-tier-in-the-cache)).
    pub fn start_compressor(self: &Arc<Self>, source_speed: SourceSpeed) -> std::io::Result<()> {
        let cache: Weak<ChunkCache> = Arc::downgrade(self);
        let codec = self.config.tier.codec;
        let poll = self.config.tier.poll;
        std::thread::Builder::new()
            .name("tierfs-compress".into())
            .spawn(move || {
                let mut encoder: Option<Encoder> = None;
                let mut calibrated: Option<Option<f64>> = None;
                let mut out = Vec::new();
                loop {
                    let Some(cache) = cache.upgrade() else {
                        return;
                    };
                    let active = match cache.compress_mode() {
                        CompressMode::Off => false,
                        CompressMode::On => true,
                        CompressMode::Auto => {
                            let source = source_speed();
                            let margin = f64::from(cache.config.tier.auto_margin.max(1));
                            let could_pay = source.is_some_and(|s| s * margin <= DECODE_CEILING);
                            could_pay && cache.under_pressure() && {
                                let decode = *calibrated.get_or_insert_with(|| {
                                    let speed = calibrate_decode();
                                    tracing::debug!(decode_bytes_per_s = ?speed, "compressed tier calibrated");
                                    speed
                                });
                                cache.compressing(cache.decode_speed(decode), source)
                            }
                        }
                    };
                    if active && encoder.is_none() {
                        match Encoder::new(codec) {
                            Ok(made) => encoder = Some(made),
                            Err(e) => {
                                tracing::warn!(error = %e, "no encoder: the compressed tier is off");
                                return;
                            }
                        }
                    }
                    let worked = match encoder.as_mut() {
                        Some(encoder) => cache.compress_round(encoder, &mut out, active),
                        None => {
                            cache.close_idle_windows();
                            0
                        }
                    };
                    drop(cache);
                    if worked == 0 {
                        std::thread::sleep(poll);
                    }
                }
            })
            .map(|_| ())
    }
}
