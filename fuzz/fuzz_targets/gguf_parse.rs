//! `index::gguf::parse` on arbitrary bytes with an arbitrary claimed file size.
//!
//! Input: 8 bytes little-endian `k`, then the file prefix; `k & 1` picks the file size
//! (`v = k >> 2`): 0: `prefix.len() + v % 2^32` (longer than what was read, the normal case);
//! 1: `v` (any size). When `k & 2` is 0, the prefix gets a valid preamble (`GGUF`, version 3) so the
//! fuzzer spends its time past the magic.
//!
//! Never panics; `NeedMore` asks for more than the prefix and no more than the file; on `Ok` the
//! tensors are sorted, never overlap, lie in `[header_bytes, file_size]`, have the size their
//! dims and ggml type give, and the chunk plan tiles `[header_bytes, data_end)`.
//!
//! The differential check against an independent reader (gguf-py's `GGUFReader`) runs in
//! `tests/python/test_gguf.py`, on files written by gguf-py and hostile variants of them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierfs_core::cache::plan::{ChunkPlan, CHUNK_BYTES};
use tierfs_core::index::gguf::{ggml_type, parse, MAX_HEADER_BYTES};
use tierfs_core::index::{Format, IndexError};

fuzz_target!(|data: &[u8]| {
    let Some((k, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let k = u64::from_le_bytes(*k);
    let mut prefix = rest.to_vec();
    if k & 2 == 0 && prefix.len() >= 8 {
        prefix[..8].copy_from_slice(b"GGUF\x03\0\0\0");
    }
    let len = prefix.len() as u64;
    let v = k >> 2;
    let file_size = if k & 1 == 0 { len + v % (1 << 32) } else { v };
    match parse(&prefix, file_size) {
        Ok(idx) => check(&idx, file_size),
        Err(IndexError::NeedMore { header_bytes }) => {
            assert!(header_bytes > len && header_bytes <= file_size.min(MAX_HEADER_BYTES));
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});

fn check(idx: &tierfs_core::index::TensorIndex, file_size: u64) {
    assert_eq!(idx.format, Format::Gguf);
    assert_eq!(idx.file_size, file_size);
    assert!(idx.header_bytes <= file_size && idx.data_end <= file_size);
    let mut cursor = idx.header_bytes;
    for t in &idx.tensors {
        assert!(t.start >= cursor && t.start <= t.end, "{t:?}");
        assert!(t.block < idx.blocks.len());
        let ty = (0..64u32)
            .filter_map(ggml_type)
            .find(|ty| ty.name == t.dtype)
            .expect("known type");
        let n: u128 = t.shape.iter().map(|&d| d as u128).product();
        assert_eq!(n / ty.block as u128 * ty.bytes as u128, t.len() as u128);
        cursor = t.end;
    }
    assert_eq!(idx.data_end, idx.tensors.last().map_or(idx.header_bytes, |t| t.end));
    if idx.data_end - idx.header_bytes > 1 << 32 {
        return; // planning is linear in bytes / 4 MiB; keep executions fast
    }
    let plan = ChunkPlan::for_index(idx);
    let mut at = idx.header_bytes;
    for (c, chunk) in plan.chunks().iter().enumerate() {
        assert_eq!(chunk.start, at, "chunk {c} not contiguous");
        assert!(!chunk.is_empty() && chunk.len() <= CHUNK_BYTES);
        assert_eq!(plan.chunk_at(chunk.start), Some(c));
        assert_eq!(plan.chunk_at(chunk.end - 1), Some(c));
        at = chunk.end;
    }
    assert_eq!(at, idx.data_end);
}
