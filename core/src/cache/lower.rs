//! What the tier below RAM holds: a chunk it holds costs a local read to bring back, one it
//! does not costs a read from the source.
//!
//! **Contract.** A chunk whose [`LowerCopy::held`] is true ranks for eviction before the
//! chunks of its turn that the tier below does not hold (`evict.rs`, rule 3), so RAM and the
//! tier below hold different chunks where they can: for passes over a model larger than the
//! budget, RAM keeps what the disk tier lacks instead of the head both would otherwise keep
//! ([measured](../../../docs/PERFORMANCE.md#ram-and-the-disk-tier-hold-different-chunks)).
//! `held` is asked under the cache's `state` lock: an implementation takes only leaf locks of
//! its own and never calls into the cache.

use std::sync::Arc;

/// A tier below RAM that keeps chunks of one file version by their byte range
/// ([`crate::disk_tier::VersionInTier`]).
pub trait LowerTier: Send + Sync + std::fmt::Debug {
    /// Whether the tier holds `[start, end)` of the version, ready to be read back.
    fn holds(&self, start: u64, end: u64) -> bool;
}

/// Where one chunk's bytes may lie in the tier below: the tier and the chunk's range.
#[derive(Debug, Clone)]
pub struct LowerCopy {
    pub tier: Arc<dyn LowerTier>,
    pub start: u64,
    pub end: u64,
}

impl LowerCopy {
    /// Whether the tier below holds the chunk now.
    pub fn held(&self) -> bool {
        self.tier.holds(self.start, self.end)
    }
}
