//! The tensor index of a `.gguf` file (GGUF v2 and v3, little-endian).
//!
//! # File format
//!
//! All integers little-endian. A GGUF file is:
//!
//! 1. magic `GGUF`, `u32` version (2 or 3), `u64` tensor count, `u64` key/value count;
//! 2. the key/value pairs: key (a *string*: `u64` length + bytes), `u32` value type, value. Scalar
//!    types are 1, 2, 4 or 8 bytes; a string value is a string; an array is `u32` element type,
//!    `u64` count, then the elements (arrays may nest);
//! 3. the tensor infos: name (string), `u32` number of dimensions, that many `u64` dimensions
//!    (`ne[0]` first, the fastest-varying), `u32` ggml type, `u64` offset relative to the data
//!    section;
//! 4. padding to the alignment (`general.alignment`, a `u32` power of two; default 32), then the
//!    data section.
//!
//! A tensor's byte size is `elements / block_size × type_size` for its ggml type ([`ggml_type`]).
//!
//! # What this parser accepts
//!
//! The reference is gguf-py's `GGUFReader` (the reader ComfyUI-GGUF and llama.cpp's Python tools
//! use): every file this module accepts, `GGUFReader` reads with the same tensor names, types,
//! shapes, offsets and sizes. `tests/python/test_gguf.py` checks that on a few hundred generated
//! and mutated files. Where we are stricter, it is because the daemon must be able to cut the
//! data into non-overlapping chunks, and the file is then served as plain bytes instead:
//!
//! - tensors may not overlap (gguf-py does not check; llama.cpp requires a packed layout);
//! - every tensor, even an empty one, must lie inside the file (gguf-py accepts an empty tensor
//!   at any offset);
//! - the header must lie inside the file: gguf-py reads past end of file as empty arrays, and so
//!   accepts a file cut inside its key/values when it declares no tensors;
//! - big-endian files are rejected (gguf-py byte-swaps them; nobody ships them for x86/ARM);
//! - arrays may nest at most [`MAX_NESTING`] deep (gguf-py recurses until Python's limit).
//!
//! Gaps between tensors (alignment padding, or any other unreferenced bytes) are fine: the chunk
//! plan gives them chunks of their own.
//!
//! # Hostile input
//!
//! Every count and length comes from the file and may be anything up to 2^64. Nothing is
//! allocated from a count: lists grow as their entries are actually read, and every entry takes
//! at least one byte of header, so memory stays proportional to the header, itself capped at
//! [`MAX_HEADER_BYTES`]. Arrays of fixed-size elements are skipped in one checked multiplication;
//! arrays of strings or arrays are walked element by element, each consuming header bytes. All
//! offset arithmetic is checked. Only scalar key/values are kept ([`TensorIndex::metadata`], long
//! strings shortened); arrays (tokenizer vocabularies) are summarised as `[N × type]`.
//!
//! The parser reads from a prefix of the file: when the prefix ends before the header does, it
//! returns [`IndexError::NeedMore`] with a larger size to read (at least twice the prefix, since
//! the header length is only known once it has been walked).

use std::collections::{BTreeMap, HashSet};

use super::{Format, IndexError, TensorIndex, TensorInfo};

/// Largest accepted header (key/values, tensor infos and padding), in bytes: the same 100 MB as
/// for safetensors. Headers of real files are far smaller: a Llama-3 GGUF carries its 128k-token
/// vocabulary and 280k merges in about 10 MB; diffusion GGUFs (no vocabulary) a few KiB.
pub const MAX_HEADER_BYTES: u64 = super::MAX_HEADER_BYTES;

/// Deepest array nesting accepted. Real files use one level (vocabularies) and at most two.
pub const MAX_NESTING: u32 = 8;

/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Longest string value kept in [`TensorIndex::metadata`], in bytes (longer ones are cut).
const MAX_KEPT_STRING: usize = 256;

const MAGIC: &[u8; 4] = b"GGUF";
const ALIGNMENT_KEY: &str = "general.alignment";

