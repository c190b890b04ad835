//! Sharded models ([`super::shards`]): discovery, one model in the store, cross-shard prefetch
//! and eviction over the whole model. Shards are small safetensors files written here, with
//! `transformer_blocks.N` tensors so that blocks are known, and one block split over two shards.

use std::path::Path;

use super::shards::{discover, FoundBy, IndexNames, Membership, Registry};
use super::tests::read_all;
use super::*;
use crate::prefetch::saved::SavedOrders;
use crate::prefetch::ManualExecutor;
use crate::source::PlainPaths;
use crate::source::SourceIdentity;
use crate::stats::Counters;
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// Writes a safetensors file of U8 tensors `(name, bytes)`, back to back, with pseudo-random
/// contents from `seed`; returns the file's bytes.
fn write_safetensors(path: &Path, tensors: &[(String, usize)], seed: u64) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for (name, len) in tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "U8", "shape": [len], "data_offsets": [at, at + len]}),
        );
        at += len;
    }
    let mut json = serde_json::to_vec(&header).unwrap();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..at {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.push(state as u8);
    }
    std::fs::write(path, &bytes).unwrap();
    bytes
}

/// A model `m` of `shards` shards of `per_shard` blocks of `block` bytes each (one big tensor
/// and one small one per block), the embedding in the first shard and the output projection in
/// the last, and the last block of each shard split: its small tensor is in the next shard.
/// With `index`, also `m.safetensors.index.json`. Returns the shards' names and bytes.
fn sharded(
    dir: &Path,
    shards: usize,
    per_shard: usize,
    block: usize,
    index: bool,
) -> Vec<(String, Vec<u8>)> {
    let mut weight_map = serde_json::Map::new();
    let mut out = Vec::new();
    for s in 0..shards {
        let name = format!("m-{:05}-of-{shards:05}.safetensors", s + 1);
        let mut tensors = Vec::new();
        if s == 0 {
            tensors.push(("embed.weight".to_owned(), MIB));
        } else {
            // The small tensor of the previous shard's last block.
            let b = s * per_shard - 1;
            tensors.push((format!("transformer_blocks.{b}.norm.weight"), 4096));
        }
        for b in s * per_shard..(s + 1) * per_shard {
            tensors.push((format!("transformer_blocks.{b}.attn.weight"), block - 4096));
            if b + 1 != (s + 1) * per_shard || s + 1 == shards {
                tensors.push((format!("transformer_blocks.{b}.norm.weight"), 4096));
            }
        }
        if s + 1 == shards {
            tensors.push(("proj_out.weight".to_owned(), MIB));
        }
        for (t, _) in &tensors {
            weight_map.insert(t.clone(), serde_json::Value::String(name.clone()));
        }
        let bytes = write_safetensors(&dir.join(&name), &tensors, s as u64 + 1);
        out.push((name, bytes));
    }
    if index {
        let doc = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        std::fs::write(
            dir.join("m.safetensors.index.json"),
            serde_json::to_vec_pretty(&doc).unwrap(),
        )
        .unwrap();
    }
    out
}

fn open(store: &ModelStore, dir: &Path, name: &str) -> Arc<ModelFile> {
    store.open(Path::new(name), &dir.join(name)).unwrap()
}

