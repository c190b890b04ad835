//! The tensor index of a `.safetensors` file.
//!
//! # File format
//!
//! A safetensors file is an 8-byte little-endian header length `n`, then `n` bytes of UTF-8 JSON,
//! then the tensor data. The JSON maps each tensor name to `{"dtype", "shape", "data_offsets"}`,
//! where `data_offsets = [begin, end)` is relative to the start of the data section (byte `8 + n`).
//! An optional `"__metadata__"` entry maps strings to strings.
//!
//! # What this module checks
//!
//! [`TensorIndex::parse`] follows the rules of the `safetensors` crate (the reference
//! implementation), and reports each violation as its own [`IndexError`] variant with the names and
//! numbers involved, because the daemon logs these for users who have a broken download:
//!
//! - the header length must fit the file and [`MAX_HEADER_BYTES`];
//! - the header must be UTF-8 JSON, an object, with no duplicate keys;
//! - every dtype must be one the crate knows, and `shape × dtype size` must equal `end - begin`
//!   (sub-byte dtypes must fill whole bytes), without arithmetic overflow;
//! - sorted by offset, the tensors must cover the data section contiguously from 0: a tensor that
//!   starts before its predecessor ends *overlaps*, one that starts after it ends leaves a *gap*.
//!   The crate rejects both; so do we;
//! - every tensor must end inside the file.
//!
//! After our own checks pass, the tensor list is also handed to
//! [`safetensors::tensor::Metadata::new`], which runs the crate's (private) validation, so that a
//! file this module accepts is never one the crate would reject ([`IndexError::Rejected`]).
//!
//! One deliberate difference: the crate requires the data section to end exactly at end of file.
//! We allow trailing bytes after the last tensor (some tools append padding) and record where the
//! tensor data ends in [`TensorIndex::data_end`], so the caller can serve the tail as plain bytes.
//!
//! JSON is parsed by our own visitor into a list of entries (instead of deserialising
//! `safetensors::tensor::Metadata` directly) for two reasons: the crate's `Metadata` deserialiser
//! folds every validation failure into one opaque `serde_json` error string, and its `HashMap`
//! silently keeps the last of two duplicate keys. Dtype names are still parsed by the crate's
//! [`Dtype`] and sized by [`Dtype::bitsize`].
//!
//! Nothing here panics on any input; see the proptest `parse_never_panics`.

pub mod blocks;
pub mod gguf;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::File;

