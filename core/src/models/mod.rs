//! The model files of a mount: one [`ModelFile`] per version of each `.safetensors`/`.sft`/`.gguf`
//! file opened, and the read path that serves their bytes. Both formats are served alike: only
//! the header parser differs ([`Format`](crate::index::Format)).
//!
//! **Contract.** A file's bytes fall in three regions, each served its own way ([`read`]):
//! - the header (`[0, header_bytes)`): parsed once at first open ([`header`]) and kept in
//!   memory, so header reads (ComfyUI's discovery, `safe_open`) never touch the disk again; a
//!   tail after it ([`ModelsConfig::header_tail_bytes`]) is kept too, from the same probe read,
//!   because buffered header readers read a little past the header, and that must not fetch a
//!   data chunk or start prefetch;
//! - the data region (`[header_bytes, data_end)`): cut into tensor-aligned chunks
//!   ([`crate::cache::plan`]) served through the mount-wide
//!   [`ChunkCache`](crate::cache::ChunkCache), except probes and spills ([`classify`]);
//! - anything after the last tensor: read from the source uncached (rare; some writers pad).
//!
//! A file whose header does not parse is *malformed*: it is served byte-exact, uncached, with
//! the reason logged once and shown in the stats.
//!
//! **Versions.** A file is identified by (device, inode, size, mtime, ctime) at open. When any of
//! those differ from the version already known, the file is re-indexed as a new version with a
//! new generation number; the old version's chunks are dropped from the cache. Handles opened
//! before the change keep reading the version (and the descriptor) they opened, so a reader
//! that opens a file after it changed can never be served cached bytes of the old one. (Except
//! where the bytes land in the mounted file's page cache, which all handles share: there a
//! file rewritten in place is served as it is now; see `crate::fs`'s read path.)
//!
//! **Descriptors.** A known version holds no descriptor of its own: an open handle
//! ([`OpenModel`], from [`ModelStore::open_handle`]) holds its source descriptors, a read or a
//! prefetch of a version nobody holds opens them again for one chunk, checked to be the same
//! version ([`crate::source::slot`]). When the last handle of a version closes and SOURCE no
//! longer holds it (deleted, replaced), the version is forgotten with its cached bytes
//! ([`open`]), so its disk space and its share of the budget are given back at once.
//!
//! **Memory.** Headers and indexes of known files are held to their own cap ([`table`]).
//!
//! **Where things are.** [`file`]: a known version ([`ModelFile`], its [`Layout`]);
//! [`header`]: the header read; [`classify`]: probes and spills; [`read`]: every read and what
//! it triggers (prefetch hooks included); [`mode`]: passthrough admission; [`snapshot`]: the
//! stats; [`store`]: the store, its budget and opens; [`open`]: handles and what their close
//! prunes; [`shards`]: sharded models; [`sequence`]: which model follows which; [`plan`]: the
//! files a client said it will load next; [`touch_ahead`]: a load's next touches read ahead on an
//! object store; [`runs`]:
//! request runs; [`config`]: the tuning ([`ModelsConfig`]).

mod classify;
mod config;
mod file;
mod header;
mod mode;
mod open;
mod plan;
mod read;
mod read_bytes;
mod runs;
mod sequence;
pub mod shards;
mod snapshot;
mod store;
pub mod table;
mod tier_copy;
mod touch_ahead;

pub use config::ModelsConfig;
pub use file::{is_model_path, Layout, ModelFile, OpenError, RawReason};
pub use mode::ServeMode;
pub use open::OpenModel;
pub use plan::MAX_PLAN_FILES;
pub use read::{ReadError, ReadKind, WARM_AFTER_TOUCHES};
pub use read_bytes::{Gathered, ReadBytes};
pub use store::ModelStore;
pub use table::DEFAULT_INDEX_CAP;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod config_tests;

#[cfg(test)]
#[cfg(target_os = "linux")]
mod disk_tier_tests;

#[cfg(test)]
mod fault_tests;

#[cfg(test)]
mod gguf_tests;

#[cfg(test)]
#[cfg(target_os = "linux")]
mod lifecycle_tests;

#[cfg(test)]
mod shard_tests;

#[cfg(test)]
#[cfg(target_os = "linux")]
mod source_fault_tests;
