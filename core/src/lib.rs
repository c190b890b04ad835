//! tierfs-core: the platform-neutral heart of tierfs.
//!
//! Nothing in this crate knows about FUSE. The `fs` crate adapts these types to the kernel; tests
//! drive them directly.
//!
//! - [`index`]: the tensor index of a `.safetensors` file and the grouping of its tensors into
//!   transformer blocks.
//! - [`synth`]: deterministic synthetic checkpoints (demo, tests, benchmarks).
pub mod index;
pub mod synth;