use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensorError;
use serde::de::{IntoDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// Largest accepted JSON header, in bytes.
///
/// The same limit as the `safetensors` crate (`MAX_HEADER_SIZE`, 100 MB), so we accept exactly the
/// headers the reference implementation accepts. Real headers are far smaller (a 10 000-tensor
/// checkpoint has a ~1 MB header); the limit bounds the memory a malformed length field can make us
/// allocate.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Size of the little-endian header-length prefix.
const LEN_PREFIX: u64 = 8;

/// Key of the free-form string map in the header.
const METADATA_KEY: &str = "__metadata__";

/// Why a file is not a usable safetensors file.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The file is too short for its own length prefix or header.
    #[error("truncated: file is {file_size} bytes, header needs {needed}")]
    Truncated { file_size: u64, needed: u64 },
    /// `parse` was given too short a prefix; retry with the first `header_bytes` bytes.
    #[error("need the first {header_bytes} bytes of the file to parse its header")]
    NeedMore { header_bytes: u64 },
    /// The length prefix exceeds [`MAX_HEADER_BYTES`].
    #[error("header length {header_len} exceeds the limit of {MAX_HEADER_BYTES} bytes")]
    HeaderTooLarge { header_len: u64 },
    /// The length prefix points past end of file.
    #[error("header length {header_len} exceeds file size {file_size}")]
    HeaderPastEnd { header_len: u64, file_size: u64 },
    /// The header is not UTF-8.
    #[error("header is not valid UTF-8: {0}")]
    InvalidUtf8(#[source] std::str::Utf8Error),
    /// The header is not a JSON object.
    #[error("header is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    /// A key appears twice in the header.
    #[error("tensor '{name}' appears more than once in the header")]
    DuplicateTensor { name: String },
    /// A tensor entry lacks or mistypes `dtype`, `shape` or `data_offsets`.
    #[error("tensor '{name}' has an invalid header entry: {source}")]
    InvalidEntry {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    /// `__metadata__` is not a map of strings to strings.
    #[error("__metadata__ must map strings to strings: {0}")]
    InvalidMetadata(#[source] serde_json::Error),
    /// The dtype string is not one the safetensors crate knows.
    #[error("tensor '{name}' has unknown dtype '{dtype}'")]
    UnknownDtype { name: String, dtype: String },
    /// `shape × dtype size` overflows.
    #[error("tensor '{name}': shape {shape:?} × dtype size overflows")]
    ShapeOverflow { name: String, shape: Vec<u64> },
    /// A sub-byte dtype whose element count does not fill whole bytes.
    #[error("tensor '{name}': {dtype} shape {shape:?} does not fill whole bytes")]
    Misaligned {
        name: String,
        dtype: String,
        shape: Vec<u64>,
    },
    /// `end - begin` differs from `shape × dtype size`.
    #[error("tensor '{name}': {dtype} shape {shape:?} needs {expected} bytes but its offsets span {actual}")]
    SizeMismatch {
        name: String,
        dtype: String,
        shape: Vec<u64>,
        expected: u64,
        actual: u64,
    },
    /// `data_offsets` has `end < begin`.
    #[error("tensor '{name}' has data_offsets [{begin}, {end}] with end before begin")]
    InvertedOffsets { name: String, begin: u64, end: u64 },
    /// An offset plus the header length does not fit in `u64`.
    #[error("tensor '{name}': offset overflows when added to header length")]
    OffsetOverflow { name: String },
    /// A tensor ends past end of file.
    #[error("tensor '{name}' ends at byte {end} past end of file (size {file_size})")]
    PastEnd {
        name: String,
        end: u64,
        file_size: u64,
    },
    /// Two tensors share bytes.
    #[error("tensors '{first}' and '{second}' overlap")]
    Overlap { first: String, second: String },
    /// Bytes between two tensors (or before the first) belong to no tensor.
    #[error("gap before tensor '{name}': it starts at data offset {begin} but the previous tensor ends at {expected} (safetensors requires contiguous data)")]
    Gap {
        name: String,
        expected: u64,
        begin: u64,
    },
    /// The safetensors crate's own validation rejected a header we accepted.
    #[error("rejected by safetensors validation: {0}")]
    Rejected(#[source] SafeTensorError),
    /// The file is not a usable GGUF file.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// Reading the file failed.
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// One tensor, with absolute file offsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorInfo {
    /// Tensor name as in the header.
    pub name: String,
    /// Dtype as written in the file ("BF16", "F8_E4M3", ...).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Absolute file offset of the first byte.
    pub start: u64,
    /// Absolute file offset one past the last byte.
    pub end: u64,
    /// Index into [`TensorIndex::blocks`].
    pub block: usize,
}

impl TensorInfo {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Whether the tensor has no bytes (a zero dimension).
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// A transformer block, or a non-block group (`(other)`, or a sub-model's own such as
/// `cond_stage_model.(other)` in an all-in-one checkpoint); see [`blocks`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockInfo {
    /// Display name, e.g. `model.diffusion_model.double_blocks.3`, `(other)` or
    /// `first_stage_model.(other)`.
    pub name: String,
    /// Family, e.g. `model.diffusion_model.double_blocks`; `None` for a non-block group.
    pub family: Option<String>,
    /// Block number; `None` for `(other)` and unnumbered blocks (`middle_block`, `mid_block`).
    pub number: Option<u32>,
    /// Number of tensors.
    pub tensors: usize,
    /// Total tensor bytes.
    pub bytes: u64,
}

/// The checkpoint formats tierfs indexes, recognised by file name extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// `.safetensors`, `.sft`
    #[default]
    Safetensors,
    /// `.gguf` ([`gguf`])
    Gguf,
}

impl Format {
    /// The format of a file named `path`, any letter case; `None` for other files.
    pub fn of_path(path: &std::path::Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?;
        if ext.eq_ignore_ascii_case("safetensors") || ext.eq_ignore_ascii_case("sft") {
            Some(Format::Safetensors)
        } else if ext.eq_ignore_ascii_case("gguf") {
            Some(Format::Gguf)
        } else {
            None
        }
    }

    /// Parses a header of this format; see [`TensorIndex::parse`] and [`gguf::parse`].
    pub fn parse(self, prefix: &[u8], file_size: u64) -> Result<TensorIndex, IndexError> {
        match self {
            Format::Safetensors => TensorIndex::parse(prefix, file_size),
            Format::Gguf => gguf::parse(prefix, file_size),
        }
    }
}

/// Parsed and validated header of a safetensors or GGUF file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorIndex {
    /// Which format the header was parsed as.
    pub format: Format,
    /// File size the header was validated against.
    pub file_size: u64,
    /// Absolute offset where tensor data starts: `8 + n` for safetensors, the aligned end of
    /// the tensor infos for GGUF.
    pub header_bytes: u64,
    /// Absolute offset where tensor data ends; bytes from here to `file_size` are trailing data.
    pub data_end: u64,
    /// Tensors sorted by `start` (ties between empty tensors broken by name). Safetensors data is
    /// contiguous; GGUF tensors may have gaps (alignment padding) but never overlap.
    pub tensors: Vec<TensorInfo>,
    /// Blocks in default model order (see [`blocks`]).
    pub blocks: Vec<BlockInfo>,
    /// The `__metadata__` map, if present; for GGUF, the key/values (arrays summarised).
    pub metadata: Option<BTreeMap<String, String>>,
}

impl TensorIndex {
    /// Parses the header from the first bytes of a file of `file_size` bytes.
    ///
    /// Returns [`IndexError::NeedMore`] if `prefix` is shorter than the header; read that many
    /// bytes and call again.
    pub fn parse(prefix: &[u8], file_size: u64) -> Result<TensorIndex, IndexError> {
        let header_bytes = header_bytes(prefix, file_size)?;
        let json = prefix
            .get(LEN_PREFIX as usize..header_bytes as usize)
            .ok_or(IndexError::NeedMore { header_bytes })?;
        let (metadata, raw) = parse_json(json)?;
        let tensors = validate(raw, header_bytes, file_size)?;
        crate_check(&metadata, &tensors, header_bytes)?;
        Ok(Self::assemble(file_size, header_bytes, tensors, metadata))
    }

    /// Reads and parses the safetensors header of `file` with positioned reads (the file offset
    /// is untouched).
    pub fn read_from(file: &File) -> Result<TensorIndex, IndexError> {
        Self::read_format(file, Format::Safetensors)
    }

    /// Reads and parses the header of `file` as `format`.
    pub fn read_format(file: &File, format: Format) -> Result<TensorIndex, IndexError> {
        let file_size = file
            .metadata()
            .map_err(|source| IndexError::Io {
                context: "reading file metadata",
                source,
            })?
            .len();
        Self::read_format_at(file, file_size, format)
    }

    /// Reads and parses the header of a file of `file_size` bytes read through `reader` as
    /// `format`.
    pub fn read_format_at(
        reader: &dyn crate::source::ReadAt,
        file_size: u64,
        format: Format,
    ) -> Result<TensorIndex, IndexError> {
        // `read_prefix` returns exactly the bytes asked for (or fails), so `wanted` is the
        // length of what was parsed.
        let (_, index) = read_header(
            format,
            file_size,
            LEN_PREFIX.min(file_size),
            |len| read_prefix(reader, len, file_size),
            |header_bytes, wanted| Ok(header_bytes as usize > wanted as usize),
        )?;
        Ok(index)
    }

    /// Index of the tensor containing absolute file offset `offset`, if any.
    ///
    /// Empty tensors contain no offset; the header, gaps and trailing bytes belong to no tensor.
    pub fn tensor_at(&self, offset: u64) -> Option<usize> {
        // Tensors are sorted and never overlap, so `end` is non-decreasing.
        let i = self.tensors.partition_point(|t| t.end <= offset);
        let t = self.tensors.get(i)?;
        (t.start <= offset).then_some(i)
    }

    /// The tensors of block `block`, in file order.
    pub fn block_tensors(&self, block: usize) -> impl Iterator<Item = &TensorInfo> + '_ {
        self.tensors.iter().filter(move |t| t.block == block)
    }

    pub(crate) fn assemble(
        file_size: u64,
        header_bytes: u64,
        mut tensors: Vec<TensorInfo>,
        metadata: Option<BTreeMap<String, String>>,
    ) -> TensorIndex {
        let grouping = blocks::group(tensors.iter().map(|t| (t.name.as_str(), t.len())));
        for (t, b) in tensors.iter_mut().zip(grouping.assignment) {
            t.block = b;
        }
        let data_end = tensors.last().map_or(header_bytes, |t| t.end);
        TensorIndex {
            format: Format::Safetensors,
            file_size,
            header_bytes,
            data_end,
            tensors,
            blocks: grouping.blocks,
            metadata,
        }
    }
}

/// The header-read loop of tierfs, shared by [`TensorIndex::read_format`] and the model store's
/// first open of a file (`crate::models::header`): reads the first `first` bytes of a file of
/// `file_size` bytes with `read`, parses them as `format` and, while the parser needs a longer
/// prefix (`NeedMore { header_bytes }`) and `read_more(header_bytes, wanted)` says to read it
/// (`wanted`: the length last asked of `read`), reads the first `header_bytes` and parses again.
/// Returns the bytes parsed last with their index; a parse error that is not read again
/// becomes `E` (`IndexError` itself for `read_format`).
pub fn read_header<E: From<IndexError>>(
    format: Format,
    file_size: u64,
    first: u64,
    mut read: impl FnMut(u64) -> Result<Vec<u8>, E>,
    mut read_more: impl FnMut(u64, u64) -> Result<bool, E>,
) -> Result<(Vec<u8>, TensorIndex), E> {
    let mut wanted = first;
    loop {
        let buf = read(wanted)?;
        match format.parse(&buf, file_size) {
            Ok(index) => return Ok((buf, index)),
            Err(IndexError::NeedMore { header_bytes }) if read_more(header_bytes, wanted)? => {
                wanted = header_bytes;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads the first `len` bytes of `file` (`len <= file_size`).
fn read_prefix(
    file: &dyn crate::source::ReadAt,
    len: u64,
    file_size: u64,
) -> Result<Vec<u8>, IndexError> {
    let mut buf = vec![0u8; len as usize];
    let filled =
        crate::source::read_full_at(file, &mut buf, 0).map_err(|(_, source)| IndexError::Io {
            context: "reading the header",
            source,
        })?;
    if filled < buf.len() {
        // The file shrank since we took its size.
        return Err(IndexError::Truncated {
            file_size,
            needed: len,
        });
    }
    Ok(buf)
}

/// Validates the length prefix and returns `8 + n`.
fn header_bytes(prefix: &[u8], file_size: u64) -> Result<u64, IndexError> {
    if file_size < LEN_PREFIX {
        return Err(IndexError::Truncated {
            file_size,
            needed: LEN_PREFIX,
        });
    }
    let len: [u8; 8] = prefix
        .get(..LEN_PREFIX as usize)
        .and_then(|b| b.try_into().ok())
        .ok_or(IndexError::NeedMore {
            header_bytes: LEN_PREFIX,
        })?;
    let header_len = u64::from_le_bytes(len);
    let header_bytes = LEN_PREFIX.saturating_add(header_len);
    if header_bytes > file_size {
        return Err(IndexError::HeaderPastEnd {
            header_len,
            file_size,
        });
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(IndexError::HeaderTooLarge { header_len });
    }
    Ok(header_bytes)
}

/// A tensor entry as written in the header.
#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// A tensor entry with its name and parsed dtype.
struct RawTensor {
    name: String,
    dtype: Dtype,
    entry: RawEntry,
}

/// Header JSON as an ordered list of `(key, value)` pairs, keeping duplicates.
/// Entries kept as raw JSON text: deserializing each entry from its own text (not from a
/// `serde_json::Value`, whose map silently keeps the last of repeated keys) rejects a field
/// repeated inside an entry, as the safetensors crate does.
struct Entries(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EntriesVisitor)
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Entries;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Entries(entries))
    }
}

type Metamap = Option<BTreeMap<String, String>>;

/// Parses the header JSON into the metadata map and the tensor entries.
fn parse_json(json: &[u8]) -> Result<(Metamap, Vec<RawTensor>), IndexError> {
    let text = std::str::from_utf8(json).map_err(IndexError::InvalidUtf8)?;
    let Entries(entries) = serde_json::from_str(text).map_err(IndexError::InvalidJson)?;
    let mut seen = HashSet::with_capacity(entries.len());
    let mut metadata = None;
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if !seen.insert(name.clone()) {
            return Err(IndexError::DuplicateTensor { name });
        }
        if name == METADATA_KEY {
            // `null` means no metadata, as in the safetensors crate (`Option<HashMap>`).
            metadata = serde_json::from_str(value.get()).map_err(IndexError::InvalidMetadata)?;
        } else {
            tensors.push(raw_tensor(name, &value)?);
        }
    }
    Ok((metadata, tensors))
}

fn raw_tensor(name: String, value: &RawValue) -> Result<RawTensor, IndexError> {
    let entry: RawEntry = match serde_json::from_str(value.get()) {
        Ok(entry) => entry,
        Err(source) => return Err(IndexError::InvalidEntry { name, source }),
    };
    let parsed: Result<Dtype, serde::de::value::Error> =
        Dtype::deserialize(entry.dtype.as_str().into_deserializer());
    match parsed {
        Ok(dtype) => Ok(RawTensor { name, dtype, entry }),
        Err(_) => Err(IndexError::UnknownDtype {
            name,
            dtype: entry.dtype,
        }),
    }
}

/// Checks every tensor and the layout; returns tensors sorted by offset with absolute offsets.
fn validate(
    mut raw: Vec<RawTensor>,
    header_bytes: u64,
    file_size: u64,
) -> Result<Vec<TensorInfo>, IndexError> {
    for t in &raw {
        check_size(t)?;
    }
    raw.sort_by(|a, b| (a.entry.data_offsets, &a.name).cmp(&(b.entry.data_offsets, &b.name)));
    check_contiguous(&raw)?;
    raw.into_iter()
        .map(|t| absolute(t, header_bytes, file_size))
        .collect()
}

/// Checks offsets order and `shape × dtype size == end - begin`.
fn check_size(t: &RawTensor) -> Result<(), IndexError> {
    let (begin, end) = t.entry.data_offsets;
    if end < begin {
        return Err(IndexError::InvertedOffsets {
            name: t.name.clone(),
            begin,
            end,
        });
    }
    let overflow = || IndexError::ShapeOverflow {
        name: t.name.clone(),
        shape: t.entry.shape.clone(),
    };
    let bits = t
        .entry
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_mul(t.dtype.bitsize() as u64))
        .ok_or_else(overflow)?;
    if bits % 8 != 0 {
        return Err(IndexError::Misaligned {
            name: t.name.clone(),
            dtype: t.entry.dtype.clone(),
            shape: t.entry.shape.clone(),
        });
    }
    if bits / 8 != end - begin {
        return Err(IndexError::SizeMismatch {
            name: t.name.clone(),
            dtype: t.entry.dtype.clone(),
            shape: t.entry.shape.clone(),
            expected: bits / 8,
            actual: end - begin,
        });
    }
    Ok(())
}

