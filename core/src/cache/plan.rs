//! How a safetensors file's data region is cut into cache chunks.
//!
//! The unit of caching follows tensor boundaries, so that evicting or prefetching a chunk is
//! evicting or prefetching (part of) known tensors of one known block:
//!
//! - a tensor larger than [`SMALL_TENSOR_BYTES`] gets chunks of its own, cut every
//!   [`CHUNK_BYTES`] from the tensor's first byte (the last piece is the remainder);
//! - runs of adjacent small tensors (biases, norms, scales) *of the same block* share a chunk of
//!   at most [`CHUNK_BYTES`], so a block's hundred tiny tensors do not cost a hundred disk reads;
//! - bytes between tensors (a gap, which the safetensors crate rejects, but the plan does not
//!   rely on that) form chunks of their own.
//!
//! The chunks cover `[header_bytes, data_end)` contiguously, sorted by offset, so the chunk that
//! holds a byte is a binary search away.
//!
//! Each chunk also carries what the compressed RAM tier needs to split it into byte planes
//! ([`ChunkCodec`]): the layout of its tensor's dtype and the offset of its first byte inside
//! an element. A pack of small tensors of one dtype keeps that dtype's layout; a pack mixing
//! dtypes, a gap, and every quantized GGUF type are one plane of bytes. The codec only steers the
//! ratio: any layout round-trips any bytes.

use crate::compress::PlaneLayout;
use crate::index::TensorIndex;

/// Largest chunk: 4 MiB. Several milliseconds of disk time at 1–3 GB/s, so the per-request cost
/// of a read is negligible; twice the 2 MiB ranges ComfyUI re-reads with; and small next to any
/// useful budget (a 512 MiB budget holds 128 chunks), so LRU decisions stay fine-grained.
pub const CHUNK_BYTES: u64 = 4 << 20;

/// Tensors up to 1 MiB are packed with their neighbours. Real checkpoints have hundreds of
/// biases and norm weights of a few KiB each between multi-MiB weight matrices.
pub const SMALL_TENSOR_BYTES: u64 = 1 << 20;

/// One cache chunk: file bytes `[start, end)`, all belonging to block `block` of the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSpan {
    pub start: u64,
    pub end: u64,
    pub block: usize,
    /// How the compressed tier splits the chunk's bytes.
    pub codec: ChunkCodec,
}

/// How a chunk's bytes are split into byte planes by the compressed RAM tier: the layout of its
/// dtype ([`PlaneLayout::for_dtype`]) and `phase`, the offset of its first byte inside an
/// element (0 unless the chunk starts mid-element).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkCodec {
    pub layout: PlaneLayout,
    pub phase: u8,
}

impl Default for ChunkCodec {
    /// One plane of bytes: what is known of bytes of no (or mixed) dtype.
    fn default() -> Self {
        ChunkCodec {
            layout: PlaneLayout::BYTES,
            phase: 0,
        }
    }
}

impl ChunkCodec {
    /// The codec of a chunk starting `offset` bytes into a tensor of `dtype`.
    pub fn of(dtype: &str, offset: u64) -> ChunkCodec {
        let layout = PlaneLayout::for_dtype(dtype);
        ChunkCodec {
            layout,
            phase: (offset % layout.width() as u64) as u8,
        }
    }
}

impl ChunkSpan {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// The chunks of one file's data region, sorted by offset.
#[derive(Debug, Clone, Default)]
pub struct ChunkPlan {
    chunks: Vec<ChunkSpan>,
    /// `by_block[b]`: the chunks of block `b`, in file order (a block's tensors can sit in
    /// several regions of the file, e.g. when a writer sorts by dtype first).
    by_block: Vec<Vec<usize>>,
}

impl ChunkPlan {
    pub fn for_index(index: &TensorIndex) -> ChunkPlan {
        let mut builder = PlanBuilder::default();
        let mut cursor = index.header_bytes;
        for tensor in &index.tensors {
            if tensor.start > cursor {
                builder.split((cursor, tensor.start, tensor.block), None);
            }
            if tensor.end == tensor.start {
                // An empty tensor has no chunk, but the gap before it does: a GGUF file may put
                // one past the last tensor with bytes, and `data_end` is its offset (found by
                // the `gguf_parse` fuzz target: the plan stopped short of `data_end`).
                cursor = cursor.max(tensor.end);
                continue;
            }
            if tensor.end - tensor.start <= SMALL_TENSOR_BYTES {
                builder.pack(tensor.start, tensor.end, tensor.block, &tensor.dtype);
            } else {
                let span = (tensor.start, tensor.end, tensor.block);
                builder.split(span, Some(&tensor.dtype));
            }
            cursor = cursor.max(tensor.end);
        }
        builder.finish(index.blocks.len())
    }

