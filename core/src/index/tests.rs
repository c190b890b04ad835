//! Tests for the tensor index.

use super::*;
use proptest::prelude::*;
use std::io::Write;

/// A file with header `json` (unpadded) followed by `data_len` zero bytes.
fn file(json: &str, data_len: usize) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.resize(out.len() + data_len, 0);
    out
}

fn parse(bytes: &[u8]) -> Result<TensorIndex, IndexError> {
    TensorIndex::parse(bytes, bytes.len() as u64)
}

const TWO: &str = r#"{"__metadata__":{"format":"pt"},
    "b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]},
    "a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;

#[test]
fn parses_valid_file() {
    let bytes = file(TWO, 16);
    let idx = parse(&bytes).unwrap();
    let hb = 8 + TWO.len() as u64;
    assert_eq!(idx.header_bytes, hb);
    assert_eq!(idx.file_size, bytes.len() as u64);
    assert_eq!(idx.data_end, hb + 16);
    let names: Vec<&str> = idx.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    let b = &idx.tensors[1];
    assert_eq!(
        (b.dtype.as_str(), b.shape.as_slice()),
        ("BF16", &[2u64, 2][..])
    );
    assert_eq!((b.start, b.end), (hb + 8, hb + 16));
    assert_eq!(idx.metadata.unwrap()["format"], "pt");
    assert_eq!(idx.blocks.len(), 1);
    assert_eq!(idx.blocks[0].name, "(other)");
    assert_eq!((idx.blocks[0].tensors, idx.blocks[0].bytes), (2, 16));
}

#[test]
fn tensor_at_finds_containing_tensor() {
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
        "z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},
        "b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}"#;
    let bytes = file(json, 10); // 4 trailing bytes
    let idx = parse(&bytes).unwrap();
    let hb = idx.header_bytes;
    let names: Vec<&str> = idx.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "z", "b"]);
    assert_eq!(idx.tensor_at(0), None);
    assert_eq!(idx.tensor_at(hb - 1), None);
    assert_eq!(idx.tensor_at(hb), Some(0));
    assert_eq!(idx.tensor_at(hb + 3), Some(0));
    assert_eq!(idx.tensor_at(hb + 4), Some(2));
    assert_eq!(idx.tensor_at(hb + 5), Some(2));
    assert_eq!(idx.tensor_at(hb + 6), None);
    assert_eq!(idx.data_end, hb + 6);
    assert_eq!(idx.file_size, hb + 10);
}

#[test]
fn zero_tensor_file_is_valid() {
    let idx = parse(&file("{}", 0)).unwrap();
    assert!(idx.tensors.is_empty() && idx.blocks.is_empty());
    assert_eq!(idx.data_end, idx.header_bytes);
    assert_eq!(idx.tensor_at(idx.header_bytes), None);
}

#[test]
fn zero_size_tensor_is_valid() {
    let json = r#"{"e":{"dtype":"F16","shape":[3,0],"data_offsets":[0,0]}}"#;
    let idx = parse(&file(json, 0)).unwrap();
    assert!(idx.tensors[0].is_empty());
}

#[test]
fn need_more_then_success() {
    let bytes = file(TWO, 16);
    let size = bytes.len() as u64;
    let hb = 8 + TWO.len() as u64;
    for short in [8, 20, hb as usize - 1] {
        match TensorIndex::parse(&bytes[..short], size) {
            Err(IndexError::NeedMore { header_bytes }) => assert_eq!(header_bytes, hb),
            other => panic!("{other:?}"),
        }
    }
    match TensorIndex::parse(&bytes[..3], size) {
        Err(IndexError::NeedMore { header_bytes: 8 }) => {}
        other => panic!("{other:?}"),
    }
    assert!(TensorIndex::parse(&bytes[..hb as usize], size).is_ok());
}

