//! The compressed RAM tier's codec, measured: per dtype, the ratio (frame bytes / chunk bytes),
//! the entropy of the plane that holds the exponent, and encode and decode speed on one core
//! (GB/s of chunk bytes), against a `memcpy` of the same chunks into the same buffer,
//! alternating the two in one process. Then the candidate coders on the bf16 planes.
//!
//! ```sh
//! cargo run --release -p tierfs-core --example compress_bench -- [MIB] [ROUNDS] [FILE.safetensors ...]
//! ```
//!
//! `MIB` (default 64) of synthetic weights per dtype (`tierfs_core::weights`: each 8 MiB tensor
//! with its own deviation, log-uniform in [0.005, 0.08]), cut into 4 MiB chunks as the cache's
//! chunk plan cuts large tensors; `ROUNDS` (default 5) alternations, the best of each side is
//! printed. Any `.safetensors` files given are measured too, per dtype of their tensors.

use std::hint::black_box;
use std::time::Instant;

use tierfs_core::compress::{CompressConfig, Decoder, Encoded, Encoder, PlaneLayout};
use tierfs_core::weights::{WeightDtype, WeightGen};

const CHUNK: usize = 4 << 20;
const TENSOR: usize = 8 << 20;

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Shannon entropy in bits per byte.
fn entropy(bytes: impl Iterator<Item = u8>) -> f64 {
    let mut counts = [0u64; 256];
    let mut n = 0u64;
    for b in bytes {
        counts[usize::from(b)] += 1;
        n += 1;
    }
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n as f64;
            -p * p.log2()
        })
        .sum()
}

/// The entropy of the plane that holds the exponent (the top byte of each element, after the
/// codec's sign rotation where the layout has one), per chunk as the codec codes it, averaged
/// over the chunks.
fn exponent_entropy(layout: PlaneLayout, data: &[u8]) -> f64 {
    let chunks = data.chunks(CHUNK);
    let n = chunks.len().max(1) as f64;
    chunks
        .map(|c| chunk_exponent_entropy(layout, c))
        .sum::<f64>()
        / n
}

fn chunk_exponent_entropy(layout: PlaneLayout, data: &[u8]) -> f64 {
    let w = layout.width();
    let top = data
        .chunks_exact(w)
        .map(|e| match (w, layout.rotate_sign()) {
            (2, true) => u16::from_le_bytes([e[0], e[1]])
                .rotate_left(1)
                .to_le_bytes()[1],
            (4, true) => u32::from_le_bytes([e[0], e[1], e[2], e[3]])
                .rotate_left(1)
                .to_le_bytes()[3],
            _ => e[w - 1],
        });
    entropy(top)
}

struct Row {
    name: String,
    bytes: usize,
    ratio: f64,
    raw_chunks: usize,
    chunks: usize,
    exp_entropy: f64,
    encode: f64,
    decode: f64,
    memcpy: f64,
}

fn measure(
    name: &str,
    layout: PlaneLayout,
    config: CompressConfig,
    data: &[u8],
    rounds: usize,
) -> Row {
    let mut enc = Encoder::new(config).unwrap_or_else(|e| panic!("{e}"));
    let mut dec = Decoder::new().unwrap_or_else(|e| panic!("{e}"));
    let mut frames: Vec<Option<Vec<u8>>> = Vec::new();
    let mut encode_best = f64::MAX;
    for round in 0..2 {
        let t = Instant::now();
        let mut out = Vec::new();
        for chunk in data.chunks(CHUNK) {
            let got = enc
                .encode(layout, 0, chunk, &mut out)
                .unwrap_or_else(|e| panic!("{e}"));
            if round == 0 {
                frames.push(match got {
                    Encoded::Frame(_) => Some(out.clone()),
                    Encoded::Raw => None,
                });
            }
        }
        encode_best = encode_best.min(t.elapsed().as_secs_f64());
    }
    let stored: usize = frames
        .iter()
        .zip(data.chunks(CHUNK))
        .map(|(f, c)| f.as_ref().map_or(c.len(), Vec::len))
        .sum();
    let mut out = vec![0u8; CHUNK];
    let (mut decode_best, mut memcpy_best) = (f64::MAX, f64::MAX);
    for _ in 0..rounds {
        let t = Instant::now();
        for chunk in data.chunks(CHUNK) {
            out[..chunk.len()].copy_from_slice(black_box(chunk));
            black_box(&out);
        }
        memcpy_best = memcpy_best.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for (frame, chunk) in frames.iter().zip(data.chunks(CHUNK)) {
            let dst = &mut out[..chunk.len()];
            match frame {
                Some(f) => dec
                    .decode(black_box(f), dst)
                    .unwrap_or_else(|e| panic!("{e}")),
                None => dst.copy_from_slice(black_box(chunk)),
            }
            black_box(&out);
        }
        decode_best = decode_best.min(t.elapsed().as_secs_f64());
    }
    // Bit-exact, once more outside the timing.
    for (frame, chunk) in frames.iter().zip(data.chunks(CHUNK)) {
        if let Some(f) = frame {
            dec.decode(f, &mut out[..chunk.len()])
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(&out[..chunk.len()] == chunk, "{name}: decoded bytes differ");
        }
    }
    Row {
        name: name.to_string(),
        bytes: data.len(),
        ratio: stored as f64 / data.len() as f64,
        raw_chunks: frames.iter().filter(|f| f.is_none()).count(),
        chunks: frames.len(),
        exp_entropy: exponent_entropy(layout, data),
        encode: gbps(data.len(), encode_best),
        decode: gbps(data.len(), decode_best),
        memcpy: gbps(data.len(), memcpy_best),
    }
}

