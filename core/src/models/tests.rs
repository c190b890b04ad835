//! The read path end to end (without FUSE): synthetic checkpoints, random ranges, bit-exact.

use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::prefetch::saved::SavedOrders;
use crate::synth::{write_checkpoint, Layout as SynthLayout, SynthDtype, SynthSpec};

fn checkpoint(dir: &Path, name: &str, bytes: u64, seed: u64) -> Vec<u8> {
    let spec = SynthSpec {
        layout: SynthLayout::Dit,
        target_bytes: bytes,
        dtype: SynthDtype::BF16,
        seed,
    };
    write_checkpoint(&dir.join(name), &spec).unwrap();
    std::fs::read(dir.join(name)).unwrap()
}

fn read_all(store: &ModelStore, file: &Arc<ModelFile>, step: u32) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let got = store.read(file, out.len() as u64, step).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend_from_slice(&got);
    }
}

#[test]
fn whole_file_reads_are_bit_exact_under_a_tiny_budget() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = checkpoint(dir.path(), "m.safetensors", 24 << 20, 1);
    let store = ModelStore::new(8 << 20, SavedOrders::default());
    let file = store
        .open(
            Path::new("m.safetensors"),
            &dir.path().join("m.safetensors"),
        )
        .unwrap();
    assert!(!file.is_malformed());
    assert_eq!(read_all(&store, &file, 1 << 20), bytes);
    assert_eq!(read_all(&store, &file, 131_072 + 7), bytes);
    let cache = store.cache().snapshot();
    assert!(cache.used_bytes <= 8 << 20, "{cache:?}");
    assert!(cache.evicted_bytes > 0);
}

#[test]
fn malformed_files_are_served_as_plain_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = vec![0u8; 5000];
    bytes[..8].copy_from_slice(&4000u64.to_le_bytes());
    bytes[8..20].copy_from_slice(b"{not json!!!");
    std::fs::write(dir.path().join("bad.safetensors"), &bytes).unwrap();
    let store = ModelStore::new(8 << 20, SavedOrders::default());
    let file = store
        .open(
            Path::new("bad.safetensors"),
            &dir.path().join("bad.safetensors"),
        )
        .unwrap();
    assert!(file.is_malformed());
    assert_eq!(read_all(&store, &file, 777), bytes);
    let snapshot = &store.files_snapshot()[0];
    assert!(snapshot.malformed);
    assert!(
        snapshot
            .malformed_reason
            .as_deref()
            .is_some_and(|r| r.contains("JSON")),
        "{snapshot:?}"
    );
}

#[test]
fn a_changed_file_is_a_new_version_and_old_bytes_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    checkpoint(dir.path(), "m.safetensors", 4 << 20, 1);
    let store = ModelStore::new(64 << 20, SavedOrders::default());
    let old = store.open(Path::new("m.safetensors"), &path).unwrap();
    read_all(&store, &old, 1 << 20);
    assert!(store.cache().cached_bytes(old.generation()) > 0);
    // Same size, different content, new mtime: written to a new file and renamed over.
    let tmp = tempfile::tempdir().unwrap();
    let new_bytes = checkpoint(tmp.path(), "m.safetensors", 4 << 20, 2);
    std::fs::rename(tmp.path().join("m.safetensors"), &path).unwrap();
    let new = store.open(Path::new("m.safetensors"), &path).unwrap();
    assert_ne!(new.generation(), old.generation());
    assert_eq!(store.cache().cached_bytes(old.generation()), 0);
    assert_eq!(read_all(&store, &new, 1 << 20), new_bytes);
    // Unchanged: the same version is reused.
    let again = store.open(Path::new("m.safetensors"), &path).unwrap();
    assert_eq!(again.generation(), new.generation());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_ranges_are_bit_exact(ranges in prop::collection::vec((0u64..(6 << 20), 0u32..(3 << 20)), 1..20)) {
        let dir = tempfile::tempdir().unwrap();
        let bytes = checkpoint(dir.path(), "m.safetensors", 5 << 20, 3);
        let store = ModelStore::new(2 << 20, SavedOrders::default());
        let file = store.open(Path::new("m.safetensors"), &dir.path().join("m.safetensors")).unwrap();
        for (offset, len) in ranges {
            let got = store.read(&file, offset, len).unwrap();
            let start = (offset as usize).min(bytes.len());
            let end = (offset as usize).saturating_add(len as usize).min(bytes.len());
            prop_assert_eq!(&got[..], &bytes[start..end]);
        }
    }
}

#[test]
fn sequential_readahead_is_not_wasted() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = checkpoint(dir.path(), "m.safetensors", 96 << 20, 1);
    let store = ModelStore::new(64 << 20, SavedOrders::default());
    let file = store
        .open(
            Path::new("m.safetensors"),
            &dir.path().join("m.safetensors"),
        )
        .unwrap();
    for _pass in 0..2 {
        let mut offset = 0;
        while offset < bytes.len() as u64 {
            let got = store.read(&file, offset, 128 << 10).unwrap();
            offset += got.len() as u64;
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    let c = store.counters();
    let (issued, used, wasted) = (
        Counters::get(&c.prefetch_issued_bytes),
        Counters::get(&c.prefetch_used_bytes),
        Counters::get(&c.prefetch_wasted_bytes),
    );
    eprintln!(
        "issued {issued} used {used} wasted {wasted} hits {} misses {}",
        Counters::get(&c.hits),
        Counters::get(&c.misses)
    );
    assert!(issued > 0);
    assert!(
        wasted <= issued / 10,
        "issued {issued} used {used} wasted {wasted}"
    );
}

#[test]
fn concurrent_sequential_readers_account_prefetch_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = checkpoint(dir.path(), "m.safetensors", 96 << 20, 1);
    let store = Arc::new(ModelStore::new(64 << 20, SavedOrders::default()));
    let file = store
        .open(
            Path::new("m.safetensors"),
            &dir.path().join("m.safetensors"),
        )
        .unwrap();
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let len = bytes.len() as u64;
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (store, file, next) = (store.clone(), file.clone(), next.clone());
            std::thread::spawn(move || loop {
                let offset = next.fetch_add(1 << 20, Ordering::SeqCst);
                if offset >= 2 * len {
                    return;
                }
                store.read(&file, offset % len, 1 << 20).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let c = store.counters();
    let (issued, used, wasted) = (
        Counters::get(&c.prefetch_issued_bytes),
        Counters::get(&c.prefetch_used_bytes),
        Counters::get(&c.prefetch_wasted_bytes),
    );
    eprintln!(
        "issued {issued} used {used} wasted {wasted} hits {} misses {} disk {}",
        Counters::get(&c.hits),
        Counters::get(&c.misses),
        Counters::get(&c.disk_read_bytes)
    );
    assert!(
        wasted <= issued / 10,
        "issued {issued} used {used} wasted {wasted}"
    );
}
