//! Descriptors and versions over the life of a mount ([`super::open`],
//! [`crate::source::slot`]): bounded by what is open, pruned when SOURCE drops a version.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::prefetch::saved::SavedOrders;
use crate::prefetch::ManualExecutor;
use crate::source::SourceIdentity;
use crate::synth::{write_checkpoint, Layout as SynthLayout, SynthDtype, SynthSpec};

fn checkpoint(path: &Path, bytes: u64, seed: u64) -> Vec<u8> {
    let spec = SynthSpec {
        layout: SynthLayout::Dit,
        target_bytes: bytes,
        dtype: SynthDtype::BF16,
        seed,
    };
    write_checkpoint(path, &spec).unwrap();
    std::fs::read(path).unwrap()
}

/// Descriptors this process holds on files under `dir` (deleted ones included).
fn descriptors_under(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

fn read_all(store: &ModelStore, file: &Arc<ModelFile>) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let got = store.read(file, out.len() as u64, 1 << 20).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend_from_slice(&got);
    }
}

/// A store whose prefetches run only when the test says, so that no worker holds descriptors
/// behind its back.
fn manual_store() -> (Arc<ModelStore>, Arc<ManualExecutor>) {
    let executor = Arc::new(ManualExecutor::new(1024));
    let store = ModelStore::with_executor(64 << 20, SavedOrders::default(), executor.clone());
    (Arc::new(store), executor)
}

#[test]
fn descriptors_are_held_by_open_handles_only() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..200).map(|i| format!("m{i}.safetensors")).collect();
    for (i, name) in names.iter().enumerate() {
        checkpoint(&dir.path().join(name), 64 << 10, i as u64);
    }
    let (store, _executor) = manual_store();
    for round in 0..2 {
        for name in &names {
            let handle = store
                .open_handle(Path::new(name), &dir.path().join(name))
                .unwrap();
            assert!(!handle.is_raw());
            assert!(store.read(handle.file(), 0, 8).unwrap().len() == 8);
        }
        assert_eq!(
            descriptors_under(dir.path()),
            Vec::<PathBuf>::new(),
            "round {round}: descriptors outlived their handles"
        );
    }
    // All 200 versions are still known (headers in memory): the second round reopened each.
    assert_eq!(store.index_snapshot().index_entries, 200);
    // Two handles of one version share one set of descriptors.
    let abs = dir.path().join(&names[0]);
    let a = store.open_handle(Path::new(&names[0]), &abs).unwrap();
    let open = descriptors_under(dir.path()).len();
    let b = store.open_handle(Path::new(&names[0]), &abs).unwrap();
    assert_eq!(descriptors_under(dir.path()).len(), open);
    drop((a, b));
    assert!(descriptors_under(dir.path()).is_empty());
}

#[test]
fn a_deleted_version_is_read_while_open_and_pruned_at_its_last_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let bytes = checkpoint(&path, 6 << 20, 1);
    let (store, executor) = manual_store();
    let rel = Path::new("m.safetensors");
    let first = store.open_handle(rel, &path).unwrap();
    let second = store.open_handle(rel, &path).unwrap();
    let generation = first.generation();
    store
        .read(first.file(), bytes.len() as u64 / 2, 4096)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    // Open handles go on reading the version they opened, whole and bit-exact.
    assert_eq!(read_all(&store, second.file()), bytes);
    assert!(store.cache().cached_bytes(generation) > 0);
    drop(first);
    assert!(!descriptors_under(dir.path()).is_empty());
    assert_eq!(store.index_snapshot().index_entries, 1);
    drop(second);
    assert!(
        descriptors_under(dir.path()).is_empty(),
        "a deleted file is still open: {:?}",
        descriptors_under(dir.path())
    );
    assert_eq!(store.cache().cached_bytes(generation), 0);
    assert_eq!(store.cache().snapshot().used_bytes, 0);
    assert_eq!(store.index_snapshot().index_entries, 0);
    // Prefetches queued while it was read find the version pruned: nothing comes back.
    executor.run_pending();
    assert_eq!(store.cache().snapshot().used_bytes, 0);
    assert!(descriptors_under(dir.path()).is_empty());
}

