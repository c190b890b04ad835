//! Synthetic weights that follow a trained model's value distribution, for measuring the
//! compressed RAM tier ([`crate::compress`]) without real checkpoints.
//!
//! # Contract
//!
//! [`WeightGen`] draws each tensor's standard deviation log-uniform in [`STD_RANGE`] (a
//! geometric mean of 0.02, the per-layer scales of trained transformers), then its values from a
//! zero-mean normal distribution of that deviation, and encodes them with round-to-nearest-even
//! as bf16, fp16, fp32, fp8 e4m3 or fp8 e5m2 (little-endian). fp8 values are scaled per tensor
//! as fp8 checkpoints store them: [`FP8_AMAX_SIGMAS`] deviations map to the format's largest
//! value, so that the values fill the format's range instead of sinking into its subnormals. The output depends only on the
//! seed: identical seeds give identical bytes on every platform and with every dependency
//! version.
//!
//! The values are drawn with SplitMix64 and the Box–Muller transform, written here as in
//! [`crate::synth`]: a random-number crate does not promise the same stream across its
//! versions, and the measurements must stay reproducible. bf16 and fp16 rounding comes from
//! the `half` crate; fp8 rounding picks the nearest of the format's values (ties to the even
//! code), which is exact by construction.

use half::{bf16, f16};

/// Range of the per-tensor standard deviations, drawn log-uniform: geometric mean 0.02, a
/// factor 4 either way (the exponent entropy it gives:
/// [PERFORMANCE.md](../../docs/PERFORMANCE.md#compressed-ram-tier-the-codec)).
pub const STD_RANGE: (f64, f64) = (0.005, 0.08);

/// fp8 values are scaled so that this many deviations are the format's largest value: the
/// largest of a million normal draws is about 5 deviations, and fp8 checkpoints scale each
/// tensor by its largest magnitude.
pub const FP8_AMAX_SIGMAS: f64 = 5.0;

/// The element encodings [`WeightGen`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    BF16,
    F16,
    F32,
    /// fp8 with 4 exponent bits, 3 mantissa bits, no infinities (`F8_E4M3`).
    F8E4M3,
    /// fp8 with 5 exponent bits, 2 mantissa bits (`F8_E5M2`).
    F8E5M2,
}

impl WeightDtype {
    /// Every dtype, in a stable order.
    pub const ALL: [WeightDtype; 5] = [
        WeightDtype::BF16,
        WeightDtype::F16,
        WeightDtype::F32,
        WeightDtype::F8E4M3,
        WeightDtype::F8E5M2,
    ];

    /// Bytes per element.
    pub fn width(self) -> usize {
        match self {
            WeightDtype::BF16 | WeightDtype::F16 => 2,
            WeightDtype::F32 => 4,
            WeightDtype::F8E4M3 | WeightDtype::F8E5M2 => 1,
        }
    }

    /// The dtype's name in safetensors headers.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            WeightDtype::BF16 => "BF16",
            WeightDtype::F16 => "F16",
            WeightDtype::F32 => "F32",
            WeightDtype::F8E4M3 => "F8_E4M3",
            WeightDtype::F8E5M2 => "F8_E5M2",
        }
    }
}

/// A deterministic stream of synthetic weights.
#[derive(Debug, Clone)]
pub struct WeightGen {
    state: u64,
    e4m3: Vec<f32>,
    e5m2: Vec<f32>,
}