/// Why a file is not a usable GGUF file (wrapped in [`IndexError::Gguf`]).
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file: magic is {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error("GGUF version {0} is not supported (only 2 and 3)")]
    UnsupportedVersion(u32),
    #[error(
        "truncated: {what} at byte {offset} needs {needed} bytes but the file is {file_size} bytes"
    )]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        file_size: u64,
    },
    #[error("header exceeds the limit of {MAX_HEADER_BYTES} bytes ({what} at byte {offset})")]
    HeaderTooLarge { what: &'static str, offset: u64 },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: u64 },
    #[error("key '{key}' has unknown value type {value_type}")]
    UnknownValueType { key: String, value_type: u32 },
    #[error("key '{key}' nests arrays deeper than {MAX_NESTING}")]
    TooDeep { key: String },
    #[error("key '{key}' appears more than once")]
    DuplicateKey { key: String },
    #[error("general.alignment must be a u32 (value type 4), found type {value_type}")]
    AlignmentType { value_type: u32 },
    #[error("general.alignment {0} is not a non-zero power of two")]
    BadAlignment(u32),
    #[error("tensor '{0}' appears more than once")]
    DuplicateTensor(String),
    #[error("tensor '{name}' has unknown ggml type {ggml_type}")]
    UnknownType { name: String, ggml_type: u32 },
    #[error("tensor '{name}': {ggml_type} rows of {row} elements are not whole blocks of {block}")]
    PartialBlock {
        name: String,
        ggml_type: &'static str,
        row: u64,
        block: u64,
    },
    #[error("tensor '{name}': shape {shape:?} overflows")]
    ShapeOverflow { name: String, shape: Vec<u64> },
    #[error("tensor '{name}': offset {offset} overflows")]
    OffsetOverflow { name: String, offset: u64 },
    #[error("tensor '{name}' spans bytes [{start}, {end}) past end of file (size {file_size})")]
    PastEnd {
        name: String,
        start: u64,
        end: u64,
        file_size: u64,
    },
    #[error("tensors '{first}' and '{second}' overlap")]
    Overlap { first: String, second: String },
}

/// A ggml tensor type: name, elements per block, bytes per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    pub name: &'static str,
    pub block: u64,
    pub bytes: u64,
}

/// Block sizes of ggml's quantised types use `QK_K` = 256 elements ("k-quants").
const QK_K: u64 = 256;

