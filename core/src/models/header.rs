//! Reading a model file's header at its first open: one probe read of
//! [`ModelsConfig::header_probe_bytes`], and a second exact read when the header is larger,
//! through the one header-read loop of tierfs ([`crate::index::read_header`]).
//!
//! **Contract.** [`read_header`] returns the header with up to
//! [`ModelsConfig::header_tail_bytes`] after it (kept in memory, so that header reads never touch
//! the disk again) and its parsed index; it never allocates a header larger than the index cap
//! ([`HeaderError::OverCap`]), and never panics on the file's bytes (a header that does not parse
//! is [`HeaderError::Malformed`]).

use super::ModelsConfig;
use crate::index::{self, Format, IndexError, TensorIndex};
use crate::source::{SourceError, SourceFile};

/// Why a header was not read.
pub(super) enum HeaderError {
    Malformed(IndexError),
    /// The header alone is larger than the index cap (`needed` bytes).
    OverCap {
        needed: u64,
    },
    Source(SourceError),
}

impl From<IndexError> for HeaderError {
    fn from(e: IndexError) -> HeaderError {
        HeaderError::Malformed(e)
    }
}

/// Reads and parses the header: one probe read, and a second exact read if the header is larger
/// (unless it is larger than `cap`: no allocation of a header that could not be kept).
pub(super) fn read_header(
    source: &SourceFile,
    format: Format,
    cap: u64,
    config: &ModelsConfig,
) -> Result<(Vec<u8>, TensorIndex), HeaderError> {
    let size = source.identity().size;
    let read = |wanted: u64| {
        let mut buf = vec![0u8; wanted as usize];
        let got = source.read_at(&mut buf, 0).map_err(HeaderError::Source)?;
        buf.truncate(got);
        Ok(buf)
    };
    let read_more = |header_bytes: u64, wanted: u64| {
        if header_bytes > wanted && header_bytes <= size {
            if header_bytes > cap {
                return Err(HeaderError::OverCap {
                    needed: header_bytes,
                });
            }
            return Ok(true);
        }
        Ok(false)
    };
    let (mut buf, index) = index::read_header(
        format,
        size,
        size.min(config.header_probe_bytes),
        read,
        read_more,
    )?;
    buf.truncate((index.header_bytes as usize).saturating_add(config.header_tail_bytes));
    Ok((buf, index))
}
