//! Deterministic synthetic `.safetensors` checkpoints for `tierfs demo`, tests and benchmarks.
//!
//! # Shape of the files
//!
//! Three layouts mimic the tensor naming of real diffusion checkpoints, so that block grouping
//! ([`crate::index::blocks`]) and default ordering see what they would see in the wild:
//!
//! - [`Layout::Dit`] — Wan-style DiT: [`DIT_BLOCKS`] × `blocks.N.{self_attn,cross_attn}.{q,k,v,o}`,
//!   `ffn.{0,2}`, norms and modulation, plus non-block `patch_embedding`, `text_embedding`,
//!   `time_embedding`, `head`.
//! - [`Layout::Flux`] — BFL Flux: [`FLUX_DOUBLE`] `double_blocks.N` + [`FLUX_SINGLE`]
//!   `single_blocks.N` (the real Flux.1 counts), plus `img_in`, `txt_in`, `time_in`, `final_layer`.
//! - [`Layout::Unet`] — LDM UNet under `model.diffusion_model.`: [`UNET_LEVELS`] `input_blocks.N`,
//!   `middle_block`, [`UNET_LEVELS`] `output_blocks.N` (the SD1.5/SDXL counts), whose attention
//!   parts nest `transformer_blocks.0` inside the outer block.
//!
//! Every layout has small tensors (biases, norm scales, modulation vectors) next to the large
//! matrices, so small-tensor packing in the cache is exercised.
//!
//! # Sizing
//!
//! Block counts are fixed per layout; the hidden width `h` and the MLP width `f` are fitted to
//! [`SynthSpec::target_bytes`]: `h` is the largest width whose file, with the usual `f = 4h`, fits
//! the target, then `f` is the largest MLP width that still fits. Because the file size is linear
//! in `f` with a small slope, the result lands just below the target — within a fraction of a
//! percent for anything above a few MiB. The size used in the search is the exact file size,
//! header included. Widths never drop below [`MIN_HIDDEN`]; a target smaller than the smallest
//! possible model gives that smallest model.
//!
//! # Writing
//!
//! Like real writers (the `safetensors` Python package), tensors are laid out sorted by name with a
//! plain string sort (`blocks.10` before `blocks.2`), the JSON header is padded with spaces to a
//! multiple of 8 bytes, and all tensors share one dtype. `__metadata__` is
//! `{"format":"pt","tierfs_synthetic":"1"}`. Data are generated in [`CHUNK`]-sized pieces and go
//! through a [`WRITE_BUFFER`]-sized `BufWriter`, so memory stays constant for multi-GiB files.
//!
//! Content is a SplitMix64 stream seeded with [`SynthSpec::seed`]: identical specs give identical
//! files. Each 64-bit word is masked so every element is a finite value of magnitude in about
//! `[2^-7, 2^-3)` (`[2^-3, 2)` for FP8) — no NaN/Inf, like trained weights — at the cost of one
//! AND and one OR per 8 bytes, which keeps generation well above disk speed.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::str::FromStr;

/// Number of transformer blocks of the DiT layout: between Wan 2.x 1.3B (30) and 14B (40).
pub const DIT_BLOCKS: u32 = 32;
/// Double-stream blocks of the Flux layout, as in Flux.1.
pub const FLUX_DOUBLE: u32 = 19;
/// Single-stream blocks of the Flux layout, as in Flux.1.
pub const FLUX_SINGLE: u32 = 38;
/// `input_blocks` and `output_blocks` of the UNet layout each, as in SD1.5/SDXL.
pub const UNET_LEVELS: u32 = 12;
/// Smallest hidden width: keeps every tensor non-trivial even for tiny targets.
pub const MIN_HIDDEN: u64 = 8;
/// Upper bound of the width search: 2^20 gives multi-PiB files, far beyond any use, and keeps
/// every size computation far from `u64` overflow.
const MAX_HIDDEN: u64 = 1 << 20;
/// Rounds of the header correction in the size fit; two suffice (see `fit`), one more is slack.
const FIT_ROUNDS: usize = 3;
/// Bytes generated per step: large enough to amortise per-call overhead, small enough for L2.
pub const CHUNK: usize = 64 * 1024;
/// `BufWriter` capacity: 1 MiB turns the chunk stream into large sequential writes.
pub const WRITE_BUFFER: usize = 1 << 20;
/// Prefix of every UNet tensor name, as in LDM/ComfyUI checkpoints.
const UNET_PREFIX: &str = "model.diffusion_model.";
/// Width of the synthetic text/time conditioning inputs.
const COND_DIM: u64 = 64;
/// Cap of the attention head width used for the per-head norm scales.
const HEAD_DIM: u64 = 128;

