//! Chunk buffers: the page-aligned memory every source read lands in ([`AlignedBytes`]), and the
//! mappings of dropped buffers kept for reuse.
//!
//! **Buffers.** Chunk buffers are anonymous `mmap`s (via `memmap2`) rather than heap
//! allocations: glibc's malloc raises its mmap threshold after the first large free and then
//! serves multi-MiB buffers from the heap, where freed memory is not returned to the OS. With one
//! mapping per chunk, dropping a chunk gives its pages back at once, so the daemon's RSS follows
//! the cache budget (give or take the few spare mappings, which `drop` and budget shrinks
//! release).
//!
//! **Spare buffers.** A fresh mapping costs more than the read into it (the read faults in and
//! zeroes every page first), and the cache evicts a chunk just before it loads the next one, so
//! the mappings of the last few dropped buffers are kept ([`SpareBuffersConfig`]) and a read of
//! the same size reuses one, already faulted in
//! ([measured](../../../docs/PERFORMANCE.md#spare-chunk-buffers)). Every byte a reused buffer
//! exposes is overwritten by the read first.

use std::io;

use super::platform::ChunkMemory;
use super::DIRECT_IO_ALIGN;
use crate::sync::{lock_static, StaticMutex};

/// Which mappings of dropped buffers are kept for reuse (see the module docs). Process-wide:
/// [`set_spare_buffers_config`] changes it; tests make their own pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpareBuffersConfig {
    /// Mappings kept at most: four is one per prefetch worker, and the cache frees a chunk
    /// right before each load. They are at most 16 MiB of 4 MiB chunks outside the cache
    /// budget ([measured](../../../docs/PERFORMANCE.md#spare-chunk-buffers)).
    pub max_spares: usize,
    /// Buffers smaller than this are not kept: cheap to map, and they would crowd out
    /// chunk-sized ones.
    pub min_bytes: usize,
}

impl SpareBuffersConfig {
    /// Today's values (a `const`, for the process-wide pool).
    pub const DEFAULT: SpareBuffersConfig = SpareBuffersConfig {
        max_spares: 4,
        min_bytes: 1 << 20,
    };
}

impl Default for SpareBuffersConfig {
    fn default() -> Self {
        SpareBuffersConfig::DEFAULT
    }
}

/// Mappings of dropped buffers, oldest first, kept by the rules of a [`SpareBuffersConfig`].
pub(super) struct SpareBuffers {
    config: SpareBuffersConfig,
    maps: Vec<ChunkMemory>,
}

impl SpareBuffers {
    const fn with_config(config: SpareBuffersConfig) -> SpareBuffers {
        SpareBuffers {
            config,
            maps: Vec::new(),
        }
    }

    /// A kept mapping of exactly `len` bytes, the most recently kept first.
    fn take(&mut self, len: usize) -> Option<ChunkMemory> {
        let at = self.maps.iter().rposition(|map| map.len() == len)?;
        Some(self.maps.remove(at))
    }

    /// Keeps `map` (dropping the oldest if there are enough), unless it is too small.
    fn keep(&mut self, map: ChunkMemory) {
        if map.len() < self.config.min_bytes || self.config.max_spares == 0 {
            return;
        }
        while self.maps.len() >= self.config.max_spares {
            self.maps.remove(0);
        }
        self.maps.push(map);
    }

    fn set_config(&mut self, config: SpareBuffersConfig) {
        self.config = config;
        let excess = self.maps.len().saturating_sub(config.max_spares);
        self.maps.drain(..excess);
        self.maps.retain(|map| map.len() >= config.min_bytes);
    }
}

/// The spare mappings. Process-wide, like the allocator it stands in front of.
static SPARE: StaticMutex<SpareBuffers> =
    StaticMutex::new(SpareBuffers::with_config(SpareBuffersConfig::DEFAULT));

/// A mapping of `len` bytes: a spare one of exactly that size if there is one, else a new one.
pub(super) fn map_buffer(len: usize) -> io::Result<ChunkMemory> {
    let spare = lock_static(&SPARE).take(len);
    match spare {
        Some(map) => Ok(map),
        None => ChunkMemory::new(len),
    }
}