/// Checks that sorted tensors cover `[0, last end)` without gaps or overlaps.
fn check_contiguous(sorted: &[RawTensor]) -> Result<(), IndexError> {
    let mut cursor = 0u64;
    let mut prev: Option<&str> = None;
    for t in sorted {
        let (begin, end) = t.entry.data_offsets;
        if begin < cursor {
            return Err(IndexError::Overlap {
                first: prev.unwrap_or_default().to_string(),
                second: t.name.clone(),
            });
        }
        if begin > cursor {
            return Err(IndexError::Gap {
                name: t.name.clone(),
                expected: cursor,
                begin,
            });
        }
        cursor = end;
        if end > begin {
            prev = Some(&t.name);
        }
    }
    Ok(())
}

/// Converts to absolute offsets and checks the tensor ends inside the file.
fn absolute(t: RawTensor, header_bytes: u64, file_size: u64) -> Result<TensorInfo, IndexError> {
    let (begin, end) = t.entry.data_offsets;
    let (Some(start), Some(end)) = (
        header_bytes.checked_add(begin),
        header_bytes.checked_add(end),
    ) else {
        return Err(IndexError::OffsetOverflow { name: t.name });
    };
    if end > file_size {
        return Err(IndexError::PastEnd {
            name: t.name,
            end,
            file_size,
        });
    }
    Ok(TensorInfo {
        name: t.name,
        dtype: t.entry.dtype,
        shape: t.entry.shape,
        start,
        end,
        block: 0,
    })
}