/// Errors of this module (parsing names of layouts and dtypes; I/O uses `std::io::Error`).
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// Not one of `dit`, `flux`, `unet`.
    #[error("unknown layout '{0}' (expected dit, flux or unet)")]
    UnknownLayout(String),
    /// Not one of `bf16`, `f16`, `f32`, `f8e4m3`.
    #[error("unknown dtype '{0}' (expected bf16, f16, f32 or f8e4m3)")]
    UnknownDtype(String),
}

/// Tensor naming scheme; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Wan-style DiT.
    Dit,
    /// BFL Flux.
    Flux,
    /// LDM UNet.
    Unet,
}

impl Layout {
    /// Number of transformer blocks (excluding the non-block group).
    pub fn blocks(self) -> usize {
        let n = match self {
            Layout::Dit => DIT_BLOCKS,
            Layout::Flux => FLUX_DOUBLE + FLUX_SINGLE,
            Layout::Unet => 2 * UNET_LEVELS + 1,
        };
        n as usize
    }
}

impl FromStr for Layout {
    type Err = SynthError;
    fn from_str(s: &str) -> Result<Self, SynthError> {
        match s.to_ascii_lowercase().as_str() {
            "dit" | "wan" => Ok(Layout::Dit),
            "flux" => Ok(Layout::Flux),
            "unet" | "sd" => Ok(Layout::Unet),
            _ => Err(SynthError::UnknownLayout(s.to_string())),
        }
    }
}

/// Element type of every tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthDtype {
    /// bfloat16.
    BF16,
    /// IEEE half.
    F16,
    /// IEEE single.
    F32,
    /// FP8 E4M3 (OCP "fn" variant, as `torch.float8_e4m3fn`).
    F8E4M3,
}

impl SynthDtype {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            SynthDtype::BF16 | SynthDtype::F16 => 2,
            SynthDtype::F32 => 4,
            SynthDtype::F8E4M3 => 1,
        }
    }

    /// Dtype string in the safetensors header.
    pub fn name(self) -> &'static str {
        match self {
            SynthDtype::BF16 => "BF16",
            SynthDtype::F16 => "F16",
            SynthDtype::F32 => "F32",
            SynthDtype::F8E4M3 => "F8_E4M3",
        }
    }

    /// `(and, or)` masks applied to each random 64-bit word: keep the sign, the mantissa and the
    /// low two exponent bits, and force the rest of the exponent to a small value.
    fn masks(self) -> (u64, u64) {
        const LANES16: u64 = 0x0001_0001_0001_0001;
        const LANES32: u64 = 0x0000_0001_0000_0001;
        const LANES8: u64 = 0x0101_0101_0101_0101;
        match self {
            // s eeeeeeee mmmmmmm: exponent 0x78..=0x7B.
            SynthDtype::BF16 => (0x81FF * LANES16, 0x3C00 * LANES16),
            // s eeeee mmmmmmmmmm: exponent 8..=11.
            SynthDtype::F16 => (0x8FFF * LANES16, 0x2000 * LANES16),
            // s eeeeeeee m×23: exponent 0x78..=0x7B.
            SynthDtype::F32 => (0x81FF_FFFF * LANES32, 0x3C00_0000 * LANES32),
            // s eeee mmm: exponent 4..=7, never the NaN pattern 0x7F.
            SynthDtype::F8E4M3 => (0x9F * LANES8, 0x20 * LANES8),
        }
    }
}

impl FromStr for SynthDtype {
    type Err = SynthError;
    fn from_str(s: &str) -> Result<Self, SynthError> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" => Ok(SynthDtype::BF16),
            "f16" | "fp16" => Ok(SynthDtype::F16),
            "f32" | "fp32" => Ok(SynthDtype::F32),
            "f8e4m3" | "f8_e4m3" | "fp8" => Ok(SynthDtype::F8E4M3),
            _ => Err(SynthError::UnknownDtype(s.to_string())),
        }
    }
}

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynthSpec {
    /// Tensor naming scheme.
    pub layout: Layout,
    /// Desired file size; the result is at most this (unless below the smallest model).
    pub target_bytes: u64,
    /// Element type.
    pub dtype: SynthDtype,
    /// PRNG seed of the tensor contents.
    pub seed: u64,
}

