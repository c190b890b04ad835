//! `tierfs demo`: the whole product in one command, with no model at hand.
//!
//! Writes a synthetic DiT-shaped checkpoint (bf16, `blocks.N.*` names) into a temporary folder,
//! mounts that folder with a budget smaller than the file, reads the file through the mount
//! twice while checking every byte against the source, prints the live stats, and unmounts.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tierfs_core::size::format_size;
use tierfs_core::synth::{write_checkpoint, Layout, SynthDtype, SynthSpec};

use crate::mount::{MountRequest, Mounted};

const READ_BYTES: usize = 8 << 20;

pub fn run(size: u64, budget: u64) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("tierfs-demo-")
        .tempdir()
        .context("cannot create a temporary folder")?;
    let models = dir.path().join("models");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&models)?;
    std::fs::create_dir_all(&mnt)?;
    let name = "demo-dit-bf16.safetensors";
    println!(
        "1. writing a {} synthetic DiT checkpoint: {}",
        format_size(size),
        models.join(name).display()
    );
    let spec = SynthSpec {
        layout: Layout::Dit,
        target_bytes: size,
        dtype: SynthDtype::BF16,
        seed: 2026,
    };
    let summary =
        write_checkpoint(&models.join(name), &spec).context("cannot write the checkpoint")?;
    println!(
        "   {} tensors in {} blocks",
        summary.tensors, summary.blocks
    );

    println!(
        "2. mounting {} at {} with a {} RAM cache",
        models.display(),
        mnt.display(),
        format_size(budget)
    );
    let request = MountRequest {
        source: models.clone(),
        mountpoint: mnt.clone(),
        budget,
        floor: None,
        threads: 8,
        transport: crate::fuse_uring::TransportMode::default(),
        readahead: 128 << 10,
        passthrough: true,
        model_passthrough: true,
        allow_other: false,
        index_cap: tierfs_core::models::DEFAULT_INDEX_CAP,
        state_file: None,
        metrics_addr: None,
        source_io: tierfs_core::source::deadline::SourceIoConfig::default(),
        source_pacing: tierfs_core::prefetch::PacingMode::Auto,
        compress: tierfs_core::cache::CompressMode::default(),
        disk_tier: None,
        object: tierfs_core::object::ObjectStoreConfig::default(),
    };
    let mounted = Mounted::start(&request)?;
    let streamed = stream_twice(&mnt.join(name), &models.join(name));
    let stats = std::fs::read_to_string(mnt.join(".tierfs/stats"));
    let unmounted = mounted.unmount();
    streamed?;
    let doc: crate::stats_read::StatsRead = serde_json::from_str(&stats?)?;
    println!("4. live stats, as `tierfs stats MOUNTPOINT` shows them (raw JSON: MOUNTPOINT/.tierfs/stats):\n");
    print!("{}", crate::stats_cmd::render_document(&doc));
    unmounted?;
    println!("\n5. unmounted. Every byte read through the mount matched the source file.");
    Ok(())
}

fn stream_twice(mounted: &Path, source: &Path) -> Result<()> {
    println!("3. streaming it through the mount, checking every byte against the source");
    for pass in 1..=2 {
        let started = Instant::now();
        let bytes = compare(mounted, source)?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "   pass {pass}: {} in {secs:.2} s ({}/s)",
            format_size(bytes),
            format_size((bytes as f64 / secs) as u64)
        );
    }
    Ok(())
}

fn compare(mounted: &Path, source: &Path) -> Result<u64> {
    let mut through =
        File::open(mounted).with_context(|| format!("cannot open {}", mounted.display()))?;
    let mut direct = File::open(source)?;
    let (mut a, mut b) = (vec![0u8; READ_BYTES], vec![0u8; READ_BYTES]);
    let mut total = 0u64;
    loop {
        let n = read_full(&mut through, &mut a)?;
        let m = read_full(&mut direct, &mut b)?;
        if n != m || a[..n] != b[..m] {
            bail!("bytes differ from the source near offset {total}");
        }
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

fn read_full(file: &mut File, buf: &mut [u8]) -> Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}