fn print_rows(rows: &[Row]) {
    println!("| data | MiB | ratio | chunks kept raw | exponent plane (bits/byte) | encode GB/s | decode GB/s | memcpy GB/s | decode / memcpy |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.3} | {}/{} | {:.3} | {:.2} | {:.2} | {:.1} | {:.2} |",
            r.name,
            r.bytes >> 20,
            r.ratio,
            r.raw_chunks,
            r.chunks,
            r.exp_entropy,
            r.encode,
            r.decode,
            r.memcpy,
            r.decode / r.memcpy
        );
    }
}

/// bf16 chunks split into the codec's two planes (sign rotated), one pair per chunk.
fn bf16_planes(data: &[u8]) -> Vec<[Vec<u8>; 2]> {
    data.chunks(CHUNK)
        .map(|c| {
            let (mut lo, mut hi) = (Vec::new(), Vec::new());
            for e in c.chunks_exact(2) {
                let [a, b] = u16::from_le_bytes([e[0], e[1]])
                    .rotate_left(1)
                    .to_le_bytes();
                lo.push(a);
                hi.push(b);
            }
            [lo, hi]
        })
        .collect()
}

type Codec = (
    &'static str,
    Box<dyn Fn(&[u8]) -> Vec<u8>>,
    Box<dyn FnMut(&[u8], &mut [u8]) -> usize>,
);

/// Each candidate coder on the two bf16 planes: each plane coded, or raw where that is
/// smaller; ratio of the chunk, and decode speed in GB/s of bf16 chunk bytes (plane decoding
/// only, without the merge and the checksum the codec adds).
fn candidates(data: &[u8], rounds: usize) {
    let planes = bf16_planes(data);
    // One decoding context per zstd row, as the codec keeps one per thread.
    let ctx = || zstd::bulk::Decompressor::new().unwrap_or_else(|e| panic!("{e}"));
    let zstd_dec = |mut c: zstd::bulk::Decompressor<'static>| {
        move |s: &[u8], d: &mut [u8]| {
            c.decompress_to_buffer(s, d)
                .unwrap_or_else(|e| panic!("{e}"))
        }
    };
    let mut zctx = zstd::bulk::Decompressor::new().unwrap_or_else(|e| panic!("{e}"));
    let mut zctx3 = zstd::bulk::Decompressor::new().unwrap_or_else(|e| panic!("{e}"));
    let mut ru = ruzstd::decoding::FrameDecoder::new();
    let codecs: Vec<Codec> = vec![
        (
            "zstd level 1 (libzstd)",
            Box::new(|p| zstd::bulk::compress(p, 1).unwrap_or_default()),
            Box::new(move |s, d| {
                zctx.decompress_to_buffer(s, d)
                    .unwrap_or_else(|e| panic!("{e}"))
            }),
        ),
        (
            "zstd level 1, min match 7 (libzstd)",
            Box::new(|p| {
                let mut c = zstd::bulk::Compressor::new(1).unwrap_or_else(|e| panic!("{e}"));
                c.set_parameter(zstd::stream::raw::CParameter::MinMatch(7))
                    .unwrap_or_else(|e| panic!("{e}"));
                c.compress(p).unwrap_or_default()
            }),
            Box::new(zstd_dec(ctx())),
        ),
        (
            "zstd level 1, min match 7, window 1 KiB (libzstd)",
            Box::new(|p| {
                let mut c = zstd::bulk::Compressor::new(1).unwrap_or_else(|e| panic!("{e}"));
                c.set_parameter(zstd::stream::raw::CParameter::MinMatch(7))
                    .unwrap_or_else(|e| panic!("{e}"));
                c.set_parameter(zstd::stream::raw::CParameter::WindowLog(10))
                    .unwrap_or_else(|e| panic!("{e}"));
                c.compress(p).unwrap_or_default()
            }),
            Box::new(zstd_dec(ctx())),
        ),
        (
            "zstd level 3 (libzstd)",
            Box::new(|p| zstd::bulk::compress(p, 3).unwrap_or_default()),
            Box::new(move |s, d| {
                zctx3
                    .decompress_to_buffer(s, d)
                    .unwrap_or_else(|e| panic!("{e}"))
            }),
        ),
        (
            "zstd level 9 (libzstd)",
            Box::new(|p| zstd::bulk::compress(p, 9).unwrap_or_default()),
            Box::new(zstd_dec(ctx())),
        ),
        (
            "zstd level 1, decoded by ruzstd (pure Rust)",
            Box::new(|p| zstd::bulk::compress(p, 1).unwrap_or_default()),
            Box::new(move |s, d| ru.decode_all(s, d).unwrap_or_else(|e| panic!("{e}"))),
        ),
        (
            "lz4_flex (no entropy stage)",
            Box::new(lz4_flex::block::compress),
            Box::new(|s, d| {
                lz4_flex::block::decompress_into(s, d).unwrap_or_else(|e| panic!("{e}"))
            }),
        ),
    ];
    println!("| coder | ratio | exponent plane coded/raw | mantissa plane coded/raw | plane decode GB/s of bf16 |");
    println!("|---|---|---|---|---|");
    for (name, compress, mut decompress) in codecs {
        let coded: Vec<[Option<Vec<u8>>; 2]> = planes
            .iter()
            .map(|pair| {
                [0, 1].map(|i| {
                    let c = compress(&pair[i]);
                    (c.len() < pair[i].len()).then_some(c)
                })
            })
            .collect();
        let stored: usize = coded
            .iter()
            .zip(&planes)
            .map(|(c, p)| {
                (0..2)
                    .map(|i| c[i].as_ref().map_or(p[i].len(), Vec::len))
                    .sum::<usize>()
            })
            .sum();
        let share = |i: usize| {
            let c: usize = coded
                .iter()
                .zip(&planes)
                .map(|(c, p)| c[i].as_ref().map_or(p[i].len(), Vec::len))
                .sum();
            let r: usize = planes.iter().map(|p| p[i].len()).sum();
            c as f64 / r as f64
        };
        let mut out = vec![0u8; CHUNK / 2];
        let mut best = f64::MAX;
        for _ in 0..rounds {
            let t = Instant::now();
            for (c, p) in coded.iter().zip(&planes) {
                for i in 0..2 {
                    let dst = &mut out[..p[i].len()];
                    match &c[i] {
                        Some(f) => {
                            let n = decompress(black_box(f), dst);
                            assert_eq!(n, p[i].len());
                        }
                        None => dst.copy_from_slice(black_box(&p[i])),
                    }
                    black_box(&out);
                }
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:.2} |",
            stored as f64 / data.len() as f64,
            share(1),
            share(0),
            gbps(data.len(), best)
        );
    }
}

