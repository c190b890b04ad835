//! The read path end to end (without FUSE): synthetic checkpoints, random ranges, bit-exact.

use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::prefetch::saved::SavedOrders;
use crate::prefetch::ManualExecutor;
use crate::stats::Counters;
use crate::synth::{write_checkpoint, Layout as SynthLayout, SynthDtype, SynthSpec};
use std::sync::atomic::Ordering;
use std::sync::Arc;

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

/// Prefetch happened, and at most a tenth of what it read was evicted unread.
fn assert_little_prefetch_wasted(store: &ModelStore) {
    let c = store.counters();
    let (issued, used, wasted) = (
        Counters::get(&c.prefetch_issued_bytes),
        Counters::get(&c.prefetch_used_bytes),
        Counters::get(&c.prefetch_wasted_bytes),
    );
    assert!(issued > 0, "no prefetch at all");
    assert!(
        wasted <= issued / 10,
        "issued {issued} used {used} wasted {wasted}, probes {} bytes",
        Counters::get(&c.probe_bytes)
    );
}

/// A synthetic checkpoint of about `bytes` bytes, opened in a store with `budget`.
fn opened(
    bytes: u64,
    budget: u64,
    seed: u64,
) -> (tempfile::TempDir, Vec<u8>, Arc<ModelStore>, Arc<ModelFile>) {
    let dir = tempfile::tempdir().unwrap();
    let content = checkpoint(dir.path(), "m.safetensors", bytes, seed);
    let store = Arc::new(ModelStore::new(budget, SavedOrders::default()));
    let file = store
        .open(
            Path::new("m.safetensors"),
            &dir.path().join("m.safetensors"),
        )
        .unwrap();
    (dir, content, store, file)
}

/// The whole file, read from offset 0 in requests of `step` bytes (shared with `shard_tests`).
pub(super) fn read_all(store: &ModelStore, file: &Arc<ModelFile>, step: u32) -> Vec<u8> {
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
    let (_dir, bytes, store, file) = opened(24 << 20, 8 << 20, 1);
    assert!(!file.is_raw());
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
    assert!(file.is_raw());
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
#[cfg_attr(
    windows,
    ignore = "Wine 8 cannot rename over a file another handle has open (no POSIX rename semantics)"
)]
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
            // What a transport sends (the pieces, and a copy of them) before the joined slice.
            prop_assert_eq!(got.len(), end - start);
            prop_assert_eq!(got.slices().collect::<Vec<_>>().concat(), &bytes[start..end]);
            let mut copied = vec![0u8; got.len()];
            prop_assert_eq!(got.copy_into(&mut copied), got.len());
            prop_assert_eq!(&copied[..], &bytes[start..end]);
            prop_assert_eq!(&got[..], &bytes[start..end]);
        }
    }
}

/// [`opened`], with prefetches run only when the test calls `run_pending` on the executor.
fn opened_manual(
    bytes: u64,
    budget: u64,
    seed: u64,
) -> (
    tempfile::TempDir,
    Vec<u8>,
    Arc<ManualExecutor>,
    ModelStore,
    Arc<ModelFile>,
) {
    let dir = tempfile::tempdir().unwrap();
    let content = checkpoint(dir.path(), "m.safetensors", bytes, seed);
    let exec = Arc::new(ManualExecutor::new(1024));
    let store = ModelStore::with_executor(budget, SavedOrders::default(), exec.clone());
    let file = store
        .open(
            Path::new("m.safetensors"),
            &dir.path().join("m.safetensors"),
        )
        .unwrap();
    (dir, content, exec, store, file)
}

#[test]
fn sequential_readahead_is_not_wasted() {
    // Prefetches run between reads, as when the disk keeps ahead of the reader.
    let (_dir, bytes, exec, store, file) = opened_manual(96 << 20, 64 << 20, 1);
    for _pass in 0..2 {
        let mut offset = 0;
        while offset < bytes.len() as u64 {
            let got = store.read(&file, offset, 128 << 10).unwrap();
            assert_eq!(
                &got[..],
                &bytes[offset as usize..offset as usize + got.len()]
            );
            offset += got.len() as u64;
            exec.run_pending();
        }
    }
    assert_little_prefetch_wasted(&store);
    // The reader found what prefetch read: after the first chunks, nearly every read hit.
    let c = store.counters();
    assert!(Counters::get(&c.prefetch_used_bytes) > 0);
}

#[test]
#[cfg_attr(
    windows,
    ignore = "timing: under Wine 8 the waste bound (10 %) was exceeded in 4 of 15 release runs (11-20 %)"
)]
fn concurrent_sequential_readers_account_prefetch_exactly() {
    let (_dir, bytes, store, file) = opened(96 << 20, 64 << 20, 1);
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
    store.wait_prefetch_idle();
    assert_little_prefetch_wasted(&store);
}

/// Reads every tensor of `file` block by block in `order`, each block's chunks by 4 threads,
/// checking bytes; returns the disk bytes read by the pass.
fn block_pass(
    store: &Arc<ModelStore>,
    file: &Arc<ModelFile>,
    bytes: &[u8],
    order: &[usize],
) -> u64 {
    let before = Counters::get(&store.counters().disk_read_bytes);
    let Layout::Indexed { index, .. } = file.layout() else {
        panic!("malformed")
    };
    for &block in order {
        let ranges: Vec<(u64, u64)> = index
            .block_tensors(block)
            .map(|t| (t.start, t.end))
            .collect();
        std::thread::scope(|scope| {
            for part in ranges.chunks(ranges.len().div_ceil(4).max(1)) {
                scope.spawn(move || {
                    for &(start, end) in part {
                        let mut pos = start;
                        while pos < end {
                            let len = (end - pos).min(1 << 20) as u32;
                            let got = store.read(file, pos, len).unwrap();
                            assert_eq!(&got[..], &bytes[pos as usize..pos as usize + len as usize]);
                            pos += u64::from(len);
                        }
                    }
                });
            }
        });
    }
    Counters::get(&store.counters().disk_read_bytes) - before
}

