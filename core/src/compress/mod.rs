//! Lossless compression of one chunk of tensor data: the codec of the compressed RAM tier.
//!
//! # Contract
//!
//! [`Encoder::encode`] takes the bytes of a chunk (a run of tensor data of one dtype, any
//! length, starting at any byte of an element) and either writes a *frame* that
//! [`Decoder::decode`] turns back into exactly those bytes, or answers [`Encoded::Raw`]: the
//! chunk does not gain [`MIN_SAVING_PERCENT`] and is better kept as it is. Nothing is lost:
//! every bit of the input comes back, NaN payloads, signed zeros and padding included.
//!
//! - **What a dtype gives the codec** is a [`PlaneLayout`] ([`PlaneLayout::for_dtype`]): the
//!   element width (bf16/fp16: 2 bytes, fp32: 4, fp8 and every other dtype: 1) and whether the
//!   sign bit is rotated next to the mantissa, so that a whole byte holds the exponent (bf16,
//!   fp32). The layout changes the ratio, never the correctness: any layout round-trips any
//!   bytes.
//! - **Phase.** `phase` is the offset of the chunk's first byte inside its element (the
//!   tensor-relative offset modulo the width; 0 for a chunk that starts on an element). The
//!   bytes before the first whole element and after the last one are stored as they are.
//! - **Byte planes.** The whole elements are split into `width` planes, byte `i` of every element
//!   in plane `i` (`planes.rs`); each plane is entropy-coded by zstd or stored raw, whichever is
//!   smaller. In bf16 the exponent plane carries about 2.5 bits per byte and codes to 0.36
//!   of its size; the sign-and-mantissa plane is close to random and stays raw.
//! - **The decoder never trusts its input** (`frame.rs`): the header's magic, version, width,
//!   plane modes and lengths are checked against each other, against the frame's length and
//!   against the output size the caller gives, before a byte is written; a coded plane must
//!   decode to exactly its length; and the [`xxh3`](xxhash_rust::xxh3) checksum of the original
//!   bytes, kept in the header, must match the decoded bytes. A damaged frame is an error,
//!   never wrong bytes. On error the output buffer holds unspecified bytes: discard it.
//! - **No allocation on the decode path** beyond what zstd needs: [`Decoder`] keeps its zstd
//!   context and one scratch plane, and writes into the caller's buffer; keep one per thread.
//!   [`Encoder`] likewise keeps its context and the split planes between calls.
//! - No locks: encoders and decoders are plain values, `Send`, used by one thread at a time.
//!
//! # Why zstd
//!
//! The planes need an order-0 entropy coder (Huffman or ANS); matches between bytes gain little
//! on weights. zstd's block format codes literals with a 4-stream Huffman coder and its
//! decoder is the fastest well-kept one within reach of Rust: the measured candidates, the
//! reasons and the table are in
//! [PERFORMANCE.md](../../../docs/PERFORMANCE.md#compressed-ram-tier-the-codec). In short:
//! `lz4_flex` has no entropy stage and codes the exponent plane to 0.65 of its size where
//! Huffman reaches 0.36; the pure-Rust zstd decoder (`ruzstd`) reads the same frames six times
//! slower; no pure-Rust Huffman or FSE crate found is both maintained and made for throughput.
//!
//! # Constants
//!
//! - [`MIN_SAVING_PERCENT`]: below it a decode on every hit costs more than the RAM it frees
//!   ([PERFORMANCE.md](../../../docs/PERFORMANCE.md#compressed-ram-tier-the-codec)).
//! - [`DEFAULT_LEVEL`]: zstd level 1; higher levels find short matches that make the planes
//!   larger, not smaller, and encode 1.5–7 times slower
//!   ([PERFORMANCE.md](../../../docs/PERFORMANCE.md#compressed-ram-tier-the-codec)).

mod codec;
mod config;
mod dtype;
mod frame;
mod planes;
#[cfg(test)]
mod tests;

pub use codec::{Decoder, Encoded, Encoder};
pub use config::CompressConfig;
pub use dtype::PlaneLayout;
pub use frame::{FrameInfo, PlaneMode, HEADER_BYTES, MAGIC, MAX_PLANES, VERSION};

/// A chunk is kept compressed only if its frame is at least this share (in percent) smaller
/// than the chunk: below it, a decode on every hit costs more than the RAM it frees.
pub const MIN_SAVING_PERCENT: u8 = 5;

/// zstd level of the planes: 1; higher levels find short matches that make the planes larger,
/// not smaller, and encode 1.5–7 times slower.
pub const DEFAULT_LEVEL: i32 = 1;

/// Errors of the codec.
#[derive(Debug, thiserror::Error)]
pub enum CompressError {
    /// The frame is shorter than its header says, or than a header.
    #[error("compressed frame truncated: {0}")]
    Truncated(&'static str),
    /// The frame does not start with [`MAGIC`].
    #[error("not a compressed frame (bad magic)")]
    BadMagic,
    /// A frame of another version of the format.
    #[error("compressed frame version {0} is not supported")]
    Version(u8),
    /// The header's fields disagree with each other or with the frame.
    #[error("corrupt compressed frame: {0}")]
    Corrupt(&'static str),
    /// The caller's output buffer is not the frame's original size.
    #[error("output buffer holds {given} bytes, the frame decodes to {expected}")]
    OutputSize { given: usize, expected: u64 },
    /// A coded plane did not decode to its length.
    #[error("plane {plane} did not decode: {reason}")]
    Plane { plane: usize, reason: String },
    /// The decoded bytes do not match the checksum of the original bytes.
    #[error("compressed frame checksum mismatch")]
    Checksum,
    /// The chunk is too large for the frame's length fields.
    #[error("chunk of {0} bytes is too large for one frame")]
    TooLarge(usize),
    /// zstd could not make a context.
    #[error("zstd: {0}")]
    Zstd(String),
}
