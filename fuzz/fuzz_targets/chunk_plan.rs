//! `ChunkPlan::for_index` over indexes parsed from *valid* fuzzer-built safetensors headers.
//!
//! The input is decoded (with `arbitrary`) into a list of tensors — names built from real model
//! families or free text, any dtype, shapes spanning the 1 MiB packing threshold and the 4 MiB
//! chunk size — laid out contiguously in an input-chosen order different from the JSON order,
//! plus trailing bytes and optional `__metadata__`. Such a header is valid, so `parse` must accept
//! it (a rejection is a bug); the index invariants and the chunk-plan tiling are then checked.
#![no_main]

use std::collections::HashSet;
use std::fmt::Write;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tierfs_core::cache::plan::ChunkPlan;
use tierfs_core::index::TensorIndex;

const PREFIXES: [&str; 6] = [
    "",
    "model.diffusion_model.",
    "transformer.",
    "text_model.encoder.",
    "first_stage_model.decoder.",
    "vae.",
];
const WORDS: [&str; 15] = [
    "blocks",
    "transformer_blocks",
    "single_transformer_blocks",
    "double_blocks",
    "single_blocks",
    "input_blocks",
    "middle_block",
    "output_blocks",
    "layers",
    "down_blocks",
    "mid_block",
    "up_blocks",
    "encoder.block",
    "decoder.block",
    "h",
];
const LEAVES: [&str; 6] = ["weight", "bias", "attn.qkv.weight", "0.norm.scale", "ffn.0.weight", ""];
const DTYPES: [&str; 23] = [
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64",
    "I64", "U64", "BF16",
];

#[derive(Arbitrary, Debug)]
enum Name {
    Family { prefix: u8, word: u8, number: u16, leaf: u8 },
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Tensor {
    name: Name,
    dtype: u8,
    /// Up to 4 dimensions; the byte size is capped at 64 MiB to keep an execution fast.
    dims: Vec<u16>,
    /// Scales the first dimension by 2^scale so sizes reach the MiB range.
    scale: u8,
    /// Position in the data section (ties by JSON order).
    rank: u8,
}

#[derive(Arbitrary, Debug)]
struct Input {
    tensors: Vec<Tensor>,
    trailing: u32,
    metadata: Option<Vec<(String, String)>>,
    pad_to_8: bool,
}

fn name_of(n: &Name) -> String {
    match n {
        Name::Family { prefix, word, number, leaf } => {
            let p = PREFIXES[*prefix as usize % PREFIXES.len()];
            let w = WORDS[*word as usize % WORDS.len()];
            let l = LEAVES[*leaf as usize % LEAVES.len()];
            if w.ends_with("_block") {
                format!("{p}{w}.{}.{l}", number % 4)
            } else {
                format!("{p}{w}.{}.{l}", number % 64)
            }
        }
        Name::Raw(s) => s.clone(),
    }
}

fuzz_target!(|input: Input| {
    let mut names = HashSet::new();
    // (rank, json position, name, dtype, shape, bytes)
    let mut tensors = Vec::new();
    for (pos, t) in input.tensors.iter().take(200).enumerate() {
        let name = name_of(&t.name);
        if name == "__metadata__" || !names.insert(name.clone()) {
            continue;
        }
        let dtype = DTYPES[t.dtype as usize % DTYPES.len()];
        let bits = tierfs_fuzz::dtype_of(dtype).unwrap().bitsize() as u64;
        let mut shape: Vec<u64> = t.dims.iter().take(4).map(|&d| d as u64).collect();
        if let Some(first) = shape.first_mut() {
            *first <<= t.scale % 24;
        }
        let Some(total_bits) = shape
            .iter()
            .try_fold(bits, |a, &d| a.checked_mul(d))
            .filter(|b| b % 8 == 0 && b / 8 <= 64 << 20)
        else {
            continue;
        };
        tensors.push((t.rank, pos, name, dtype, shape, total_bits / 8));
    }
    // Data layout order differs from JSON order.
    let mut layout: Vec<usize> = (0..tensors.len()).collect();
    layout.sort_by_key(|&i| (tensors[i].0, tensors[i].1));
    let mut offsets = vec![(0u64, 0u64); tensors.len()];
    let mut cursor = 0u64;
    for &i in &layout {
        offsets[i] = (cursor, cursor + tensors[i].5);
        cursor += tensors[i].5;
    }
    let mut json = String::from("{");
    if let Some(meta) = &input.metadata {
        let map: serde_json::Map<String, serde_json::Value> = meta
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        write!(json, "\"__metadata__\":{}", serde_json::Value::Object(map)).unwrap();
    }
    for (i, (_, _, name, dtype, shape, _)) in tensors.iter().enumerate() {
        if i > 0 || input.metadata.is_some() {
            json.push(',');
        }
        write!(
            json,
            "{}:{{\"dtype\":\"{dtype}\",\"shape\":{},\"data_offsets\":[{},{}]}}",
            serde_json::Value::String(name.clone()),
            serde_json::to_string(shape).unwrap(),
            offsets[i].0,
            offsets[i].1
        )
        .unwrap();
    }
    json.push('}');
    if input.pad_to_8 {
        while json.len() % 8 != 0 {
            json.push(' ');
        }
    }
    let mut prefix = (json.len() as u64).to_le_bytes().to_vec();
    prefix.extend_from_slice(json.as_bytes());
    let header_bytes = prefix.len() as u64;
    let file_size = header_bytes + cursor + input.trailing as u64;

    let idx = match TensorIndex::parse(&prefix, file_size) {
        Ok(idx) => idx,
        Err(e) => panic!("valid header rejected: {e}\n{json}"),
    };
    assert_eq!(idx.header_bytes, header_bytes);
    assert_eq!(idx.data_end, header_bytes + cursor);
    assert_eq!(idx.tensors.len(), tensors.len());
    tierfs_fuzz::check_index(&idx);
    tierfs_fuzz::check_plan(&idx, &ChunkPlan::for_index(&idx));
    tierfs_fuzz::check_against_crate(&prefix[8..], &Ok(idx));
});
