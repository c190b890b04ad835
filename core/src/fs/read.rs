//! `read`: the read path of the filesystem. A read of a model file goes to the store's cache
//! ([`ModelStore::read`](crate::models::ModelStore::read) and its `O_DIRECT` and readahead
//! variants); a read of any other served file is a plain `pread`; a read of `.tierfs/stats`
//! or `.tierfs/metrics` is a slice of the text rendered at open. What a model read puts in the
//! mounted file's page cache is recorded in the [`KernelCacheWindow`](crate::kernel_cache)
//! (see the module docs of [`super`]).
//!
//! No lock of this module is held across the read itself.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use crate::models::{ModelFile, OpenModel, ReadBytes};
use crate::source::read_full_at;
use crate::stats::ops::Op;

use super::handles::Handle;
use super::{FsError, TierFs};

/// Who asks for a read, as far as the front end can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadKind {
    /// A reader's own `read()` call, not a page-cache fill (kernel readahead, `mmap` faults).
    pub from_reader: bool,
    /// The reader opened the file `O_DIRECT` (the FUSE request carries the open's flags): see
    /// `ModelStore::read_direct`.
    pub o_direct: bool,
}

/// How one read of a handle is to be served, from its [`ReadKind`] and the mount's mode.
#[derive(Debug, Clone, Copy)]
struct HandleRead {
    /// Which of the store's model reads serves it.
    model_read: ModelRead,
    /// The bytes land in the mounted file's page cache (see [`TierFs::read`]).
    into_page_cache: bool,
}

/// Which of the store's reads serves a model read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModelRead {
    /// The reader opened the file `O_DIRECT` (`ModelStore::read_direct`).
    Direct,
    /// The kernel fills its page cache (readahead, `mmap` faults), not for a reader's `read()`
    /// (`ModelStore::read_readahead`).
    Readahead,
    /// A reader's own `read()` (`ModelStore::read`).
    Reader,
}

impl ModelRead {
    fn of(kind: ReadKind) -> ModelRead {
        if kind.o_direct {
            ModelRead::Direct
        } else if !kind.from_reader {
            ModelRead::Readahead
        } else {
            ModelRead::Reader
        }
    }
}

impl<B: Send + Sync> TierFs<B> {
    /// `read` of handle `fh` (of inode `ino`): up to `size` bytes at `offset`, fewer only at
    /// the end of the file; `kind` says who asks ([`ReadKind`]).
    pub fn read(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        kind: ReadKind,
    ) -> Result<ReadBytes, FsError> {
        // Which reads fill the mounted file's page cache: with `direct_io`, a `read()` goes
        // straight into the reader's buffer, and only `mmap` faults (kernel readahead) land in
        // the page cache. Recording direct reads in the window would only cost a needless
        // page-cache invalidation per range
        // ([measured](../../../docs/PERFORMANCE.md#open-flags-of-cache-served-model-files)).
        let into_page_cache = !(self.direct_io_mmap && kind.from_reader);
        let (bytes, model) = self.ops().time(Op::Read, || {
            let how = HandleRead {
                model_read: ModelRead::of(kind),
                into_page_cache,
            };
            self.read_handle(fh, offset, size, how)
        })?;
        if model && into_page_cache {
            for range in self.window.record(ino, offset, bytes.len() as u64) {
                // The front end's notifier only stops when the mount does.
                let _ = self.invalidations.send(range);
            }
        }
        Ok(bytes)
    }

    /// The bytes a `read` of handle `fh` answers, and whether they are a model file's (which
    /// the kernel may keep in the mounted file's page cache: see `read`), served as `how` says.
    fn read_handle(
        &self,
        fh: u64,
        offset: u64,
        size: u32,
        how: HandleRead,
    ) -> Result<(ReadBytes, bool), FsError> {
        match &self.handles.get(fh)?.kind {
            Handle::Model(model) if how.into_page_cache && superseded(model) => {
                Ok((read_as_the_file_is_now(model, offset, size)?, true))
            }
            Handle::Model(model) => Ok((
                self.read_model(model.file(), offset, size, how.model_read)?,
                true,
            )),
            Handle::Plain(file) => Ok((
                ReadBytes::Owned(pread_full(file.reader(), offset, size)?),
                false,
            )),
            Handle::Stats(json) => {
                let start = (offset as usize).min(json.len());
                let end = start.saturating_add(size as usize).min(json.len());
                Ok((ReadBytes::Owned(json[start..end].to_vec()), false))
            }
            Handle::ModelPassthrough(..)
            | Handle::Passthrough(_)
            | Handle::Dir(..)
            | Handle::Control => Err(FsError::BadHandle),
        }
    }

    /// Reads a model file through the cache.
    fn read_model(
        &self,
        model: &Arc<ModelFile>,
        offset: u64,
        size: u32,
        how: ModelRead,
    ) -> Result<ReadBytes, FsError> {
        let started = Instant::now();
        let result = match how {
            ModelRead::Direct => self.store.read_direct(model, offset, size),
            ModelRead::Readahead => self.store.read_readahead(model, offset, size),
            ModelRead::Reader => self.store.read(model, offset, size),
        };
        let elapsed = started.elapsed();
        if elapsed > self.config.slow_read {
            tracing::warn!(file = %model.path().display(), offset, size, ms = elapsed.as_millis() as u64, "slow read");
        }
        result.map_err(|e| {
            tracing::warn!(file = %model.path().display(), offset, size, error = %e, "read failed: returning EIO");
            e.into()
        })
    }
}

/// Whether the version a model handle opened is no longer what its file holds (rewritten in
/// place). The inode's page cache is shared by every handle of it, so what a fill puts there
/// must be the file as it is: the old version's header, kept in memory, over the file's new
/// data would show readers of either version a mix of two.
fn superseded(model: &OpenModel) -> bool {
    model.source().changed_since_open().unwrap_or_else(|e| {
        tracing::warn!(file = %model.path().display(), error = %e, "fstat of an open model failed");
        false
    })
}

/// A page-cache fill for a handle whose version was superseded: the file's bytes as they are
/// now, read from its descriptor uncached, as a local `mmap` of the rewritten file would see.
fn read_as_the_file_is_now(
    model: &OpenModel,
    offset: u64,
    size: u32,
) -> Result<ReadBytes, FsError> {
    tracing::debug!(file = %model.path().display(), offset, size, "rewritten in place: page-cache fill served from the file as it is now");
    let mut buf = vec![0u8; size as usize];
    let filled = model
        .source()
        .read_at(&mut buf, offset)
        .map_err(|e| FsError::io("read")(io::Error::other(e)))?;
    buf.truncate(filled);
    Ok(ReadBytes::Owned(buf))
}

fn pread_full(
    file: &dyn crate::source::ReadAt,
    offset: u64,
    size: u32,
) -> Result<Vec<u8>, FsError> {
    let mut buf = vec![0u8; size as usize];
    let filled = read_full_at(file, &mut buf, offset).map_err(|(_, e)| FsError::io("read")(e))?;
    buf.truncate(filled);
    Ok(buf)
}