#[test]
fn read_from_file_with_trailing_bytes() {
    let mut f = tempfile::tempfile().unwrap();
    let mut bytes = file(TWO, 16);
    bytes.extend_from_slice(b"tail");
    f.write_all(&bytes).unwrap();
    let idx = TensorIndex::read_from(&f).unwrap();
    assert_eq!(idx, parse(&bytes).unwrap());
    assert_eq!(idx.file_size - idx.data_end, 4);
}

#[test]
fn read_from_short_file() {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(&[1, 2, 3]).unwrap();
    let err = TensorIndex::read_from(&f).unwrap_err();
    assert!(
        matches!(
            err,
            IndexError::Truncated {
                file_size: 3,
                needed: 8
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "truncated: file is 3 bytes, header needs 8"
    );
}

/// Asserts `bytes` fails to parse with an error matching `pat`, and returns its message.
macro_rules! rejects {
    ($bytes:expr, $pat:pat) => {{
        let err = parse(&$bytes).unwrap_err();
        assert!(matches!(err, $pat), "unexpected error: {err:?}");
        err.to_string()
    }};
}

fn one(dtype: &str, shape: &str, offsets: &str) -> String {
    format!(r#"{{"t":{{"dtype":"{dtype}","shape":{shape},"data_offsets":{offsets}}}}}"#)
}

#[test]
fn rejects_short_file() {
    rejects!(
        [0u8; 7],
        IndexError::Truncated {
            file_size: 7,
            needed: 8
        }
    );
    rejects!(Vec::<u8>::new(), IndexError::Truncated { .. });
}

#[test]
fn rejects_header_past_end() {
    let mut bytes = 123_456_789_012u64.to_le_bytes().to_vec();
    bytes.resize(4096, b' ');
    let msg = rejects!(bytes, IndexError::HeaderPastEnd { .. });
    assert_eq!(msg, "header length 123456789012 exceeds file size 4096");
    // Exactly one byte too long.
    let mut bytes = file("{}", 0);
    bytes[0] = 3;
    rejects!(bytes, IndexError::HeaderPastEnd { header_len: 3, .. });
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    rejects!(bytes, IndexError::HeaderPastEnd { .. });
}

#[test]
fn rejects_huge_header() {
    // The file is big enough; only the first bytes are handed over.
    let len = MAX_HEADER_BYTES + 1;
    let err = TensorIndex::parse(&len.to_le_bytes(), 2 * len).unwrap_err();
    assert!(matches!(err, IndexError::HeaderTooLarge { header_len } if header_len == len));
}

#[test]
fn rejects_bad_text() {
    let mut bytes = file("{\"\u{e9}\":1}", 0);
    bytes[10] = 0xff;
    rejects!(bytes, IndexError::InvalidUtf8(_));
    let msg = rejects!(file("{not json", 0), IndexError::InvalidJson(_));
    assert!(msg.starts_with("header is not valid JSON: "), "{msg}");
    rejects!(file("[]", 0), IndexError::InvalidJson(_));
    rejects!(file("", 0), IndexError::InvalidJson(_));
    rejects!(file("{} x", 0), IndexError::InvalidJson(_));
}

#[test]
fn rejects_bad_entries() {
    rejects!(
        file(r#"{"t":{"dtype":"U8"}}"#, 0),
        IndexError::InvalidEntry { .. }
    );
    rejects!(
        file(&one("U8", "[-1]", "[0,1]"), 1),
        IndexError::InvalidEntry { .. }
    );
    rejects!(
        file(&one("U8", "[1]", "[0,1,2]"), 1),
        IndexError::InvalidEntry { .. }
    );
    rejects!(
        file(r#"{"__metadata__":{"a":1}}"#, 0),
        IndexError::InvalidMetadata(_)
    );
    let dup = r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
        "t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    rejects!(file(dup, 2), IndexError::DuplicateTensor { .. });
}

/// Regression (fuzz target `index_parse`, seed `fuzz/corpus/index_parse/meta-null-valid`): the
/// safetensors crate reads `"__metadata__": null` as no metadata; we rejected the file with
/// `InvalidMetadata`.
#[test]
fn null_metadata_is_no_metadata() {
    let json = r#"{"__metadata__":null,"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    let bytes = file(json, 1);
    assert!(safetensors::SafeTensors::deserialize(&bytes).is_ok());
    let idx = parse(&bytes).unwrap();
    assert_eq!(idx.metadata, None);
    assert_eq!(idx.tensors.len(), 1);
}

/// Regression (fuzz target `index_parse`, seed `fuzz/corpus/index_parse/regress-dup-field`): a
/// field repeated inside one tensor entry is rejected by the safetensors crate ("duplicate field
/// `dtype`"), but `parse_json` reads entries through `serde_json::Value`, whose map silently keeps
/// the last value, so we accepted a header the crate rejects.
#[test]
fn rejects_duplicate_field_in_entry() {
    let json = r#"{"a":{"dtype":"U8","shape":[1],"dtype":"U8","data_offsets":[0,1]}}"#;
    let bytes = file(json, 1);
    assert!(safetensors::SafeTensors::deserialize(&bytes).is_err());
    assert!(
        parse(&bytes).is_err(),
        "accepted a header the crate rejects"
    );
}

#[test]
fn rejects_unknown_dtype() {
    let msg = rejects!(
        file(&one("Q4_K", "[1]", "[0,1]"), 1),
        IndexError::UnknownDtype { .. }
    );
    assert_eq!(msg, "tensor 't' has unknown dtype 'Q4_K'");
}

#[test]
fn rejects_size_mismatch() {
    let msg = rejects!(
        file(&one("BF16", "[2,3]", "[0,10]"), 10),
        IndexError::SizeMismatch {
            expected: 12,
            actual: 10,
            ..
        }
    );
    assert!(msg.contains("needs 12 bytes"), "{msg}");
    rejects!(
        file(&one("F4", "[3]", "[0,1]"), 1),
        IndexError::Misaligned { .. }
    );
    // Sub-byte dtype that fills whole bytes is fine.
    parse(&file(&one("F4", "[4]", "[0,2]"), 2)).unwrap();
}

#[test]
fn rejects_overflows() {
    let big = u64::MAX;
    rejects!(
        file(&one("F32", &format!("[{big},2]"), "[0,8]"), 8),
        IndexError::ShapeOverflow { .. }
    );
    // 16 contiguous 2^60-byte tensors reach u64::MAX; adding the header length overflows.
    let step = 1u64 << 60;
    let entries: Vec<String> = (0..16u64)
        .map(|i| {
            let end = if i == 15 { big } else { (i + 1) * step };
            let n = end - i * step;
            format!(
                r#""t{i:02}":{{"dtype":"U8","shape":[{n}],"data_offsets":[{},{end}]}}"#,
                i * step
            )
        })
        .collect();
    let bytes = file(&format!("{{{}}}", entries.join(",")), 0);
    let err = TensorIndex::parse(&bytes, u64::MAX).unwrap_err();
    assert!(matches!(err, IndexError::OffsetOverflow { .. }), "{err:?}");
    rejects!(
        file(&one("U8", "[2]", &format!("[{big},1]")), 8),
        IndexError::InvertedOffsets { .. }
    );
}

#[test]
fn rejects_past_end() {
    let json = one("U8", "[100]", "[0,100]");
    let bytes = file(&json, 10);
    let hb = 8 + json.len() as u64;
    let msg = rejects!(bytes, IndexError::PastEnd { .. });
    assert_eq!(
        msg,
        format!(
            "tensor 't' ends at byte {} past end of file (size {})",
            hb + 100,
            hb + 10
        )
    );
}

#[test]
fn rejects_overlap_and_gap() {
    let overlap = r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},
        "b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}"#;
    let msg = rejects!(file(overlap, 12), IndexError::Overlap { .. });
    assert_eq!(msg, "tensors 'a' and 'b' overlap");
    let gap = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
        "b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}"#;
    rejects!(
        file(gap, 12),
        IndexError::Gap {
            expected: 4,
            begin: 8,
            ..
        }
    );
    rejects!(
        file(&one("U8", "[4]", "[4,8]"), 8),
        IndexError::Gap { expected: 0, .. }
    );
    // An empty tensor strictly inside another one overlaps it.
    let inside = r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},
        "z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}}"#;
    rejects!(file(inside, 8), IndexError::Overlap { .. });
}

#[test]
fn blocks_are_assigned() {
    let json = r#"{"blocks.10.w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
        "blocks.2.w":{"dtype":"U8","shape":[2],"data_offsets":[1,3]},
        "head.w":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}}"#;
    let idx = parse(&file(json, 7)).unwrap();
    let names: Vec<&str> = idx.blocks.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["(other)", "blocks.2", "blocks.10"]);
    let blocks: Vec<usize> = idx.tensors.iter().map(|t| t.block).collect();
    assert_eq!(blocks, [2, 1, 0]);
    assert_eq!(
        idx.block_tensors(1)
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["blocks.2.w"]
    );
}

