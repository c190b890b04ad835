//! A model file served by passthrough from its whole copy in the local disk tier.
//!
//! **Contract.** On a mount with a disk tier, a model file that fits what the budget has left
//! is handed to the kernel by FUSE passthrough only from a copy the tier holds whole, each of
//! its chunks checked against its checksum ([`crate::disk_tier::WholeCopy`]), never from the
//! slow source: the kernel then reads it at the local disk's speed, and the source is not
//! read. The copy is acquired by the open that chose passthrough and shared by every
//! passthrough handle of the version; the last one to close lets the tier make room from its
//! chunks again. The passthrough tier ([`crate::passthrough`]) accounts the copy's page cache
//! under the data file's own path and identity.

use std::fs::File;
use std::io;
use std::path::PathBuf;

use super::ModelFile;
use crate::disk_tier::WholeCopy;
use crate::source::SourceIdentity;
use crate::sync::lock;

/// The whole copy a version's passthrough handles read, and how many hold it.
#[derive(Debug)]
pub(super) struct CopyInUse {
    copy: WholeCopy,
    identity: SourceIdentity,
    handles: usize,
}

/// What the passthrough tier accounts an open by: the file the kernel reads and its identity.
#[derive(Debug, Clone)]
pub(super) struct PassthroughTarget {
    pub path: PathBuf,
    pub identity: SourceIdentity,
}

impl ModelFile {
    /// Takes one handle's share of this version's whole copy in the tier: the copy in use, or
    /// a new one if the tier holds the version whole and it checks out. `None`: the tier does
    /// not (or the mount has no tier).
    pub(super) fn acquire_tier_copy(&self) -> Option<PassthroughTarget> {
        let tier = self.disk_tier.as_ref()?;
        let mut slot = lock(&self.tier_copy);
        if let Some(in_use) = slot.as_mut() {
            in_use.handles += 1;
            return Some(in_use.target());
        }
        // Checked with the slot held: a second open of the version waits for the first's
        // check rather than reading the copy again.
        let copy = tier.whole_copy()?;
        let identity = match SourceIdentity::of_file(copy.file()) {
            Ok(identity) => identity,
            Err(e) => {
                tracing::debug!(file = %copy.path().display(), error = %e, "cannot stat a whole copy in the disk tier");
                return None;
            }
        };
        let in_use = CopyInUse {
            copy,
            identity,
            handles: 1,
        };
        let target = in_use.target();
        *slot = Some(in_use);
        Some(target)
    }

    /// The identity the passthrough tier knows this version's copy by (its data file's), read
    /// without checking the copy; `None` without a tier or a data file.
    pub(super) fn tier_copy_identity(&self) -> Option<SourceIdentity> {
        if let Some(in_use) = lock(&self.tier_copy).as_ref() {
            return Some(in_use.identity);
        }
        let path = self.disk_tier.as_ref()?.data_path();
        SourceIdentity::of_path(&path).ok()
    }

    /// One handle's share of the copy given back; the last one releases the copy.
    pub(super) fn release_tier_copy(&self) {
        let mut slot = lock(&self.tier_copy);
        if let Some(in_use) = slot.as_mut() {
            in_use.handles = in_use.handles.saturating_sub(1);
            if in_use.handles == 0 {
                *slot = None;
            }
        }
    }

    /// Takes one more handle's share of the copy this version's passthrough handles read;
    /// false when they read none (the copy is not made here: the kernel serves the inode from
    /// the backing it has).
    pub(super) fn join_tier_copy(&self) -> bool {
        match lock(&self.tier_copy).as_mut() {
            Some(in_use) => {
                in_use.handles += 1;
                true
            }
            None => false,
        }
    }

    /// What this version's passthrough opens are accounted by: its copy in the disk tier
    /// while one is in use, else its source file.
    pub(super) fn passthrough_target(&self) -> PassthroughTarget {
        match lock(&self.tier_copy).as_ref() {
            Some(in_use) => in_use.target(),
            None => PassthroughTarget {
                path: self.source.path().to_owned(),
                identity: self.source.identity(),
            },
        }
    }

    /// A descriptor of the file a passthrough open of this version reads: its copy in the
    /// disk tier while one is in use, else `None` (the source's).
    pub fn tier_copy_file(&self) -> Option<io::Result<File>> {
        lock(&self.tier_copy)
            .as_ref()
            .map(|in_use| in_use.copy.file().try_clone())
    }
}

impl CopyInUse {
    fn target(&self) -> PassthroughTarget {
        PassthroughTarget {
            path: self.copy.path().to_owned(),
            identity: self.identity,
        }
    }
}