/// What was (or would be) written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynthSummary {
    /// Number of tensors.
    pub tensors: usize,
    /// Number of transformer blocks, excluding the non-block group.
    pub blocks: usize,
    /// File size.
    pub bytes: u64,
    /// Fitted hidden width.
    pub hidden: u64,
    /// Fitted MLP width.
    pub ffn: u64,
}

/// Model widths.
#[derive(Debug, Clone, Copy)]
struct Dims {
    h: u64,
    f: u64,
}

/// A fully laid-out file: padded header JSON and data length.
struct Plan {
    header: Vec<u8>,
    tensors: usize,
    data_len: u64,
}

impl Plan {
    fn file_size(&self) -> u64 {
        8 + self.header.len() as u64 + self.data_len
    }
}

/// The file `spec` describes, without writing it.
pub fn plan(spec: &SynthSpec) -> SynthSummary {
    let dims = fit(spec);
    summary(spec, dims, &layout_plan(spec, dims))
}

/// Writes the checkpoint `spec` describes to `path` (created or truncated).
pub fn write_checkpoint(path: &Path, spec: &SynthSpec) -> io::Result<SynthSummary> {
    let dims = fit(spec);
    let plan = layout_plan(spec, dims);
    let mut out = BufWriter::with_capacity(WRITE_BUFFER, File::create(path)?);
    out.write_all(&(plan.header.len() as u64).to_le_bytes())?;
    out.write_all(&plan.header)?;
    write_data(&mut out, spec, plan.data_len)?;
    out.into_inner().map_err(|e| e.into_error())?;
    Ok(summary(spec, dims, &plan))
}

fn summary(spec: &SynthSpec, dims: Dims, plan: &Plan) -> SynthSummary {
    SynthSummary {
        tensors: plan.tensors,
        blocks: spec.layout.blocks(),
        bytes: plan.file_size(),
        hidden: dims.h,
        ffn: dims.f,
    }
}

/// Streams `len` bytes of masked PRNG output.
fn write_data<W: Write>(out: &mut W, spec: &SynthSpec, len: u64) -> io::Result<()> {
    let mut rng = SplitMix64(spec.seed);
    let (and, or) = spec.dtype.masks();
    let mut buf = vec![0u8; CHUNK];
    let mut left = len;
    while left > 0 {
        let n = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
        let chunk = &mut buf[..n];
        let mut words = chunk.chunks_exact_mut(8);
        for word in &mut words {
            word.copy_from_slice(&((rng.next() & and) | or).to_le_bytes());
        }
        let rest = words.into_remainder();
        let tail = ((rng.next() & and) | or).to_le_bytes();
        rest.copy_from_slice(&tail[..rest.len()]);
        out.write_all(chunk)?;
        left -= n as u64;
    }
    Ok(())
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny state, passes BigCrush, ~1 ns per word.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Fits the widths to the target size (see the module docs).
///
/// Probes use the data size only (building the JSON header for every probe is ~5× slower); the
/// header length of the previous fit is then subtracted from the budget and the fit repeated. The
/// header only shrinks when the widths do, so the second round already fits.
fn fit(spec: &SynthSpec) -> Dims {
    let mut header = 0;
    let mut dims = fit_data(spec, spec.target_bytes);
    for _ in 0..FIT_ROUNDS {
        let plan = layout_plan(spec, dims);
        if plan.file_size() <= spec.target_bytes || plan.header.len() as u64 <= header {
            break;
        }
        header = plan.header.len() as u64;
        dims = fit_data(spec, spec.target_bytes.saturating_sub(8 + header));
    }
    dims
}

/// Widths whose tensor data alone fits in `budget` bytes.
fn fit_data(spec: &SynthSpec, budget: u64) -> Dims {
    let fits = |h: u64, f: u64| data_len(spec, Dims { h, f }) <= budget;
    let h = largest(MIN_HIDDEN, MAX_HIDDEN, |h| fits(h, 4 * h));
    let f = largest(1, 16 * h, |f| fits(h, f));
    Dims { h, f }
}

/// Total tensor bytes at widths `dims`.
fn data_len(spec: &SynthSpec, dims: Dims) -> u64 {
    let elems: u64 = tensor_list(spec.layout, dims)
        .iter()
        .map(|(_, shape)| shape.iter().product::<u64>())
        .sum();
    elems * spec.dtype.size()
}

/// Largest `x` in `[lo, hi]` with `pred(x)`, for monotone (true-then-false) `pred`; `lo` if none.
fn largest(lo: u64, hi: u64, pred: impl Fn(u64) -> bool) -> u64 {
    let (mut ok, mut bad) = (lo, hi + 1);
    if !pred(lo) {
        return lo;
    }
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        if pred(mid) {
            ok = mid;
        } else {
            bad = mid;
        }
    }
    ok
}

