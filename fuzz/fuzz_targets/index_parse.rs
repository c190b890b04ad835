//! `TensorIndex::parse` on arbitrary bytes with an arbitrary claimed file size.
//!
//! Input: 8 bytes little-endian `k`, then the file prefix handed to `parse`. `k & 3` picks how the
//! file size relates to the prefix (`v = k >> 2`):
//! 0: `prefix.len() + v % 2^40` (a file longer than what was read, the normal case);
//! 1: `prefix.len() - v % 64` (shorter than the prefix);
//! 2: `v` (any size);
//! 3: `u64::MAX - v % 2^16` (offset-overflow territory).
//!
//! Never panics; on `Ok` the index invariants hold (`tierfs_fuzz::check_index`), its chunk plan
//! tiles the data region (`check_plan`), and the safetensors crate accepts the same header with
//! the same tensors (`check_against_crate`); on `Err` the crate also rejects it, except for the
//! documented differences (duplicate keys, tensors past end of file).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierfs_core::cache::plan::ChunkPlan;
use tierfs_core::index::{IndexError, TensorIndex};

fuzz_target!(|data: &[u8]| {
    let Some((k, prefix)) = data.split_first_chunk::<8>() else {
        return;
    };
    let k = u64::from_le_bytes(*k);
    let v = k >> 2;
    let len = prefix.len() as u64;
    let file_size = match k & 3 {
        0 => len + v % (1 << 40),
        1 => len.saturating_sub(v % 64),
        2 => v,
        _ => u64::MAX - v % (1 << 16),
    };
    let result = TensorIndex::parse(prefix, file_size);
    match &result {
        Ok(idx) => {
            assert_eq!(idx.file_size, file_size);
            tierfs_fuzz::check_index(idx);
            // Planning is linear in data_end / 4 MiB; keep each execution fast.
            if idx.data_end - idx.header_bytes <= 1 << 32 {
                tierfs_fuzz::check_plan(idx, &ChunkPlan::for_index(idx));
            }
        }
        Err(e) => {
            let _ = e.to_string();
            if let IndexError::NeedMore { header_bytes } = e {
                assert!(*header_bytes > len && *header_bytes <= file_size);
            }
        }
    }
    // Differential check whenever the header JSON is complete in the prefix.
    if file_size >= 8 && prefix.len() >= 8 {
        let n = u64::from_le_bytes(prefix[..8].try_into().unwrap());
        if n <= tierfs_core::index::MAX_HEADER_BYTES && 8 + n <= len && 8 + n <= file_size {
            tierfs_fuzz::check_against_crate(&prefix[8..(8 + n) as usize], &result);
        }
    }
});