fn resident_blocks(store: &ModelStore, file: &ModelFile) -> Vec<usize> {
    let plan = file.plan().unwrap();
    let mut blocks: Vec<usize> = (0..plan.len())
        .filter(|&c| file.chunk_present(store.cache(), c))
        .map(|c| plan.get(c).unwrap().block)
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

/// Repeated passes over a file twice the budget read only what does not fit, pass after pass.
///
/// What stays resident is not a fixed head of the order but a set that moves backwards through
/// it (see the eviction docs in `crate::cache`): here about two blocks of 33 per pass, traced
/// over twelve passes (`{0–13, 31, 32}` after the first, `{0, 17–30, 32}` after the eighth),
/// while every pass read 1.05–1.11 × (data − budget). So the test asserts the bytes of eight
/// passes (by then the set has moved past most of what the first pass kept) and that
/// consecutive passes keep most of one set, not which blocks it holds.
#[test]
fn repeated_passes_read_only_what_does_not_fit_and_keep_most_of_one_set() {
    let budget = 32 << 20;
    let (_dir, bytes, store, file) = opened(64 << 20, budget, 5);
    let blocks = file
        .plan()
        .map(|_| file.tracker().unwrap().order())
        .unwrap();
    let data = (bytes.len() as u64)
        - match file.layout() {
            Layout::Indexed { index, .. } => index.header_bytes,
            Layout::Raw { .. } => unreachable!(),
        };
    let mut previous: Vec<usize> = Vec::new();
    for pass in 0..8 {
        let disk = block_pass(&store, &file, &bytes, &blocks);
        store.wait_prefetch_idle(); // prefetches queued by this pass are done
        assert!(store.cache().snapshot().used_bytes <= budget);
        let resident = resident_blocks(&store, &file);
        if pass >= 1 {
            // LRU would read the whole file again; order-aware eviction reads what does not fit.
            let bound = (data - budget) as f64 * 1.15;
            assert!((disk as f64) <= bound, "pass {pass}: {disk} bytes from disk, bound {bound:.0} (data {data}, budget {budget})");
            let kept = resident.iter().filter(|b| previous.contains(b)).count();
            assert!(
                kept * 2 >= resident.len(),
                "pass {pass}: resident sets {previous:?} vs {resident:?}"
            );
        }
        previous = resident;
    }
    assert!(file.tracker().unwrap().learned().0, "a pass was learned");
}

#[test]
fn a_jump_cancels_queued_block_prefetches() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path(), "m.safetensors", 16 << 20, 6);
    let exec = Arc::new(ManualExecutor::new(1024));
    let store = ModelStore::with_executor(64 << 20, SavedOrders::default(), exec.clone());
    let file = store
        .open(
            Path::new("m.safetensors"),
            &dir.path().join("m.safetensors"),
        )
        .unwrap();
    let tracker = file.tracker().unwrap();
    let plan = file.plan().unwrap();
    let before_jump = tracker.epoch();
    tracker.touch(3);
    assert_ne!(
        tracker.epoch(),
        before_jump,
        "an unpredicted block is a jump"
    );
    let stale_chunk = plan.block_chunks(5)[0];
    let fresh_chunk = plan.block_chunks(6)[0];
    assert!(store
        .prefetcher
        .queue(&file, stale_chunk, Some(before_jump)));
    assert!(store
        .prefetcher
        .queue(&file, fresh_chunk, Some(tracker.epoch())));
    assert_eq!(exec.run_pending(), 2);
    assert!(
        file.chunk_present(store.cache(), fresh_chunk),
        "a current prefetch is done"
    );
    assert!(
        !file.chunk_present(store.cache(), stale_chunk),
        "a stale one is dropped"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    /// Readers on several threads plus the prefetcher never push the cache over its budget.
    #[test]
    fn budget_holds_under_concurrent_reads_and_prefetch(
        budget_mib in 1u64..12,
        reads in prop::collection::vec((0u64..(12 << 20), 1u32..(3 << 20)), 8..40),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let bytes = checkpoint(dir.path(), "m.safetensors", 12 << 20, 7);
        let budget = budget_mib << 20;
        let store = Arc::new(ModelStore::new(budget, SavedOrders::default()));
        let file = store.open(Path::new("m.safetensors"), &dir.path().join("m.safetensors")).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        let peak = std::thread::scope(|scope| {
            let monitor = scope.spawn(|| {
                let mut peak = 0;
                while !done.load(Ordering::Relaxed) {
                    peak = peak.max(store.cache().snapshot().used_bytes);
                    std::thread::yield_now();
                }
                peak
            });
            let readers: Vec<_> = reads.chunks(reads.len().div_ceil(4)).map(|part| {
                let (store, file, bytes) = (&store, &file, &bytes);
                scope.spawn(move || {
                    for &(offset, len) in part {
                        let got = store.read(file, offset, len).unwrap();
                        let start = (offset as usize).min(bytes.len());
                        let end = (offset as usize + len as usize).min(bytes.len());
                        assert_eq!(&got[..], &bytes[start..end]);
                    }
                })
            }).collect();
            for reader in readers {
                reader.join().unwrap();
            }
            store.wait_prefetch_idle();
            done.store(true, Ordering::Relaxed);
            monitor.join().unwrap()
        });
        prop_assert!(peak <= budget, "peak {peak} over budget {budget}");
    }
}

