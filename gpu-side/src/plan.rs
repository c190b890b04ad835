//! Range planning: which bytes of a file to read, where they land in the destination, and in
//! which pieces they are read.
//!
//! # The arena
//!
//! A load fills one contiguous destination buffer, the *arena* (device memory, or host memory in
//! tests and for `device="cpu"`). Selected tensors that sit next to each other in the file form
//! an [`Extent`]; each extent is read as one run of [`IO_ALIGN`]-aligned file bytes and lands in
//! its own aligned region of the arena, laid out exactly as in the file. Reading whole aligned
//! pages is what cuFile and `O_DIRECT` want (offsets, lengths and buffer addresses multiples of
//! 4 KiB); the few bytes before the first and after the last tensor of an extent are read but
//! belong to no tensor (they are *trimmed*: no tensor points at them, and the bounce-buffer path
//! does not even copy them to the device).
//!
//! Two selected tensors share an extent when their aligned spans touch or overlap, i.e. when the
//! bytes between them do not contain a whole aligned page: reading them separately would read the
//! shared page twice, and merging costs at most two pages of arena. An unselected run of a page or
//! more between them splits the extent, so a subset of a file costs arena only for that subset.
//!
//! # Tensor alignment
//!
//! Arena regions start at multiples of [`IO_ALIGN`], so a tensor's address in the arena has the
//! same alignment as its file offset. Files written by the `safetensors` package order tensors so
//! that every one is aligned for its dtype, but the format does not require it. A tensor whose
//! in-place address is not a multiple of its element size is *relocated*: after all reads it is
//! copied to its own slot after the extents, aligned to [`SLOT_ALIGN`], and that slot is its
//! address. The in-place copy is left unused (arena memory of those tensors is spent twice).
//!
//! # Chunks
//!
//! Each extent is cut into [`Chunk`]s of at most `chunk_bytes` (a multiple of [`IO_ALIGN`]) from
//! its aligned start: the unit of one read, one bounce buffer, one host-to-device copy and one
//! `cuFileRead`. The default, [`DEFAULT_CHUNK_BYTES`], is justified in [`crate::load`].
//!
//! Empty tensors (a zero dimension) have no bytes: they get offset 0 and no extent.
//!
//! Nothing here does I/O; everything is unit-tested, including a proptest over random layouts.

use std::collections::HashSet;

use safetensors::tensor::Dtype;
use serde::de::IntoDeserializer;
use serde::{Deserialize, Serialize};
use tierfs_core::index::TensorIndex;

/// Alignment of file offsets, read lengths and arena regions: what cuFile needs for direct
/// transfers and what `O_DIRECT` needs on 512-byte and 4 KiB-sector devices alike (the same value
/// as `tierfs_core::source::DIRECT_IO_ALIGN`).
pub const IO_ALIGN: u64 = tierfs_core::source::DIRECT_IO_ALIGN;

/// Alignment of relocated tensors' slots: the alignment `cudaMalloc` itself guarantees, enough for
/// every dtype and for vectorised loads.
pub const SLOT_ALIGN: u64 = 256;

/// Default size of one read: see [`crate::load`] for the choice.
pub const DEFAULT_CHUNK_BYTES: u64 = 8 << 20;

/// Which tensors of a file to load.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Selection {
    /// Every tensor.
    #[default]
    All,
    /// Tensors by exact name.
    Tensors(Vec<String>),
    /// Whole blocks by name, as `tierfs inspect` lists them (`blocks.3`, `(other)`).
    Blocks(Vec<String>),
}

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("the file has no tensor named '{name}'")]
    UnknownTensor { name: String },
    #[error("the file has no block named '{name}' (its blocks: {available})")]
    UnknownBlock { name: String, available: String },
    #[error("tensor '{name}' has dtype '{dtype}', which the safetensors format does not define")]
    UnknownDtype { name: String, dtype: String },
    #[error("chunk size {0} is not a positive multiple of {IO_ALIGN} bytes")]
    BadChunk(u64),
}

/// One selected tensor and where it ends up in the arena.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedTensor {
    pub name: String,
    /// Dtype as written in the file ("BF16", "F8_E4M3", ...).
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Absolute file offset of the first byte.
    pub file_start: u64,
    /// Length in bytes.
    pub len: u64,
    /// Offset of the tensor in the arena: a multiple of its element size.
    pub offset: u64,
}

