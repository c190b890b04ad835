//! Invariant checks shared by the fuzz targets.
//!
//! Every check panics (via `assert!`) on a violation, which libFuzzer reports as a crash with the
//! offending input saved under `fuzz/artifacts/<target>/`.

use std::collections::{BTreeMap, HashMap, HashSet};

use safetensors::tensor::{Dtype, Metadata};
use tierfs_core::cache::plan::{ChunkPlan, CHUNK_BYTES, SMALL_TENSOR_BYTES};
use tierfs_core::index::blocks::{block_key, OTHER_BLOCK};
use tierfs_core::index::{IndexError, TensorIndex, MAX_HEADER_BYTES};

/// The safetensors crate's name for a dtype string, if it knows it.
pub fn dtype_of(name: &str) -> Option<Dtype> {
    serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()
}

/// Checks everything a successfully parsed index promises (see `tierfs_core::index`).
pub fn check_index(idx: &TensorIndex) {
    assert!(idx.header_bytes >= 8, "header_bytes {} < 8", idx.header_bytes);
    assert!(idx.header_bytes - 8 <= MAX_HEADER_BYTES);
    assert!(idx.header_bytes <= idx.file_size);
    assert!(idx.header_bytes <= idx.data_end && idx.data_end <= idx.file_size);
    assert_eq!(
        idx.data_end,
        idx.tensors.last().map_or(idx.header_bytes, |t| t.end)
    );

    let mut names = HashSet::new();
    let mut cursor = idx.header_bytes;
    for (i, t) in idx.tensors.iter().enumerate() {
        assert!(names.insert(t.name.as_str()), "duplicate tensor {:?}", t.name);
        assert_ne!(t.name, "__metadata__");
        // Sorted, contiguous, inside [header_bytes, file_size].
        assert_eq!(t.start, cursor, "tensor {i} {:?} not contiguous", t.name);
        assert!(t.start <= t.end && t.end <= idx.file_size);
        assert_eq!(t.len(), t.end - t.start);
        assert_eq!(t.is_empty(), t.start == t.end);
        cursor = t.end;
        // Size matches shape × dtype.
        let dtype = dtype_of(&t.dtype).unwrap_or_else(|| panic!("unknown dtype {:?}", t.dtype));
        let bits = t
            .shape
            .iter()
            .try_fold(1u128, |a, &d| a.checked_mul(d as u128))
            .and_then(|n| n.checked_mul(dtype.bitsize() as u128))
            .expect("accepted shape overflows u128");
        assert_eq!(bits % 8, 0);
        assert_eq!(bits / 8, t.len() as u128, "tensor {:?} size", t.name);
        // Block assignment.
        assert!(t.block < idx.blocks.len(), "block index out of range");
        let want = block_key(&t.name).map_or_else(|| OTHER_BLOCK.to_string(), |k| k.name());
        assert_eq!(idx.blocks[t.block].name, want, "tensor {:?}", t.name);
    }
    // Sorted by (start, end); ties (empty tensors at one offset) broken by name.
    for w in idx.tensors.windows(2) {
        assert!(
            (w[0].start, w[0].end, &w[0].name) < (w[1].start, w[1].end, &w[1].name),
            "tensors not sorted: {:?} / {:?}",
            w[0].name,
            w[1].name
        );
    }
    check_blocks(idx);
    check_tensor_at(idx);
}

fn check_blocks(idx: &TensorIndex) {
    let mut counts = vec![0usize; idx.blocks.len()];
    let mut bytes = vec![0u64; idx.blocks.len()];
    for t in &idx.tensors {
        counts[t.block] += 1;
        bytes[t.block] = bytes[t.block].saturating_add(t.len());
    }
    let mut seen = HashSet::new();
    for (b, info) in idx.blocks.iter().enumerate() {
        assert!(seen.insert(info.name.as_str()), "duplicate block {:?}", info.name);
        assert!(info.tensors > 0, "empty block {:?}", info.name);
        assert_eq!(info.tensors, counts[b]);
        assert_eq!(info.bytes, bytes[b]);
        assert_eq!(idx.block_tensors(b).count(), counts[b]);
        if info.name == OTHER_BLOCK {
            assert_eq!(b, 0, "(other) must come first");
            assert!(info.family.is_none() && info.number.is_none());
        } else {
            let family = info.family.as_deref().expect("block without family");
            assert!(info.name.starts_with(family));
        }
    }
}

fn check_tensor_at(idx: &TensorIndex) {
    for (i, t) in idx.tensors.iter().enumerate() {
        if !t.is_empty() {
            assert_eq!(idx.tensor_at(t.start), Some(i));
            assert_eq!(idx.tensor_at(t.end - 1), Some(i));
        }
    }
    if idx.header_bytes > 0 {
        assert_eq!(idx.tensor_at(idx.header_bytes - 1), None);
    }
    assert_eq!(idx.tensor_at(idx.data_end), None);
}