/// ComfyUI's view phase: reads 4 KiB at the start of every tensor, in name order, each checked
/// against `bytes`; returns how many tensors were touched.
fn touch_tensors_in_name_order(store: &ModelStore, file: &Arc<ModelFile>, bytes: &[u8]) -> usize {
    let Layout::Indexed { index, .. } = file.layout() else {
        panic!("malformed")
    };
    let mut starts: Vec<(&str, u64)> = index
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.start))
        .collect();
    starts.sort();
    for (_, start) in &starts {
        let got = store.read(file, *start, 4096).unwrap();
        let end = (*start as usize + 4096).min(bytes.len());
        assert_eq!(&got[..], &bytes[*start as usize..end]);
    }
    starts.len()
}

/// ComfyUI's first pass: one small read at the start of every tensor, in name order. Each is a
/// probe: served bit-exact from the source, nothing cached, nothing prefetched, no block
/// visited; then a sequential pass over the file goes through the cache as before.
#[test]
fn tensor_touches_are_probes_and_prefetch_nothing() {
    let (_dir, bytes, store, file) = opened(48 << 20, 12 << 20, 11);
    let touched = touch_tensors_in_name_order(&store, &file, &bytes);
    let c = store.counters();
    assert!(Counters::get(&c.probe_bytes) > 0);
    assert_eq!(
        Counters::get(&c.prefetch_issued_bytes),
        0,
        "probes start no prefetch"
    );
    assert_eq!(
        store.cache().snapshot().used_bytes,
        0,
        "probes cache nothing"
    );
    assert!(
        Counters::get(&c.disk_read_bytes) <= touched as u64 * 4096,
        "only the touched bytes were read"
    );
    // A reader streaming the file afterwards is served through the cache.
    assert_eq!(read_all(&store, &file, 1 << 20), bytes);
    assert!(Counters::get(&c.miss_bytes) + Counters::get(&c.hit_bytes) > bytes.len() as u64 / 2);
}

/// The same touches of a model that fits the cache, on a source read in order (one that
/// charges per request): after the first [`read::WARM_AFTER_TOUCHES`], read exactly, the model
/// is warmed into the cache in order and the touches are served through it; the source serves
/// the file about once, in requests far fewer than the touches, and the copies that follow read
/// nothing more. Bit-exact throughout. A model larger than the cache keeps its touches exact
/// and uncached.
#[test]
fn touches_of_a_model_that_fits_warm_it_on_an_ordered_source() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = checkpoint(dir.path(), "m.safetensors", 48 << 20, 21);
    let open = |budget: u64| {
        let store = ModelStore::new(budget, SavedOrders::default())
            .with_source_pacing(crate::prefetch::PacingMode::Ordered);
        let file = store
            .open(
                Path::new("m.safetensors"),
                &dir.path().join("m.safetensors"),
            )
            .unwrap();
        (store, file)
    };
    let exact = (read::WARM_AFTER_TOUCHES - 1) * 4096;
    let (store, file) = open(64 << 20);
    let touched = touch_tensors_in_name_order(&store, &file, &bytes) as u64;
    let c = store.counters();
    assert!(touched > 4 * read::WARM_AFTER_TOUCHES, "{touched} touches");
    assert_eq!(
        Counters::get(&c.probe_bytes),
        exact,
        "the first touches read exactly"
    );
    assert_eq!(Counters::get(&c.probe_cached_bytes), touched * 4096 - exact);
    assert!(
        Counters::get(&c.disk_reads) * 4 <= touched,
        "{} requests for {touched} touches",
        Counters::get(&c.disk_reads)
    );
    assert_eq!(read_all(&store, &file, 1 << 20), bytes);
    store.wait_prefetch_idle();
    let read = Counters::get(&c.disk_read_bytes);
    assert!(
        read <= bytes.len() as u64 + exact,
        "the file once and the first touches: {read}"
    );

    let (store, file) = open(12 << 20);
    touch_tensors_in_name_order(&store, &file, &bytes);
    let c = store.counters();
    assert!(Counters::get(&c.probe_bytes) >= touched * 4096);
    assert_eq!(Counters::get(&c.probe_cached_bytes), 0);
    assert_eq!(
        store.cache().snapshot().used_bytes,
        0,
        "larger than the cache: nothing cached"
    );
}

/// ComfyUI loading a checkpoint again: the previous load streamed the file and left chunks
/// resident (the start of the next pass, prefetched). The new load's tensor touches are still
/// probes: those that find their chunk resident are served from it, and none enters a block
/// or starts a prefetch (which swept the whole file ahead of the touches: acceptance benchmark, part 2).
#[test]
fn a_reload_touching_resident_chunks_prefetches_nothing() {
    let (dir, bytes, exec, store, file) = opened_manual(48 << 20, 24 << 20, 12);
    let mut offset = 0;
    while offset < bytes.len() as u64 {
        offset += store.read(&file, offset, 128 << 10).unwrap().len() as u64;
        exec.run_pending();
    }
    assert!(
        store.cache().snapshot().used_bytes > 0,
        "the load left chunks resident"
    );
    let reopened = store
        .open(
            Path::new("m.safetensors"),
            &dir.path().join("m.safetensors"),
        )
        .unwrap();
    let c = store.counters();
    let (hits, disk) = (Counters::get(&c.hits), Counters::get(&c.disk_read_bytes));
    let touched = touch_tensors_in_name_order(&store, &reopened, &bytes);
    assert!(exec.is_empty(), "touches queued {} prefetches", exec.len());
    assert!(
        Counters::get(&c.hits) > hits,
        "resident chunks served touches"
    );
    assert!(
        Counters::get(&c.disk_read_bytes) - disk <= touched as u64 * 4096,
        "only touched bytes were read"
    );
    assert_eq!(read_all(&store, &reopened, 1 << 20), bytes);
}