/// A run of selected tensors read as one aligned range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Extent {
    /// Aligned file range read: `[file_start, file_end)`.
    pub file_start: u64,
    pub file_end: u64,
    /// The tensor bytes inside it: `[data_start, data_end)`.
    pub data_start: u64,
    pub data_end: u64,
    /// Where `file_start` lands in the arena (a multiple of [`IO_ALIGN`]).
    pub arena_offset: u64,
}

/// One read: `len` aligned bytes at `file_offset`, landing at `arena_offset`, of which
/// `[keep_start, keep_end)` (relative to the chunk) are tensor bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Chunk {
    pub file_offset: u64,
    pub len: u64,
    pub arena_offset: u64,
    pub keep_start: u64,
    pub keep_end: u64,
}

impl Chunk {
    /// File bytes the chunk must have read for its tensor bytes to be complete (the aligned
    /// length may run past end of file).
    pub fn needed(&self) -> u64 {
        self.keep_end
    }
}

/// A copy within the arena, done after all chunks have landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Relocation {
    pub from: u64,
    pub to: u64,
    pub len: u64,
}

/// Everything a load needs to know about the file's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoadPlan {
    /// Selected tensors in file order.
    pub tensors: Vec<PlannedTensor>,
    pub extents: Vec<Extent>,
    pub chunks: Vec<Chunk>,
    pub relocations: Vec<Relocation>,
    /// Size of the arena in bytes.
    pub arena_bytes: u64,
    /// Sum of the selected tensors' lengths.
    pub tensor_bytes: u64,
    /// Aligned bytes read from the file.
    pub read_bytes: u64,
    /// The chunk size the plan was cut with.
    pub chunk_bytes: u64,
}

impl LoadPlan {
    /// Plans loading `selection` of `index` in reads of at most `chunk_bytes`.
    pub fn new(
        index: &TensorIndex,
        selection: &Selection,
        chunk_bytes: u64,
    ) -> Result<LoadPlan, PlanError> {
        if chunk_bytes == 0 || !chunk_bytes.is_multiple_of(IO_ALIGN) {
            return Err(PlanError::BadChunk(chunk_bytes));
        }
        let picked = select(index, selection)?;
        let extents = extents(&picked);
        let mut cursor = extents
            .last()
            .map_or(0, |e| e.arena_offset + (e.file_end - e.file_start));
        let mut tensors = Vec::with_capacity(picked.len());
        let mut relocations = Vec::new();
        for t in &picked {
            let mut planned = place(t, &extents);
            if !planned.offset.is_multiple_of(element_size(t)?) {
                let to = align_up(cursor, SLOT_ALIGN);
                relocations.push(Relocation {
                    from: planned.offset,
                    to,
                    len: planned.len,
                });
                planned.offset = to;
                cursor = to + planned.len;
            }
            tensors.push(planned);
        }
        let chunks = chunks(&extents, chunk_bytes);
        Ok(LoadPlan {
            tensor_bytes: tensors.iter().map(|t| t.len).sum(),
            read_bytes: chunks.iter().map(|c| c.len).sum(),
            tensors,
            extents,
            chunks,
            relocations,
            arena_bytes: cursor,
            chunk_bytes,
        })
    }
}

/// A selected tensor, borrowed from the index.
struct Picked<'a> {
    name: &'a str,
    dtype: &'a str,
    shape: &'a [u64],
    start: u64,
    end: u64,
}

/// The selected tensors in file order, each once.
fn select<'a>(index: &'a TensorIndex, selection: &Selection) -> Result<Vec<Picked<'a>>, PlanError> {
    let keep: Vec<bool> = match selection {
        Selection::All => vec![true; index.tensors.len()],
        Selection::Tensors(names) => {
            let wanted: HashSet<&str> = names.iter().map(String::as_str).collect();
            let keep: Vec<bool> = index
                .tensors
                .iter()
                .map(|t| wanted.contains(t.name.as_str()))
                .collect();
            let found: HashSet<&str> = index.tensors.iter().map(|t| t.name.as_str()).collect();
            if let Some(missing) = names.iter().find(|n| !found.contains(n.as_str())) {
                return Err(PlanError::UnknownTensor {
                    name: missing.clone(),
                });
            }
            keep
        }
        Selection::Blocks(names) => {
            let blocks = block_numbers(index, names)?;
            index
                .tensors
                .iter()
                .map(|t| blocks.contains(&t.block))
                .collect()
        }
    };
    Ok(index
        .tensors
        .iter()
        .zip(keep)
        .filter(|(_, keep)| *keep)
        .map(|(t, _)| Picked {
            name: &t.name,
            dtype: &t.dtype,
            shape: &t.shape,
            start: t.start,
            end: t.end,
        })
        .collect())
}

