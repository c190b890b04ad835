//! The bounce-buffer pipeline: reader threads fill staging buffers with chunks of the file while
//! earlier chunks are being copied to the destination.
//!
//! # Shape
//!
//! ```text
//!   free leases ──► reader threads (pread / O_DIRECT) ──► filled ──► copier ──► Sink::submit
//!        ▲                                                                          │
//!        └──────────────────── Sink::reclaim (copy finished) ◄──────────────────────┘
//! ```
//!
//! Readers take chunk numbers from a shared counter, so chunks are *issued* in file order (the
//! disk sees one forward sweep with `threads` reads in flight) and complete in any order. The
//! copier runs on the calling thread, which owns the destination (a CUDA stream is used from one
//! thread): it submits each filled chunk's tensor bytes, trimmed of alignment padding, to the
//! [`Sink`], and returns a buffer to the free list only when the sink reports that copy finished —
//! an asynchronous host-to-device copy reads its source until then. With twice as many buffers as
//! readers, every reader has a buffer to fill while a full set is in flight to the device.
//!
//! # Destinations
//!
//! The pipeline is generic over [`Sink`]: [`crate::cuda::DeviceSink`] (async copies on a CUDA
//! stream), [`HostSink`] (memcpy into host memory: `device="cpu"` and the tests), and
//! [`NullSink`] (discards: the disk-speed measurement of `tierfs-gpu bench`). Range planning,
//! chunking, ordering, buffer reuse and bit-exactness are therefore tested here without a GPU.
//!
//! # Failure
//!
//! The first error (a read, a short file, the sink) stops the readers, waits for the copies
//! already submitted (their source buffers must outlive them) and is returned; nothing is left
//! running.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use crossbeam::channel::{self, Receiver, Sender};

use crate::io::{ReadError, ReadMode, SourceReader};
use crate::plan::{Chunk, LoadPlan};
use crate::staging::{Lease, StagingPool};

/// A failure of the destination.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("copy to arena bytes [{offset}, {end}) is outside the {capacity}-byte destination")]
    OutOfBounds {
        offset: u64,
        end: u64,
        capacity: u64,
    },
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
}

/// A failure of the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("staging buffers of {buffer} bytes cannot hold chunks of {chunk} bytes")]
    BufferTooSmall { buffer: usize, chunk: u64 },
    #[error("the pipeline needs at least one reader thread and one staging buffer")]
    NoWorkers,
    #[error("a reader thread stopped unexpectedly")]
    ReaderLost,
    #[error("the destination reported no finished copy while all buffers were in flight")]
    Stalled,
}

/// Where chunk bytes go.
pub trait Sink {
    /// Starts copying `src` to `arena_offset`.
    ///
    /// # Safety
    /// `src` must stay valid and unchanged until [`Sink::reclaim`] has returned `id` (or
    /// [`Sink::finish`] has returned): the copy may read it asynchronously until then.
    unsafe fn submit(&mut self, id: usize, src: &[u8], arena_offset: u64) -> Result<(), SinkError>;

    /// Ids of submitted buffers whose copies have finished, each reported once. With `wait`, blocks
    /// until at least one has finished if any is outstanding.
    fn reclaim(&mut self, wait: bool) -> Result<Vec<usize>, SinkError>;

    /// Copies `len` arena bytes from `from` to `to`, after every copy submitted before it.
    fn relocate(&mut self, from: u64, to: u64, len: u64) -> Result<(), SinkError>;

    /// Waits until every submitted copy and relocation has finished.
    fn finish(&mut self) -> Result<(), SinkError>;
}

/// What a pipeline run did.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PipelineStats {
    /// Chunks read.
    pub chunks: usize,
    /// Aligned bytes read from the file.
    pub read_bytes: u64,
    /// Tensor bytes handed to the sink.
    pub copied_bytes: u64,
    /// Whether every chunk was read with `O_DIRECT` (false after a fallback to buffered reads).
    pub direct_io: bool,
    /// Seconds from the first read to the last copy finished.
    pub seconds: f64,
}