/// Probes cost the daemon no copy: a touch of a chunk not in memory is served from the buffer
/// its own source read filled, and one that finds its chunk resident borrows the chunk.
#[test]
fn probes_are_served_without_a_copy() {
    let (dir, bytes, store, file) = opened(48 << 20, 24 << 20, 12);
    let Layout::Indexed { index, .. } = file.layout() else {
        panic!("malformed")
    };
    // The last tensor, cold: its chunk is not in memory.
    let last = index.tensors.iter().map(|t| t.start).max().unwrap();
    let expected = &bytes[last as usize..(last as usize + 4096).min(bytes.len())];
    let cold = store.read(&file, last, 4096).unwrap();
    assert!(matches!(cold, ReadBytes::Source(_)), "a cold probe");
    assert_eq!(&cold[..], expected);
    assert_eq!(read_all(&store, &file, 128 << 10), bytes);
    store.wait_prefetch_idle();
    // A new load's touch is a probe again (its file's runs start empty): touch a tensor whose
    // first 4 KiB lie in a chunk the pass left resident.
    let reopened = store
        .open(
            Path::new("m.safetensors"),
            &dir.path().join("m.safetensors"),
        )
        .unwrap();
    let plan = reopened.plan().unwrap();
    let start = index
        .tensors
        .iter()
        .map(|t| t.start)
        .find(|&start| {
            plan.chunk_at(start).is_some_and(|chunk| {
                reopened.chunk_present(store.cache(), chunk)
                    && plan.get(chunk).is_some_and(|span| start + 4096 <= span.end)
            })
        })
        .expect("the pass left a chunk resident");
    let expected = &bytes[start as usize..start as usize + 4096];
    let probes = Counters::get(&store.counters().probe_bytes);
    let resident = store.read(&reopened, start, 4096).unwrap();
    assert!(
        matches!(resident, ReadBytes::Chunk { .. }),
        "a probe of a resident chunk"
    );
    assert_eq!(&resident[..], expected);
    // One across the boundary of two resident chunks is served from both, borrowed, exactly.
    let boundary = (1..plan.chunks().len())
        .find(|&c| {
            reopened.chunk_present(store.cache(), c - 1) && reopened.chunk_present(store.cache(), c)
        })
        .map(|c| plan.chunks()[c].start)
        .expect("two adjacent resident chunks");
    let across = store.read(&reopened, boundary - 2048, 4096).unwrap();
    let pieces: Vec<&[u8]> = across.slices().collect();
    assert!(
        matches!(across, ReadBytes::Gathered(_)) && pieces.len() == 2,
        "a probe across chunks is sent in two pieces"
    );
    assert_eq!(
        pieces.concat(),
        &bytes[boundary as usize - 2048..boundary as usize + 2048]
    );
    assert_eq!(
        &across[..],
        &bytes[boundary as usize - 2048..boundary as usize + 2048]
    );
    assert_eq!(
        Counters::get(&store.counters().probe_bytes),
        probes,
        "served from memory, not the source"
    );
}

/// Reads block `block` whole, checking its bytes; queued prefetches run after each request, as
/// when the disk keeps ahead of the reader. Returns how long it took.
fn read_block(
    (store, exec, file, bytes): (&ModelStore, &ManualExecutor, &Arc<ModelFile>, &[u8]),
    block: usize,
) -> std::time::Duration {
    let started = std::time::Instant::now();
    let plan = file.plan().unwrap();
    for &chunk in plan.block_chunks(block) {
        let span = *plan.get(chunk).unwrap();
        let mut pos = span.start;
        while pos < span.end {
            let step = (span.end - pos).min(1 << 20) as u32;
            let got = store.read(file, pos, step).unwrap();
            assert_eq!(&got[..], &bytes[pos as usize..pos as usize + got.len()]);
            pos += got.len() as u64;
            exec.run_pending();
        }
    }
    started.elapsed()
}

/// Chunks of `block` that are neither cached nor being read.
fn chunks_missing(store: &ModelStore, file: &ModelFile, block: usize) -> Vec<usize> {
    let plan = file.plan().unwrap();
    let chunks = plan.block_chunks(block).iter().copied();
    chunks
        .filter(|&c| !file.chunk_present(store.cache(), c))
        .collect()
}

/// Walks blocks 1–3 in order (`pause` says how long to stop after each), then enters block 4
/// with a one-byte read: returns the chunks of block 5 not prefetched by then. Blocks are larger
/// than an eighth of the budget (index 0 is `(other)`; index k + 1 is `blocks.k`).
fn next_block_missing_after_walk(pause: bool) -> Vec<usize> {
    let (_dir, bytes, exec, store, file) = opened_manual(64 << 20, 12 << 20, 3);
    let block_bytes = file.plan().unwrap().block_bytes(5);
    assert!(block_bytes > (12 << 20) / 8, "{block_bytes}");
    let reader = (&store, &*exec, &file, &bytes[..]);
    for block in 1..=3 {
        let reading = read_block(reader, block);
        if pause {
            // Compute: longer than the reading and than pace::MIN_PAUSE, however slow the
            // machine (a sleep lasts at least this long).
            std::thread::sleep(reading + std::time::Duration::from_millis(10));
        }
    }
    let first = file.plan().unwrap().block_chunks(4)[0];
    let start = file.plan().unwrap().get(first).unwrap().start;
    let got = store.read(&file, start, 1).unwrap();
    assert_eq!(got[0], bytes[start as usize]);
    exec.run_pending();
    chunks_missing(&store, &file, 5)
}

/// Blocks larger than an eighth of the budget, a reader that computes between blocks: it gets
/// the whole next block ahead as soon as it enters a block, the block it is in not using up
/// the lead (acceptance benchmark part 3: 210 MB blocks through a 1 GiB budget stalled 23 points above
/// the pass from RAM when it did).
#[test]
fn a_computing_reader_gets_a_whole_large_block_ahead() {
    let missing = next_block_missing_after_walk(true);
    assert!(
        missing.is_empty(),
        "chunks of the next block not prefetched: {missing:?}"
    );
}