/// Runs the safetensors crate's own validation over the accepted tensor list.
fn crate_check(
    metadata: &Metamap,
    tensors: &[TensorInfo],
    header_bytes: u64,
) -> Result<(), IndexError> {
    let list = tensors
        .iter()
        .map(|t| Ok((t.name.clone(), crate_info(t, header_bytes)?)))
        .collect::<Result<Vec<_>, SafeTensorError>>()
        .map_err(IndexError::Rejected)?;
    let meta = metadata.as_ref().map(|m| m.clone().into_iter().collect());
    Metadata::new(meta, list).map_err(IndexError::Rejected)?;
    Ok(())
}

/// The crate's view of one tensor (relative offsets, `usize` sizes).
fn crate_info(
    t: &TensorInfo,
    header_bytes: u64,
) -> Result<safetensors::tensor::TensorInfo, SafeTensorError> {
    let usize_of = |v: u64| usize::try_from(v).map_err(|_| SafeTensorError::ValidationOverflow);
    let dtype = Dtype::deserialize(t.dtype.as_str().into_deserializer())
        .map_err(|_: serde::de::value::Error| SafeTensorError::TensorInvalidInfo)?;
    Ok(safetensors::tensor::TensorInfo {
        dtype,
        shape: t
            .shape
            .iter()
            .map(|&d| usize_of(d))
            .collect::<Result<_, _>>()?,
        data_offsets: (
            usize_of(t.start.saturating_sub(header_bytes))?,
            usize_of(t.end.saturating_sub(header_bytes))?,
        ),
    })
}

#[cfg(test)]
mod tests;