#[test]
fn shards_are_found_by_index_json_and_by_name_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = sharded(dir.path(), 3, 2, MIB, true)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let found = discover(
        &PlainPaths,
        &IndexNames::default(),
        &dir.path().join(&names[1]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(found.by, FoundBy::IndexJson);
    assert_eq!(found.name, "m.safetensors.index.json");
    assert_eq!(found.shards, names);

    std::fs::remove_file(dir.path().join("m.safetensors.index.json")).unwrap();
    let found = discover(
        &PlainPaths,
        &IndexNames::default(),
        &dir.path().join(&names[2]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(found.by, FoundBy::Pattern);
    assert_eq!(found.name, "m-*-of-00003.safetensors");
    assert_eq!(found.shards, names);
}

#[test]
fn name_patterns() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "m.safetensors",
        "m-00001-of-00001.safetensors", // one shard is a plain file
        "m-001-of-00002.safetensors",   // widths differ
        "m-00000-of-00002.safetensors", // shards count from 1
        "m-00003-of-00002.safetensors", // past the count
        "-00001-of-00002.safetensors",  // no stem
        "m-0000a-of-00002.safetensors",
        "m-00001-00002.safetensors",
    ] {
        std::fs::write(dir.path().join(name), b"x").unwrap();
        assert_eq!(
            discover(&PlainPaths, &IndexNames::default(), &dir.path().join(name)),
            Ok(None),
            "{name}"
        );
    }
    // Any width and extension, as long as both numbers have the same width.
    for name in ["model-1-of-2.gguf", "model-2-of-2.gguf"] {
        std::fs::write(dir.path().join(name), b"x").unwrap();
    }
    let found = discover(
        &PlainPaths,
        &IndexNames::default(),
        &dir.path().join("model-2-of-2.gguf"),
    )
    .unwrap()
    .unwrap();
    assert_eq!(found.shards, ["model-1-of-2.gguf", "model-2-of-2.gguf"]);
}

#[test]
fn a_missing_shard_leaves_each_file_alone_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = sharded(dir.path(), 3, 2, MIB, false)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    std::fs::remove_file(dir.path().join(&names[2])).unwrap();
    let reason = discover(
        &PlainPaths,
        &IndexNames::default(),
        &dir.path().join(&names[0]),
    )
    .unwrap_err();
    assert!(reason.contains("m-00003-of-00003.safetensors") && reason.contains("missing"));

    let store = ModelStore::new(64 << 20, SavedOrders::default());
    let file = open(&store, dir.path(), &names[0]);
    assert!(file.shard_of.is_none() && !file.is_raw());
    let snap = store.files_snapshot();
    assert_eq!(snap[0].standalone_reason.as_deref(), Some(reason.as_str()));
    assert_eq!(snap[0].model, None);
    assert!(store.models_snapshot().is_empty());
}

#[test]
fn a_malformed_index_json_leaves_each_shard_alone_with_the_reason() {
    let cases: [(&[u8], &str); 4] = [
        (b"{not json", "not JSON"),
        (b"{\"metadata\": {}}", "no weight_map"),
        (
            b"{\"weight_map\": {\"a\": \"../m-00001-of-00003.safetensors\"}}",
            "not a file of this directory",
        ),
        (
            b"{\"weight_map\": {\"a\": \"m-00001-of-00003.safetensors\", \"b\": \"m-00002-of-00003.safetensors\", \"c\": \"m-00003-of-00003.safetensors\", \"d\": \"gone.safetensors\"}}",
            "shard gone.safetensors is missing",
        ),
    ];
    for (text, why) in cases {
        let dir = tempfile::tempdir().unwrap();
        let shards = sharded(dir.path(), 3, 2, MIB, false);
        std::fs::write(dir.path().join("m.safetensors.index.json"), text).unwrap();
        let store = ModelStore::new(64 << 20, SavedOrders::default());
        for (name, bytes) in &shards {
            let file = open(&store, dir.path(), name);
            assert!(file.shard_of.is_none(), "{why}");
            assert_eq!(
                &read_all(&store, &file, 1 << 20),
                bytes,
                "served bit-exact alone"
            );
        }
        for snap in store.files_snapshot() {
            let reason = snap.standalone_reason.unwrap_or_default();
            assert!(
                reason.starts_with("m.safetensors.index.json: ") && reason.contains(why),
                "{why}: {reason}"
            );
        }
        assert!(store.models_snapshot().is_empty());
    }
}

#[test]
fn a_malformed_shard_leaves_each_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded(dir.path(), 2, 2, MIB, true);
    std::fs::write(
        dir.path().join(&shards[1].0),
        b"\xff\xff\xff\xff\xff\xff\xff\xffjunk",
    )
    .unwrap();
    let store = ModelStore::new(64 << 20, SavedOrders::default());
    let file = open(&store, dir.path(), &shards[0].0);
    assert!(file.shard_of.is_none());
    let reason = store.files_snapshot()[0].standalone_reason.clone().unwrap();
    assert!(
        reason.contains("m-00002-of-00002.safetensors is not a valid"),
        "{reason}"
    );
}

