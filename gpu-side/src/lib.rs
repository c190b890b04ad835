//! tierfs-gpu: read tensors from the files behind a tierfs mount (or any `.safetensors` file)
//! straight into GPU memory, with GPUDirect Storage where it works and a pipelined bounce-buffer
//! path where it does not.
//!
//! GDS cannot read through FUSE, so a path on a tierfs mount is first [resolved](resolve) to the
//! SOURCE file behind it (the mount names it in the `user.tierfs.source` extended attribute), and
//! that file's tensor byte ranges are read directly.
//!
//! - [`resolve`]: path → source file + tensor index (`tierfs_core::index`).
//! - [`plan`]: which aligned byte ranges to read, where each tensor lands, in which chunks.
//! - [`io`]: `O_DIRECT`/buffered chunk reads; page-cache residency.
//! - [`staging`]: bounce buffers and their leases.
//! - [`pipeline`]: reader threads → staging buffers → asynchronous copies, over any [`pipeline::Sink`].
//! - [`cuda`]: the CUDA driver via cudarc (dynamic loading: no CUDA needed to build or test).
//! - [`cufile`]: finding `libcufile`, opening its driver in GDS or compat mode, `cuFileRead`.
//! - [`load`]: choosing the route (`--gds auto|on|off|compat`) and reporting what happened.
//! - [`bench`](mod@bench): `tierfs-gpu bench`'s measurements and table.
//! - [`ffi`]: the C ABI the Python wrapper (`python/tierfs_gpu.py`) uses.
//!
//! ```no_run
//! use tierfs_gpu::{load::{Loader, LoadOptions}, plan::{LoadPlan, Selection, DEFAULT_CHUNK_BYTES}, resolve};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let source = resolve::open("/mnt/models/flux.safetensors".as_ref())?;
//! let plan = LoadPlan::new(&source.index, &Selection::All, DEFAULT_CHUNK_BYTES)?;
//! let mut loader = Loader::new(0, LoadOptions::default())?;
//! let (arena, report) = loader.load(&source, &plan)?;
//! println!("{report}; first tensor at {:#x}", arena.ptr() + plan.tensors[0].offset);
//! # Ok(()) }
//! ```

pub mod bench;
pub mod cuda;
pub mod cufile;
pub mod ffi;
pub mod io;
pub mod load;
pub mod pipeline;
pub mod plan;
pub mod resolve;
pub mod staging;

#[cfg(test)]
mod testutil;
