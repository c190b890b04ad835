//! Tests for the GGUF parser.

use super::*;
use proptest::prelude::*;

/// A minimal GGUF writer for tests: key/values as raw `(key, type, value bytes)`, tensors as
/// `(name, dims, ggml type, relative offset)`.
#[derive(Clone)]
pub(crate) struct Gguf {
    pub(crate) version: u32,
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    alignment: u64,
    data_len: u64,
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

impl Gguf {
    pub(crate) fn new() -> Gguf {
        Gguf {
            version: 3,
            kvs: vec![("general.architecture".into(), 8, string(b"llama"))],
            tensors: Vec::new(),
            alignment: 32,
            data_len: 0,
        }
    }

    /// Adds a tensor packed after the previous one (aligned), growing the data section.
    pub(crate) fn tensor(mut self, name: &str, dims: &[u64], ty: u32) -> Gguf {
        let t = ggml_type(ty).unwrap();
        let len = dims.iter().product::<u64>() / t.block * t.bytes;
        let offset = self.data_len.next_multiple_of(self.alignment);
        self.tensors.push((name.into(), dims.to_vec(), ty, offset));
        self.data_len = offset + len;
        self
    }

    fn kv(mut self, key: &str, ty: u32, value: Vec<u8>) -> Gguf {
        self.kvs.push((key.into(), ty, value));
        self
    }

    /// The header, up to (not including) the padding.
    fn header(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kvs {
            out.extend(string(k.as_bytes()));
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(v);
        }
        for (name, dims, ty, offset) in &self.tensors {
            out.extend(string(name.as_bytes()));
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        out
    }

    /// The whole file; data bytes are their offset mod 251.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut out = self.header();
        out.resize(out.len().next_multiple_of(self.alignment as usize), 0);
        out.extend((0..self.data_len).map(|i| (i % 251) as u8));
        out
    }
}

fn parse_all(bytes: &[u8]) -> Result<TensorIndex, IndexError> {
    parse(bytes, bytes.len() as u64)
}

fn gguf_err(bytes: &[u8]) -> GgufError {
    match parse_all(bytes) {
        Err(IndexError::Gguf(e)) => e,
        other => panic!("expected a GGUF error, got {other:?}"),
    }
}

fn llama() -> Gguf {
    Gguf::new()
        .tensor("token_embd.weight", &[64, 10], 2) // Q4_0: 640 / 32 × 18 = 360 bytes
        .tensor("blk.0.attn_norm.weight", &[64], 0)
        .tensor("blk.0.attn_q.weight", &[256, 4], 12) // Q4_K: 4 × 144
        .tensor("blk.1.attn_norm.weight", &[64], 0)
        .tensor("blk.1.attn_q.weight", &[256, 4], 12)
        .tensor("output_norm.weight", &[64], 0)
}

#[test]
fn parses_llama_style_file() {
    let g = llama();
    let bytes = g.bytes();
    let idx = parse_all(&bytes).unwrap();
    assert_eq!(idx.format, Format::Gguf);
    let data_start = g.header().len().next_multiple_of(32) as u64;
    assert_eq!(idx.header_bytes, data_start);
    assert_eq!(idx.file_size, bytes.len() as u64);
    assert_eq!(idx.data_end, bytes.len() as u64);
    let t = &idx.tensors[0];
    assert_eq!(
        (t.name.as_str(), t.dtype.as_str()),
        ("token_embd.weight", "Q4_0")
    );
    assert_eq!((t.start, t.end), (data_start, data_start + 360));
    assert_eq!(t.shape, [64, 10]);
    // The next tensor starts at the next multiple of 32 (a 24-byte gap).
    assert_eq!(idx.tensors[1].start, data_start + 384);
    let q = &idx.tensors[2];
    assert_eq!((q.dtype.as_str(), q.len()), ("Q4_K", 4 * 144));
    let blocks: Vec<&str> = idx.blocks.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(blocks, ["(other)", "blk.0", "blk.1"]);
    assert_eq!(idx.blocks[1].tensors, 2);
    assert_eq!(
        idx.metadata.as_ref().unwrap()["general.architecture"],
        "llama"
    );
    assert_eq!(
        idx.tensor_at(data_start + 370),
        None,
        "padding belongs to no tensor"
    );
    assert_eq!(idx.tensor_at(data_start + 384), Some(1));
}

#[test]
fn diffusion_names_form_blocks() {
    let g = Gguf::new()
        .tensor("double_blocks.0.img_attn.qkv.weight", &[64, 2], 8)
        .tensor("double_blocks.1.img_attn.qkv.weight", &[64, 2], 8)
        .tensor("img_in.weight", &[64], 1)
        .tensor("single_blocks.0.linear1.weight", &[64, 2], 8)
        .tensor("single_blocks.10.linear1.weight", &[64, 2], 8)
        .tensor("single_blocks.2.linear1.weight", &[64, 2], 8);
    let idx = parse_all(&g.bytes()).unwrap();
    let blocks: Vec<&str> = idx.blocks.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        blocks,
        [
            "(other)",
            "double_blocks.0",
            "double_blocks.1",
            "single_blocks.0",
            "single_blocks.2",
            "single_blocks.10"
        ]
    );
}

