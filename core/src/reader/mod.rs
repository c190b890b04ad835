//! How each file version is being read: the order its reader walks the blocks in, the block it
//! is in now, and whether it computes between blocks.
//!
//! Three modules lower in the stack than both the cache and prefetch, which both read them:
//! - [`order`]: the learned block order of a file ([`order::BlockOrder`]), persisted across
//!   mounts by [`crate::prefetch::saved`];
//! - [`tracker`]: the reader's position in that order ([`ReaderTracker`]): what the read path
//!   reports every block touch to, what prefetch asks for the blocks that come next, and what
//!   eviction asks how soon a block is needed again;
//! - [`pace`]: whether the reader pauses to compute between blocks ([`pace::ReaderPace`]).
pub mod order;
pub mod pace;
pub mod tracker;

pub use pace::PaceConfig;
pub use tracker::{FileCounters, ReaderConfig, ReaderTracker, Step};