/// Lays out the tensors of `spec` at widths `dims`.
fn layout_plan(spec: &SynthSpec, dims: Dims) -> Plan {
    let mut tensors = tensor_list(spec.layout, dims);
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let elem = spec.dtype.size();
    let mut map = serde_json::Map::new();
    let meta = serde_json::json!({"format": "pt", "tierfs_synthetic": "1"});
    map.insert("__metadata__".into(), meta);
    let mut offset = 0u64;
    for (name, shape) in &tensors {
        let end = offset + shape.iter().product::<u64>() * elem;
        let entry = serde_json::json!({
            "dtype": spec.dtype.name(), "shape": shape, "data_offsets": [offset, end]
        });
        map.insert(name.clone(), entry);
        offset = end;
    }
    let mut header = serde_json::Value::Object(map).to_string().into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    Plan {
        header,
        tensors: tensors.len(),
        data_len: offset,
    }
}

/// `(name, shape)` of every tensor, unsorted.
fn tensor_list(layout: Layout, dims: Dims) -> Vec<(String, Vec<u64>)> {
    match layout {
        Layout::Dit => dit(dims),
        Layout::Flux => flux(dims),
        Layout::Unet => unet(dims),
    }
}

/// Collects `(name, shape)` pairs.
#[derive(Default)]
struct Builder(Vec<(String, Vec<u64>)>);

impl Builder {
    fn t(&mut self, name: String, shape: &[u64]) {
        self.0.push((name, shape.to_vec()));
    }

    /// `{name}.weight [out, inp]` and `{name}.bias [out]`.
    fn linear(&mut self, name: &str, out: u64, inp: u64) {
        self.t(format!("{name}.weight"), &[out, inp]);
        self.t(format!("{name}.bias"), &[out]);
    }

    /// `{name}.weight [n]` and `{name}.bias [n]`.
    fn norm(&mut self, name: &str, n: u64) {
        self.t(format!("{name}.weight"), &[n]);
        self.t(format!("{name}.bias"), &[n]);
    }
}

fn dit(Dims { h, f }: Dims) -> Vec<(String, Vec<u64>)> {
    let mut b = Builder::default();
    b.t("patch_embedding.weight".into(), &[h, 16, 1, 2, 2]);
    b.t("patch_embedding.bias".into(), &[h]);
    b.linear("text_embedding.0", h, COND_DIM);
    b.linear("text_embedding.2", h, h);
    b.linear("time_embedding.0", h, COND_DIM);
    b.linear("time_embedding.2", h, h);
    b.linear("time_projection.1", 6 * h, h);
    b.linear("head.head", 64, h);
    b.t("head.modulation".into(), &[1, 2, h]);
    for n in 0..DIT_BLOCKS {
        let p = format!("blocks.{n}");
        for attn in ["self_attn", "cross_attn"] {
            for m in ["q", "k", "v", "o"] {
                b.linear(&format!("{p}.{attn}.{m}"), h, h);
            }
            b.t(format!("{p}.{attn}.norm_q.weight"), &[h]);
            b.t(format!("{p}.{attn}.norm_k.weight"), &[h]);
        }
        b.norm(&format!("{p}.norm3"), h);
        b.linear(&format!("{p}.ffn.0"), f, h);
        b.linear(&format!("{p}.ffn.2"), h, f);
        b.t(format!("{p}.modulation"), &[1, 6, h]);
    }
    b.0
}

