//! The bytes of one read, copied as little as possible.
//!
//! **Contract.** A [`ReadBytes`] holds exactly the bytes a read returns, in file order. Where
//! they come from decides its form: borrowed from one cached chunk (the kernel's
//! 128 KiB–1 MiB requests inside 4 MiB chunks, nearly always), the buffer a source read filled
//! for this request alone (a probe or `O_DIRECT` read of bytes not resident), bytes made here
//! (the header, a plain file), or, for a read that spans chunks or regions, those pieces in
//! order ([`Gathered`]), each still borrowed where it can be.
//!
//! A transport sends the pieces as they are: [`ReadBytes::slices`] (a vectored write) and
//! [`ReadBytes::copy_into`] (one copy into a buffer of its own) never join them, and
//! [`ReadBytes::len`] never copies. The `Deref` to one slice is free for every form but
//! [`Gathered`], which joins its pieces into one buffer on first use (once): it is for callers
//! that need one slice, not for the data path. A read across chunks is not rare (a reader whose
//! buffer does not start on a page gives requests that often cross a chunk boundary, and
//! requests larger than a chunk always do), and joining them cost the daemon CPU
//! ([measured](../../../docs/PERFORMANCE.md#reads-across-chunks-sent-in-pieces)).

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use crate::cache::Chunk;
use crate::source::AlignedBytes;

/// The most pieces a read is sent in: well under the kernel's `IOV_MAX` (1024 slices in one
/// `writev`, the header among them). Only a request over many small chunks has more, and those
/// are joined into one buffer instead.
pub const MAX_PIECES: usize = 256;

/// The bytes of one read (see the module's contract).
pub enum ReadBytes {
    /// Part of one cached chunk.
    Chunk {
        bytes: Arc<Chunk>,
        range: Range<usize>,
    },
    /// A buffer a source read filled for this read alone.
    Source(AlignedBytes),
    /// Bytes made for this read.
    Owned(Vec<u8>),
    /// A read across chunks or regions: its pieces, in order.
    Gathered(Gathered),
}

/// The pieces of a read across chunks or regions, in file order; never nested, never empty
/// pieces.
#[derive(Default)]
pub struct Gathered {
    pieces: Vec<ReadBytes>,
    len: usize,
    /// The pieces joined, made on the first `Deref` only.
    joined: OnceLock<Vec<u8>>,
}

impl Gathered {
    /// An empty read, to be filled in order.
    pub fn new() -> Gathered {
        Gathered::default()
    }

    /// Appends `piece` after what is there (a gathered piece's own pieces, one by one).
    pub fn push(&mut self, piece: ReadBytes) {
        match piece {
            ReadBytes::Gathered(inner) => {
                for piece in inner.pieces {
                    self.push(piece);
                }
            }
            piece if piece.is_empty() => {}
            piece => {
                self.len += piece.len();
                self.pieces.push(piece);
            }
        }
    }

    /// Appends a copy of `bytes` (a header's few KiB), into the last piece where that one was
    /// made here too.
    pub fn push_copy(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.len += bytes.len();
        if let Some(ReadBytes::Owned(last)) = self.pieces.last_mut() {
            last.extend_from_slice(bytes);
        } else {
            self.pieces.push(ReadBytes::Owned(bytes.to_vec()));
        }
    }

    /// The bytes gathered so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was gathered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The read: a single piece as itself, several as they are, more than [`MAX_PIECES`]
    /// joined.
    pub fn finish(mut self) -> ReadBytes {
        match self.pieces.len() {
            0 => ReadBytes::Owned(Vec::new()),
            1 => self.pieces.pop().unwrap_or(ReadBytes::Owned(Vec::new())),
            n if n > MAX_PIECES => ReadBytes::Owned(self.join()),
            _ => ReadBytes::Gathered(self),
        }
    }

    /// The pieces copied into one buffer.
    fn join(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for piece in &self.pieces {
            out.extend_from_slice(piece.single());
        }
        out
    }

    fn joined(&self) -> &[u8] {
        self.joined.get_or_init(|| self.join())
    }
}

impl ReadBytes {
    /// How many bytes the read returns (no copy).
    pub fn len(&self) -> usize {
        match self {
            ReadBytes::Chunk { range, .. } => range.len(),
            ReadBytes::Source(bytes) => bytes.as_slice().len(),
            ReadBytes::Owned(bytes) => bytes.len(),
            ReadBytes::Gathered(gathered) => gathered.len(),
        }
    }

