use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::index::{BlockInfo, TensorIndex, TensorInfo};
use crate::stats::Counters;

const MIB: u64 = 1 << 20;

/// A file of `blocks` blocks of one 16 MiB tensor each (four 4 MiB chunks per block); its
/// prefetches read nothing.
struct Target {
    tracker: Arc<ReaderTracker>,
    plan: ChunkPlan,
    path: PathBuf,
    /// In an object store ([`PrefetchTarget::is_remote`]).
    remote: bool,
}

impl Target {
    fn new(blocks: usize) -> Arc<Target> {
        let header_bytes = 4096;
        let tensors: Vec<TensorInfo> = (0..blocks)
            .map(|b| {
                let start = header_bytes + b as u64 * 16 * MIB;
                TensorInfo {
                    name: format!("blocks.{b}.weight"),
                    dtype: "U8".into(),
                    shape: vec![16 * MIB],
                    start,
                    end: start + 16 * MIB,
                    block: b,
                }
            })
            .collect();
        let end = header_bytes + blocks as u64 * 16 * MIB;
        let index = TensorIndex {
            format: Default::default(),
            file_size: end,
            header_bytes,
            data_end: end,
            tensors,
            blocks: (0..blocks)
                .map(|b| BlockInfo {
                    name: format!("b{b}"),
                    family: None,
                    number: None,
                    tensors: 1,
                    bytes: 16 * MIB,
                })
                .collect(),
            metadata: None,
        };
        Arc::new(Target {
            tracker: Arc::new(ReaderTracker::new(blocks, None)),
            plan: ChunkPlan::for_index(&index),
            path: PathBuf::from("model.safetensors"),
            remote: false,
        })
    }

    /// [`Self::new`] in an object store.
    fn remote(blocks: usize) -> Arc<Target> {
        let local = Target::new(blocks);
        Arc::new(Target {
            tracker: Arc::clone(&local.tracker),
            plan: local.plan.clone(),
            path: local.path.clone(),
            remote: true,
        })
    }
}

impl PrefetchTarget for Target {
    fn tracker(&self) -> Option<&Arc<ReaderTracker>> {
        Some(&self.tracker)
    }
    fn plan(&self) -> Option<&ChunkPlan> {
        Some(&self.plan)
    }
    fn chunk_key(&self, chunk: usize) -> ChunkKey {
        ChunkKey {
            file: 1,
            chunk: chunk as u32,
        }
    }
    fn prefetch_chunk(&self, _cache: &ChunkCache, _chunk: usize) -> Result<(), CacheError> {
        Ok(())
    }
    fn display_path(&self) -> &Path {
        &self.path
    }
    fn is_remote(&self) -> bool {
        self.remote
    }
}

/// Chunks queued after a sequential reader read the first chunk, with `config`.
fn read_ahead_with(config: PrefetchConfig) -> usize {
    let cache = Arc::new(ChunkCache::new(1 << 30, Arc::new(Counters::default())));
    let executor = Arc::new(ManualExecutor::new(1024));
    let prefetcher = Prefetcher::with_executor_config(cache, executor.clone(), config);
    let file = Target::new(4);
    file.tracker.touch(0);
    prefetcher.after_read(&file, 0);
    executor.len()
}

/// [`PrefetchConfig::readahead_bytes`] is how far a sequential reader is read ahead of.
#[test]
fn the_read_ahead_is_configurable() {
    assert_eq!(
        read_ahead_with(PrefetchConfig::default()),
        4,
        "16 MiB: four chunks"
    );
    let short = PrefetchConfig {
        readahead_bytes: 4 * MIB,
        ..PrefetchConfig::default()
    };
    assert_eq!(read_ahead_with(short), 1, "4 MiB: one chunk");
}

/// A sequential reader of an object store is read further ahead
/// ([`PrefetchConfig::remote_readahead_bytes`]), within its block and the next as any reader,
/// and never more than a sixteenth of the budget.
#[test]
fn an_object_store_is_read_further_ahead_within_a_sixteenth_of_the_budget() {
    let queued = |file: Arc<Target>, budget: u64| {
        let cache = Arc::new(ChunkCache::new(budget, Arc::new(Counters::default())));
        let executor = Arc::new(ManualExecutor::new(1024));
        let prefetcher =
            Prefetcher::with_executor_config(cache, executor.clone(), PrefetchConfig::default());
        file.tracker.touch(0);
        prefetcher.after_read(&file, 0);
        executor.len()
    };
    assert_eq!(queued(Target::new(4), 1 << 30), 4, "a local file: 16 MiB");
    assert_eq!(
        queued(Target::remote(4), 1 << 30),
        7,
        "the rest of its block and all of the next: 28 MiB of 64"
    );
    assert_eq!(
        queued(Target::remote(4), 256 * MIB),
        4,
        "a sixteenth of 256 MiB: 16 MiB"
    );
}

/// [`PrefetchConfig::lead_share`] bounds the blocks queued ahead of a reader that follows the
/// order.
#[test]
fn the_lead_share_is_configurable() {
    let queued = |lead_share: u64| {
        let cache = Arc::new(ChunkCache::new(256 * MIB, Arc::new(Counters::default())));
        let executor = Arc::new(ManualExecutor::new(1024));
        let config = PrefetchConfig {
            lead_share,
            ..PrefetchConfig::default()
        };
        let prefetcher = Prefetcher::with_executor_config(cache, executor.clone(), config);
        let file = Target::new(8);
        file.tracker.touch(0);
        let Step::Entered { predicted, .. } = file.tracker.touch(1) else {
            panic!("block 1 is entered");
        };
        prefetcher.queue_after_block_entry(&file, 1, predicted);
        executor.len()
    };
    // 256 MiB / 8 = 32 MiB: block 1 (16 MiB) and the next block; / 16 = 16 MiB: block 1 only.
    assert!(queued(8) > queued(16), "{} vs {}", queued(8), queued(16));
}
