//! Writes a safetensors checkpoint of synthetic bf16 weights that follow a trained model's
//! distribution (`tierfs_core::weights`: each tensor normal with its own deviation, log-uniform
//! in [0.005, 0.08], rounded to nearest even), laid out as a DiT (dim 1024, ffn 4096) of as many
//! blocks as reach `MIB`: the models of `tests/bench/compress_tier.py`.
//!
//! ```sh
//! cargo run --release -p tierfs-core --example weights_file -- OUT.safetensors MIB [SEED]
//! ```
//!
//! Prints the exponent plane's entropy (bits per byte, after the codec's sign rotation) of the
//! whole file's weights.

use std::io::{BufWriter, Write};

use tierfs_core::weights::{WeightDtype, WeightGen};

const DIM: u64 = 1024;
const FFN: u64 = 4096;

/// The tensors of block `n`: (name, shape).
fn block(n: u64) -> Vec<(String, Vec<u64>)> {
    vec![
        (format!("blocks.{n}.attn.qkv.weight"), vec![3 * DIM, DIM]),
        (format!("blocks.{n}.attn.proj.weight"), vec![DIM, DIM]),
        (format!("blocks.{n}.mlp.fc1.weight"), vec![FFN, DIM]),
        (format!("blocks.{n}.mlp.fc2.weight"), vec![DIM, FFN]),
        (format!("blocks.{n}.norm1.weight"), vec![DIM]),
        (format!("blocks.{n}.norm2.weight"), vec![DIM]),
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(out), Some(mib)) = (args.first(), args.get(1)) else {
        return Err("usage: weights_file OUT.safetensors MIB [SEED]".into());
    };
    let target = mib.parse::<u64>()? << 20;
    let seed = args.get(2).map_or(Ok(1), |s| s.parse::<u64>())?;
    let mut tensors = Vec::new();
    let mut bytes = 0;
    let mut n = 0;
    while bytes < target {
        for (name, shape) in block(n) {
            let len = shape.iter().product::<u64>() * 2;
            tensors.push((name, shape, bytes, bytes + len));
            bytes += len;
        }
        n += 1;
    }
    let mut header = serde_json::Map::new();
    for (name, shape, start, end) in &tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, end]}),
        );
    }
    let mut text = serde_json::to_string(&header)?;
    while (8 + text.len()) % 8 != 0 {
        text.push(' ');
    }
    let mut file = BufWriter::with_capacity(8 << 20, std::fs::File::create(out)?);
    file.write_all(&(text.len() as u64).to_le_bytes())?;
    file.write_all(text.as_bytes())?;
    let mut gen = WeightGen::new(seed);
    let mut counts = [0u64; 256];
    let mut buf = Vec::new();
    for (_, _, start, end) in &tensors {
        buf.resize((end - start) as usize, 0);
        let std = gen.tensor_std();
        gen.fill(WeightDtype::BF16, std, &mut buf);
        for e in buf.chunks_exact(2) {
            // The exponent byte after the sign is rotated below the mantissa.
            let v = u16::from_le_bytes([e[0], e[1]]).rotate_left(1);
            counts[usize::from((v >> 8) as u8)] += 1;
        }
        file.write_all(&buf)?;
    }
    file.flush()?;
    let total: u64 = counts.iter().sum();
    let entropy: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / total as f64;
            -p * p.log2()
        })
        .sum();
    println!(
        "{out}: {} blocks, {} tensors, {:.1} MiB of bf16, exponent plane entropy {entropy:.3} bits/byte",
        n,
        tensors.len(),
        bytes as f64 / f64::from(1 << 20)
    );
    Ok(())
}