#[test]
fn a_replaced_version_is_pruned_and_the_new_one_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let old_bytes = checkpoint(&path, 4 << 20, 1);
    let (store, _executor) = manual_store();
    let rel = Path::new("m.safetensors");
    let old = store.open_handle(rel, &path).unwrap();
    assert_eq!(read_all(&store, old.file()), old_bytes);
    let old_generation = old.generation();
    // Same size, new content, renamed over: another inode.
    let tmp = dir.path().join("new.tmp");
    let new_bytes = checkpoint(&tmp, 4 << 20, 2);
    std::fs::rename(&tmp, &path).unwrap();
    let new = store.open_handle(rel, &path).unwrap();
    assert_ne!(new.generation(), old_generation);
    assert_eq!(read_all(&store, old.file()), old_bytes);
    assert_eq!(read_all(&store, new.file()), new_bytes);
    drop(old);
    assert_eq!(store.cache().cached_bytes(old_generation), 0);
    assert!(store.cache().cached_bytes(new.generation()) > 0);
    drop(new);
    // The current version stays known and cached, without descriptors.
    assert!(descriptors_under(dir.path()).is_empty());
    assert_eq!(store.index_snapshot().index_entries, 1);
    assert!(store.cache().snapshot().used_bytes > 0);
}

#[test]
fn a_prefetch_of_a_closed_file_reopens_it_or_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let bytes = checkpoint(&path, 8 << 20, 3);
    let (store, executor) = manual_store();
    let rel = Path::new("m.safetensors");
    let file = store.open_handle(rel, &path).unwrap().file().clone();
    assert!(!file.source().is_open());
    // Warmed with no handle open: each chunk read opens the file again, checked, then closes.
    store.warm(&file);
    executor.run_pending();
    let cached = store.cache().cached_bytes(file.generation());
    assert!(cached > bytes.len() as u64 / 2, "cached {cached}");
    assert!(descriptors_under(dir.path()).is_empty());
    let handle = store.open_handle(rel, &path).unwrap();
    assert_eq!(read_all(&store, handle.file()), bytes);
    drop(handle);
    // Rewritten in place (same inode, new bytes and mtime) while closed: the old version's
    // prefetch reads nothing, and is no error for anyone but itself.
    store.drop_cached();
    let rewritten: Vec<u8> = bytes.iter().map(|b| !b).collect();
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::write(&path, &rewritten).unwrap();
    store.warm(&file);
    executor.run_pending();
    assert_eq!(store.cache().cached_bytes(file.generation()), 0);
    let err = match store.read(&file, bytes.len() as u64 - (1 << 20), 4096) {
        Ok(_) => panic!("the old version was read from the rewritten file"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("no longer the version"), "{err}");
    assert!(descriptors_under(dir.path()).is_empty());
}

#[test]
fn a_handle_adopts_the_front_ends_descriptor_of_the_same_version_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let bytes = checkpoint(&path, 2 << 20, 4);
    let (store, _executor) = manual_store();
    let rel = Path::new("m.safetensors");
    drop(store.open_handle(rel, &path).unwrap()); // indexed, no descriptor left
    let handle = store
        .open_handle_with(rel, &path, std::fs::File::open(&path).unwrap())
        .unwrap()
        .expect("the same version");
    assert_eq!(
        descriptors_under(dir.path()).len(),
        1,
        "the adopted one only"
    );
    assert_eq!(read_all(&store, handle.file()), bytes);
    drop(handle);
    // A descriptor opened before a replacement reads the version it opened: that is the
    // version indexed and served, never the one the path names a moment later.
    let stale = std::fs::File::open(&path).unwrap();
    let old = SourceIdentity::of_file(&stale).unwrap();
    let tmp = dir.path().join("new.tmp");
    checkpoint(&tmp, 2 << 20, 5);
    std::fs::rename(&tmp, &path).unwrap();
    let first = store.open_handle_with(rel, &path, stale).unwrap().unwrap();
    assert_eq!(first.source().identity().ino, old.ino, "the file it opened");
    assert_eq!(read_all(&store, first.file()), bytes);
    // A newer descriptor while that version is open: ESTALE is not asked for, the new
    // version is indexed and replaces the old one for later opens.
    let fresh = std::fs::File::open(&path).unwrap();
    let new = store.open_handle_with(rel, &path, fresh).unwrap();
    assert!(new.is_some_and(|h| h.source().identity() == SourceIdentity::of_path(&path).unwrap()));
    drop(first);
    assert!(descriptors_under(dir.path()).is_empty());
}
