//! A version the tier holds whole, handed to the kernel: a model file that fits the budget is
//! served by FUSE passthrough from its copy in the tier, at the local disk's own speed.
//!
//! **Contract.** [`DiskTier::whole_copy`] returns a [`WholeCopy`] only when the tier's chunks of
//! the version cover it from its first byte to its last and every one of them matched its
//! checksum since the tier was opened (chunks this tier wrote did; chunks taken in from an
//! earlier mount are read and checked now, through the page cache the passthrough reads
//! next). A chunk that does not match is dropped (`damaged`) and no copy is returned: the file
//! is served through the RAM cache, which reads that chunk from the source. While a
//! [`WholeCopy`] lives, none of the version's chunks gives way to make room; and once a copy
//! was made, no hole is ever punched in its data file (the kernel may still map it after the
//! last handle closed): the version gives way whole, its files deleted, their bytes kept by
//! the kernel for as long as it holds them open.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{add, DiskTier, Shared, TierVersion};
use crate::source::read_full_at;
use crate::sync::lock;

/// Bytes read at a time to check a chunk taken in from an earlier mount.
const CHECK_PIECE: usize = 4 << 20;

/// A version's whole copy in the tier, its chunks kept while this lives.
pub struct WholeCopy {
    shared: Arc<Shared>,
    name: String,
    path: PathBuf,
    file: File,
}

impl std::fmt::Debug for WholeCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WholeCopy")
            .field("path", &self.path)
            .finish()
    }
}

impl WholeCopy {
    /// The data file holding the copy, at the source's own offsets.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A read-only descriptor of the data file.
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Drop for WholeCopy {
    fn drop(&mut self) {
        lock(&self.shared.index).unpin(&self.name);
    }
}

impl DiskTier {
    /// Where `version`'s data file is (whether or not the tier holds any of it).
    pub fn data_path(&self, version: &TierVersion) -> PathBuf {
        super::version_file(&self.shared.dir, &version.name, super::DATA)
    }

    /// The whole copy of `version`, checked ([module docs](self)); `None` when the tier does
    /// not hold every byte of it, or a chunk is damaged.
    pub fn whole_copy(&self, version: &TierVersion) -> Option<WholeCopy> {
        let shared = &self.shared;
        let chunks = {
            let mut index = lock(&shared.index);
            let chunks = index.whole(&version.name, version.size)?;
            index.pin(&version.name);
            index.touch(&version.name);
            chunks
        };
        let path = self.data_path(version);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) => {
                lock(&shared.index).unpin(&version.name);
                tracing::debug!(file = %path.display(), error = %e, "cannot open a whole copy in the disk tier");
                return None;
            }
        };
        let copy = WholeCopy {
            shared: Arc::clone(shared),
            name: version.name.clone(),
            path,
            file,
        };
        // A file cut short since its chunks were written (checked or not) is no copy.
        match copy.file.metadata() {
            Ok(meta) if meta.len() >= version.size => {}
            got => {
                let why = match got {
                    Ok(meta) => format!("the data file ends at {}", meta.len()),
                    Err(e) => e.to_string(),
                };
                if let Some(&(start, held, _)) = chunks.last() {
                    self.damaged(&version.name, start, held.end, held.hash, &why);
                }
                return None;
            }
        }
        let mut buf = vec![0u8; CHECK_PIECE];
        for (start, held, unverified) in chunks {
            if !unverified {
                continue;
            }
            match check(&copy.file, &mut buf, start, held.end) {
                Ok(hash) if hash == held.hash => {
                    lock(&shared.index).verified(&version.name, start);
                }
                got => {
                    let why = match got {
                        Ok(_) => "its bytes do not match their checksum".to_owned(),
                        Err(e) => e.to_string(),
                    };
                    self.damaged(&version.name, start, held.end, held.hash, &why);
                    return None;
                }
            }
        }
        lock(&shared.index).seal(&version.name);
        add(&shared.counters.whole_copies, 1);
        Some(copy)
    }
}

/// The checksum of `[start, end)` of `file`, read through the page cache in pieces of `buf`;
/// a file that ends before `end` is an error.
fn check(file: &File, buf: &mut [u8], start: u64, end: u64) -> std::io::Result<u64> {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut at = start;
    while at < end {
        let len = buf
            .len()
            .min(usize::try_from(end - at).unwrap_or(usize::MAX));
        let piece = &mut buf[..len];
        let got = read_full_at(file, piece, at).map_err(|(_, e)| e)?;
        if got < len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the disk tier's file ends at {}", at + got as u64),
            ));
        }
        hasher.update(piece);
        at += len as u64;
    }
    Ok(hasher.digest())
}