#[test]
fn shards_form_one_model_with_one_access_state_and_block_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded(dir.path(), 3, 2, 2 * MIB, true);
    let saved = SavedOrders::default();
    let store = ModelStore::new(64 << 20, saved);
    let files: Vec<Arc<ModelFile>> = shards
        .iter()
        .map(|(n, _)| open(&store, dir.path(), n))
        .collect();
    let tracker = files[0].tracker().unwrap();
    for f in &files {
        assert!(
            Arc::ptr_eq(f.tracker().unwrap(), tracker),
            "one reader tracker"
        );
        assert!(f.shard_of.is_some());
    }
    // (other) + 6 transformer blocks over the model.
    let model = &files[0].shard_of.as_ref().unwrap().model;
    assert_eq!(model.blocks(), 7);
    assert_eq!(tracker.order(), (0..7).collect::<Vec<_>>());
    // Block 2 (transformer_blocks.1) is split: its big tensor in shard 1, its norm in shard 2.
    assert_eq!(model.holders(2), [0, 1]);
    assert_eq!(
        model.holders(0),
        [0, 2],
        "(other): embed first, proj_out last"
    );
    let blocks_of = |f: &ModelFile| {
        let mut b: Vec<usize> = f.plan().unwrap().chunks().iter().map(|c| c.block).collect();
        b.dedup();
        b
    };
    assert_eq!(blocks_of(&files[0]), [0, 1, 2]);
    assert_eq!(blocks_of(&files[1]), [2, 3, 4]);
    assert_eq!(blocks_of(&files[2]), [4, 5, 6, 0]);
    for (f, (_, bytes)) in files.iter().zip(&shards) {
        assert_eq!(&read_all(&store, f, 1 << 20), bytes);
    }
    let models = store.models_snapshot();
    assert_eq!(models.len(), 1);
    assert_eq!(models[0].name, "m.safetensors.index.json");
    assert_eq!(models[0].shards.len(), 3);
    assert!(models[0].shards.iter().all(|s| s.indexed));
    let snaps = store.files_snapshot();
    assert!(snaps
        .iter()
        .all(|s| s.model.as_deref() == Some("m.safetensors.index.json")));
}

#[test]
fn the_learned_order_spans_the_shards_and_is_saved_under_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded(dir.path(), 2, 3, MIB, true);
    let saved = SavedOrders::default();
    let store = ModelStore::new(64 << 20, saved);
    // Two passes, shard 2 first: its blocks come before shard 1's in the learned order.
    for _ in 0..2 {
        for (name, bytes) in shards.iter().rev() {
            let file = open(&store, dir.path(), name);
            assert_eq!(&read_all(&store, &file, 1 << 20), bytes);
        }
    }
    let file = open(&store, dir.path(), &shards[0].0);
    let tracker = file.tracker().unwrap();
    assert!(tracker.learned().0);
    let order = tracker.order();
    let position = |b: usize| order.iter().position(|&x| x == b).unwrap();
    assert!(
        position(5) < position(1),
        "shard 2's blocks first: {order:?}"
    );
    let model = &file.shard_of.as_ref().unwrap().model;
    assert!(
        store.saved.get(model.order_key()).is_some(),
        "saved under the model"
    );
    let canonical = dir.path().join(&shards[0].0).canonicalize().unwrap();
    let shard_key = SavedOrders::key(&canonical, &file.source.identity());
    assert!(store.saved.get(&shard_key).is_none(), "not under a shard");
    // A new store (a remount) starts from the saved order.
    let again = ModelStore::new(64 << 20, SavedOrders::default());
    again
        .saved
        .put(model.order_key().to_owned(), tracker.saved_order());
    let file = open(&again, dir.path(), &shards[1].0);
    assert_eq!(file.tracker().unwrap().order(), order);
}

