//! Test helpers: small safetensors files with chosen layouts (unit tests only).

use std::io::Write;

use tierfs_core::index::TensorIndex;

use crate::plan::dtype_size;

/// `(name, dtype, shape)`, laid out in the file in the order given.
pub type Spec<'a> = (&'a str, &'a str, &'a [u64]);

/// The bytes of a safetensors file holding `specs` in order, with pseudo-random tensor data.
///
/// `header_len` pads the JSON header with spaces to exactly that many bytes when given (so the
/// data section, and with it tensor alignment, starts where the test wants); otherwise to a
/// multiple of 8 as the `safetensors` writer does.
pub fn file_bytes(specs: &[Spec], header_len: Option<usize>, seed: u64) -> Vec<u8> {
    let mut entries = Vec::new();
    let mut offset = 0u64;
    for (name, dtype, shape) in specs {
        let elems: u64 = shape.iter().product();
        let len = elems * dtype_size(dtype).expect("test dtype");
        entries.push(format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{offset},{}]}}",
            offset + len
        ));
        offset += len;
    }
    let mut header = format!("{{{}}}", entries.join(",")).into_bytes();
    let target = header_len.unwrap_or(header.len().div_ceil(8) * 8);
    assert!(
        target >= header.len(),
        "header needs {} bytes",
        header.len()
    );
    header.resize(target, b' ');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend(pseudo_random(offset as usize, seed));
    out
}

/// Deterministic bytes (SplitMix64), different for every seed.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The parsed index of `bytes`.
pub fn index_of(bytes: &[u8]) -> TensorIndex {
    TensorIndex::parse(bytes, bytes.len() as u64).expect("test file parses")
}

/// `bytes` written to a fresh temporary file (on disk, so `O_DIRECT` works).
pub fn temp_file(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(bytes).expect("write temp file");
    f.flush().expect("flush temp file");
    f
}
