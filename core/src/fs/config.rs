//! Tuning of the filesystem ([`TierFs::with_config`](super::TierFs::with_config)).

use std::time::Duration;

/// How long the kernel may trust attributes and lookups by default. Half a second keeps the
/// promise that a change in SOURCE shows within a second, and still saves most repeated
/// `stat`s of a loader that stats each file several times in a row.
pub const ATTR_TTL: Duration = Duration::from_millis(500);

/// The filesystem's tuning; [`Default`] is what a mount uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsConfig {
    /// Attribute and entry timeout given to the kernel ([`ATTR_TTL`]): what bounds how long a
    /// change in SOURCE takes to show through the mount.
    pub attr_ttl: Duration,
    /// A model read taking longer than this is logged: it means the disk is saturated or a
    /// reader waits on a chunk another request is loading. Two seconds is a hundred times a
    /// 4 MiB chunk read on a healthy disk.
    pub slow_read: Duration,
}

impl Default for FsConfig {
    fn default() -> FsConfig {
        FsConfig {
            attr_ttl: ATTR_TTL,
            slow_read: Duration::from_secs(2),
        }
    }
}
