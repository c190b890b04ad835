//! [`ModelsConfig`]: each field varied changes what it tunes.

use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::prefetch::saved::SavedOrders;
use crate::prefetch::ManualExecutor;
use crate::stats::Counters;
use crate::synth::{write_checkpoint, Layout as SynthLayout, SynthDtype, SynthSpec};

/// A synthetic checkpoint of about `bytes` bytes, opened in a store with `budget` tuned by
/// `config`, prefetches run only by the test.
fn opened_with(
    config: ModelsConfig,
    bytes: u64,
    budget: u64,
) -> (tempfile::TempDir, Vec<u8>, ModelStore, Arc<ModelFile>) {
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        layout: SynthLayout::Dit,
        target_bytes: bytes,
        dtype: SynthDtype::BF16,
        seed: 7,
    };
    let path = dir.path().join("m.safetensors");
    write_checkpoint(&path, &spec).unwrap();
    let content = std::fs::read(&path).unwrap();
    let exec = Arc::new(ManualExecutor::new(1024));
    let store = ModelStore::with_executor(budget, SavedOrders::default(), exec).with_config(config);
    let file = store.open(Path::new("m.safetensors"), &path).unwrap();
    (dir, content, store, file)
}

#[test]
fn the_default_config_is_the_daemons() {
    let config = ModelsConfig::default();
    assert_eq!(config.direct_exact_min, 256 << 10);
    assert_eq!(config.header_probe_bytes, 256 << 10);
    assert_eq!(config.header_tail_bytes, 64 << 10);
    assert_eq!(config.spill_bytes, 512 << 10);
    assert_eq!(config.stream_after, 1 << 20);
    assert_eq!(config.index_cap, DEFAULT_INDEX_CAP);
    assert_eq!(config.trim_after_evicted_bytes, 16 << 20);
    assert_eq!(config.next_model_head_share, 8);
    let store = ModelStore::new(1 << 20, SavedOrders::default());
    assert_eq!(*store.config(), config);
}

/// Small `O_DIRECT` pieces of a file larger than the cache go through the chunk cache by
/// default, and are served exactly and uncached once `direct_exact_min` is below them.
#[test]
fn direct_exact_min_decides_which_direct_reads_are_served_exactly() {
    for (min, exact) in [
        (ModelsConfig::default().direct_exact_min, false),
        (4096, true),
    ] {
        let config = ModelsConfig {
            direct_exact_min: min,
            ..ModelsConfig::default()
        };
        let (_dir, bytes, store, file) = opened_with(config, 24 << 20, 8 << 20);
        let start = file.header_end().unwrap() + (8 << 20);
        let mut pos = start;
        while pos < start + (2 << 20) {
            let got = store.read_direct(&file, pos, 4096).unwrap();
            assert_eq!(&got[..], &bytes[pos as usize..pos as usize + 4096]);
            pos += 4096;
        }
        let direct = Counters::get(&store.counters().direct_bytes);
        let cached = store.cache().snapshot().used_bytes;
        if exact {
            assert_eq!(direct, 2 << 20, "every piece served exactly");
            assert_eq!(cached, 0, "nothing cached");
        } else {
            assert_eq!(direct, 0);
            assert!(cached > 0, "4 KiB pieces were cached");
        }
    }
}

/// A header larger than the probe read is read in a second, exact request, and a read just
/// past its end is served from memory only within `header_tail_bytes`.
#[test]
fn the_header_probe_and_tail_sizes_are_what_the_config_says() {
    let config = ModelsConfig {
        header_probe_bytes: 16,
        header_tail_bytes: 0,
        ..ModelsConfig::default()
    };
    let (_dir, bytes, store, file) = opened_with(config, 8 << 20, 64 << 20);
    let header = file.header_end().unwrap();
    assert!(header > 16, "the probe read could not hold the header");
    // With no tail kept, a header read running past the header reads the disk.
    let got = store.read(&file, header - 96, 4096).unwrap();
    assert_eq!(
        &got[..],
        &bytes[header as usize - 96..header as usize + 4000]
    );
    assert!(Counters::get(&store.counters().disk_read_bytes) > 0);

    let (_dir, bytes, store, file) = opened_with(ModelsConfig::default(), 8 << 20, 64 << 20);
    let header = file.header_end().unwrap();
    let got = store.read(&file, header - 96, 4096).unwrap();
    assert_eq!(
        &got[..],
        &bytes[header as usize - 96..header as usize + 4000]
    );
    assert_eq!(
        Counters::get(&store.counters().disk_read_bytes),
        0,
        "served from the header's tail"
    );
}

/// A sequential reader is served as probes until its run covers `stream_after` bytes: never,
/// with no limit, and from its first request, with none.
#[test]
fn stream_after_decides_when_a_run_is_a_stream() {
    for (stream_after, streams) in [(u64::MAX, false), (0, true)] {
        let config = ModelsConfig {
            stream_after,
            ..ModelsConfig::default()
        };
        let (_dir, bytes, store, file) = opened_with(config, 8 << 20, 64 << 20);
        let start = file.header_end().unwrap();
        let mut pos = start;
        while pos < start + (2 << 20) {
            let got = store.read(&file, pos, 128 << 10).unwrap();
            assert_eq!(&got[..], &bytes[pos as usize..pos as usize + got.len()]);
            pos += got.len() as u64;
        }
        let probes = Counters::get(&store.counters().probe_bytes);
        let cached = store.cache().snapshot().used_bytes;
        if streams {
            assert_eq!(probes, 0, "no request was a probe");
            assert!(cached > 0, "the stream's chunks were cached");
        } else {
            assert_eq!(probes, pos - start, "every request was a probe");
            assert_eq!(cached, 0, "nothing cached");
        }
    }
}
