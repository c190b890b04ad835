//! Tuning of the codec.

use super::{DEFAULT_LEVEL, MIN_SAVING_PERCENT};

/// How chunks are encoded. The defaults are the measured values
/// ([PERFORMANCE.md](../../../docs/PERFORMANCE.md#compressed-ram-tier-the-codec)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressConfig {
    /// zstd level of each plane ([`DEFAULT_LEVEL`]). Past level 1 the planes get larger, not
    /// smaller, decoding slower and encoding 1.5–7 times slower.
    pub level: i32,
    /// A chunk is kept compressed only if its frame is at least this many percent smaller than
    /// the chunk ([`MIN_SAVING_PERCENT`]); 0 keeps every frame not larger than the chunk.
    pub min_saving_percent: u8,
}

impl Default for CompressConfig {
    fn default() -> Self {
        CompressConfig {
            level: DEFAULT_LEVEL,
            min_saving_percent: MIN_SAVING_PERCENT,
        }
    }
}

impl CompressConfig {
    /// Whether a frame of `frame_len` bytes saves enough over a chunk of `raw_len` bytes.
    pub fn worth_it(&self, frame_len: usize, raw_len: usize) -> bool {
        let keep = 100 - u128::from(self.min_saving_percent.min(100));
        (frame_len as u128) * 100 <= (raw_len as u128) * keep && frame_len < raw_len
    }
}
