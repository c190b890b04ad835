//! Encoding a chunk into a frame and decoding a frame into the caller's buffer.
//!
//! Both sides keep their zstd context and scratch planes between calls, so that a decode
//! allocates nothing once its scratch has grown to the largest chunk; keep one [`Decoder`] per
//! thread. The frame format and its checks are in `frame.rs`.

use xxhash_rust::xxh3::xxh3_64;

use super::frame::{FrameInfo, PlaneMode, HEADER_BYTES, MAX_PLANES};
use super::{planes, CompressConfig, CompressError, PlaneLayout};

/// What [`Encoder::encode`] did with a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoded {
    /// The output holds a frame of this many bytes.
    Frame(usize),
    /// Not worth it: the chunk does not gain the configured margin; keep it raw. The output is
    /// empty.
    Raw,
}

/// Encodes chunks; keeps a zstd context and the split planes between calls.
pub struct Encoder {
    config: CompressConfig,
    cctx: zstd::bulk::Compressor<'static>,
    planes: Vec<u8>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Encoder {
    /// An encoder with `config`.
    pub fn new(config: CompressConfig) -> Result<Encoder, CompressError> {
        let cctx = zstd::bulk::Compressor::new(config.level)
            .map_err(|e| CompressError::Zstd(e.to_string()))?;
        Ok(Encoder {
            config,
            cctx,
            planes: Vec::new(),
        })
    }

    /// The encoder's tuning.
    pub fn config(&self) -> CompressConfig {
        self.config
    }

    /// Encodes `chunk`, whose first byte is at offset `phase` inside its element (see the
    /// module docs), split by `layout`, into `out` (cleared first). Returns
    /// [`Encoded::Raw`], with `out` empty, when the frame would not save the configured margin.
    pub fn encode(
        &mut self,
        layout: PlaneLayout,
        phase: usize,
        chunk: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Encoded, CompressError> {
        let len = self.encode_frame(layout, phase, chunk, out)?;
        if !self.config.worth_it(len, chunk.len()) {
            out.clear();
            return Ok(Encoded::Raw);
        }
        Ok(Encoded::Frame(len))
    }

    /// Like [`Encoder::encode`], but writes the frame whatever it saves, even when it is
    /// larger than the chunk; returns its length.
    pub fn encode_frame(
        &mut self,
        layout: PlaneLayout,
        phase: usize,
        chunk: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, CompressError> {
        out.clear();
        let width = layout.width();
        let lead = layout.lead(phase).min(chunk.len());
        let elements = (chunk.len() - lead) / width;
        let body_end = lead + elements * width;
        if u32::try_from(elements).is_err() {
            return Err(CompressError::TooLarge(chunk.len()));
        }
        let body = &chunk[lead..body_end];
        self.planes.clear();
        self.planes.resize(body.len(), 0);
        planes::split(layout, body, &mut self.planes);

        out.resize(HEADER_BYTES, 0);
        out.extend_from_slice(&chunk[..lead]);
        // No element: every plane is empty and raw.
        let mut modes = [(PlaneMode::Raw, 0); MAX_PLANES];
        for (slot, plane) in modes
            .iter_mut()
            .zip(self.planes.chunks_exact(elements.max(1)).take(width))
        {
            let pos = out.len();
            let mut mode = (PlaneMode::Raw, elements);
            if elements > 1 {
                // Room for one byte less than the plane: a frame that does not fit is no gain.
                out.resize(pos + elements - 1, 0);
                if let Ok(n) = self.cctx.compress_to_buffer(plane, &mut out[pos..]) {
                    if n > 0 && n < elements {
                        mode = (PlaneMode::Zstd, n);
                    }
                }
            }
            match mode.0 {
                PlaneMode::Zstd => out.truncate(pos + mode.1),
                PlaneMode::Raw => {
                    out.truncate(pos);
                    out.extend_from_slice(plane);
                }
            }
            *slot = mode;
        }
        out.extend_from_slice(&chunk[body_end..]);
        let info = FrameInfo {
            layout,
            lead,
            trail: chunk.len() - body_end,
            elements,
            raw_len: chunk.len(),
            checksum: xxh3_64(chunk),
            plane_table: modes,
        };
        info.write(out);
        Ok(out.len())
    }
}

/// Decodes frames; keeps a zstd context and the scratch of coded planes between calls.
pub struct Decoder {
    dctx: zstd::bulk::Decompressor<'static>,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("scratch", &self.scratch.len())
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder.
    pub fn new() -> Result<Decoder, CompressError> {
        let dctx =
            zstd::bulk::Decompressor::new().map_err(|e| CompressError::Zstd(e.to_string()))?;
        Ok(Decoder {
            dctx,
            scratch: Vec::new(),
        })
    }

    /// Decodes `frame` into `out`, which must be exactly the original chunk's length
    /// ([`FrameInfo::parse`] tells it). On `Ok`, `out` holds the original bytes, checked
    /// against their checksum; on error its content is unspecified.
    pub fn decode(&mut self, frame: &[u8], out: &mut [u8]) -> Result<(), CompressError> {
        let info = FrameInfo::parse(frame)?;
        if out.len() != info.raw_len {
            return Err(CompressError::OutputSize {
                given: out.len(),
                expected: info.raw_len as u64,
            });
        }
        let n = info.elements;
        let coded = info
            .planes()
            .iter()
            .filter(|(m, _)| *m == PlaneMode::Zstd)
            .count();
        if self.scratch.len() < coded * n {
            self.scratch.resize(coded * n, 0);
        }
        // `FrameInfo::parse` checked that the header, lead, planes and trail tile the frame and
        // that lead + width × n + trail is `out.len()`: the slicing below stays in bounds.
        let mut pos = HEADER_BYTES;
        out[..info.lead].copy_from_slice(&frame[pos..pos + info.lead]);
        pos += info.lead;
        let mut starts = [0usize; MAX_PLANES];
        let mut k = 0;
        for (i, &(mode, len)) in info.planes().iter().enumerate() {
            starts[i] = pos;
            if mode == PlaneMode::Zstd {
                let dst = &mut self.scratch[k * n..(k + 1) * n];
                let got = self
                    .dctx
                    .decompress_to_buffer(&frame[pos..pos + len], dst)
                    .map_err(|e| CompressError::Plane {
                        plane: i,
                        reason: e.to_string(),
                    })?;
                if got != n {
                    return Err(CompressError::Plane {
                        plane: i,
                        reason: format!("{got} bytes instead of {n}"),
                    });
                }
                k += 1;
            }
            pos += len;
        }
        let mut slices: [&[u8]; MAX_PLANES] = [&[]; MAX_PLANES];
        let mut k = 0;
        for (i, &(mode, _)) in info.planes().iter().enumerate() {
            slices[i] = match mode {
                PlaneMode::Raw => &frame[starts[i]..starts[i] + n],
                PlaneMode::Zstd => {
                    k += 1;
                    &self.scratch[(k - 1) * n..k * n]
                }
            };
        }
        let width = info.layout.width();
        let body_end = info.lead + n * width;
        planes::merge(info.layout, &slices[..width], &mut out[info.lead..body_end]);
        out[body_end..].copy_from_slice(&frame[pos..]);
        if xxh3_64(out) != info.checksum {
            return Err(CompressError::Checksum);
        }
        Ok(())
    }
}