    /// The same chunks with their blocks renumbered: local block `b` becomes `to[b]`, out of
    /// `blocks` in all. How a shard's plan speaks in its model's blocks
    /// ([`crate::models::shards`]): one block numbering, order and eviction distance over every
    /// shard. A block missing from `to` keeps its number (cannot happen for a map built from
    /// the same index).
    pub fn renumbered(self, to: &[usize], blocks: usize) -> ChunkPlan {
        let mut builder = PlanBuilder {
            chunks: self.chunks,
            open_pack: None,
        };
        for span in &mut builder.chunks {
            span.block = to.get(span.block).copied().unwrap_or(span.block);
        }
        builder.finish(blocks)
    }

    /// The chunks of block `block`, in file order.
    pub fn block_chunks(&self, block: usize) -> &[usize] {
        self.by_block.get(block).map_or(&[], Vec::as_slice)
    }

    /// Bytes of block `block`'s chunks.
    pub fn block_bytes(&self, block: usize) -> u64 {
        self.block_chunks(block)
            .iter()
            .map(|&c| self.chunks[c].len())
            .sum()
    }

    pub fn chunks(&self) -> &[ChunkSpan] {
        &self.chunks
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    pub fn get(&self, chunk: usize) -> Option<&ChunkSpan> {
        self.chunks.get(chunk)
    }

    /// The chunk holding byte `offset`, if the offset is inside the data region.
    pub fn chunk_at(&self, offset: u64) -> Option<usize> {
        let after = self.chunks.partition_point(|c| c.start <= offset);
        let candidate = after.checked_sub(1)?;
        (offset < self.chunks[candidate].end).then_some(candidate)
    }
}

#[derive(Default)]
struct PlanBuilder {
    chunks: Vec<ChunkSpan>,
    /// A chunk of small tensors still open for more neighbours.
    open_pack: Option<ChunkSpan>,
}

impl PlanBuilder {
    /// Adds a small tensor of `dtype`: to the open pack if it continues it, else as a new pack.
    /// A pack keeps its first tensor's layout while the tensors share it (each a whole number of
    /// elements, so the phase stays 0); a mix of layouts is bytes.
    fn pack(&mut self, start: u64, end: u64, block: usize, dtype: &str) {
        let codec = ChunkCodec::of(dtype, 0);
        if let Some(pack) = &mut self.open_pack {
            if pack.block == block && pack.end == start && end - pack.start <= CHUNK_BYTES {
                pack.end = end;
                if pack.codec != codec {
                    pack.codec = ChunkCodec::default();
                }
                return;
            }
        }
        self.close_pack();
        self.open_pack = Some(ChunkSpan {
            start,
            end,
            block,
            codec,
        });
    }

    /// Cuts `[start, end)` of `block` into chunks, from its start: a large tensor of `dtype`,
    /// or (`None`) bytes between tensors.
    fn split(&mut self, (start, end, block): (u64, u64, usize), dtype: Option<&str>) {
        self.close_pack();
        let mut piece = start;
        while piece < end {
            let piece_end = end.min(piece + CHUNK_BYTES);
            self.chunks.push(ChunkSpan {
                start: piece,
                end: piece_end,
                block,
                codec: dtype.map_or_else(ChunkCodec::default, |d| ChunkCodec::of(d, piece - start)),
            });
            piece = piece_end;
        }
    }

    fn close_pack(&mut self) {
        self.chunks.extend(self.open_pack.take());
    }

