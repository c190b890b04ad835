//! Reading ahead of readers, in the background.
//!
//! This first policy is *sequential readahead in file order*: when a reader touches chunk `i`,
//! the next chunks of the file (up to [`READAHEAD_BYTES`], and never more than a quarter of the
//! budget, so read-ahead cannot evict what readers are using) are queued for worker threads that
//! load them into the cache. It keeps the disk busy while the reader copies and computes, which
//! is what lets a cold sequential read through the mount match a direct read of the source.
//! Block-order prefetch (learned access order) plugs in here: it decides *which* chunks to
//! queue; the workers, the queue and the cache's single-flight loading stay the same.
//!
//! Requests go through a bounded `crossbeam` channel with `try_send`: when the workers are
//! behind, new requests are dropped rather than queued, since a reader that outruns the disk
//! will fetch those chunks itself anyway.

pub mod order;

use std::sync::Arc;
use std::thread;

use crossbeam::channel::{bounded, Receiver, Sender, TrySendError};

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::cache::{ChunkCache, ChunkKey, Want};
use crate::models::ModelFile;

/// Bytes read ahead of the chunk a reader is on: 16 MiB is four chunks, about 16 ms of disk
/// time at 1 GB/s — enough to cover the gap between a reader finishing one chunk and asking for
/// the next, even with the FUSE round trips in between.
pub const READAHEAD_BYTES: u64 = 16 << 20;

/// Worker threads. Each has one chunk read in flight; four keep an NVMe or virtual disk queue
/// busy (their reads use `O_DIRECT`, so they cost no CPU copying) without flooding it.
const WORKERS: usize = 4;

/// Pending requests beyond which new ones are dropped.
const QUEUE_DEPTH: usize = 64;

struct Job {
    file: Arc<ModelFile>,
    chunk: usize,
}

/// Chunks queued and not yet picked up by a worker: a reader issues many small reads per chunk,
/// and each would otherwise queue the same chunks again.
type Queued = Arc<Mutex<HashSet<ChunkKey>>>;

/// The prefetch worker pool of a mount.
pub struct Prefetcher {
    cache: Arc<ChunkCache>,
    jobs: Sender<Job>,
    queued: Queued,
}

impl Prefetcher {
    pub fn new(cache: Arc<ChunkCache>) -> Prefetcher {
        let (jobs, queue) = bounded(QUEUE_DEPTH);
        let queued = Queued::default();
        for worker in 0..WORKERS {
            let cache = Arc::clone(&cache);
            let queue: Receiver<Job> = queue.clone();
            let queued = Arc::clone(&queued);
            let spawned = thread::Builder::new()
                .name(format!("tierfs-prefetch-{worker}"))
                .spawn(move || run_worker(&cache, &queue, &queued));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a prefetch worker; reading ahead with fewer");
            }
        }
        Prefetcher {
            cache,
            jobs,
            queued,
        }
    }

    /// A reader just read chunk `chunk` of `file`: queue what follows it.
    pub fn after_read(&self, file: &Arc<ModelFile>, chunk: usize) {
        let Some(plan) = file.plan() else { return };
        let limit = READAHEAD_BYTES.min(self.cache.budget() / 4);
        let mut ahead = 0;
        for next in chunk + 1..plan.len() {
            let Some(span) = plan.get(next) else { break };
            ahead += span.len();
            if ahead > limit {
                break;
            }
            if file.chunk_present(&self.cache, next) || !lock(&self.queued).insert(file.key(next)) {
                continue;
            }
            let job = Job {
                file: Arc::clone(file),
                chunk: next,
            };
            match self.jobs.try_send(job) {
                Ok(()) => {}
                Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => {
                    lock(&self.queued).remove(&job.file.key(job.chunk));
                    break;
                }
            }
        }
    }
}

fn run_worker(cache: &ChunkCache, queue: &Receiver<Job>, queued: &Mutex<HashSet<ChunkKey>>) {
    for job in queue {
        lock(queued).remove(&job.file.key(job.chunk));
        if job.file.chunk_present(cache, job.chunk) {
            continue;
        }
        if let Err(e) = job.file.fetch_chunk(cache, job.chunk, Want::Prefetch) {
            tracing::debug!(file = %job.file.path().display(), chunk = job.chunk, error = %e, "prefetch failed; the reader will retry");
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