/// Unmaps the spare mappings, so that the daemon's RSS is the cache's again (after `drop` or a
/// smaller budget).
pub fn release_spare_buffers() {
    lock_static(&SPARE).maps.clear();
}

/// Changes which dropped mappings the process keeps; spares the new rules do not keep are
/// unmapped at once.
pub fn set_spare_buffers_config(config: SpareBuffersConfig) {
    lock_static(&SPARE).set_config(config);
}

/// Keeps `map` as a spare (dropping the oldest spare if there are enough).
fn keep_spare(map: ChunkMemory) {
    lock_static(&SPARE).keep(map);
}

/// Bytes `[start, end)` of a source file, held in their own page-aligned mapping.
pub struct AlignedBytes {
    /// Always `Some` until dropped, when the mapping goes back to the spares.
    pub(super) map: Option<ChunkMemory>,
    pub(super) skip: usize,
    pub(super) len: usize,
}

impl AlignedBytes {
    /// `len` zero bytes in a fresh anonymous mapping, untouched (so costing no memory until
    /// written): for tests and benchmarks of the cache without files.
    #[doc(hidden)]
    pub fn anonymous(len: usize) -> io::Result<AlignedBytes> {
        Ok(AlignedBytes {
            map: Some(ChunkMemory::new(align_up(len.max(1) as u64) as usize)?),
            skip: 0,
            len,
        })
    }

    /// A copy of `bytes` in its own (page-rounded) mapping: for tests of the cache without
    /// files.
    #[doc(hidden)]
    pub fn copy_of(bytes: &[u8]) -> io::Result<AlignedBytes> {
        let mut map = ChunkMemory::new(align_up(bytes.len().max(1) as u64) as usize)?;
        map[..bytes.len()].copy_from_slice(bytes);
        Ok(AlignedBytes {
            map: Some(map),
            skip: 0,
            len: bytes.len(),
        })
    }

    /// A buffer of `len` bytes to be written in full by the caller ([`Self::as_mut_slice`]):
    /// a spare mapping of that size if there is one (its old bytes are not cleared), else a
    /// fresh one. What the compressed RAM tier decodes a chunk into.
    pub fn writable(len: usize) -> io::Result<AlignedBytes> {
        Ok(AlignedBytes {
            map: Some(map_buffer(align_up(len.max(1) as u64) as usize)?),
            skip: 0,
            len,
        })
    }

    /// A buffer for file bytes `[start, end)` laid out as
    /// [`super::SourceFile::read_aligned`] of that range has them (its whole pages from
    /// `start` rounded down), to be filled through [`Self::whole_pages_mut`]. Its old bytes are
    /// not cleared. What the disk tier reads a chunk back into.
    pub fn for_range(start: u64, end: u64) -> io::Result<AlignedBytes> {
        let too_large = || io::Error::from(io::ErrorKind::InvalidInput);
        let map_len = usize::try_from(aligned_footprint(start, end)).map_err(|_| too_large())?;
        let len = usize::try_from(end.saturating_sub(start)).map_err(|_| too_large())?;
        Ok(AlignedBytes {
            map: Some(map_buffer(map_len.max(1))?),
            skip: (start - align_down(start)) as usize,
            len,
        })
    }

    /// Every page of the buffer, from the page its bytes start in: what an aligned read of the
    /// buffer's range fills.
    pub fn whole_pages_mut(&mut self) -> &mut [u8] {
        let pages = align_up((self.skip + self.len).max(1) as u64) as usize;
        match self.map.as_deref_mut() {
            Some(map) => {
                let n = pages.min(map.len());
                &mut map[..n]
            }
            None => &mut [],
        }
    }

