//! tierfs-core: the platform-neutral heart of tierfs.
//!
//! Nothing in this crate knows about FUSE. The `fs` crate adapts these types to the kernel; tests
//! drive them directly.
//!
//! - [`index`]: the tensor index of a `.safetensors` file and the grouping of its tensors into
//!   transformer blocks.
//! - [`source`]: reading source files without filling the page cache (`O_DIRECT`).
//! - [`budget`]: the budget governor: shrinking the cache under memory pressure.
//! - [`cache`]: the mount-wide, byte-bounded chunk cache and the tensor-aligned chunk plan.
//! - [`reader`]: how each file is being read (block order, reader position, pace), which the
//!   cache and prefetch both consult.
//! - [`prefetch`]: background read-ahead.
//! - [`models`]: model file versions and the read path that ties the above together.
//! - [`disk_tier`]: chunks of slow sources kept on a local disk, below the RAM cache.
//! - `object` (feature `object-store`): the client of an `s3://` source.
//! - [`kernel_cache`]: keeping the mounted files' kernel page cache bounded.
//! - [`stats`]: the counters behind `.tierfs/stats`.
//! - [`stats_doc`]: the `.tierfs/stats` document itself.
//! - [`control`]: the commands of `.tierfs/control`.
//! - [`synth`]: deterministic synthetic checkpoints (demo, tests, benchmarks).
//! - [`size`]: human byte sizes.
//! - [`histogram`]: the log-linear latency buckets of the stats and the source meter.
//! - `cli` (feature `cli`): the command-line pieces both front ends share.
//! - [`sync`]: the locks of the core (swapped for loom's in model-checked tests).
//! - [`allocator`]: the daemon's use of the C allocator (malloc arenas).
//! - [`access`]: who may see what through a shared mount (per-request credentials).
//! - [`fs`]: the filesystem itself (inodes, handles, open policy, errors), free of any kernel
//!   interface: front ends translate their requests into its calls.
pub mod allocator;
// Per-request credentials (fsuid, supplementary groups, /proc): Linux only; WinFsp has its own
// access checks.
#[cfg(target_os = "linux")]
pub mod access;
// Built on `access` (and passthrough descriptors): Linux only for now (see its docs).
pub mod budget;
pub mod cache;
// The front ends' shared command line; `clap` only where asked for.
#[cfg(any(feature = "cli", test))]
pub mod cli;
pub mod compress;
pub mod control;
pub mod disk_tier;
// Linux and Windows: its OS-facing pieces are in `fs::platform`.
#[cfg(any(target_os = "linux", windows))]
pub mod fs;
pub mod histogram;
pub mod index;
pub mod kernel_cache;
pub mod models;
// The S3 client of an `s3://` source; off by default, never on for Windows builds.
#[cfg(feature = "object-store")]
pub mod object;
pub mod passthrough;
pub mod prefetch;
pub mod reader;
pub mod size;
pub mod source;
pub mod stats;
pub mod stats_doc;
pub mod sync;
pub mod synth;
pub mod weights;
