//! `tierfs inspect FILE [--json]`: a file's tensor index and block grouping, without mounting.
//! The format follows the extension (`.gguf`, else safetensors), as in the mount; a sharded
//! model's `*.index.json` is shown as one model ([`crate::inspect_shards`]).

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use tierfs_core::index::{Format, TensorIndex};
use tierfs_core::size::format_size;

pub fn run(path: &Path, json: bool) -> Result<()> {
    if crate::inspect_shards::is_index(path) {
        return crate::inspect_shards::run(path, json);
    }
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let format = Format::of_path(path).unwrap_or_default();
    let index = TensorIndex::read_format(&file, format)
        .with_context(|| format!("{} is not a valid {format:?} file", path.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&index)?);
    } else {
        print_table(path, &index);
    }
    Ok(())
}

fn print_table(path: &Path, index: &TensorIndex) {
    println!(
        "{}: {} tensors in {} blocks, {} of data after a {}-byte header",
        path.display(),
        index.tensors.len(),
        index.blocks.len(),
        format_size(index.data_end - index.header_bytes),
        index.header_bytes
    );
    println!("\nBlocks (default model order):");
    println!("  {:<48} {:>8} {:>12}", "block", "tensors", "bytes");
    for block in &index.blocks {
        println!(
            "  {:<48} {:>8} {:>12}",
            block.name,
            block.tensors,
            format_size(block.bytes)
        );
    }
    println!("\nTensors (file order):");
    println!(
        "  {:<56} {:<8} {:<20} {:>14} {:>14}  block",
        "name", "dtype", "shape", "start", "end"
    );
    for tensor in &index.tensors {
        let block = index
            .blocks
            .get(tensor.block)
            .map_or("?", |b| b.name.as_str());
        let shape = format!("{:?}", tensor.shape);
        println!(
            "  {:<56} {:<8} {:<20} {:>14} {:>14}  {}",
            tensor.name, tensor.dtype, shape, tensor.start, tensor.end, block
        );
    }
}