/// Indices into `index.blocks` of the named blocks.
fn block_numbers(index: &TensorIndex, names: &[String]) -> Result<HashSet<usize>, PlanError> {
    names
        .iter()
        .map(|name| {
            index
                .blocks
                .iter()
                .position(|b| &b.name == name)
                .ok_or_else(|| PlanError::UnknownBlock {
                    name: name.clone(),
                    available: block_list(index),
                })
        })
        .collect()
}

/// The first few block names, for error messages.
fn block_list(index: &TensorIndex) -> String {
    const SHOWN: usize = 6;
    let mut names: Vec<&str> = index
        .blocks
        .iter()
        .take(SHOWN)
        .map(|b| b.name.as_str())
        .collect();
    if index.blocks.len() > SHOWN {
        names.push("…");
    }
    names.join(", ")
}

/// Groups non-empty tensors (in file order) into extents and lays the extents out in the arena.
fn extents(picked: &[Picked]) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    for t in picked.iter().filter(|t| t.end > t.start) {
        match out.last_mut() {
            Some(e) if align_down(t.start) <= e.file_end => {
                e.data_end = t.end;
                e.file_end = align_up(t.end, IO_ALIGN);
            }
            _ => {
                let arena_offset = out
                    .last()
                    .map_or(0, |e| e.arena_offset + (e.file_end - e.file_start));
                out.push(Extent {
                    file_start: align_down(t.start),
                    file_end: align_up(t.end, IO_ALIGN),
                    data_start: t.start,
                    data_end: t.end,
                    arena_offset,
                });
            }
        }
    }
    out
}

/// The tensor at its in-place arena address (offset 0 if it is empty).
fn place(t: &Picked, extents: &[Extent]) -> PlannedTensor {
    // Extents are sorted and disjoint, and a non-empty tensor lies inside exactly one: the first
    // that ends at or after it (an earlier one ending exactly at its start would have merged it).
    let i = extents.partition_point(|e| e.data_end < t.end);
    let offset = match extents.get(i) {
        Some(e) if t.end > t.start => e.arena_offset + (t.start - e.file_start),
        _ => 0,
    };
    PlannedTensor {
        name: t.name.to_owned(),
        dtype: t.dtype.to_owned(),
        shape: t.shape.to_vec(),
        file_start: t.start,
        len: t.end - t.start,
        offset,
    }
}

/// Cuts every extent into chunks of at most `chunk_bytes`.
fn chunks(extents: &[Extent], chunk_bytes: u64) -> Vec<Chunk> {
    let mut out = Vec::new();
    for e in extents {
        let mut offset = e.file_start;
        while offset < e.file_end {
            let len = chunk_bytes.min(e.file_end - offset);
            let keep_start = e.data_start.max(offset) - offset;
            let keep_end = e.data_end.min(offset + len) - offset;
            out.push(Chunk {
                file_offset: offset,
                len,
                arena_offset: e.arena_offset + (offset - e.file_start),
                keep_start,
                keep_end,
            });
            offset += len;
        }
    }
    out
}

/// Bytes per element of the tensor's dtype (1 for sub-byte dtypes): the alignment its address
/// needs, and what `torch.Tensor.view(dtype)` checks.
fn element_size(t: &Picked) -> Result<u64, PlanError> {
    dtype_size(t.dtype).ok_or_else(|| PlanError::UnknownDtype {
        name: t.name.to_owned(),
        dtype: t.dtype.to_owned(),
    })
}

/// Bytes per element of a safetensors dtype name, at least 1; `None` for unknown names.
pub fn dtype_size(dtype: &str) -> Option<u64> {
    let parsed: Result<Dtype, serde::de::value::Error> =
        Dtype::deserialize(dtype.into_deserializer());
    parsed.ok().map(|d| (d.bitsize() as u64 / 8).max(1))
}

/// `x` rounded down to a multiple of [`IO_ALIGN`].
pub fn align_down(x: u64) -> u64 {
    x - x % IO_ALIGN
}

/// `x` rounded up to a multiple of `align`.
pub fn align_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

#[cfg(test)]
mod tests;