#[test]
fn prefetch_crosses_into_the_next_shard_before_it_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded(dir.path(), 3, 2, 2 * MIB, true);
    let exec = Arc::new(ManualExecutor::new(1024));
    let store = ModelStore::with_executor(64 << 20, SavedOrders::default(), exec.clone());
    let first = open(&store, dir.path(), &shards[0].0);
    assert_eq!(store.files_snapshot().len(), 1, "only shard 1 is open");
    assert_eq!(&read_all(&store, &first, 1 << 20), &shards[0].1);
    exec.run_pending();
    // Shard 2 was opened for prefetch, and its first own block (transformer_blocks.2, model
    // block 3) is cached, though no reader opened it; shard 3 was not touched.
    let snaps = store.files_snapshot();
    assert!(
        snaps[1].path.ends_with("m-00002-of-00003.safetensors"),
        "{snaps:?}"
    );
    let second = open(&store, dir.path(), &shards[1].0);
    let plan = second.plan().unwrap();
    for block in [3] {
        for &chunk in plan.block_chunks(block) {
            assert!(second.chunk_present(store.cache(), chunk), "block {block}");
        }
    }
    let model = &store.models_snapshot()[0];
    assert!(model.shards[1].indexed && model.shards[1].cached_bytes >= 2 * MIB as u64 - 4096);
    // At most shard 3's part of the split block (depth 2 reaches it), not its own blocks.
    assert!(model.shards[2].cached_bytes <= 4096, "{model:?}");
    assert!(model.prefetch.issued_bytes > 0);
    // The reader then finds them in memory, bit-exact.
    let misses = Counters::get(&store.counters().misses);
    let head = store.read(
        &second,
        plan.get(plan.block_chunks(3)[0]).unwrap().start,
        4096,
    );
    let chunk3 = plan.get(plan.block_chunks(3)[0]).unwrap();
    assert_eq!(
        &head.unwrap()[..],
        &shards[1].1[chunk3.start as usize..chunk3.start as usize + 4096]
    );
    assert_eq!(Counters::get(&store.counters().misses), misses);
}

#[test]
fn eviction_distance_runs_over_the_whole_model() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded(dir.path(), 3, 2, MIB, true);
    let store = ModelStore::new(64 << 20, SavedOrders::default());
    let files: Vec<Arc<ModelFile>> = shards
        .iter()
        .map(|(n, _)| open(&store, dir.path(), n))
        .collect();
    // The reader is in transformer_blocks.1 (model block 2, the end of shard 1).
    let tracker = files[0].tracker().unwrap();
    for b in 0..=2 {
        tracker.touch(b);
    }
    // Shard 2's first block is next; shard 1's first block is needed last.
    assert_eq!(tracker.distance(3), 1);
    assert_eq!(tracker.distance(6), 4);
    assert_eq!(tracker.distance(1), 6);
    let _ = files;
}

#[test]
fn repeated_passes_over_shards_read_only_what_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded(dir.path(), 4, 16, 2 * MIB, true);
    let data: u64 = shards.iter().map(|(_, b)| b.len() as u64).sum();
    let budget = 64 << 20;
    assert!(data >= 2 * budget, "model {data} twice the budget");
    let store = ModelStore::new(budget, SavedOrders::default());
    for pass in 0..4 {
        let before = Counters::get(&store.counters().disk_read_bytes);
        for (name, bytes) in &shards {
            let file = open(&store, dir.path(), name);
            assert_eq!(&read_all(&store, &file, 1 << 20), bytes);
        }
        store.wait_prefetch_idle();
        assert!(store.cache().snapshot().used_bytes <= budget);
        let disk = Counters::get(&store.counters().disk_read_bytes) - before;
        if pass >= 1 {
            // LRU per shard would read the whole model again.
            let bound = (data - budget) as f64 * 1.15;
            assert!(
                (disk as f64) <= bound,
                "pass {pass}: {disk} bytes from disk, bound {bound:.0} (model {data}, budget {budget})"
            );
        }
    }
}