fn real_file(path: &str, rounds: usize, rows: &mut Vec<Row>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let st =
        safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut by_dtype: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
    for (_, t) in st.tensors() {
        by_dtype
            .entry(format!("{:?}", t.dtype()))
            .or_default()
            .extend_from_slice(t.data());
    }
    for (dtype, data) in by_dtype {
        let layout = PlaneLayout::for_dtype(&dtype);
        rows.push(measure(
            &format!("{path} {dtype}"),
            layout,
            CompressConfig::default(),
            &data,
            rounds,
        ));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(64);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let bytes = mib << 20;
    let mut rows = Vec::new();
    let mut bf16 = Vec::new();
    for dtype in WeightDtype::ALL {
        let data = WeightGen::new(1).tensors(dtype, bytes, TENSOR);
        let layout = PlaneLayout::for_dtype(dtype.safetensors_name());
        rows.push(measure(
            dtype.safetensors_name(),
            layout,
            CompressConfig::default(),
            &data,
            rounds,
        ));
        if dtype == WeightDtype::BF16 {
            bf16 = data;
        }
    }
    let unrotated = PlaneLayout::new(2, false).unwrap_or(PlaneLayout::BYTES);
    rows.push(measure(
        "BF16, sign not rotated",
        unrotated,
        CompressConfig::default(),
        &bf16,
        rounds,
    ));
    rows.push(measure(
        "BF16, one plane (no split)",
        PlaneLayout::BYTES,
        CompressConfig::default(),
        &bf16,
        rounds,
    ));
    for level in [3, 9] {
        let config = CompressConfig {
            level,
            ..CompressConfig::default()
        };
        rows.push(measure(
            &format!("BF16, zstd level {level}"),
            PlaneLayout::BF16,
            config,
            &bf16,
            rounds,
        ));
    }
    let random: Vec<u8> = WeightGen::new(2)
        .tensors(WeightDtype::F32, bytes, TENSOR)
        .chunks_exact(4)
        .flat_map(|c| [c[0], c[1]])
        .collect();
    rows.push(measure(
        "random bytes (fp32 low halves) as BF16",
        PlaneLayout::BF16,
        CompressConfig::default(),
        &random,
        rounds,
    ));
    for path in args.iter().skip(2) {
        real_file(path, rounds, &mut rows);
    }
    print_rows(&rows);
    println!();
    candidates(&bf16, rounds);
}
