//! One source request for several adjacent chunks.
//!
//! **Contract.** [`ChunkCache::load_run`] answers the first chunk of a run exactly as
//! [`ChunkCache::get_or_load`] would (a hit, a wait for the read in flight, a skipped
//! prefetch, or a new read). When it is a new read, the chunks that follow it in the run are
//! claimed too, in order, as prefetches (each reserving its footprint and evicting only what
//! is needed later, `evict.rs`), up to the first one that is resident, being read, or has no
//! room; then the claimed chunks are read with **one** `load` of the bytes they cover and each
//! is settled on its own, as a read of that chunk alone would be: resident (or, the first,
//! handed over uncached), or the read's error to every waiter of each, caching nothing.
//!
//! Why: a source that charges per request (a hard disk's seek, a network round trip) serves
//! one request of the chunks' sum in the time of one, where the same bytes as several chunk
//! reads pay that charge several times ([measured](../../../docs/PERFORMANCE.md#slow-and-network-sources)).
//! Chunks stay the unit of caching: each gets a buffer of its own
//! ([`AlignedBytes::piece`], one copy), so each is evicted on its own.

use std::sync::Arc;
use std::time::Instant;

use super::inflight::{InFlight, Lookup};
use super::{CacheError, Chunk, ChunkCache, ChunkKey, ChunkOwner, Outcome, Want};
use crate::source::{AlignedBytes, SourceError};
use crate::stats::Counters;

/// One chunk of a run: its key, the file bytes it holds, and its owner.
#[derive(Clone)]
pub struct RunChunk {
    pub key: ChunkKey,
    pub start: u64,
    pub end: u64,
    pub owner: Option<ChunkOwner>,
}

impl RunChunk {
    fn footprint(&self) -> u64 {
        crate::source::aligned_footprint(self.start, self.end)
    }
}

impl ChunkCache {
    /// The first chunk of `run`, as [`ChunkCache::get_or_load`] gives it (`want` is the first
    /// chunk's), with the chunks after it that are absent read by the same `load(start, end)`
    /// (see the module docs). `run` must be adjacent chunks of one file version in file order;
    /// an empty run is [`CacheError::NoRoom`].
    pub fn load_run(
        &self,
        run: &[RunChunk],
        want: Want,
        load: impl FnOnce(u64, u64) -> Result<AlignedBytes, SourceError>,
    ) -> Result<(Arc<Chunk>, Outcome), CacheError> {
        let Some(first) = run.first() else {
            return Err(CacheError::NoRoom);
        };
        let started = Instant::now();
        let (lookup, evicted) =
            self.lookup(first.key, first.footprint(), want, first.owner.as_ref());
        drop(evicted);
        let result = match lookup {
            Lookup::Hit(chunk) => match self.readable(first.key, chunk) {
                Some(chunk) => return Ok((chunk, Outcome::Hit)),
                // A damaged frame, dropped: read the source as on a miss.
                None => return self.load_run(run, want, load),
            },
            Lookup::Skip => return Err(CacheError::NoRoom),
            Lookup::Wait(loading) => loading.wait(),
            Lookup::Load { loading, cached } => {
                let marks = first.owner.as_ref().map(|o| o.marks.as_ref());
                let head =
                    InFlight::new(self, first.key, first.footprint(), cached, marks, loading);
                let mut claimed = vec![(head, want, first)];
                claimed.extend(self.claim_followers(&run[1..]));
                self.read_claimed(claimed, load)
            }
        };
        self.missed(want, started, result)
    }

    /// Claims the chunks of `rest` in order as prefetches, up to the first that cannot be.
    fn claim_followers<'a>(
        &'a self,
        rest: &'a [RunChunk],
    ) -> Vec<(InFlight<'a>, Want, &'a RunChunk)> {
        let mut claimed = Vec::new();
        for next in rest {
            let (lookup, evicted) = self.lookup(
                next.key,
                next.footprint(),
                Want::Prefetch,
                next.owner.as_ref(),
            );
            drop(evicted);
            let Lookup::Load { loading, cached } = lookup else {
                break; // resident, being read, or no room: the run ends here
            };
            let marks = next.owner.as_ref().map(|o| o.marks.as_ref());
            let in_flight = InFlight::new(self, next.key, next.footprint(), cached, marks, loading);
            claimed.push((in_flight, Want::Prefetch, next));
        }
        claimed
    }

    /// Reads the claimed chunks with one `load` and settles each; returns the first's result.
    fn read_claimed(
        &self,
        claimed: Vec<(InFlight<'_>, Want, &RunChunk)>,
        load: impl FnOnce(u64, u64) -> Result<AlignedBytes, SourceError>,
    ) -> Result<Arc<Chunk>, CacheError> {
        let (start, end) = match (claimed.first(), claimed.last()) {
            (Some(first), Some(last)) => (first.2.start, last.2.end),
            _ => return Err(CacheError::NoRoom),
        };
        let whole = match load(start, end) {
            Ok(whole) => Ok(whole),
            Err(e) => {
                Counters::add(&self.counters.disk_errors, 1);
                Err(Arc::new(e))
            }
        };
        let mut first = None;
        for (in_flight, want, chunk) in claimed {
            let owner = chunk.owner.as_ref();
            let result = match &whole {
                Ok(whole) => self.load(in_flight, (want, owner), || piece_of(whole, start, chunk)),
                Err(e) => in_flight.fail(CacheError::Source(Arc::clone(e))),
            };
            first.get_or_insert(result);
        }
        first.unwrap_or(Err(CacheError::NoRoom))
    }
}

/// Chunk `chunk`'s bytes cut out of `whole`, the file's bytes from `at`.
fn piece_of(whole: &AlignedBytes, at: u64, chunk: &RunChunk) -> Result<AlignedBytes, SourceError> {
    match whole.piece(at, chunk.start, chunk.end) {
        Some(Ok(piece)) => Ok(piece),
        Some(Err(source)) => Err(SourceError::Alloc {
            len: chunk.footprint() as usize,
            source,
        }),
        // The load returned fewer bytes than the run covers: a bug of the caller's `load`.
        None => Err(SourceError::Alloc {
            len: chunk.footprint() as usize,
            source: std::io::Error::other("a run's read returned less than the run"),
        }),
    }
}