impl WeightGen {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> WeightGen {
        WeightGen {
            state: seed,
            e4m3: fp8_magnitudes(4, 3, 0x7E),
            e5m2: fp8_magnitudes(5, 2, 0x7B),
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// A standard deviation drawn log-uniform in [`STD_RANGE`].
    pub fn tensor_std(&mut self) -> f64 {
        let (lo, hi) = STD_RANGE;
        (lo.ln() + self.uniform() * (hi.ln() - lo.ln())).exp()
    }

    /// Fills `out` with normal values of deviation `std` encoded as `dtype` (fp8: scaled to
    /// the format, see the module docs); trailing bytes short of a whole element are zero.
    pub fn fill(&mut self, dtype: WeightDtype, std: f64, out: &mut [u8]) {
        let w = dtype.width();
        let mut pair: Option<f64> = None;
        let whole = out.len() / w * w;
        let scale = match dtype {
            WeightDtype::F8E4M3 => f64::from(E4M3_MAX) / FP8_AMAX_SIGMAS,
            WeightDtype::F8E5M2 => f64::from(E5M2_MAX) / FP8_AMAX_SIGMAS,
            _ => std,
        };
        let (body, tail) = out.split_at_mut(whole);
        tail.fill(0);
        for e in body.chunks_exact_mut(w) {
            let z = match pair.take() {
                Some(z) => z,
                None => {
                    let (r, t) = (
                        (-2.0 * self.uniform().ln()).sqrt(),
                        std::f64::consts::TAU * self.uniform(),
                    );
                    pair = Some(r * t.sin());
                    r * t.cos()
                }
            };
            let x = (z * scale) as f32;
            match dtype {
                WeightDtype::BF16 => e.copy_from_slice(&bf16::from_f32(x).to_le_bytes()),
                WeightDtype::F16 => e.copy_from_slice(&f16::from_f32(x).to_le_bytes()),
                WeightDtype::F32 => e.copy_from_slice(&x.to_le_bytes()),
                WeightDtype::F8E4M3 => e[0] = fp8_encode(&self.e4m3, x),
                WeightDtype::F8E5M2 => e[0] = fp8_encode(&self.e5m2, x),
            }
        }
    }

    /// `bytes` of weights as consecutive tensors of `tensor_bytes` each (the last one
    /// shorter), each with its own deviation.
    pub fn tensors(&mut self, dtype: WeightDtype, bytes: usize, tensor_bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; bytes];
        for t in out.chunks_mut(tensor_bytes.max(1)) {
            let std = self.tensor_std();
            self.fill(dtype, std, t);
        }
        out
    }
}

/// The largest finite fp8 e4m3 value.
const E4M3_MAX: f32 = 448.0;
/// The largest finite fp8 e5m2 value.
const E5M2_MAX: f32 = 57344.0;

/// The magnitudes of the fp8 codes `0..=max_code` (sign bit clear), which increase with the
/// code: subnormals for a zero exponent field, bias `2^(exp_bits-1) - 1`.
fn fp8_magnitudes(exp_bits: u32, man_bits: u32, max_code: u8) -> Vec<f32> {
    let bias = (1i32 << (exp_bits - 1)) - 1;
    (0..=max_code)
        .map(|c| {
            let e = i32::from(c >> man_bits);
            let m = f32::from(c & ((1 << man_bits) - 1)) / (1u32 << man_bits) as f32;
            if e == 0 {
                m * 2f32.powi(1 - bias)
            } else {
                (1.0 + m) * 2f32.powi(e - bias)
            }
        })
        .collect()
}

/// The fp8 code nearest to `x` (ties to the even code), saturating at the largest finite value.
fn fp8_encode(magnitudes: &[f32], x: f32) -> u8 {
    let a = x.abs();
    let i = magnitudes.partition_point(|&m| m < a);
    let code = if i == 0 {
        0
    } else if i >= magnitudes.len() {
        magnitudes.len() - 1
    } else {
        let (below, above) = (a - magnitudes[i - 1], magnitudes[i] - a);
        if below < above || (below == above && (i - 1) % 2 == 0) {
            i - 1
        } else {
            i
        }
    };
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    sign | code as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_tables_match_the_formats() {
        let g = WeightGen::new(0);
        assert_eq!(g.e4m3.last().copied(), Some(E4M3_MAX));
        assert_eq!(g.e4m3[1], 2f32.powi(-9));
        assert_eq!(g.e5m2.last().copied(), Some(E5M2_MAX));
        assert_eq!(g.e5m2[1], 2f32.powi(-16));
        assert!(g.e4m3.windows(2).all(|w| w[0] < w[1]));
        assert!(g.e5m2.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(fp8_encode(&g.e4m3, 1.0), 0x38);
        assert_eq!(fp8_encode(&g.e4m3, -1.0), 0xB8);
        // 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39): ties to the even code.
        assert_eq!(fp8_encode(&g.e4m3, 1.0625), 0x38);
        assert_eq!(fp8_encode(&g.e4m3, 1e6), 0x7E);
        assert_eq!(fp8_encode(&g.e5m2, 1.0), 0x3C);
    }

    #[test]
    fn same_seed_same_bytes_and_the_spread_is_the_drawn_one() {
        let a = WeightGen::new(7).tensors(WeightDtype::BF16, 1 << 16, 1 << 14);
        let b = WeightGen::new(7).tensors(WeightDtype::BF16, 1 << 16, 1 << 14);
        assert_eq!(a, b);
        let mut g = WeightGen::new(3);
        let mut out = vec![0u8; 4 << 16];
        g.fill(WeightDtype::F32, 0.02, &mut out);
        let v: Vec<f64> = out
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.001, "{mean}");
        assert!((var.sqrt() - 0.02).abs() < 0.0005, "{}", var.sqrt());
        for _ in 0..1000 {
            let s = g.tensor_std();
            assert!((STD_RANGE.0..=STD_RANGE.1).contains(&s));
        }
    }
}