#[test]
fn custom_alignment_and_version_2() {
    let mut g = Gguf::new().kv("general.alignment", 4, 64u32.to_le_bytes().to_vec());
    g.alignment = 64;
    g.version = 2;
    let g = g.tensor("a", &[3], 0).tensor("b", &[5], 0);
    let bytes = g.bytes();
    let idx = parse_all(&bytes).unwrap();
    assert_eq!(idx.header_bytes % 64, 0);
    assert_eq!(idx.tensors[1].start - idx.header_bytes, 64);
    assert_eq!(idx.metadata.unwrap()["general.alignment"], "64");
}

#[test]
fn alignment_must_be_u32_power_of_two() {
    let bad = Gguf::new().kv("general.alignment", 4, 48u32.to_le_bytes().to_vec());
    assert!(matches!(
        gguf_err(&bad.bytes()),
        GgufError::BadAlignment(48)
    ));
    let zero = Gguf::new().kv("general.alignment", 4, 0u32.to_le_bytes().to_vec());
    assert!(matches!(
        gguf_err(&zero.bytes()),
        GgufError::BadAlignment(0)
    ));
    let wide = Gguf::new().kv("general.alignment", 10, 32u64.to_le_bytes().to_vec());
    assert!(matches!(
        gguf_err(&wide.bytes()),
        GgufError::AlignmentType { value_type: 10 }
    ));
}

#[test]
fn header_prefix_grows_until_it_parses() {
    let g = llama().kv("tokenizer.ggml.tokens", 9, {
        let mut v = 8u32.to_le_bytes().to_vec();
        v.extend(5000u64.to_le_bytes());
        for i in 0..5000 {
            v.extend(string(format!("token{i}").as_bytes()));
        }
        v
    });
    let bytes = g.bytes();
    let size = bytes.len() as u64;
    let mut wanted = 64u64;
    let mut rounds = 0;
    let idx = loop {
        rounds += 1;
        match parse(&bytes[..wanted as usize], size) {
            Err(IndexError::NeedMore { header_bytes }) => {
                assert!(header_bytes > wanted && header_bytes <= size);
                wanted = header_bytes;
            }
            other => break other.unwrap(),
        }
    };
    assert!(rounds < 20, "{rounds} rounds");
    assert!(wanted >= idx.header_bytes);
    assert_eq!(idx, parse_all(&bytes).unwrap());
    assert_eq!(
        idx.metadata.unwrap()["tokenizer.ggml.tokens"],
        "[5000 × string]"
    );
}

#[test]
fn rejects_wrong_magic_version_and_endianness() {
    let mut bytes = llama().bytes();
    bytes[0] = b'X';
    assert!(matches!(gguf_err(&bytes), GgufError::BadMagic(_)));
    for (version, want_be) in [(1u32, false), (4, false), (3u32.swap_bytes(), true)] {
        let mut g = llama();
        g.version = version;
        let e = gguf_err(&g.bytes());
        assert_eq!(matches!(e, GgufError::BigEndian), want_be, "{e}");
        assert_eq!(
            matches!(e, GgufError::UnsupportedVersion(_)),
            !want_be,
            "{e}"
        );
    }
}

#[test]
fn hostile_counts_and_lengths_are_refused_without_allocating() {
    let header = |tensors: u64, kvs: u64| {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(tensors.to_le_bytes());
        out.extend(kvs.to_le_bytes());
        out
    };
    let truncated = |b: &[u8]| matches!(gguf_err(b), GgufError::Truncated { .. });
    assert!(truncated(&header(u64::MAX, 0)));
    assert!(truncated(&header(0, u64::MAX)));
    // A key of length 2^63.
    let mut b = header(0, 1);
    b.extend((1u64 << 63).to_le_bytes());
    assert!(truncated(&b));
    // An array of 2^62 u64 values (the byte count overflows).
    let mut b = header(0, 1);
    b.extend(string(b"k"));
    b.extend(9u32.to_le_bytes());
    b.extend(10u32.to_le_bytes());
    b.extend((1u64 << 62).to_le_bytes());
    assert!(truncated(&b));
    // An array of u64::MAX strings.
    let mut b = header(0, 1);
    b.extend(string(b"k"));
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(u64::MAX.to_le_bytes());
    b.extend(string(b"x"));
    assert!(truncated(&b));
    // A tensor with 2^32 - 1 dimensions.
    let mut b = header(1, 0);
    b.extend(string(b"t"));
    b.extend(u32::MAX.to_le_bytes());
    assert!(truncated(&b));
}

