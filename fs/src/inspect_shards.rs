//! `tierfs inspect NAME.safetensors.index.json [--json]`: a sharded model (diffusers /
//! transformers `save_pretrained` layout) as one model: its shards in name order, each shard's
//! index checked against the weight map, and the blocks of the whole model (default model
//! order over all shards' tensors).
//!
//! Shard names in the weight map must be plain file names in the index's directory: a name with
//! a path separator or `..` is refused, so a hostile index cannot point outside the model.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tierfs_core::index::blocks;
use tierfs_core::index::{BlockInfo, Format, TensorIndex};
use tierfs_core::size::format_size;

/// Whether `path` names a sharded model's index (`*.index.json`).
pub fn is_index(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".index.json"))
}

#[derive(Serialize)]
struct Shard {
    file: String,
    tensors: usize,
    data_bytes: u64,
}

#[derive(Serialize)]
struct Sharded {
    format: &'static str,
    shards: Vec<Shard>,
    blocks: Vec<BlockInfo>,
}

pub fn run(path: &Path, json: bool) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let map = doc
        .get("weight_map")
        .and_then(|m| m.as_object())
        .with_context(|| format!("{} has no weight_map object", path.display()))?;
    let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (tensor, shard) in map {
        let shard = shard
            .as_str()
            .with_context(|| format!("weight_map entry {tensor:?} is not a file name"))?;
        if shard.contains('/') || shard.contains('\\') || shard == ".." || shard == "." {
            bail!("weight_map names {shard:?}, which is not a file in the model's directory");
        }
        by_shard.entry(shard).or_default().push(tensor);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut shards = Vec::new();
    let mut all: Vec<(String, u64)> = Vec::new();
    for (name, tensors) in &by_shard {
        let index = shard_index(&dir.join(name))?;
        for t in tensors {
            if !index.tensors.iter().any(|x| x.name == *t) {
                bail!("weight_map puts {t:?} in {name}, which has no such tensor");
            }
        }
        all.extend(index.tensors.iter().map(|t| (t.name.clone(), t.len())));
        shards.push(Shard {
            file: (*name).to_owned(),
            tensors: index.tensors.len(),
            data_bytes: index.data_end - index.header_bytes,
        });
    }
    let grouping = blocks::group(all.iter().map(|(n, len)| (n.as_str(), *len)));
    let model = Sharded {
        format: "sharded",
        shards,
        blocks: grouping.blocks,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&model)?);
    } else {
        print_table(path, &model);
    }
    Ok(())
}

fn shard_index(path: &Path) -> Result<TensorIndex> {
    let file = File::open(path).with_context(|| format!("cannot open shard {}", path.display()))?;
    let format = Format::of_path(path).unwrap_or_default();
    TensorIndex::read_format(&file, format)
        .with_context(|| format!("shard {} is not a valid {format:?} file", path.display()))
}

fn print_table(path: &Path, model: &Sharded) {
    let blocks = model.blocks.iter().filter(|b| b.family.is_some()).count();
    println!(
        "{}: {} shards, {} blocks (+ non-block tensors)",
        path.display(),
        model.shards.len(),
        blocks
    );
    println!("\nShards:");
    for s in &model.shards {
        println!(
            "  {:<60} {:>8} tensors {:>12}",
            s.file,
            s.tensors,
            format_size(s.data_bytes)
        );
    }
    println!("\nBlocks over all shards (default model order):");
    for b in &model.blocks {
        println!(
            "  {:<48} {:>8} {:>12}",
            b.name,
            b.tensors,
            format_size(b.bytes)
        );
    }
}