/// The ggml type with number `id`, as in gguf-py's `GGML_QUANT_SIZES` (gguf 0.19).
pub fn ggml_type(id: u32) -> Option<GgmlType> {
    let t = |name, block, bytes| Some(GgmlType { name, block, bytes });
    match id {
        0 => t("F32", 1, 4),
        1 => t("F16", 1, 2),
        2 => t("Q4_0", 32, 2 + 16),
        3 => t("Q4_1", 32, 2 + 2 + 16),
        6 => t("Q5_0", 32, 2 + 4 + 16),
        7 => t("Q5_1", 32, 2 + 2 + 4 + 16),
        8 => t("Q8_0", 32, 2 + 32),
        9 => t("Q8_1", 32, 4 + 4 + 32),
        10 => t("Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
        11 => t("Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
        12 => t("Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
        13 => t("Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
        14 => t("Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
        15 => t("Q8_K", QK_K, 4 + QK_K + QK_K / 8),
        16 => t("IQ2_XXS", QK_K, 2 + QK_K / 4),
        17 => t("IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
        18 => t("IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
        19 => t("IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
        20 => t("IQ4_NL", 32, 2 + 16),
        21 => t("IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
        22 => t("IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
        23 => t("IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
        24 => t("I8", 1, 1),
        25 => t("I16", 1, 2),
        26 => t("I32", 1, 4),
        27 => t("I64", 1, 8),
        28 => t("F64", 1, 8),
        29 => t("IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
        30 => t("BF16", 1, 2),
        34 => t("TQ1_0", QK_K, 2 + 4 * 13),
        35 => t("TQ2_0", QK_K, 2 + 64),
        39 => t("MXFP4", 32, 1 + 16),
        40 => t("NVFP4", 64, 4 + 32),
        41 => t("Q1_0", 128, 2 + 16),
        _ => None,
    }
}

/// GGUF key/value types.
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_UINT32: u32 = 4;

/// Size of a fixed-size value type, `None` for string, array and unknown types.
fn scalar_size(value_type: u32) -> Option<u64> {
    match value_type {
        0 | 1 | 7 => Some(1), // u8, i8, bool
        2 | 3 => Some(2),     // u16, i16
        4..=6 => Some(4),     // u32, i32, f32
        10..=12 => Some(8),   // u64, i64, f64
        _ => None,
    }
}

fn type_name(value_type: u32) -> &'static str {
    const NAMES: [&str; 13] = [
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64",
        "f64",
    ];
    NAMES.get(value_type as usize).copied().unwrap_or("?")
}

/// Parses the header of a GGUF file of `file_size` bytes from its first bytes.
///
/// Returns [`IndexError::NeedMore`] if `prefix` ends before the header (and its padding) does.
pub fn parse(prefix: &[u8], file_size: u64) -> Result<TensorIndex, IndexError> {
    let mut r = Reader {
        buf: prefix,
        pos: 0,
        file_size,
    };
    let (tensor_count, kv_count) = preamble(&mut r)?;
    let (metadata, alignment) = key_values(&mut r, kv_count)?;
    let raw = tensor_infos(&mut r, tensor_count)?;
    let data_start = align_up(r.pos, alignment).ok_or(GgufError::HeaderTooLarge {
        what: "padding",
        offset: r.pos,
    })?;
    if data_start <= file_size {
        // The header kept in memory runs to the data start: make sure the prefix covers it.
        r.take(data_start - r.pos, "padding")?;
    }
    let tensors = place(raw, data_start, file_size)?;
    // With no tensors, the padding may run past a file that ends right after the infos.
    let header_bytes = data_start.min(file_size);
    let mut index = TensorIndex::assemble(file_size, header_bytes, tensors, Some(metadata));
    index.format = Format::Gguf;
    Ok(index)
}

/// A cursor over the prefix; running past its end asks for more (or reports truncation).
struct Reader<'a> {
    buf: &'a [u8],
    pos: u64,
    file_size: u64,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], IndexError> {
        let offset = self.pos;
        let end = offset.checked_add(n).filter(|&e| e <= self.file_size);
        let Some(end) = end else {
            return Err(GgufError::Truncated {
                what,
                offset,
                needed: n,
                file_size: self.file_size,
            }
            .into());
        };
        if end > MAX_HEADER_BYTES {
            return Err(GgufError::HeaderTooLarge { what, offset }.into());
        }
        let Some(bytes) = self.buf.get(offset as usize..end as usize) else {
            let grown = end
                .max(2 * self.buf.len() as u64)
                .min(self.file_size)
                .min(MAX_HEADER_BYTES);
            return Err(IndexError::NeedMore {
                header_bytes: grown,
            });
        };
        self.pos = end;
        Ok(bytes)
    }

    fn skip(&mut self, n: u64, what: &'static str) -> Result<(), IndexError> {
        self.take(n, what).map(|_| ())
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], IndexError> {
        let bytes = self.take(N as u64, what)?;
        Ok(bytes.try_into().unwrap_or([0; N]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, IndexError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, IndexError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A string's bytes.
    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], IndexError> {
        let len = self.u64(what)?;
        self.take(len, what)
    }

    /// A string that must be UTF-8 (keys and tensor names; gguf-py decodes them strictly).
    fn text(&mut self, what: &'static str) -> Result<String, IndexError> {
        let offset = self.pos;
        let bytes = self.bytes(what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 { what, offset }.into()),
        }
    }
}

/// Magic, version, and the two counts.
fn preamble(r: &mut Reader) -> Result<(u64, u64), IndexError> {
    let magic: [u8; 4] = r.array("magic")?;
    if &magic != MAGIC {
        return Err(GgufError::BadMagic(magic).into());
    }
    let version = r.u32("version")?;
    if version & 0xffff == 0 && version != 0 {
        // What a big-endian writer's 2 or 3 reads as here (gguf-py's own test).
        return Err(GgufError::BigEndian.into());
    }
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version).into());
    }
    Ok((r.u64("tensor count")?, r.u64("key/value count")?))
}

/// The key/values: the scalars worth showing, and the data alignment.
fn key_values(r: &mut Reader, count: u64) -> Result<(BTreeMap<String, String>, u64), IndexError> {
    let mut metadata = BTreeMap::new();
    let mut seen = HashSet::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    // No allocation from `count`: each pair consumes header bytes, so the loop ends (with
    // `Truncated` or `NeedMore`) long before a hostile count matters.
    for _ in 0..count {
        let key = r.text("key")?;
        if !seen.insert(key.clone()) {
            return Err(GgufError::DuplicateKey { key }.into());
        }
        let value_type = r.u32("value type")?;
        let value = value(r, &key, value_type)?;
        if key == ALIGNMENT_KEY {
            alignment = check_alignment(value_type, &value)?;
        }
        metadata.insert(key, value);
    }
    Ok((metadata, alignment))
}

fn check_alignment(value_type: u32, value: &str) -> Result<u64, GgufError> {
    if value_type != T_UINT32 {
        return Err(GgufError::AlignmentType { value_type });
    }
    let a: u32 = value.parse().unwrap_or(0);
    if a.is_power_of_two() {
        Ok(u64::from(a))
    } else {
        Err(GgufError::BadAlignment(a))
    }
}

/// Reads one value and returns it as display text (arrays summarised).
fn value(r: &mut Reader, key: &str, value_type: u32) -> Result<String, IndexError> {
    let unknown = || GgufError::UnknownValueType {
        key: key.to_owned(),
        value_type,
    };
    match value_type {
        T_STRING => {
            let bytes = r.bytes("string value")?;
            let cut = &bytes[..bytes.len().min(MAX_KEPT_STRING)];
            Ok(String::from_utf8_lossy(cut).into_owned())
        }
        T_ARRAY => {
            let elem = r.u32("array type")?;
            let count = r.u64("array length")?;
            skip_elements(r, key, elem, count, 1)?;
            Ok(format!("[{count} × {}]", type_name(elem)))
        }
        _ => {
            let size = scalar_size(value_type).ok_or_else(unknown)?;
            let bytes = r.take(size, "value")?;
            Ok(scalar_text(value_type, bytes))
        }
    }
}

/// Skips `count` array elements of type `elem` at nesting `depth`.
fn skip_elements(
    r: &mut Reader,
    key: &str,
    elem: u32,
    count: u64,
    depth: u32,
) -> Result<(), IndexError> {
    if count == 0 {
        // gguf-py only checks the element type of an element it reads.
        return Ok(());
    }
    if let Some(size) = scalar_size(elem) {
        let total = size.saturating_mul(count);
        return r.skip(total, "array data");
    }
    match elem {
        T_STRING => {
            for _ in 0..count {
                r.bytes("array string")?;
            }
            Ok(())
        }
        T_ARRAY if depth >= MAX_NESTING => Err(GgufError::TooDeep {
            key: key.to_owned(),
        }
        .into()),
        T_ARRAY => {
            for _ in 0..count {
                let inner = r.u32("array type")?;
                let n = r.u64("array length")?;
                skip_elements(r, key, inner, n, depth + 1)?;
            }
            Ok(())
        }
        _ => Err(GgufError::UnknownValueType {
            key: key.to_owned(),
            value_type: elem,
        }
        .into()),
    }
}

/// A fixed-size little-endian value as text.
fn scalar_text(value_type: u32, b: &[u8]) -> String {
    let le8 = |b: &[u8]| {
        let mut a = [0u8; 8];
        a[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(a)
    };
    let v = le8(b);
    match value_type {
        0 | 2 | 4 | 10 => v.to_string(),
        1 => (v as u8 as i8).to_string(),
        3 => (v as u16 as i16).to_string(),
        5 => (v as u32 as i32).to_string(),
        11 => (v as i64).to_string(),
        6 => f32::from_bits(v as u32).to_string(),
        12 => f64::from_bits(v).to_string(),
        _ => (v != 0).to_string(), // bool
    }
}

/// A tensor info as written: offset relative to the data section.
struct RawTensor {
    name: String,
    shape: Vec<u64>,
    ggml_type: u32,
    offset: u64,
}

fn tensor_infos(r: &mut Reader, count: u64) -> Result<Vec<RawTensor>, IndexError> {
    let mut tensors = Vec::new();
    for _ in 0..count {
        let name = r.text("tensor name")?;
        let n_dims = r.u32("dimension count")?;
        // `take` first, so a hostile `n_dims` is refused before anything is allocated.
        let dims = r.take(u64::from(n_dims) * 8, "dimensions")?;
        let shape = dims
            .chunks_exact(8)
            .map(|d| u64::from_le_bytes(d.try_into().unwrap_or([0; 8])))
            .collect();
        let ggml_type = r.u32("tensor type")?;
        let offset = r.u64("tensor offset")?;
        tensors.push(RawTensor {
            name,
            shape,
            ggml_type,
            offset,
        });
    }
    Ok(tensors)
}

fn align_up(pos: u64, alignment: u64) -> Option<u64> {
    pos.checked_next_multiple_of(alignment)
}

/// Sizes and places every tensor, sorted by offset, checking types, bounds and overlaps.
fn place(
    raw: Vec<RawTensor>,
    data_start: u64,
    file_size: u64,
) -> Result<Vec<TensorInfo>, IndexError> {
    let mut names = HashSet::with_capacity(raw.len());
    let mut tensors = Vec::with_capacity(raw.len());
    for t in raw {
        if !names.insert(t.name.clone()) {
            return Err(GgufError::DuplicateTensor(t.name).into());
        }
        tensors.push(sized(t, data_start, file_size)?);
    }
    tensors.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    let mut cursor = (0, None::<&str>);
    for t in &tensors {
        if t.start < cursor.0 {
            return Err(GgufError::Overlap {
                first: cursor.1.unwrap_or_default().to_owned(),
                second: t.name.clone(),
            }
            .into());
        }
        cursor = (t.end, Some(&t.name));
    }
    Ok(tensors)
}

/// One tensor's absolute byte range.
fn sized(t: RawTensor, data_start: u64, file_size: u64) -> Result<TensorInfo, GgufError> {
    let Some(ty) = ggml_type(t.ggml_type) else {
        return Err(GgufError::UnknownType {
            name: t.name,
            ggml_type: t.ggml_type,
        });
    };
    if ty.block > 1 {
        // gguf-py requires whole blocks along `ne[0]` (and a first dimension at all).
        let row = t.shape.first().copied().unwrap_or(1);
        if t.shape.is_empty() || row % ty.block != 0 {
            return Err(GgufError::PartialBlock {
                name: t.name,
                ggml_type: ty.name,
                row,
                block: ty.block,
            });
        }
    }
    let elements = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    // numpy (so gguf-py) refuses an array whose nonzero dimensions, times the item size, exceed
    // `isize::MAX` bytes, even when another dimension is 0; refuse those empty tensors too.
    let nominal = t
        .shape
        .iter()
        .filter(|&&d| d > 0)
        .try_fold(ty.bytes, |a, &d| a.checked_mul(d));
    let representable = nominal.is_some_and(|n| n <= i64::MAX as u64);
    let len = elements.and_then(|n| (n / ty.block).checked_mul(ty.bytes));
    let Some(len) = len.filter(|_| representable) else {
        return Err(GgufError::ShapeOverflow {
            name: t.name,
            shape: t.shape,
        });
    };
    let start = data_start.checked_add(t.offset);
    let Some((start, end)) = start.and_then(|s| Some((s, s.checked_add(len)?))) else {
        return Err(GgufError::OffsetOverflow {
            name: t.name,
            offset: t.offset,
        });
    };
    if end > file_size {
        return Err(GgufError::PastEnd {
            name: t.name,
            start,
            end,
            file_size,
        });
    }
    Ok(TensorInfo {
        name: t.name,
        dtype: ty.name.to_owned(),
        shape: t.shape,
        start,
        end,
        block: 0,
    })
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
pub(crate) mod tests;