    /// The bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let (skip, len) = (self.skip, self.len);
        self.map
            .as_deref_mut()
            .map_or(&mut [], |map| &mut map[skip..skip + len])
    }

    pub fn as_slice(&self) -> &[u8] {
        self.map
            .as_deref()
            .map_or(&[], |map| &map[self.skip..self.skip + self.len])
    }

    /// Bytes of memory this buffer occupies (what the cache budget is charged).
    pub fn footprint(&self) -> u64 {
        self.map.as_ref().map_or(0, |map| map.len() as u64)
    }

    /// File bytes `[start, end)` copied into a buffer of their own, laid out as
    /// [`super::SourceFile::read_aligned`] of that range would have them (same footprint),
    /// from these bytes, which are the file's from offset `at`. `None` if the range is not
    /// within these bytes. One read of several adjacent chunks is cut into one buffer per
    /// chunk this way, so that each chunk is evicted on its own.
    pub fn piece(&self, at: u64, start: u64, end: u64) -> Option<io::Result<AlignedBytes>> {
        let from = usize::try_from(start.checked_sub(at)?).ok()?;
        let len = usize::try_from(end.checked_sub(start)?).ok()?;
        let bytes = self.as_slice().get(from..from.checked_add(len)?)?;
        let skip = (start - align_down(start)) as usize;
        let map_len = usize::try_from(aligned_footprint(start, end)).ok()?;
        Some(map_buffer(map_len.max(1)).map(|mut map| {
            map[skip..skip + len].copy_from_slice(bytes);
            AlignedBytes {
                map: Some(map),
                skip,
                len,
            }
        }))
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            keep_spare(map);
        }
    }
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBytes")
            .field("len", &self.len)
            .field("footprint", &self.footprint())
            .finish()
    }
}

/// The memory an aligned read of `[start, end)` needs; lets the cache reserve budget first.
pub fn aligned_footprint(start: u64, end: u64) -> u64 {
    align_up(end) - align_down(start)
}

pub(super) fn align_down(x: u64) -> u64 {
    x & !(DIRECT_IO_ALIGN - 1)
}

pub(super) fn align_up(x: u64) -> u64 {
    x.div_ceil(DIRECT_IO_ALIGN) * DIRECT_IO_ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_buffers_keep_what_their_config_says() {
        let big = 2 * 4096;
        let map = || ChunkMemory::new(big).unwrap();
        let mut two = SpareBuffers::with_config(SpareBuffersConfig {
            max_spares: 2,
            min_bytes: 4096,
        });
        for _ in 0..3 {
            two.keep(map());
        }
        assert_eq!(two.maps.len(), 2, "the oldest is dropped past max_spares");
        two.keep(ChunkMemory::new(1024).unwrap());
        assert_eq!(two.maps.len(), 2, "smaller than min_bytes: not kept");
        assert!(two.take(big).is_some());

        let mut none = SpareBuffers::with_config(SpareBuffersConfig {
            max_spares: 0,
            ..SpareBuffersConfig::default()
        });
        none.keep(ChunkMemory::new(SpareBuffersConfig::DEFAULT.min_bytes).unwrap());
        assert!(none.take(SpareBuffersConfig::DEFAULT.min_bytes).is_none());

        two.set_config(SpareBuffersConfig {
            max_spares: 0,
            min_bytes: 4096,
        });
        assert!(two.maps.is_empty(), "a smaller config unmaps the excess");
    }

    #[test]
    fn a_piece_holds_its_range_with_the_layout_of_its_own_read() {
        let bytes: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
        let at = 10_000; // file offset of bytes[0], not aligned
        let whole = AlignedBytes::copy_of(&bytes).unwrap();
        let (start, end) = (at + 5000, at + 9000);
        let piece = whole.piece(at, start, end).unwrap().unwrap();
        assert_eq!(piece.as_slice(), &bytes[5000..9000]);
        assert_eq!(piece.footprint(), aligned_footprint(start, end));
        assert_eq!(piece.skip as u64, start % 4096);
        assert!(
            whole.piece(at, at - 1, at + 10).is_none(),
            "before the bytes"
        );
        assert!(
            whole
                .piece(at, at + 10, at + bytes.len() as u64 + 1)
                .is_none(),
            "past them"
        );
        let empty = whole.piece(at, at + 7, at + 7).unwrap().unwrap();
        assert!(empty.as_slice().is_empty());
    }
}
