//! What a resident chunk's memory holds: its bytes as read, a compressed frame of them, or both.
//!
//! **Contract.** A [`Body`] never changes once made: the compressed tier (`tier.rs`) changes a
//! chunk's form by putting a new [`super::Chunk`] with another body in the resident set, sharing
//! the old one's bookkeeping ([`super::ChunkMeta`]). A reader is only ever handed a chunk whose
//! body holds the raw bytes ([`Body::raw`]); one holding only a frame is decoded first.
//! - [`Body::Raw`]: the bytes as the source gave them.
//! - [`Body::Frame`]: a frame of the codec ([`crate::compress`]) and nothing else: what the
//!   tier keeps of a chunk no reader is in.
//! - [`Body::Window`]: a frame decoded for readers, the frame kept too, so that dropping the
//!   window (the decoded bytes) costs no encoding.
//!
//! Frames live in their own page-aligned mappings ([`AlignedBytes`]), like chunk buffers, so that
//! dropping one returns its pages at once and the daemon's RSS follows the budget.

use std::sync::Arc;

use crate::source::AlignedBytes;

/// The memory of one resident chunk (see the module docs).
#[derive(Debug)]
pub(super) enum Body {
    Raw(AlignedBytes),
    Frame(Arc<AlignedBytes>),
    Window {
        raw: AlignedBytes,
        frame: Arc<AlignedBytes>,
    },
}

impl Body {
    /// The chunk's bytes, when this body holds them.
    pub(super) fn raw(&self) -> Option<&[u8]> {
        match self {
            Body::Raw(raw) | Body::Window { raw, .. } => Some(raw.as_slice()),
            Body::Frame(_) => None,
        }
    }

    /// The frame, when this body has one.
    pub(super) fn frame(&self) -> Option<&Arc<AlignedBytes>> {
        match self {
            Body::Raw(_) => None,
            Body::Frame(frame) | Body::Window { frame, .. } => Some(frame),
        }
    }

    /// Memory held: what the budget is charged.
    pub(super) fn footprint(&self) -> u64 {
        self.raw_footprint() + self.frame_footprint()
    }

    /// Memory of the raw bytes (0 for a frame alone).
    pub(super) fn raw_footprint(&self) -> u64 {
        match self {
            Body::Raw(raw) | Body::Window { raw, .. } => raw.footprint(),
            Body::Frame(_) => 0,
        }
    }

    /// Memory of the frame (0 for raw bytes alone).
    pub(super) fn frame_footprint(&self) -> u64 {
        self.frame().map_or(0, |f| f.footprint())
    }

    pub(super) fn is_window(&self) -> bool {
        matches!(self, Body::Window { .. })
    }
}
