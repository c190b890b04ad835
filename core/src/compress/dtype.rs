//! What a tensor's dtype gives the codec: the element width (how many byte planes) and whether
//! the sign bit is rotated next to the mantissa.
//!
//! The layout only steers the ratio: any layout round-trips any bytes, so a wrong or unknown
//! dtype costs compression, never correctness.

/// How the codec splits a chunk's elements into byte planes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlaneLayout {
    width: u8,
    rotate_sign: bool,
}

impl PlaneLayout {
    /// One plane, the bytes as they are: fp8, integers, quantized blocks, unknown dtypes.
    pub const BYTES: PlaneLayout = PlaneLayout {
        width: 1,
        rotate_sign: false,
    };
    /// bf16: two planes, the sign rotated below the mantissa so that the high byte is the whole
    /// 8-bit exponent.
    pub const BF16: PlaneLayout = PlaneLayout {
        width: 2,
        rotate_sign: true,
    };
    /// fp16: two planes as stored (its 5-bit exponent shares a byte with mantissa bits
    /// either way; rotating gains nothing).
    pub const F16: PlaneLayout = PlaneLayout {
        width: 2,
        rotate_sign: false,
    };
    /// fp32: four planes, the sign rotated below the mantissa so that the top byte is the
    /// whole 8-bit exponent.
    pub const F32: PlaneLayout = PlaneLayout {
        width: 4,
        rotate_sign: true,
    };

    /// The layout for a dtype as written in safetensors headers (`BF16`, `F16`, `F32`,
    /// `F8_E4M3`, …, case-insensitive; GGUF's `F16`/`BF16`/`F32` names are the same). Any other
    /// dtype, fp8 included, is one plane of bytes.
    pub fn for_dtype(dtype: &str) -> PlaneLayout {
        match dtype.to_ascii_uppercase().as_str() {
            "BF16" => PlaneLayout::BF16,
            "F16" | "FP16" => PlaneLayout::F16,
            "F32" | "FP32" => PlaneLayout::F32,
            _ => PlaneLayout::BYTES,
        }
    }

    /// A layout from its parts, as a frame header stores them; `None` for a width other than
    /// 1, 2 or 4, or a rotation of 1-byte elements.
    pub fn new(width: u8, rotate_sign: bool) -> Option<PlaneLayout> {
        match (width, rotate_sign) {
            (1, false) | (2, _) | (4, _) => Some(PlaneLayout { width, rotate_sign }),
            _ => None,
        }
    }

    /// Bytes per element, which is the number of planes.
    pub fn width(self) -> usize {
        usize::from(self.width)
    }

    /// Whether each element is rotated left by one bit before the split (sign bit to bit 0).
    pub fn rotate_sign(self) -> bool {
        self.rotate_sign
    }

    /// How many bytes of a chunk starting at `phase` (the chunk's first byte's offset inside
    /// its element) come before its first whole element.
    pub fn lead(self, phase: usize) -> usize {
        let w = self.width();
        (w - phase % w) % w
    }
}