    /// Whether the read returns nothing (end of file).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The read's bytes as one or more slices, in order, none of them copied: what a vectored
    /// write sends.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        let (one, many) = match self {
            ReadBytes::Gathered(gathered) => (None, gathered.pieces.as_slice()),
            other => (Some(other.single()), &[][..]),
        };
        one.into_iter().chain(many.iter().map(ReadBytes::single))
    }

    /// Copies the read's bytes to the start of `out`, as many as fit; returns how many.
    pub fn copy_into(&self, out: &mut [u8]) -> usize {
        let mut filled = 0;
        for slice in self.slices() {
            let room = out.len() - filled;
            let take = slice.len().min(room);
            out[filled..filled + take].copy_from_slice(&slice[..take]);
            filled += take;
            if take < slice.len() {
                break;
            }
        }
        filled
    }

    /// The bytes of a form that is one slice (a gathered read's pieces are).
    fn single(&self) -> &[u8] {
        match self {
            ReadBytes::Chunk { bytes, range } => &bytes.as_slice()[range.clone()],
            ReadBytes::Source(bytes) => bytes.as_slice(),
            ReadBytes::Owned(bytes) => bytes,
            ReadBytes::Gathered(gathered) => gathered.joined(),
        }
    }
}

/// One slice of the read's bytes: free for every form but [`Gathered`], which is joined into one
/// buffer the first time (a copy; the data path uses [`ReadBytes::slices`]).
impl std::ops::Deref for ReadBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.single()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gathered(parts: &[&[u8]]) -> ReadBytes {
        let mut out = Gathered::new();
        for part in parts {
            out.push(ReadBytes::Owned(part.to_vec()));
        }
        out.finish()
    }

    #[test]
    fn pieces_keep_their_order_and_length_without_joining() {
        let read = gathered(&[b"abc", b"", b"defg", b"h"]);
        let ReadBytes::Gathered(inner) = &read else {
            panic!("three pieces stay gathered");
        };
        assert_eq!(read.len(), 8);
        assert_eq!(inner.pieces.len(), 3, "the empty piece is dropped");
        let slices: Vec<&[u8]> = read.slices().collect();
        assert_eq!(slices, vec![&b"abc"[..], b"defg", b"h"]);
        assert!(inner.joined.get().is_none(), "len and slices do not join");
        assert_eq!(&*read, b"abcdefgh");
    }

    #[test]
    fn one_piece_is_itself_and_none_is_empty() {
        assert!(matches!(gathered(&[b"", b"xy"]), ReadBytes::Owned(v) if v == b"xy"));
        let empty = gathered(&[]);
        assert!(empty.is_empty());
        assert_eq!(empty.slices().count(), 1);
    }

    #[test]
    fn copies_go_into_the_last_made_piece_and_nested_reads_flatten() {
        let mut out = Gathered::new();
        out.push_copy(b"he");
        out.push_copy(b"ad");
        out.push(gathered(&[b"12", b"34"]));
        out.push_copy(b"");
        let read = out.finish();
        let slices: Vec<&[u8]> = read.slices().collect();
        assert_eq!(slices, vec![&b"head"[..], b"12", b"34"]);
    }

    #[test]
    fn too_many_pieces_are_joined() {
        let parts: Vec<Vec<u8>> = (0..=MAX_PIECES).map(|i| vec![i as u8; 3]).collect();
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let read = gathered(&parts);
        assert!(matches!(read, ReadBytes::Owned(_)));
        assert_eq!(read.len(), 3 * (MAX_PIECES + 1));
        assert_eq!(&read[..], parts.concat());
        assert!(matches!(
            gathered(&parts[..MAX_PIECES]),
            ReadBytes::Gathered(_)
        ));
    }

    #[test]
    fn copy_into_fills_what_fits() {
        let read = gathered(&[b"abc", b"defg"]);
        let mut big = [0u8; 10];
        assert_eq!(read.copy_into(&mut big), 7);
        assert_eq!(&big[..7], b"abcdefg");
        let mut small = [0u8; 5];
        assert_eq!(read.copy_into(&mut small), 5);
        assert_eq!(&small, b"abcde");
    }
}