    fn finish(mut self, blocks: usize) -> ChunkPlan {
        self.close_pack();
        let mut by_block = vec![Vec::new(); blocks];
        for (chunk, span) in self.chunks.iter().enumerate() {
            if let Some(list) = by_block.get_mut(span.block) {
                list.push(chunk);
            }
        }
        ChunkPlan {
            chunks: self.chunks,
            by_block,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{BlockInfo, TensorInfo};
    use proptest::prelude::*;

    /// An index with tensors of the given (length, block) laid out back to back.
    fn index_of(tensors: &[(u64, usize)]) -> TensorIndex {
        let header_bytes = 1000;
        let mut start = header_bytes;
        let tensors: Vec<TensorInfo> = tensors
            .iter()
            .enumerate()
            .map(|(i, &(len, block))| {
                let t = TensorInfo {
                    name: format!("t{i}"),
                    dtype: "U8".into(),
                    shape: vec![len],
                    start,
                    end: start + len,
                    block,
                };
                start += len;
                t
            })
            .collect();
        let blocks = (0..=tensors.iter().map(|t| t.block).max().unwrap_or(0))
            .map(|b| BlockInfo {
                name: format!("b{b}"),
                family: None,
                number: None,
                tensors: 0,
                bytes: 0,
            })
            .collect();
        TensorIndex {
            format: Default::default(),
            file_size: start,
            header_bytes,
            data_end: start,
            tensors,
            blocks,
            metadata: None,
        }
    }

    #[test]
    fn large_tensors_are_cut_from_their_start_and_small_ones_packed_per_block() {
        let mib = 1 << 20;
        let index = index_of(&[(10 * mib, 0), (4096, 0), (8192, 0), (4096, 1), (5 * mib, 1)]);
        let plan = ChunkPlan::for_index(&index);
        let spans: Vec<(u64, u64, usize)> = plan
            .chunks()
            .iter()
            .map(|c| (c.start - 1000, c.len(), c.block))
            .collect();
        assert_eq!(
            spans,
            vec![
                (0, 4 * mib, 0),
                (4 * mib, 4 * mib, 0),
                (8 * mib, 2 * mib, 0),
                (10 * mib, 4096 + 8192, 0), // two small tensors of block 0 share a chunk
                (10 * mib + 12288, 4096, 1), // a new block starts a new chunk
                (10 * mib + 16384, 4 * mib, 1),
                (14 * mib + 16384, mib, 1),
            ]
        );
        assert_eq!(plan.chunk_at(999), None);
        assert_eq!(plan.chunk_at(1000), Some(0));
        assert_eq!(plan.chunk_at(1000 + 4 * mib), Some(1));
        assert_eq!(plan.chunk_at(index.data_end - 1), Some(6));
        assert_eq!(plan.chunk_at(index.data_end), None);
    }

    #[test]
    fn the_gap_before_a_trailing_empty_tensor_is_a_chunk() {
        let mut index = index_of(&[(4096, 0), (0, 1)]);
        // The empty tensor sits 1000 bytes past the end of the first one (GGUF allows it).
        let last = index.tensors.last_mut().unwrap();
        last.start += 1000;
        last.end += 1000;
        index.data_end = last.end;
        index.file_size = last.end;
        let plan = ChunkPlan::for_index(&index);
        let spans: Vec<(u64, u64, usize)> = plan
            .chunks()
            .iter()
            .map(|c| (c.start, c.end, c.block))
            .collect();
        assert_eq!(spans, [(1000, 5096, 0), (5096, 6096, 1)]);
        assert_eq!(plan.chunk_at(index.data_end - 1), Some(1));
    }

    proptest! {
        /// Whatever the tensors, chunks cover the data region exactly, in order, never exceed
        /// CHUNK_BYTES, and never mix tensors unless all of them are small and of one block.
        #[test]
        fn chunks_tile_the_data_and_respect_tensor_boundaries(
            tensors in prop::collection::vec((0u64..12 << 20, 0usize..4), 0..40)
        ) {
            let index = index_of(&tensors);
            let plan = ChunkPlan::for_index(&index);
            let mut cursor = index.header_bytes;
            for chunk in plan.chunks() {
                prop_assert_eq!(chunk.start, cursor);
                prop_assert!(!chunk.is_empty() && chunk.len() <= CHUNK_BYTES);
                let inside: Vec<&TensorInfo> = index.tensors.iter()
                    .filter(|t| t.start < chunk.end && t.end > chunk.start)
                    .collect();
                if inside.len() > 1 {
                    for t in &inside {
                        prop_assert!(t.len() <= SMALL_TENSOR_BYTES);
                        prop_assert!(t.start >= chunk.start && t.end <= chunk.end);
                        prop_assert_eq!(t.block, chunk.block);
                    }
                } else {
                    prop_assert_eq!(inside.len(), 1);
                    let t = inside[0];
                    prop_assert_eq!(t.block, chunk.block);
                    // Pieces of a large tensor start at multiples of CHUNK_BYTES from its start.
                    prop_assert_eq!((chunk.start - t.start) % CHUNK_BYTES, 0);
                }
                cursor = chunk.end;
            }
            prop_assert_eq!(cursor, index.data_end);
        }
    }
}