/// Pipeline settings.
#[derive(Debug, Clone, Copy)]
pub struct PipelineConfig {
    /// Reader threads.
    pub threads: usize,
    pub mode: ReadMode,
}

/// Runs `plan` from `reader` into `sink` through the buffers of `pool`.
pub fn run(
    plan: &LoadPlan,
    reader: &SourceReader,
    pool: &mut StagingPool,
    sink: &mut dyn Sink,
    config: PipelineConfig,
) -> Result<PipelineStats, PipelineError> {
    if config.threads == 0 || pool.count() == 0 {
        return Err(PipelineError::NoWorkers);
    }
    if (pool.buffer_len() as u64) < plan.chunk_bytes {
        return Err(PipelineError::BufferTooSmall {
            buffer: pool.buffer_len(),
            chunk: plan.chunk_bytes,
        });
    }
    let started = Instant::now();
    let leases = pool.leases();
    let total = leases.len();
    let (free_tx, free_rx) = channel::unbounded();
    for lease in leases {
        // The receiver is alive: it is in this scope.
        let _ = free_tx.send(lease);
    }
    let (done_tx, done_rx) = channel::unbounded();
    let shared = Shared {
        plan,
        reader,
        mode: config.mode,
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    };
    let outcome = std::thread::scope(|scope| {
        for _ in 0..config.threads.min(plan.chunks.len()) {
            let (free_rx, done_tx, shared) = (free_rx.clone(), done_tx.clone(), &shared);
            scope.spawn(move || shared.read_loop(&free_rx, &done_tx));
        }
        drop(done_tx);
        let mut copier = Copier {
            plan,
            sink: &mut *sink,
            free: free_tx,
            in_flight: HashMap::new(),
            total,
            copied: 0,
        };
        let outcome = copier.run(&done_rx);
        shared.stop.store(true, Ordering::Relaxed);
        // Readers waiting for a buffer see the free list close and exit; the copies in flight
        // still read their buffers, so wait for them before the leases go.
        let Copier {
            sink,
            free,
            in_flight,
            ..
        } = copier;
        drop(free);
        let finished = sink.finish();
        drop(in_flight);
        outcome.and_then(|copied| finished.map(|()| copied).map_err(PipelineError::from))
    })?;
    Ok(PipelineStats {
        chunks: plan.chunks.len(),
        read_bytes: plan.read_bytes,
        copied_bytes: outcome,
        direct_io: config.mode == ReadMode::Direct && reader.direct_works(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// What reader threads share.
struct Shared<'a> {
    plan: &'a LoadPlan,
    reader: &'a SourceReader,
    mode: ReadMode,
    next: AtomicUsize,
    stop: AtomicBool,
}

type Filled<'p> = Result<(usize, Lease<'p>), PipelineError>;

impl Shared<'_> {
    /// Takes the next chunk number and a free buffer, fills it, hands it on; until the chunks run
    /// out, the pipeline stops, or the free list closes.
    fn read_loop<'p>(&self, free: &Receiver<Lease<'p>>, done: &Sender<Filled<'p>>) {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(chunk) = self.plan.chunks.get(i) else {
                return;
            };
            let Ok(mut lease) = free.recv() else {
                return;
            };
            let filled = self.fill(chunk, &mut lease).map(|()| (i, lease));
            let failed = filled.is_err();
            if failed {
                self.stop.store(true, Ordering::Relaxed);
            }
            if done.send(filled).is_err() || failed {
                return;
            }
        }
    }

    fn fill(&self, chunk: &Chunk, lease: &mut Lease) -> Result<(), PipelineError> {
        let buf = &mut lease.bytes_mut()[..chunk.len as usize];
        self.reader
            .read_at_least(buf, chunk.file_offset, chunk.needed(), self.mode)?;
        Ok(())
    }
}

/// The calling thread's half: submits filled chunks, recycles finished buffers.
struct Copier<'a, 'p> {
    plan: &'a LoadPlan,
    sink: &'a mut dyn Sink,
    free: Sender<Lease<'p>>,
    in_flight: HashMap<usize, Lease<'p>>,
    total: usize,
    copied: u64,
}