/// Dtypes with byte-sized elements, as (name, bytes per element).
const DTYPES: [(safetensors::Dtype, u64); 6] = [
    (safetensors::Dtype::BF16, 2),
    (safetensors::Dtype::F16, 2),
    (safetensors::Dtype::F32, 4),
    (safetensors::Dtype::F8_E4M3, 1),
    (safetensors::Dtype::U8, 1),
    (safetensors::Dtype::I64, 8),
];

fn tensor_strategy() -> impl Strategy<Value = (usize, Vec<usize>)> {
    (0..DTYPES.len(), proptest::collection::vec(0usize..5, 0..4))
}

proptest! {
    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256), extra in 0u64..64) {
        let _ = TensorIndex::parse(&bytes, bytes.len() as u64);
        let _ = TensorIndex::parse(&bytes, bytes.len() as u64 + extra);
    }

    #[test]
    fn parse_never_panics_on_json_like(body in "\\{(\"[a-z]\":\\{\"dtype\":\"(U8|F32|X)\",\"shape\":\\[[0-9]{0,3}\\],\"data_offsets\":\\[[0-9]{1,3},[0-9]{1,3}\\]\\},?){0,3}\\}", data in 0usize..300) {
        let _ = parse(&file(&body, data));
    }

    #[test]
    fn round_trips_crate_serialize(specs in proptest::collection::btree_map("[a-z.0-9]{1,12}", tensor_strategy(), 0..8), tail in 0usize..16) {
        let data: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = specs
            .iter()
            .map(|(name, (d, shape))| {
                let (dtype, size) = DTYPES[*d];
                let n = shape.iter().product::<usize>() * size as usize;
                (name.clone(), dtype, shape.clone(), vec![7u8; n])
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
            .iter()
            .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let exact = safetensors::serialize(views, None).unwrap();
        let reference = safetensors::SafeTensors::deserialize(&exact).unwrap();
        let mut bytes = exact.clone();
        bytes.resize(bytes.len() + tail, 0);
        let idx = parse(&bytes).unwrap();
        prop_assert_eq!(idx.tensors.len(), data.len());
        prop_assert_eq!(idx.data_end + tail as u64, bytes.len() as u64);
        for t in &idx.tensors {
            let view = reference.tensor(&t.name).unwrap();
            prop_assert_eq!(&t.dtype, &view.dtype().to_string());
            let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            prop_assert_eq!(&t.shape, &shape);
            prop_assert_eq!(&bytes[t.start as usize..t.end as usize], view.data());
        }
        for w in idx.tensors.windows(2) {
            prop_assert_eq!(w[0].end, w[1].start);
        }
    }
}