/// Checks the chunk plan of an accepted index (see `tierfs_core::cache::plan`).
pub fn check_plan(idx: &TensorIndex, plan: &ChunkPlan) {
    let mut cursor = idx.header_bytes;
    let mut first_tensor = 0usize;
    for (c, chunk) in plan.chunks().iter().enumerate() {
        assert_eq!(chunk.start, cursor, "chunk {c} not contiguous");
        assert!(!chunk.is_empty() && chunk.len() <= CHUNK_BYTES, "chunk {c} size");
        assert!(chunk.block < idx.blocks.len());
        assert_eq!(plan.get(c), Some(chunk));
        // Tensors overlapping the chunk (tensors are sorted and contiguous).
        while idx.tensors[first_tensor].end <= chunk.start {
            first_tensor += 1;
        }
        let inside: Vec<_> = idx.tensors[first_tensor..]
            .iter()
            .take_while(|t| t.start < chunk.end)
            .filter(|t| !t.is_empty())
            .collect();
        assert!(!inside.is_empty(), "chunk {c} holds no tensor");
        if inside.len() > 1 {
            for t in &inside {
                assert!(t.len() <= SMALL_TENSOR_BYTES, "large tensor shares chunk {c}");
                assert!(t.start >= chunk.start && t.end <= chunk.end);
                assert_eq!(t.block, chunk.block);
            }
        } else {
            let t = inside[0];
            assert_eq!(t.block, chunk.block);
            if t.len() <= SMALL_TENSOR_BYTES {
                assert_eq!((chunk.start, chunk.end), (t.start, t.end));
            } else {
                assert_eq!((chunk.start - t.start) % CHUNK_BYTES, 0);
            }
        }
        assert_eq!(plan.chunk_at(chunk.start), Some(c));
        assert_eq!(plan.chunk_at(chunk.end - 1), Some(c));
        cursor = chunk.end;
    }
    assert_eq!(cursor, idx.data_end, "chunks do not reach data_end");
    assert_eq!(plan.len(), plan.chunks().len());
    assert_eq!(plan.is_empty(), plan.chunks().is_empty());
    assert_eq!(plan.chunk_at(idx.data_end), None);
    if idx.header_bytes > 0 {
        assert_eq!(plan.chunk_at(idx.header_bytes - 1), None);
    }
    // by_block partitions the chunks.
    let mut owner = vec![None; plan.len()];
    for (b, info) in idx.blocks.iter().enumerate() {
        let list = plan.block_chunks(b);
        assert!(list.windows(2).all(|w| w[0] < w[1]));
        for &c in list {
            assert_eq!(plan.chunks()[c].block, b);
            assert!(owner[c].replace(b).is_none(), "chunk {c} listed twice");
        }
        assert_eq!(plan.block_bytes(b), info.bytes, "block {:?} bytes", info.name);
    }
    assert!(owner.iter().all(Option::is_some), "chunk in no block list");
    assert!(plan.block_chunks(idx.blocks.len()).is_empty());
}

/// Errors that only exist because we know the file size or refuse what the crate silently accepts.
fn allowed_divergence(err: &IndexError) -> bool {
    matches!(
        err,
        IndexError::DuplicateTensor { .. }
            | IndexError::PastEnd { .. }
            | IndexError::OffsetOverflow { .. }
    )
}

/// Differential check against the safetensors crate's own header parser, given the header JSON
/// (bytes `8..header_bytes`) and our verdict on it.
pub fn check_against_crate(json: &[u8], ours: &Result<TensorIndex, IndexError>) {
    let theirs = match std::str::from_utf8(json).map(serde_json::from_str::<Metadata>) {
        Ok(Ok(meta)) => Some(meta),
        _ => None,
    };
    match (ours, theirs) {
        (Ok(idx), Some(meta)) => {
            let hb = idx.header_bytes;
            assert_eq!(meta.data_len() as u64, idx.data_end - hb, "data length differs");
            let tensors = meta.tensors();
            assert_eq!(tensors.len(), idx.tensors.len(), "tensor count differs");
            for t in &idx.tensors {
                let info = tensors.get(&t.name).expect("tensor missing in crate view");
                assert_eq!(info.dtype.to_string(), t.dtype);
                let shape: Vec<u64> = info.shape.iter().map(|&d| d as u64).collect();
                assert_eq!(shape, t.shape);
                let (b, e) = info.data_offsets;
                assert_eq!((b as u64 + hb, e as u64 + hb), (t.start, t.end));
            }
            let theirs: Option<BTreeMap<String, String>> = meta
                .metadata()
                .as_ref()
                .map(|m: &HashMap<String, String>| m.clone().into_iter().collect());
            assert_eq!(theirs, idx.metadata, "__metadata__ differs");
        }
        (Ok(idx), None) => panic!(
            "accepted a header the safetensors crate rejects ({} tensors)",
            idx.tensors.len()
        ),
        (Err(err), Some(_)) => assert!(
            allowed_divergence(err),
            "rejected a header the safetensors crate accepts: {err}"
        ),
        (Err(_), None) => {}
    }
}
