//! The frame format of a compressed chunk, and the checks that make a frame safe to decode.
//!
//! A frame is a fixed [`HEADER_BYTES`]-byte header, then the *lead* bytes (before the chunk's
//! first whole element, as they are), the planes in order (each raw or a zstd frame), then the
//! *trail* bytes (after the last whole element, as they are). All integers little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | [`MAGIC`] |
//! | 4 | 1 | [`VERSION`] |
//! | 5 | 1 | element width: 1, 2 or 4 (the number of planes) |
//! | 6 | 1 | 1 if elements are rotated left one bit before the split, else 0 |
//! | 7 | 1 | lead bytes, `< width` |
//! | 8 | 1 | trail bytes, `< width` |
//! | 9 | 4 | each plane's [`PlaneMode`]; 0 past the width |
//! | 13 | 3 | zero |
//! | 16 | 8 | original length in bytes |
//! | 24 | 8 | xxh3-64 of the original bytes |
//! | 32 | 16 | each plane's stored length (`u32`); 0 past the width |
//!
//! [`FrameInfo::parse`] accepts a header only if every field is in range and the lengths add up
//! to the frame's length exactly: a raw plane is as long as the element count, a coded one
//! shorter, and `lead + width × elements + trail` is the original length.

use super::{CompressError, PlaneLayout};

/// The first bytes of every frame.
pub const MAGIC: [u8; 4] = *b"TFzc";
/// The format version this build writes and reads.
pub const VERSION: u8 = 1;
/// Bytes of the header.
pub const HEADER_BYTES: usize = 48;
/// Most planes of a frame (fp32).
pub const MAX_PLANES: usize = 4;

/// How one plane is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaneMode {
    /// The plane's bytes as they are.
    Raw,
    /// A zstd frame that decodes to the plane.
    Zstd,
}

impl PlaneMode {
    fn code(self) -> u8 {
        match self {
            PlaneMode::Raw => 0,
            PlaneMode::Zstd => 1,
        }
    }

    fn from_code(code: u8) -> Option<PlaneMode> {
        match code {
            0 => Some(PlaneMode::Raw),
            1 => Some(PlaneMode::Zstd),
            _ => None,
        }
    }
}

/// A checked frame header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameInfo {
    /// How the elements were split.
    pub layout: PlaneLayout,
    /// Bytes before the first whole element.
    pub lead: usize,
    /// Bytes after the last whole element.
    pub trail: usize,
    /// Whole elements, which is each plane's length.
    pub elements: usize,
    /// The original chunk's length.
    pub raw_len: usize,
    /// xxh3-64 of the original bytes.
    pub checksum: u64,
    /// Each plane's mode and stored length; entries past `layout.width()` are `(Raw, 0)`
    /// ([`FrameInfo::planes`] gives the meaningful ones). An array, so that parsing a header
    /// allocates nothing.
    pub plane_table: [(PlaneMode, usize); MAX_PLANES],
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl FrameInfo {
    /// Reads and checks the header of `frame` (the whole frame: its length is checked too).
    pub fn parse(frame: &[u8]) -> Result<FrameInfo, CompressError> {
        let h = frame
            .get(..HEADER_BYTES)
            .ok_or(CompressError::Truncated("shorter than a header"))?;
        if h[0..4] != MAGIC {
            return Err(CompressError::BadMagic);
        }
        if h[4] != VERSION {
            return Err(CompressError::Version(h[4]));
        }
        let rotate = match h[6] {
            0 => false,
            1 => true,
            _ => return Err(CompressError::Corrupt("rotation flag")),
        };
        let layout = PlaneLayout::new(h[5], rotate).ok_or(CompressError::Corrupt("width"))?;
        let width = layout.width();
        let (lead, trail) = (usize::from(h[7]), usize::from(h[8]));
        if lead >= width || trail >= width {
            return Err(CompressError::Corrupt("lead or trail not under the width"));
        }
        if h[13..16] != [0, 0, 0] {
            return Err(CompressError::Corrupt("reserved bytes"));
        }
        let raw_len = usize::try_from(u64_at(h, 16))
            .map_err(|_| CompressError::Corrupt("original length"))?;
        let checksum = u64_at(h, 24);
        let body = raw_len
            .checked_sub(lead + trail)
            .ok_or(CompressError::Corrupt(
                "original length under lead and trail",
            ))?;
        if body % width != 0 {
            return Err(CompressError::Corrupt("original length not whole elements"));
        }
        let elements = body / width;
        let mut plane_table = [(PlaneMode::Raw, 0); MAX_PLANES];
        let mut total = HEADER_BYTES + lead + trail;
        for i in 0..MAX_PLANES {
            let mode =
                PlaneMode::from_code(h[9 + i]).ok_or(CompressError::Corrupt("plane mode"))?;
            let len = u32_at(h, 32 + 4 * i) as usize;
            if i >= width {
                if h[9 + i] != 0 || len != 0 {
                    return Err(CompressError::Corrupt("plane past the width"));
                }
                continue;
            }
            match mode {
                PlaneMode::Raw if len != elements => {
                    return Err(CompressError::Corrupt("raw plane length"));
                }
                PlaneMode::Zstd if len >= elements || len == 0 => {
                    return Err(CompressError::Corrupt("coded plane length"));
                }
                _ => {}
            }
            total = total
                .checked_add(len)
                .ok_or(CompressError::Corrupt("lengths overflow"))?;
            plane_table[i] = (mode, len);
        }
        if total > frame.len() {
            return Err(CompressError::Truncated("shorter than its planes"));
        }
        if total < frame.len() {
            return Err(CompressError::Corrupt("bytes after the last plane"));
        }
        Ok(FrameInfo {
            layout,
            lead,
            trail,
            elements,
            raw_len,
            checksum,
            plane_table,
        })
    }

    /// Each plane's mode and stored length, `layout.width()` of them.
    pub fn planes(&self) -> &[(PlaneMode, usize)] {
        &self.plane_table[..self.layout.width().min(MAX_PLANES)]
    }

    /// Writes this header into `out[..HEADER_BYTES]`.
    pub(crate) fn write(&self, out: &mut [u8]) {
        let h = &mut out[..HEADER_BYTES];
        h.fill(0);
        h[0..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        h[5] = self.layout.width() as u8;
        h[6] = u8::from(self.layout.rotate_sign());
        h[7] = self.lead as u8;
        h[8] = self.trail as u8;
        h[16..24].copy_from_slice(&(self.raw_len as u64).to_le_bytes());
        h[24..32].copy_from_slice(&self.checksum.to_le_bytes());
        for (i, &(mode, len)) in self.planes().iter().enumerate() {
            h[9 + i] = mode.code();
            h[32 + 4 * i..36 + 4 * i].copy_from_slice(&(len as u32).to_le_bytes());
        }
    }
}
