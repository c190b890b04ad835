//! How each file version is being read: the order its reader walks the blocks in, the block it
//! is in now, and whether it computes between blocks.
//!
//! **Contract.** The read path reports every block a reader touches ([`ReaderTracker::touch`]);
//! eviction ([`crate::cache`]) asks how soon a block is needed again, prefetch
//! ([`crate::prefetch`]) which blocks come next and whether the reader computes. This module
//! sits below both and imports neither: what it knows comes from touches and reads only. Its
//! tuning is [`ReaderConfig`] (with [`PaceConfig`]); every lock goes through [`crate::sync`].
//!
//! - [`order`]: the learned block order of a file ([`order::BlockOrder`]), persisted across
//!   mounts by [`crate::prefetch::saved`];
//! - [`tracker`]: the reader's position in that order ([`ReaderTracker`]);
//! - [`pace`]: whether the reader pauses to compute between blocks ([`pace::ReaderPace`]).

pub mod order;
pub mod pace;
pub mod tracker;

pub use pace::PaceConfig;
pub use tracker::{FileCounters, ReaderConfig, ReaderTracker, Step};
