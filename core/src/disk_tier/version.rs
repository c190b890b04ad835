//! Which source version chunks belong to, and a version's view of the tier.
//!
//! **Contract.** A [`TierVersion`]'s name changes whenever the version does (a replaced file is
//! a new version, whose chunks never mix with the old one's); [`VersionInTier`] is what a model
//! file reads, checks and offers its chunks through.

use std::sync::Arc;

use super::DiskTier;
use crate::cache::lower::LowerTier;
use crate::source::{AlignedBytes, SourceIdentity};
use crate::sync::lock;

/// Which source version chunks belong to: a name that changes whenever the version does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TierVersion {
    pub(super) name: String,
    pub(super) size: u64,
}

impl TierVersion {
    /// The version of a local file: its inode, size, modification and change times. The
    /// device number is left out: a network file system's changes with each mount, and a file
    /// restored elsewhere has a new inode anyway.
    pub fn of_file(identity: &SourceIdentity) -> TierVersion {
        TierVersion::named(
            &format!(
                "file\0{}\0{}\0{}\0{}",
                identity.ino, identity.size, identity.mtime_ns, identity.ctime_ns
            ),
            identity.size,
        )
    }

    /// A version identified by `id` (e.g. an object's key and ETag), of `size` bytes.
    pub fn named(id: &str, size: u64) -> TierVersion {
        TierVersion {
            name: format!("{:032x}", xxhash_rust::xxh3::xxh3_128(id.as_bytes())),
            size,
        }
    }
}

/// One source version's view of the tier: what a model file reads and offers its chunks
/// through.
#[derive(Debug, Clone)]
pub struct VersionInTier {
    tier: Arc<DiskTier>,
    version: TierVersion,
}

impl VersionInTier {
    pub fn new(tier: &Arc<DiskTier>, version: TierVersion) -> VersionInTier {
        VersionInTier {
            tier: Arc::clone(tier),
            version,
        }
    }

    /// [`DiskTier::read`] of this version.
    pub fn read(&self, start: u64, end: u64) -> Option<AlignedBytes> {
        self.tier.read(&self.version, start, end)
    }

    /// The first bytes of the file as one chunk, `[0, end)`, if the tier holds them (a model
    /// file's header, [`Self::offer`]ed at its first open).
    pub fn read_head(&self) -> Option<AlignedBytes> {
        let end = lock(&self.tier.shared.index).head(&self.version.name)?.end;
        self.read(0, end)
    }

    /// [`DiskTier::whole_copy`] of this version.
    pub fn whole_copy(&self) -> Option<super::WholeCopy> {
        self.tier.whole_copy(&self.version)
    }

    /// [`DiskTier::data_path`] of this version.
    pub fn data_path(&self) -> std::path::PathBuf {
        self.tier.data_path(&self.version)
    }

    /// [`DiskTier::holds`] of this version.
    pub fn holds(&self, start: u64, end: u64) -> bool {
        self.tier.holds(&self.version, start, end)
    }

    /// [`DiskTier::offer`] of this version.
    pub fn offer(&self, start: u64, end: u64, bytes: &[u8]) {
        self.tier.offer(&self.version, start, end, bytes);
    }

    /// Offers each chunk of `spans` (ranges of the file, within `[at, at + bytes.len())`) cut
    /// from `bytes`, one read of adjacent chunks.
    pub fn offer_run(&self, at: u64, bytes: &[u8], spans: impl Iterator<Item = (u64, u64)>) {
        for (start, end) in spans {
            let piece = start
                .checked_sub(at)
                .and_then(|from| usize::try_from(from).ok())
                .zip(usize::try_from(end - start).ok())
                .and_then(|(from, len)| bytes.get(from..from.checked_add(len)?));
            if let Some(piece) = piece {
                self.offer(start, end, piece);
            }
        }
    }
}

/// RAM's eviction asks whether a chunk is held here ([`crate::cache::lower`]): the index's
/// lock is a leaf.
impl LowerTier for VersionInTier {
    fn holds(&self, start: u64, end: u64) -> bool {
        VersionInTier::holds(self, start, end)
    }
}