impl<'p> Copier<'_, 'p> {
    /// Returns the tensor bytes submitted.
    fn run(&mut self, done: &Receiver<Filled<'p>>) -> Result<u64, PipelineError> {
        let mut received = 0;
        while received < self.plan.chunks.len() {
            self.recycle(false)?;
            if self.in_flight.len() == self.total {
                // Every buffer is in flight: the readers can only go on once a copy finishes.
                self.recycle(true)?;
                continue;
            }
            let (i, lease) = done.recv().map_err(|_| PipelineError::ReaderLost)??;
            self.submit(&self.plan.chunks[i], lease)?;
            received += 1;
        }
        for r in &self.plan.relocations {
            self.sink.relocate(r.from, r.to, r.len)?;
        }
        Ok(self.copied)
    }

    fn submit(&mut self, chunk: &Chunk, lease: Lease<'p>) -> Result<(), PipelineError> {
        let src = &lease.bytes()[chunk.keep_start as usize..chunk.keep_end as usize];
        // SAFETY: the lease is kept in `in_flight` until the sink reports the copy finished
        // (`recycle`), or until `finish` has returned (`run` in the pipeline), so `src` stays valid
        // and no reader writes to it meanwhile.
        unsafe {
            self.sink
                .submit(lease.id(), src, chunk.arena_offset + chunk.keep_start)?;
        }
        self.copied += src.len() as u64;
        self.in_flight.insert(lease.id(), lease);
        Ok(())
    }

    /// Moves buffers whose copies finished back to the free list.
    fn recycle(&mut self, wait: bool) -> Result<(), PipelineError> {
        let ids = self.sink.reclaim(wait)?;
        if wait && ids.is_empty() {
            return Err(PipelineError::Stalled);
        }
        for id in ids {
            if let Some(lease) = self.in_flight.remove(&id) {
                // Readers may all have exited (no chunks left): a closed list is fine.
                let _ = self.free.send(lease);
            }
        }
        Ok(())
    }
}

/// Copies into host memory, synchronously.
pub struct HostSink<'a> {
    dst: &'a mut [u8],
    finished: Vec<usize>,
}

impl<'a> HostSink<'a> {
    pub fn new(dst: &'a mut [u8]) -> HostSink<'a> {
        HostSink {
            dst,
            finished: Vec::new(),
        }
    }

    fn range(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>, SinkError> {
        let end = offset.saturating_add(len);
        if end > self.dst.len() as u64 {
            return Err(SinkError::OutOfBounds {
                offset,
                end,
                capacity: self.dst.len() as u64,
            });
        }
        Ok(offset as usize..end as usize)
    }
}

impl Sink for HostSink<'_> {
    unsafe fn submit(&mut self, id: usize, src: &[u8], arena_offset: u64) -> Result<(), SinkError> {
        let range = self.range(arena_offset, src.len() as u64)?;
        self.dst[range].copy_from_slice(src);
        self.finished.push(id);
        Ok(())
    }

    fn reclaim(&mut self, _wait: bool) -> Result<Vec<usize>, SinkError> {
        Ok(std::mem::take(&mut self.finished))
    }

    fn relocate(&mut self, from: u64, to: u64, len: u64) -> Result<(), SinkError> {
        let src = self.range(from, len)?;
        self.range(to, len)?;
        self.dst.copy_within(src, to as usize);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Discards everything: measures how fast the file can be read.
#[derive(Debug, Default)]
pub struct NullSink {
    finished: Vec<usize>,
}

impl Sink for NullSink {
    unsafe fn submit(&mut self, id: usize, _src: &[u8], _offset: u64) -> Result<(), SinkError> {
        self.finished.push(id);
        Ok(())
    }

    fn reclaim(&mut self, _wait: bool) -> Result<Vec<usize>, SinkError> {
        Ok(std::mem::take(&mut self.finished))
    }

    fn relocate(&mut self, _from: u64, _to: u64, _len: u64) -> Result<(), SinkError> {
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