#[test]
fn a_changed_shard_forms_the_model_again() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded(dir.path(), 2, 2, MIB, true);
    let store = ModelStore::new(64 << 20, SavedOrders::default());
    let first = open(&store, dir.path(), &shards[0].0);
    let second = open(&store, dir.path(), &shards[1].0);
    // Replace shard 2 with other contents (same tensors).
    std::thread::sleep(std::time::Duration::from_millis(20));
    let path = dir.path().join(&shards[1].0);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let second_new = open(&store, dir.path(), &shards[1].0);
    assert_ne!(second_new.generation(), second.generation());
    assert_eq!(read_all(&store, &second_new, 1 << 20), bytes);
    let first_new = open(&store, dir.path(), &shards[0].0);
    assert_ne!(first_new.generation(), first.generation(), "re-indexed");
    assert!(Arc::ptr_eq(
        first_new.tracker().unwrap(),
        second_new.tracker().unwrap()
    ));
    assert_eq!(store.models_snapshot().len(), 1);
}

#[test]
fn a_registry_keeps_one_model_per_shard_set() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded(dir.path(), 2, 1, MIB, false);
    let registry = Registry::default();
    let saved = SavedOrders::default();
    let member = |name: &str| {
        let abs = dir.path().join(name);
        let identity = SourceIdentity::of_path(&abs).unwrap();
        registry.membership(
            (Path::new(name), &abs),
            &identity,
            &saved,
            Some(&PlainPaths),
        )
    };
    let (Membership::Shard(a), Membership::Shard(b)) = (member(&shards[0].0), member(&shards[1].0))
    else {
        panic!("not shards")
    };
    assert!(Arc::ptr_eq(&a.model, &b.model));
    assert_eq!((a.shard, b.shard), (0, 1));
    assert_eq!(registry.models().len(), 1);
}

#[test]
fn sequential_read_ahead_runs_on_into_the_next_shard() {
    // Blocks of 8 MiB on a 32 MiB budget: the block lead (4–12 MiB) cannot hold the current
    // block and the next, so only the sequential read-ahead (8 MiB) reaches into shard 2.
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded(dir.path(), 2, 2, 8 * MIB, true);
    let exec = Arc::new(ManualExecutor::new(1024));
    let store = ModelStore::with_executor(32 << 20, SavedOrders::default(), exec.clone());
    let first = open(&store, dir.path(), &shards[0].0);
    let mut at = 0;
    while at < shards[0].1.len() {
        let got = store.read(&first, at as u64, 1 << 20).unwrap();
        assert_eq!(&got[..], &shards[0].1[at..at + got.len()]);
        at += got.len();
        exec.run_pending();
    }
    let second = open(&store, dir.path(), &shards[1].0);
    let plan = second.plan().unwrap();
    // Shard 2 starts with the rest of transformer_blocks.1 (model block 2), then
    // transformer_blocks.2 (block 3): the first and the big tensor of the next are read ahead
    // (8 MiB in all); the output projection (non-block group, current at the start of shard 1)
    // is not fetched early.
    let present = |c: usize| second.chunk_present(store.cache(), c);
    let chunks = plan.chunks();
    assert_eq!(
        (chunks[0].block, chunks[1].block, chunks[2].block),
        (2, 3, 3)
    );
    assert!(present(0) && present(1) && present(2), "{chunks:?}");
    assert!(!plan.block_chunks(0).iter().any(|&c| present(c)));
    assert_eq!(&read_all(&store, &second, 1 << 20), &shards[1].1);
}

/// Whether the store formed a model of the shards in `dir`.
#[cfg(unix)]
fn forms_a_model(dir: &Path, names: &[String]) -> (bool, Option<String>) {
    let store = ModelStore::new(64 << 20, SavedOrders::default());
    let file = open(&store, dir, &names[0]);
    let reason = store
        .files_snapshot()
        .into_iter()
        .find(|f| f.path == names[0])
        .and_then(|f| f.standalone_reason);
    (file.shard_of.is_some(), reason)
}