/// The same walk without pauses (a loader, a repeated pass): the block the reader is in counts
/// towards the lead, which leaves no room for the next whole block, so the resident set that
/// later passes keep is not spent on it.
#[test]
fn a_reader_that_does_not_compute_keeps_the_ordinary_lead() {
    let missing = next_block_missing_after_walk(false);
    assert!(
        !missing.is_empty(),
        "the next block was prefetched whole for a reader that does not pause"
    );
}

/// `prefetch FILE` after a reader stopped early in a pass (the control test's sequence: a full
/// pass in a shuffled order, then the first two blocks of the next, then `drop`): the warm
/// loads the order's first blocks and keeps them. With the reader's stale position, the first
/// block of the order was the block it had just left, "needed last", and the warm's later
/// chunks (whose buffers exceed their spans by alignment slack, so the budget's worth of spans
/// overflows it) evicted it again (tests/python/test_control.py, 5 failures in 8 runs).
#[test]
fn a_warm_keeps_the_first_blocks_of_the_order_whatever_the_reader_left_behind() {
    let (_dir, bytes, exec, store, file) = opened_manual(64 << 20, 16 << 20, 9);
    let reader = (&store, &*exec, &file, &bytes[..]);
    let tracker = file.tracker().unwrap();
    let mut order: Vec<usize> = tracker.order();
    order.reverse(); // any order but the default one
    for &block in order.iter().chain(&order[..2]) {
        read_block(reader, block);
    }
    assert!(tracker.learned().0, "the pass was learned");
    assert_eq!(tracker.order(), order);
    store.drop_cached();
    // A budget of exactly the spans of the order's first blocks: the buffers overflow it.
    let plan = file.plan().unwrap();
    let spans: u64 = order[..6]
        .iter()
        .flat_map(|&block| plan.block_chunks(block))
        .map(|&chunk| plan.get(chunk).unwrap().len())
        .sum();
    store.set_budget(spans);
    store.warm(&file);
    exec.run_pending();
    for &block in &order[..3] {
        let missing = chunks_missing(&store, &file, block);
        assert!(missing.is_empty(), "block {block} not warm: {missing:?}");
    }
    store.cache().check_accounting();
}

/// The small `O_DIRECT` pieces of a reader that also sends large ones (a range's unaligned
/// head and tail, in whatever order the transport hands them over) are served exactly, never
/// loading chunks: a stream of them after a large piece reads only what it asks for.
#[test]
fn small_direct_pieces_of_a_reader_of_large_ones_are_exact() {
    let (_dir, bytes, exec, store, file) = opened_manual(24 << 20, 8 << 20, 4);
    let c = store.counters();
    let header = file.header_end().unwrap();
    let large = header + (16 << 20);
    let got = store.read_direct(&file, large, 1 << 20).unwrap();
    assert_eq!(&got[..], &bytes[large as usize..large as usize + (1 << 20)]);
    // 2 MiB of 64 KiB pieces in file order: a stream had they come from a reader of small ones.
    let (start, mut pos) = (header + (4 << 20), header + (4 << 20));
    while pos < start + (2 << 20) {
        let got = store.read_direct(&file, pos, 64 << 10).unwrap();
        assert_eq!(&got[..], &bytes[pos as usize..pos as usize + (64 << 10)]);
        pos += 64 << 10;
        exec.run_pending();
    }
    assert_eq!(Counters::get(&c.disk_read_bytes), (1 << 20) + (2 << 20));
    assert_eq!(Counters::get(&c.direct_bytes), (1 << 20) + (2 << 20));
    assert_eq!(Counters::get(&c.prefetch_issued_bytes), 0);
    assert_eq!(store.cache().snapshot().used_bytes, 0, "nothing cached");
}

/// `O_DIRECT` reads of a file larger than the chunk cache: exactly the bytes asked for, read
/// once, nothing cached or prefetched (runai's heads-last pattern read 1.1x the file through
/// the chunk cache); resident chunks still serve them. Small pieces, and every piece of a file
/// the cache holds, go through the cache.
#[test]
fn direct_reads_of_a_file_larger_than_the_cache_are_exact_and_uncached() {
    let (_dir, bytes, exec, store, file) = opened_manual(24 << 20, 8 << 20, 4);
    let c = store.counters();
    let (mut asked, mut pos) = (0u64, 0u64);
    // Aligned 1 MiB pieces from the second MiB on, then the unaligned head: like runai.
    let mut pieces: Vec<(u64, u32)> = (1..=((bytes.len() as u64 - 1) >> 20))
        .map(|mib| (mib << 20, 1 << 20))
        .collect();
    pieces.push((0, 1 << 20));
    for (offset, len) in pieces {
        let got = store.read_direct(&file, offset, len).unwrap();
        let end = (offset + u64::from(len)).min(bytes.len() as u64);
        assert_eq!(&got[..], &bytes[offset as usize..end as usize]);
        exec.run_pending();
        asked += end - offset;
        pos = pos.max(end);
    }
    assert_eq!(pos, bytes.len() as u64);
    let header = file.header_end().unwrap();
    let from_disk = Counters::get(&c.disk_read_bytes);
    assert!(
        from_disk <= asked && from_disk + header >= asked,
        "{from_disk} of {asked}"
    );
    assert_eq!(Counters::get(&c.direct_bytes), from_disk);
    assert_eq!(Counters::get(&c.prefetch_issued_bytes), 0);
    assert_eq!(store.cache().snapshot().used_bytes, 0, "nothing cached");

    // Resident chunks serve them: a stream (past its first megabyte, a probe) caches chunks,
    // a direct read of one is a hit.
    let plan = file.plan().unwrap();
    let mut pos = header;
    while pos < header + (4 << 20) {
        pos += store.read(&file, pos, 256 << 10).unwrap().len() as u64;
    }
    exec.run_pending();
    let last = plan.chunk_at(pos - 1).unwrap();
    let span = *plan.get(last).unwrap();
    let disk = Counters::get(&c.disk_read_bytes);
    assert!(file.chunk_present(store.cache(), last));
    let got = store.read_direct(&file, span.start, 4096).unwrap();
    let want = &bytes[span.start as usize..span.start as usize + 4096];
    assert_eq!(&got[..], want);
    assert_eq!(
        Counters::get(&c.disk_read_bytes),
        disk,
        "served from the cache"
    );

    // Small direct pieces of another reader (dd bs=4k iflag=direct, which opens the file) go
    // through the cache: a stream of them is served from chunks, with prefetch.
    store.drop_cached();
    file.opened();
    let (start, mut pos) = (header + (8 << 20), header + (8 << 20));
    while pos < start + (2 << 20) {
        let got = store.read_direct(&file, pos, 4096).unwrap();
        assert_eq!(&got[..], &bytes[pos as usize..pos as usize + 4096]);
        pos += 4096;
    }
    assert!(
        store.cache().snapshot().used_bytes > 0,
        "4 KiB pieces were cached"
    );

    // A file the cache holds: its direct reads go through the cache.
    let (_dir, bytes, _exec, store, file) = opened_manual(4 << 20, 8 << 20, 4);
    let mut got = Vec::new();
    while got.len() < bytes.len() {
        got.extend_from_slice(
            &store
                .read_direct(&file, got.len() as u64, 256 << 10)
                .unwrap(),
        );
    }
    assert_eq!(got, bytes);
    assert!(store.cache().snapshot().used_bytes > 0);
    assert_eq!(Counters::get(&store.counters().direct_bytes), 0);
}

