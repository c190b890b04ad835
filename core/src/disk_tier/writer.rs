//! The disk tier's writer: one thread that writes offered chunks and drops damaged ones, so
//! that no reader waits on the local disk's writes.
//!
//! **Contract.** Jobs are done in the order sent. A chunk is recorded in its log, then in the
//! index (where readers find it), only after its bytes were written back: a reader never finds
//! a chunk that is not on disk. Every offered chunk's bytes leave [`Shared::pending`] once its
//! job is done, written or not.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam::channel::Receiver;

use super::index::NoRoom;
use super::log::{chunk_hash, Held, Record};
use super::{add, io, Shared, TierVersion};
use crate::source::AlignedBytes;
use crate::sync::lock;

/// What the writer is asked to do.
pub(super) enum Job {
    /// Write `bytes`, the version's bytes from `start`.
    Put {
        version: TierVersion,
        start: u64,
        bytes: AlignedBytes,
    },
    /// Free a damaged chunk's range and record that it is gone.
    Drop { name: String, start: u64, end: u64 },
    /// Delete a damaged version that was handed to the kernel whole.
    DropVersion { name: String },
}

pub(super) fn start(
    shared: Arc<Shared>,
    jobs: Receiver<Job>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tierfs-disk-tier".into())
        .spawn(move || {
            for job in jobs {
                match job {
                    Job::Put {
                        version,
                        start,
                        bytes,
                    } => {
                        let len = bytes.as_slice().len() as u64;
                        if !shared.stopping.load(Ordering::Acquire) {
                            put(&shared, &version, start, bytes.as_slice());
                        }
                        shared.pending.fetch_sub(len, Ordering::AcqRel);
                    }
                    Job::Drop { name, start, end } => shared.drop_range(&name, start, end),
                    Job::DropVersion { name } => shared.drop_version(&name),
                }
            }
        })
}

/// Writes one chunk, making room first.
fn put(shared: &Shared, version: &TierVersion, start: u64, bytes: &[u8]) {
    let end = start + bytes.len() as u64;
    let room = {
        let mut index = lock(&shared.index);
        if index.get(&version.name, start, end).is_some() {
            return;
        }
        index.reserve(&version.name, start, end)
    };
    for victim in &room.victims {
        shared.drop_victim(victim);
        add(&shared.counters.evicted, victim.chunks);
        add(&shared.counters.evicted_bytes, victim.bytes);
    }
    match room.refused {
        None => {}
        Some(NoRoom::NeededLater | NoRoom::TooLarge) => {
            add(&shared.counters.not_kept, 1);
            return;
        }
        Some(NoRoom::Overlaps) => return,
    }
    let hash = chunk_hash(bytes);
    let written = shared
        .files_of(&version.name, Some(version.size))
        .and_then(|files| {
            io::write_chunk(&files.data, bytes, start).inspect_err(|_| {
                io::punch(&files.data, start, end);
            })?;
            use std::io::Write;
            lock(&files.log).write_all(&Record::Add { start, end, hash }.encode())
        });
    let mut index = lock(&shared.index);
    match written {
        Ok(()) => {
            index.commit(&version.name, version.size, start, Held { end, hash });
            drop(index);
            add(&shared.counters.written, 1);
            add(&shared.counters.written_bytes, end - start);
        }
        Err(e) => {
            index.release(end - start);
            add(&shared.counters.write_errors, 1);
            if is_full(&e) {
                // The disk holds no more: the tier keeps what it has.
                index.capacity = index.used;
                drop(index);
                if !shared.full_reported.swap(true, Ordering::Relaxed) {
                    tracing::warn!(dir = %shared.dir.display(), error = %e, "the disk cache's disk is full: it keeps what it holds and writes no more");
                }
            } else {
                drop(index);
                tracing::warn!(dir = %shared.dir.display(), error = %e, start, end, "cannot write a chunk to the disk cache");
            }
        }
    }
}

fn is_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}
