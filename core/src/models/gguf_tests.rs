//! GGUF files through the read path (without FUSE): indexed, chunked by tensor, bit-exact; a
//! malformed one served as plain bytes with its reason.

use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::index::gguf::tests::Gguf;
use crate::index::Format;
use crate::prefetch::saved::SavedOrders;
use std::sync::Arc;

/// A llama-style file of about 14 MiB: Q8_0 weights of 1.1 MiB (just over the packing limit)
/// and 2.2 MiB, F32 norms, six `blk.N` blocks, 32-byte alignment padding between tensors.
fn llama() -> Vec<u8> {
    let mut g = Gguf::new().tensor("token_embd.weight", &[4096, 256], 8);
    for b in 0..6 {
        g = g
            .tensor(&format!("blk.{b}.attn_norm.weight"), &[4095], 0)
            .tensor(&format!("blk.{b}.attn_q.weight"), &[4096, 256], 8)
            .tensor(&format!("blk.{b}.ffn_up.weight"), &[4096, 512], 8);
    }
    g.tensor("output_norm.weight", &[4096], 0).bytes()
}

fn store_with(
    name: &str,
    bytes: &[u8],
    budget: u64,
) -> (tempfile::TempDir, ModelStore, Arc<ModelFile>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(name), bytes).unwrap();
    let store = ModelStore::new(budget, SavedOrders::default());
    let file = store.open(Path::new(name), &dir.path().join(name)).unwrap();
    (dir, store, file)
}

fn read_range(
    store: &ModelStore,
    file: &Arc<ModelFile>,
    start: u64,
    end: u64,
    step: u32,
) -> Vec<u8> {
    let mut out = Vec::new();
    while start + (out.len() as u64) < end {
        let want = step.min((end - start - out.len() as u64) as u32);
        let got = store.read(file, start + out.len() as u64, want).unwrap();
        if got.is_empty() {
            break;
        }
        out.extend_from_slice(&got);
    }
    out
}

#[test]
fn gguf_is_indexed_and_bit_exact_under_a_small_budget() {
    let bytes = llama();
    let (_dir, store, file) = store_with("m.gguf", &bytes, 6 << 20);
    let Layout::Indexed { index, plan } = file.layout() else {
        panic!("malformed: {:?}", file.layout());
    };
    assert_eq!(index.format, Format::Gguf);
    assert_eq!(index.blocks.len(), 7, "(other) + blk.0..5");
    assert!(plan.len() > 12, "{} chunks", plan.len());
    let size = bytes.len() as u64;
    for step in [1 << 20, 131_072 + 7] {
        assert_eq!(read_range(&store, &file, 0, size, step), bytes);
    }
    assert!(store.cache().snapshot().used_bytes <= 6 << 20);
    let snap = &store.files_snapshot()[0];
    assert_eq!((snap.tensors, snap.blocks, snap.malformed), (20, 7, false));
}

#[test]
fn malformed_gguf_is_served_raw_with_its_reason() {
    let mut bytes = llama();
    bytes[4..8].copy_from_slice(&7u32.to_le_bytes());
    let (_dir, store, file) = store_with("bad.GGUF", &bytes, 8 << 20);
    assert!(file.is_raw());
    assert_eq!(
        read_range(&store, &file, 0, bytes.len() as u64, 1 << 20),
        bytes
    );
    let snap = &store.files_snapshot()[0];
    let reason = snap.malformed_reason.as_deref().unwrap_or_default();
    assert!(reason.contains("GGUF version 7"), "{reason}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn random_ranges_are_bit_exact(ranges in prop::collection::vec((0u64..(15 << 20), 1u32..(3 << 20)), 1..12)) {
        let bytes = llama();
        let (_dir, store, file) = store_with("m.gguf", &bytes, 4 << 20);
        for (start, len) in ranges {
            let start = start.min(bytes.len() as u64);
            let end = (start + u64::from(len)).min(bytes.len() as u64);
            let got = read_range(&store, &file, start, end, len);
            prop_assert_eq!(&got[..], &bytes[start as usize..end as usize]);
        }
    }
}