/// The first chunk, in file order, that starts a block the order does not name after the block
/// ending just before it, with at least 1.5 MiB of chunk on either side of the boundary.
fn boundary_to_a_block_not_next(file: &ModelFile) -> usize {
    let plan = file.plan().unwrap();
    let tracker = file.tracker().unwrap();
    (1..plan.len())
        .find(|&c| {
            let (a, b) = (plan.get(c - 1).unwrap(), plan.get(c).unwrap());
            a.block != b.block
                && !tracker.follows(a.block, b.block)
                && a.end == b.start
                && a.len().min(b.len()) >= 3 << 19
        })
        .expect("a boundary between blocks that do not follow each other")
}

/// Kernel readahead that runs on in file order past the end of its block into a block the order
/// does not name next (`blocks.1` is followed in the file by `blocks.10`) is served exactly and
/// uncached there, for the first [`SPILL_BYTES`] of that block: it loads no chunk of a block
/// needed only later. A reader that goes on into that block becomes its stream, and its chunks
/// are cached again; a reader's own `read()` across the boundary loads the chunk as before.
#[test]
fn a_stream_running_into_a_block_not_next_in_the_order_loads_none_of_it() {
    let (_dir, bytes, _exec, store, file) = opened_manual(256 << 20, 64 << 20, 9);
    let boundary = boundary_to_a_block_not_next(&file);
    let a_end = file.plan().unwrap().get(boundary).unwrap().start;
    let step: u64 = 128 << 10;
    let exact = |offset: u64, len: u64| {
        let got = store.read_readahead(&file, offset, len as u32).unwrap();
        assert_eq!(&got[..], &bytes[offset as usize..(offset + len) as usize]);
    };
    // Stream through the last 1.5 MiB of block A in readahead-sized requests.
    let mut pos = a_end - (3 << 19);
    while pos + step <= a_end - step / 2 {
        exact(pos, step);
        pos += step;
    }
    let probes = Counters::get(&store.counters().probe_bytes);
    // A request across the boundary, then one inside B right after it.
    exact(pos, a_end + step / 2 - pos);
    exact(a_end + step / 2, step);
    assert!(
        !file.chunk_present(store.cache(), boundary),
        "the chunk of the block not heading for was loaded"
    );
    assert!(Counters::get(&store.counters().probe_bytes) >= probes + step + step / 2);
    // Going on into B: past its first SPILL_BYTES it is the stream, and its chunk is cached.
    let mut pos = a_end + step / 2 + step;
    while pos < a_end + (3 << 19) {
        exact(pos, step);
        pos += step;
    }
    assert!(
        file.chunk_present(store.cache(), boundary),
        "a reader going on into the block streams it"
    );
}

/// The same kind of boundary crossed by a reader's own `read()`s: the next block's chunk is
/// loaded, as a `read()` reader in file order goes on into it.
#[test]
fn a_readers_own_read_across_a_block_boundary_loads_the_next_block() {
    let (_dir, bytes, _exec, store, file) = opened_manual(256 << 20, 64 << 20, 9);
    let boundary = boundary_to_a_block_not_next(&file);
    let a_end = file.plan().unwrap().get(boundary).unwrap().start;
    let step: u64 = 128 << 10;
    let mut pos = a_end - (3 << 19);
    while pos < a_end + step {
        let got = store.read(&file, pos, step as u32).unwrap();
        assert_eq!(&got[..], &bytes[pos as usize..(pos + step) as usize]);
        pos += step;
    }
    assert!(file.chunk_present(store.cache(), boundary));
}