#[cfg(unix)]
#[test]
fn a_model_is_formed_only_of_shards_open_to_the_same_users() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    // Files of the directory, same owner and mode: one model.
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = sharded(dir.path(), 2, 1, MIB, false)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for n in &names {
        mode(&dir.path().join(n), 0o644).unwrap();
    }
    assert_eq!(forms_a_model(dir.path(), &names), (true, None));
    // One shard private to its owner: anyone else could open shard 1 and not shard 2.
    mode(&dir.path().join(&names[1]), 0o600).unwrap();
    let (formed, reason) = forms_a_model(dir.path(), &names);
    assert!(!formed);
    assert!(reason.unwrap().contains("not open to the same users"));

    // The Hugging Face cache: every shard a link into blobs/: one model.
    let hf = tempfile::tempdir().unwrap();
    let (snap, blobs) = (hf.path().join("snapshots/rev"), hf.path().join("blobs"));
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(&blobs).unwrap();
    let names: Vec<String> = sharded(&blobs, 2, 1, MIB, false)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for n in &names {
        std::fs::rename(blobs.join(n), blobs.join(format!("sha-{n}"))).unwrap();
        symlink(format!("../../blobs/sha-{n}"), snap.join(n)).unwrap();
    }
    assert_eq!(forms_a_model(&snap, &names), (true, None));
    // One of them planted elsewhere (a link to another directory): each file stands alone.
    let elsewhere = hf.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::rename(blobs.join(format!("sha-{}", names[1])), elsewhere.join("x")).unwrap();
    std::fs::remove_file(snap.join(&names[1])).unwrap();
    symlink("../../elsewhere/x", snap.join(&names[1])).unwrap();
    let (formed, reason) = forms_a_model(&snap, &names);
    assert!(!formed);
    assert!(reason.unwrap().contains("different directories"));
}

/// Source paths whose `open` of one file stalls for `stall`.
struct StallingPaths {
    stalls: std::path::PathBuf,
    stall: std::time::Duration,
}

impl crate::source::PathAccess for StallingPaths {
    fn open(&self, abs: &Path) -> std::io::Result<crate::source::Opened> {
        if abs == self.stalls {
            std::thread::sleep(self.stall);
        }
        PlainPaths.open(abs)
    }

    fn identity(&self, abs: &Path) -> std::io::Result<crate::source::SourceIdentity> {
        PlainPaths.identity(abs)
    }

    fn list_dir(&self, abs: &Path) -> std::io::Result<Vec<std::ffi::OsString>> {
        PlainPaths.list_dir(abs)
    }

    fn dir_identity(&self, abs: &Path) -> std::io::Result<crate::source::SourceIdentity> {
        PlainPaths.dir_identity(abs)
    }

    fn link_target(&self, abs: &Path) -> std::io::Result<Option<std::path::PathBuf>> {
        PlainPaths.link_target(abs)
    }
}

#[test]
fn a_shard_that_stalls_while_its_model_is_formed_stalls_only_its_directory() {
    let root = tempfile::tempdir().unwrap();
    for dir in ["a", "b"] {
        std::fs::create_dir(root.path().join(dir)).unwrap();
        sharded(&root.path().join(dir), 3, 2, MIB, true);
    }
    let stall = std::time::Duration::from_millis(1500);
    let store = Arc::new(ModelStore::new(64 << 20, SavedOrders::default()));
    store.reach_source_through(Arc::new(StallingPaths {
        stalls: root.path().join("a/m-00002-of-00003.safetensors"),
        stall,
    }));
    let open = |store: &ModelStore, name: &str| {
        let file = store
            .open(Path::new(name), &root.path().join(name))
            .unwrap();
        assert!(file.shard_of.is_some(), "{name} is a shard of its model");
    };
    std::thread::scope(|scope| {
        // Forming a's model reads its second shard's header: stalled.
        let forming = scope.spawn(|| open(&store, "a/m-00001-of-00003.safetensors"));
        std::thread::sleep(std::time::Duration::from_millis(200));
        // Meanwhile b's model is formed, from another directory.
        let started = std::time::Instant::now();
        open(&store, "b/m-00003-of-00003.safetensors");
        let waited = started.elapsed();
        assert!(
            waited < stall / 3,
            "an open in another directory waited {waited:?} for a stalled formation"
        );
        assert!(!forming.is_finished(), "a's formation was still stalled");
        forming.join().unwrap();
    });
}