fn flux(Dims { h, f }: Dims) -> Vec<(String, Vec<u64>)> {
    let mut b = Builder::default();
    let head = h.min(HEAD_DIM);
    b.linear("img_in", h, 64);
    b.linear("txt_in", h, COND_DIM);
    b.linear("time_in.in_layer", h, COND_DIM);
    b.linear("time_in.out_layer", h, h);
    b.linear("vector_in.in_layer", h, COND_DIM);
    b.linear("vector_in.out_layer", h, h);
    b.linear("final_layer.linear", 64, h);
    b.linear("final_layer.adaLN_modulation.1", 2 * h, h);
    for n in 0..FLUX_DOUBLE {
        for s in ["img", "txt"] {
            let p = format!("double_blocks.{n}.{s}");
            b.linear(&format!("{p}_attn.qkv"), 3 * h, h);
            b.linear(&format!("{p}_attn.proj"), h, h);
            b.t(format!("{p}_attn.norm.query_norm.scale"), &[head]);
            b.t(format!("{p}_attn.norm.key_norm.scale"), &[head]);
            b.linear(&format!("{p}_mlp.0"), f, h);
            b.linear(&format!("{p}_mlp.2"), h, f);
            b.linear(&format!("{p}_mod.lin"), 6 * h, h);
        }
    }
    for n in 0..FLUX_SINGLE {
        let p = format!("single_blocks.{n}");
        b.linear(&format!("{p}.linear1"), 3 * h + f, h);
        b.linear(&format!("{p}.linear2"), h, h + f);
        b.t(format!("{p}.norm.query_norm.scale"), &[head]);
        b.t(format!("{p}.norm.key_norm.scale"), &[head]);
        b.linear(&format!("{p}.modulation.lin"), 3 * h, h);
    }
    b.0
}

fn unet(dims: Dims) -> Vec<(String, Vec<u64>)> {
    let h = dims.h;
    let mut b = Builder::default();
    let p = UNET_PREFIX;
    b.linear(&format!("{p}time_embed.0"), h, COND_DIM);
    b.linear(&format!("{p}time_embed.2"), h, h);
    b.norm(&format!("{p}out.0"), h);
    b.t(format!("{p}out.2.weight"), &[4, h, 3, 3]);
    b.t(format!("{p}out.2.bias"), &[4]);
    b.t(format!("{p}input_blocks.0.0.weight"), &[h, 4, 3, 3]);
    b.t(format!("{p}input_blocks.0.0.bias"), &[h]);
    for n in 1..UNET_LEVELS {
        unet_level(&mut b, &format!("{p}input_blocks.{n}"), dims);
    }
    resnet(&mut b, &format!("{p}middle_block.0"), h);
    spatial_transformer(&mut b, &format!("{p}middle_block.1"), dims);
    resnet(&mut b, &format!("{p}middle_block.2"), h);
    for n in 0..UNET_LEVELS {
        unet_level(&mut b, &format!("{p}output_blocks.{n}"), dims);
    }
    b.0
}

/// A UNet level: resnet at `.0`, spatial transformer at `.1`.
fn unet_level(b: &mut Builder, p: &str, dims: Dims) {
    resnet(b, &format!("{p}.0"), dims.h);
    spatial_transformer(b, &format!("{p}.1"), dims);
}

fn resnet(b: &mut Builder, p: &str, h: u64) {
    b.norm(&format!("{p}.in_layers.0"), h);
    b.t(format!("{p}.in_layers.2.weight"), &[h, h, 3, 3]);
    b.t(format!("{p}.in_layers.2.bias"), &[h]);
    b.linear(&format!("{p}.emb_layers.1"), h, h);
    b.norm(&format!("{p}.out_layers.0"), h);
    b.t(format!("{p}.out_layers.3.weight"), &[h, h, 3, 3]);
    b.t(format!("{p}.out_layers.3.bias"), &[h]);
}