/// A workflow taking turns between two models: once `b` was seen to follow `a`, closing `a`
/// queues the first blocks of `b`, and only those; a model never followed by another warms
/// nothing.
#[test]
fn closing_a_model_warms_the_head_of_the_one_that_followed_it() {
    let dir = tempfile::tempdir().unwrap();
    let a_bytes = checkpoint(dir.path(), "a.safetensors", 24 << 20, 21);
    let b_bytes = checkpoint(dir.path(), "b.safetensors", 24 << 20, 22);
    let exec = Arc::new(ManualExecutor::new(1024));
    let store = Arc::new(ModelStore::with_executor(
        16 << 20,
        SavedOrders::default(),
        exec.clone(),
    ));
    let open = |name: &str| {
        let handle = store
            .open_handle(Path::new(name), &dir.path().join(name))
            .unwrap();
        assert_eq!(store.choose_mode(&handle, false), ServeMode::Cache);
        handle
    };
    for (name, bytes) in [("a.safetensors", &a_bytes), ("b.safetensors", &b_bytes)] {
        let handle = open(name);
        assert_eq!(&read_all(&store, handle.file(), 1 << 20), bytes);
        drop(handle);
        exec.run_pending();
    }
    let b = open("b.safetensors");
    let b_file = Arc::clone(b.file());
    drop(b);
    store.drop_cached();
    exec.run_pending();
    assert_eq!(store.cache().cached_bytes(b_file.generation), 0);
    // Only probed (as a header scan does), `a` warms nothing.
    drop(open("a.safetensors"));
    exec.run_pending();
    assert_eq!(store.cache().cached_bytes(b_file.generation), 0);

    let a = open("a.safetensors");
    assert_eq!(&read_all(&store, a.file(), 1 << 20), &a_bytes);
    exec.run_pending();
    store.drop_cached();
    drop(a);
    exec.run_pending();
    let order = b_file.tracker().unwrap().order();
    let first = b_file.plan().unwrap().block_chunks(order[0])[0];
    assert!(
        b_file.chunk_present(store.cache(), first),
        "the next model's first chunk is warm"
    );
    let warm = store.cache().cached_bytes(b_file.generation);
    assert!(
        warm > 0 && warm <= (16 << 20) / sequence::HEAD_SHARE + (4 << 20),
        "only the head of the next model is warmed: {warm} bytes"
    );
    // `b` was last followed by `a`: closing `b` warms `a`, and nothing of `b` itself.
    let b = open("b.safetensors");
    read_all(&store, b.file(), 1 << 20);
    exec.run_pending();
    store.drop_cached();
    drop(b);
    exec.run_pending();
    assert_eq!(store.cache().cached_bytes(b_file.generation), 0);
    store.cache().check_accounting();
}

/// The sequence is kept with the orders: after a remount (a new store on the same state
/// file), closing `a` warms `b`, which this store never opened, by the path it had.
#[test]
fn the_next_model_is_remembered_across_remounts() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path(), "a.safetensors", 24 << 20, 23);
    checkpoint(dir.path(), "b.safetensors", 24 << 20, 24);
    let state = dir.path().join("state/orders.json");
    let store_with = |exec: &Arc<ManualExecutor>| {
        let saved = SavedOrders::load(Some(state.clone()));
        Arc::new(ModelStore::with_executor(16 << 20, saved, exec.clone()))
    };
    let open = |store: &Arc<ModelStore>, name: &str| {
        let handle = store
            .open_handle(Path::new(name), &dir.path().join(name))
            .unwrap();
        store.choose_mode(&handle, false);
        handle
    };
    let stream = |store: &Arc<ModelStore>, exec: &ManualExecutor, name: &str| {
        let handle = open(store, name);
        read_all(store, handle.file(), 1 << 20);
        drop(handle);
        exec.run_pending();
    };
    {
        let exec = Arc::new(ManualExecutor::new(1024));
        let store = store_with(&exec);
        stream(&store, &exec, "a.safetensors");
        stream(&store, &exec, "b.safetensors");
    } // unmounted: the state file is written

    let exec = Arc::new(ManualExecutor::new(1024));
    let store = store_with(&exec);
    stream(&store, &exec, "a.safetensors");
    store.drop_cached();
    exec.run_pending();
    let a = open(&store, "a.safetensors");
    read_all(&store, a.file(), 1 << 20);
    drop(a);
    exec.run_pending();
    let b = store
        .files_snapshot()
        .into_iter()
        .find(|f| f.path == "b.safetensors")
        .expect("b is known: opened by its saved path");
    assert!(b.cached_bytes > 0, "b's head is warm: {b:?}");
    store.cache().check_accounting();
}

/// A model whose successor was never seen guesses the first model of the chain that led to it
/// (`a → b → c`: closing `c` warms the head of `a`), once per file; a model nothing led to
/// guesses nothing.
#[test]
fn a_model_with_no_known_successor_warms_the_first_of_its_chain_once() {
    let dir = tempfile::tempdir().unwrap();
    for (name, seed) in [("a", 41), ("b", 42), ("c", 43)] {
        checkpoint(dir.path(), &format!("{name}.safetensors"), 24 << 20, seed);
    }
    let exec = Arc::new(ManualExecutor::new(1024));
    let store = Arc::new(ModelStore::with_executor(
        16 << 20,
        SavedOrders::default(),
        exec.clone(),
    ));
    let mut files = std::collections::HashMap::new();
    // Streams `name` whole, empties the cache before the close, and returns what the close
    // warmed of each model.
    let mut stream = |name: &str| {
        let path = format!("{name}.safetensors");
        let handle = store
            .open_handle(Path::new(&path), &dir.path().join(&path))
            .unwrap();
        assert_eq!(store.choose_mode(&handle, false), ServeMode::Cache);
        read_all(&store, handle.file(), 1 << 20);
        exec.run_pending();
        files.insert(name.to_owned(), Arc::clone(handle.file()));
        store.drop_cached();
        drop(handle);
        exec.run_pending();
        files
            .iter()
            .map(|(n, f)| (n.clone(), store.cache().cached_bytes(f.generation)))
            .filter(|(_, bytes)| *bytes > 0)
            .collect::<Vec<_>>()
    };
    assert_eq!(stream("a"), [], "nothing led to a: no guess");
    let warmed = stream("b");
    assert_eq!(warmed.len(), 1, "{warmed:?}");
    assert_eq!(warmed[0].0, "a", "{warmed:?}");
    assert!(
        warmed[0].1 <= (16 << 20) / sequence::HEAD_SHARE + (4 << 20),
        "only the head: {warmed:?}"
    );
    assert_eq!(stream("b"), [], "b's successor is guessed once");
    let warmed = stream("c");
    assert_eq!(
        warmed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["a"],
        "the chain b → c leads back to a: {warmed:?}"
    );
    store.cache().check_accounting();
}