#[test]
fn nested_arrays_are_capped() {
    let nested = |depth: u32| {
        let mut v = Vec::new();
        for _ in 1..depth {
            v.extend(9u32.to_le_bytes());
            v.extend(1u64.to_le_bytes());
        }
        v.extend(0u32.to_le_bytes());
        v.extend(1u64.to_le_bytes());
        v.push(7);
        Gguf::new().kv("deep", 9, v).bytes()
    };
    assert!(parse_all(&nested(MAX_NESTING)).is_ok());
    assert!(matches!(
        gguf_err(&nested(MAX_NESTING + 1)),
        GgufError::TooDeep { .. }
    ));
}

#[test]
fn rejects_bad_tensors() {
    let dup = Gguf::new().tensor("a", &[4], 0).tensor("a", &[4], 0);
    assert!(matches!(
        gguf_err(&dup.bytes()),
        GgufError::DuplicateTensor(_)
    ));
    let mut unknown = Gguf::new().tensor("a", &[4], 0);
    unknown.tensors[0].2 = 4;
    assert!(matches!(
        gguf_err(&unknown.bytes()),
        GgufError::UnknownType { ggml_type: 4, .. }
    ));
    let mut partial = Gguf::new().tensor("a", &[64, 2], 2);
    partial.tensors[0].1 = vec![48, 2];
    assert!(matches!(
        gguf_err(&partial.bytes()),
        GgufError::PartialBlock { row: 48, .. }
    ));
    let mut overlap = Gguf::new().tensor("a", &[16], 0).tensor("b", &[16], 0);
    overlap.tensors[1].3 = 32;
    assert!(matches!(
        gguf_err(&overlap.bytes()),
        GgufError::Overlap { .. }
    ));
    let mut past = Gguf::new().tensor("a", &[16], 0);
    past.tensors[0].3 = 64;
    assert!(matches!(gguf_err(&past.bytes()), GgufError::PastEnd { .. }));
    let mut huge = Gguf::new().tensor("a", &[16], 0);
    huge.tensors[0].1 = vec![u64::MAX, 2];
    assert!(matches!(
        gguf_err(&huge.bytes()),
        GgufError::ShapeOverflow { .. }
    ));
    let mut far = Gguf::new().tensor("a", &[16], 0);
    far.tensors[0].3 = u64::MAX - 8;
    assert!(matches!(
        gguf_err(&far.bytes()),
        GgufError::OffsetOverflow { .. }
    ));
    let dup_key = Gguf::new().kv("general.architecture", 8, string(b"x"));
    assert!(matches!(
        gguf_err(&dup_key.bytes()),
        GgufError::DuplicateKey { .. }
    ));
    let bad_type = Gguf::new().kv("k", 13, vec![0; 8]);
    assert!(matches!(
        gguf_err(&bad_type.bytes()),
        GgufError::UnknownValueType { value_type: 13, .. }
    ));
}

#[test]
fn empty_arrays_of_unknown_type_are_accepted_like_gguf_py() {
    let mut v = 99u32.to_le_bytes().to_vec();
    v.extend(0u64.to_le_bytes());
    assert!(parse_all(&Gguf::new().kv("k", 9, v).bytes()).is_ok());
}

#[test]
fn chunk_plan_covers_gaps() {
    let idx = parse_all(&llama().bytes()).unwrap();
    let plan = crate::cache::plan::ChunkPlan::for_index(&idx);
    let mut cursor = idx.header_bytes;
    for c in plan.chunks() {
        assert_eq!(c.start, cursor);
        cursor = c.end;
    }
    assert_eq!(cursor, idx.data_end);
}

proptest! {
    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512), extra in 0u64..1 << 40) {
        let _ = parse(&bytes, bytes.len() as u64);
        let _ = parse(&bytes, bytes.len() as u64 + extra);
    }

    #[test]
    fn mutated_files_never_panic(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut bytes = llama().bytes();
        for (i, v) in flips {
            let at = i.index(bytes.len());
            bytes[at] = v;
        }
        if let Ok(idx) = parse_all(&bytes) {
            let mut cursor = idx.header_bytes;
            for t in &idx.tensors {
                prop_assert!(t.start >= cursor && t.end <= idx.file_size);
                cursor = t.end;
            }
        }
    }
}