fn spatial_transformer(b: &mut Builder, p: &str, Dims { h, f }: Dims) {
    b.norm(&format!("{p}.norm"), h);
    b.linear(&format!("{p}.proj_in"), h, h);
    let t = format!("{p}.transformer_blocks.0");
    for m in ["to_q", "to_k", "to_v"] {
        b.t(format!("{t}.attn1.{m}.weight"), &[h, h]);
    }
    b.linear(&format!("{t}.attn1.to_out.0"), h, h);
    b.norm(&format!("{t}.norm1"), h);
    b.linear(&format!("{t}.ff.net.0.proj"), 2 * f, h);
    b.linear(&format!("{t}.ff.net.2"), h, f);
    b.linear(&format!("{p}.proj_out"), h, h);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::TensorIndex;

    fn spec(layout: Layout, target_bytes: u64, dtype: SynthDtype) -> SynthSpec {
        SynthSpec {
            layout,
            target_bytes,
            dtype,
            seed: 42,
        }
    }

    fn write(spec: &SynthSpec) -> (tempfile::TempDir, std::path::PathBuf, SynthSummary) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let summary = write_checkpoint(&path, spec).unwrap();
        (dir, path, summary)
    }

    #[test]
    fn round_trips_through_index_and_crate() {
        for layout in [Layout::Dit, Layout::Flux, Layout::Unet] {
            let s = spec(layout, 3 << 20, SynthDtype::BF16);
            let (_dir, path, summary) = write(&s);
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(bytes.len() as u64, summary.bytes);
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            assert_eq!(st.len(), summary.tensors);
            let idx = TensorIndex::read_from(&File::open(&path).unwrap()).unwrap();
            assert_eq!(idx.tensors.len(), summary.tensors);
            assert_eq!(idx.data_end, idx.file_size);
            assert_eq!(idx.header_bytes % 8, 0);
            // Non-block group first, then exactly the layout's blocks.
            assert_eq!(idx.blocks[0].name, "(other)");
            assert_eq!(idx.blocks.len(), summary.blocks + 1, "{layout:?}");
            let meta = idx.metadata.as_ref().unwrap();
            assert_eq!(meta["format"], "pt");
            assert_eq!(meta["tierfs_synthetic"], "1");
            for t in &idx.tensors {
                assert_eq!(t.dtype, "BF16");
                let view = st.tensor(&t.name).unwrap();
                assert_eq!(&bytes[t.start as usize..t.end as usize], view.data());
            }
        }
    }

    #[test]
    fn laid_out_in_string_order_with_small_tensors() {
        let (_dir, path, _) = write(&spec(Layout::Dit, 1 << 20, SynthDtype::F16));
        let idx = TensorIndex::read_from(&File::open(&path).unwrap()).unwrap();
        let names: Vec<&str> = idx.tensors.iter().map(|t| t.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        let pos = |n: &str| names.iter().position(|x| x.starts_with(n)).unwrap();
        assert!(pos("blocks.10.") < pos("blocks.2."));
        assert!(idx.tensors.iter().any(|t| t.len() < 1024));
        // Default order is numeric regardless of layout on disk.
        let blocks: Vec<&str> = idx.blocks.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            &blocks[..4],
            ["(other)", "blocks.0", "blocks.1", "blocks.2"]
        );
    }

    #[test]
    fn sizes_close_to_target() {
        for layout in [Layout::Dit, Layout::Flux, Layout::Unet] {
            for dtype in [SynthDtype::BF16, SynthDtype::F32, SynthDtype::F8E4M3] {
                for target in [4u64 << 20, 64 << 20, 2 << 30, 20 << 30] {
                    let s = plan(&spec(layout, target, dtype));
                    assert!(s.bytes <= target, "{layout:?} {dtype:?} {target}: {s:?}");
                    let err = (target - s.bytes) as f64 / target as f64;
                    assert!(err < 0.01, "{layout:?} {dtype:?} {target}: {s:?}");
                }
            }
        }
    }

    #[test]
    fn tiny_target_gives_smallest_model() {
        let s = plan(&spec(Layout::Flux, 1000, SynthDtype::BF16));
        assert_eq!(s.hidden, MIN_HIDDEN);
        assert_eq!(s.ffn, 1);
        let (_dir, path, w) = write(&spec(Layout::Flux, 1000, SynthDtype::BF16));
        assert_eq!(w, s);
        TensorIndex::read_from(&File::open(path).unwrap()).unwrap();
    }

    #[test]
    fn block_structure_per_layout() {
        let (_dir, path, _) = write(&spec(Layout::Unet, 1 << 20, SynthDtype::F8E4M3));
        let idx = TensorIndex::read_from(&File::open(&path).unwrap()).unwrap();
        let names: Vec<&str> = idx.blocks.iter().map(|b| b.name.as_str()).collect();
        let p = UNET_PREFIX;
        assert_eq!(names[1], format!("{p}input_blocks.0"));
        assert_eq!(names[12], format!("{p}input_blocks.11"));
        assert_eq!(names[13], format!("{p}middle_block"));
        assert_eq!(names[14], format!("{p}output_blocks.0"));
        assert_eq!(names[25], format!("{p}output_blocks.11"));

        let (_dir, path, _) = write(&spec(Layout::Flux, 1 << 20, SynthDtype::F8E4M3));
        let idx = TensorIndex::read_from(&File::open(&path).unwrap()).unwrap();
        let fam = |f: &str| {
            idx.blocks
                .iter()
                .filter(|b| b.family.as_deref() == Some(f))
                .count()
        };
        assert_eq!(fam("double_blocks"), FLUX_DOUBLE as usize);
        assert_eq!(fam("single_blocks"), FLUX_SINGLE as usize);
        assert_eq!(idx.blocks[1].name, "double_blocks.0");
        assert_eq!(idx.blocks[1 + FLUX_DOUBLE as usize].name, "single_blocks.0");
    }

    #[test]
    fn deterministic_per_seed() {
        let s = spec(Layout::Dit, 1 << 20, SynthDtype::BF16);
        let (_d1, p1, _) = write(&s);
        let (_d2, p2, _) = write(&s);
        let (_d3, p3, _) = write(&SynthSpec { seed: 7, ..s });
        let (a, b, c) = (
            std::fs::read(p1).unwrap(),
            std::fs::read(p2).unwrap(),
            std::fs::read(p3).unwrap(),
        );
        assert_eq!(a, b);
        assert_eq!(a.len(), c.len());
        assert_ne!(a, c);
    }

    #[test]
    fn values_are_finite_and_small() {
        for dtype in [
            SynthDtype::BF16,
            SynthDtype::F16,
            SynthDtype::F32,
            SynthDtype::F8E4M3,
        ] {
            let mut buf = Vec::new();
            let s = spec(Layout::Dit, 0, dtype);
            write_data(&mut buf, &s, 4099).unwrap();
            assert_eq!(buf.len(), 4099);
            for e in buf.chunks_exact(dtype.size() as usize) {
                let v = decode(dtype, e);
                assert!(
                    v.is_finite() && v.abs() >= 2f32.powi(-7) && v.abs() < 2.0,
                    "{dtype:?} {v}"
                );
            }
        }
    }

    fn decode(dtype: SynthDtype, e: &[u8]) -> f32 {
        match dtype {
            SynthDtype::BF16 => f32::from_bits(u32::from(u16::from_le_bytes([e[0], e[1]])) << 16),
            SynthDtype::F32 => f32::from_le_bytes([e[0], e[1], e[2], e[3]]),
            SynthDtype::F16 => {
                let x = u16::from_le_bytes([e[0], e[1]]);
                let exp = i32::from((x >> 10) & 0x1F);
                let mant = f32::from(x & 0x3FF) / 1024.0;
                let sign = if x & 0x8000 != 0 { -1.0 } else { 1.0 };
                if exp == 0x1F {
                    f32::NAN
                } else {
                    sign * (1.0 + mant) * 2f32.powi(exp - 15)
                }
            }
            SynthDtype::F8E4M3 => {
                let x = e[0];
                let exp = i32::from((x >> 3) & 0xF);
                let mant = f32::from(x & 7) / 8.0;
                let sign = if x & 0x80 != 0 { -1.0 } else { 1.0 };
                if x & 0x7F == 0x7F {
                    f32::NAN
                } else {
                    sign * (1.0 + mant) * 2f32.powi(exp - 7)
                }
            }
        }
    }

    #[test]
    fn parses_names() {
        assert_eq!("Flux".parse::<Layout>().unwrap(), Layout::Flux);
        assert_eq!("fp8".parse::<SynthDtype>().unwrap(), SynthDtype::F8E4M3);
        assert!(matches!(
            "vae".parse::<Layout>(),
            Err(SynthError::UnknownLayout(_))
        ));
        assert!(matches!(
            "q4".parse::<SynthDtype>(),
            Err(SynthError::UnknownDtype(_))
        ));
    }

    /// Throughput check: `cargo test --release -p tierfs-core -- --ignored --nocapture writes_2gib`.
    #[test]
    #[ignore]
    fn writes_2gib_quickly() {
        let start = std::time::Instant::now();
        let (_dir, _path, s) = write(&spec(Layout::Dit, 2 << 30, SynthDtype::BF16));
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "{} bytes in {secs:.2}s = {:.2} GB/s",
            s.bytes,
            s.bytes as f64 / secs / 1e9
        );
        let start = std::time::Instant::now();
        write_data(
            &mut io::sink(),
            &spec(Layout::Dit, 0, SynthDtype::BF16),
            s.bytes,
        )
        .unwrap();
        let secs = start.elapsed().as_secs_f64();
        eprintln!("generation alone: {:.2} GB/s", s.bytes as f64 / secs / 1e9);
    }
}