/// The floor holds for the chunk cache itself: a model open by passthrough that reserves most
/// of the budget, and then memory pressure shrinking the budget below what it reserves, leave
/// the chunk cache the floor, not nothing (every request would read a chunk and drop it).
#[test]
fn the_chunk_cache_keeps_the_floor_next_to_a_passthrough_file() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path(), "te.safetensors", 60 << 20, 31);
    let store = Arc::new(ModelStore::new(64 << 20, SavedOrders::default()));
    let target: Arc<dyn crate::budget::BudgetTarget> = store.clone();
    let governor = crate::budget::Governor::new(target, 64 << 20, 16 << 20);
    let handle = store
        .open_handle(
            Path::new("te.safetensors"),
            &dir.path().join("te.safetensors"),
        )
        .unwrap();
    assert_eq!(store.choose_mode(&handle, true), ServeMode::Passthrough);
    assert!(store.passthrough_held_bytes() > 48 << 20);
    assert_eq!(
        store.cache().budget(),
        16 << 20,
        "budget − reserved < floor"
    );
    governor.set_configured(32 << 20); // the budget shrinks, as under memory pressure
    assert_eq!(store.budget(), 32 << 20);
    assert_eq!(store.cache().budget(), 16 << 20);
    drop(handle);
}

#[test]
fn a_read_ahead_the_reader_has_passed_by_the_time_it_runs_is_dropped() {
    let (_dir, bytes, exec, store, file) = opened_manual(96 << 20, 64 << 20, 1);
    let plan = file.plan().unwrap();
    let tracker = file.tracker().unwrap().clone();
    // A chunk whose next chunk in the file is read ahead: in the same block or the next one.
    let (chunk, block) = (0..plan.len() - 1)
        .map(|c| (c, plan.get(c).unwrap().block))
        .find(|&(c, b)| b > 0 && [b, b + 1].contains(&plan.get(c + 1).unwrap().block))
        .unwrap();
    // Reads from the chunk's start, probes until they make a stream, then read through the
    // cache, which reads ahead.
    let (mut pos, end) = (plan.get(chunk).unwrap().start, plan.get(chunk).unwrap().end);
    while exec.is_empty() && pos < end {
        let got = store.read(&file, pos, 128 << 10).unwrap();
        assert_eq!(&got[..], &bytes[pos as usize..pos as usize + got.len()]);
        pos += got.len() as u64;
    }
    assert!(!exec.is_empty(), "the reads queued a read-ahead");
    // Before a worker runs it, the reader moves three blocks on.
    for ahead in 1..=3 {
        tracker.touch(block + ahead);
    }
    exec.run_pending();
    assert!(
        !file.chunk_present(store.cache(), chunk + 1),
        "read ahead for a block the reader had left"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn a_model_held_in_ram_is_passed_through_outside_the_budget() {
    // /dev/shm is tmpfs on Linux; the control lies in this crate's folder, on disk.
    let ram = tempfile::tempdir_in("/dev/shm").unwrap();
    let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    for dir in [ram.path(), disk.path()] {
        checkpoint(dir, "m.safetensors", 24 << 20, 41);
    }
    let in_ram = |dir: &Path| {
        crate::source::SourceFile::open(&dir.join("m.safetensors"))
            .unwrap()
            .is_in_ram()
    };
    assert!(in_ram(ram.path()), "/dev/shm is not tmpfs here");
    assert!(!in_ram(disk.path()), "the crate's folder is in RAM here");

    let budget = 16 << 20;
    let store = Arc::new(ModelStore::new(budget, SavedOrders::default()));
    // Named apart in the mount, as two files of one folder would be.
    let open = |dir: &Path| {
        let name = if in_ram(dir) {
            "ram.safetensors"
        } else {
            "disk.safetensors"
        };
        store
            .open_handle(Path::new(name), &dir.join("m.safetensors"))
            .unwrap()
    };
    // Larger than the budget: from disk, the chunk cache serves it.
    let on_disk = open(disk.path());
    assert_eq!(store.choose_mode(&on_disk, true), ServeMode::Cache);
    drop(on_disk);
    // Held in RAM: passed through, reserving nothing, and nothing parked once closed.
    let held = open(ram.path());
    assert_eq!(store.choose_mode(&held, true), ServeMode::Passthrough);
    let file = Arc::clone(held.file());
    let reason = store
        .files_snapshot()
        .into_iter()
        .find(|f| f.path == "ram.safetensors")
        .and_then(|f| f.mode_reason);
    assert_eq!(reason, Some("its source is held in RAM (tmpfs)"));
    assert_eq!(store.passthrough_held_bytes(), 0);
    assert_eq!(store.cache().budget(), budget);
    store.force_passthrough(&file); // another handle of the same inode: still outside
    assert_eq!(store.passthrough_held_bytes(), 0);
    store.close_passthrough(&file);
    drop(held);
    let tier = store.passthrough_snapshot();
    assert_eq!((tier.open_bytes, tier.parked_bytes), (0, 0));
    assert_eq!(store.cache().budget(), budget);
    // Without passthrough (an ordinary user) it goes through the chunk cache as before.
    let held = open(ram.path());
    assert_eq!(store.choose_mode(&held, false), ServeMode::Cache);
}
