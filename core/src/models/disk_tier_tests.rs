//! The disk tier under the model store: what a load offers it is served back to the next
//! store on the same folder (a restart) without one byte from the source, the header included;
//! a source file replaced since is read from the source, never from the old version's chunks;
//! RAM and the tier keep different chunks, so passes over a model they hold together between
//! them read nothing from the source.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::mode::ModeReason;
use super::*;
use crate::disk_tier::{DiskTier, DiskTierConfig};
use crate::prefetch::saved::SavedOrders;
use crate::source::ReadAt;
use crate::synth::{write_checkpoint, Layout as SynthLayout, SynthDtype, SynthSpec};

const BUDGET: u64 = 4 << 20;

/// A source descriptor that counts the bytes it reads.
struct Counted {
    file: File,
    bytes: Arc<AtomicU64>,
}

impl ReadAt for Counted {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = ReadAt::read_at(&self.file, buf, offset)?;
        self.bytes.fetch_add(n as u64, Ordering::SeqCst);
        Ok(n)
    }
}

fn checkpoint(path: &Path, seed: u64) -> Vec<u8> {
    checkpoint_of(path, seed, 12 << 20)
}

fn checkpoint_of(path: &Path, seed: u64, size: u64) -> Vec<u8> {
    let spec = SynthSpec {
        layout: SynthLayout::Dit,
        target_bytes: size,
        dtype: SynthDtype::BF16,
        seed,
    };
    write_checkpoint(path, &spec).unwrap();
    std::fs::read(path).unwrap()
}

/// Opens the tier in `dir`, waiting for the last store's tier to let go of the folder.
fn tier(dir: &Path) -> Arc<DiskTier> {
    tier_of(dir, 64 << 20)
}

/// [`tier`] of `capacity` bytes.
fn tier_of(dir: &Path, capacity: u64) -> Arc<DiskTier> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match DiskTier::open(&DiskTierConfig::new(dir.to_owned(), capacity)) {
            Ok(tier) => return tier,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("the tier does not open: {e}"),
        }
    }
}

/// A store of budget [`BUDGET`] on `tier` whose source reads are counted in the returned
/// counter (by every descriptor of the store).
fn counted_store(tier: &Arc<DiskTier>) -> (Arc<ModelStore>, Arc<AtomicU64>) {
    counted_store_of(tier, BUDGET)
}

/// [`counted_store`] of budget `budget`.
fn counted_store_of(tier: &Arc<DiskTier>, budget: u64) -> (Arc<ModelStore>, Arc<AtomicU64>) {
    let counted = Arc::new(AtomicU64::new(0));
    let shared = Arc::clone(&counted);
    let store = Arc::new(
        ModelStore::new(budget, SavedOrders::default())
            .with_read_wrapper(Arc::new(move |file| {
                Arc::new(Counted {
                    file,
                    bytes: Arc::clone(&shared),
                }) as Arc<dyn ReadAt>
            }))
            .with_disk_tier(Arc::clone(tier)),
    );
    (store, counted)
}

/// Reads the whole file through `store` in 1 MiB reads, checked against `want`.
fn pass(store: &Arc<ModelStore>, source: &Path, want: &[u8]) {
    let handle = store
        .open_handle(Path::new("m.safetensors"), source)
        .unwrap();
    let mut offset = 0u64;
    while (offset as usize) < want.len() {
        let got = store.read(handle.file(), offset, 1 << 20).unwrap();
        let end = offset as usize + got.len();
        assert_eq!(
            &got[..],
            &want[offset as usize..end],
            "wrong bytes at {offset}"
        );
        offset = end as u64;
    }
}

/// Reads the whole file through a new store on `tier` in 1 MiB reads, checked against
/// `want`; returns the source bytes read.
fn load(source: &Path, tier: Arc<DiskTier>, want: &[u8]) -> u64 {
    let (store, counted) = counted_store(&tier);
    pass(&store, source, want);
    assert!(tier.settle(Duration::from_secs(20)));
    counted.load(Ordering::SeqCst)
}

/// Passes over a model larger than the budget, with a disk tier that holds what the budget
/// does not (and a chunk more): from the third pass on, nothing is read from the source (the
/// second still finds the few chunks RAM gave up before the tier had written them), since RAM
/// gives up the chunks the tier holds first and keeps those it lacks. Were both to keep the
/// model's head, each pass would read the model's tail from the source again.
#[test]
fn ram_keeps_what_the_disk_tier_lacks_so_later_passes_read_nothing_from_the_source() {
    let src = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let path = src.path().join("m.safetensors");
    let want = checkpoint_of(&path, 11, 32 << 20);
    let model = want.len() as u64;
    // The tier holds the model but the budget, and 2 MiB of slack for chunk edges.
    let tier = tier_of(cache.path(), model - BUDGET + (2 << 20));
    let (store, counted) = counted_store(&tier);
    let mut read = Vec::new();
    for _ in 0..4 {
        let before = counted.load(Ordering::SeqCst);
        pass(&store, &path, &want);
        assert!(tier.settle(Duration::from_secs(20)));
        read.push(counted.load(Ordering::SeqCst) - before);
    }
    assert!(
        read[0] >= model * 9 / 10,
        "the first pass reads the source: {read:?}"
    );
    assert!(
        read[1] <= model / 16,
        "the second pass reads little: {read:?} of {model}"
    );
    for later in &read[2..] {
        assert!(
            *later <= 1 << 20,
            "later passes read at most a chunk from the source: {read:?} of {model}"
        );
    }
}

#[test]
fn a_restarted_store_reads_nothing_from_the_source_and_a_replaced_file_is_read_again() {
    let src = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let path = src.path().join("m.safetensors");
    let first = checkpoint(&path, 7);

    let read = load(&path, tier(cache.path()), &first);
    assert!(
        read >= first.len() as u64 * 9 / 10,
        "the first load reads the source: {read}"
    );

    // A restart: a new tier on the same folder, a new store.
    assert_eq!(
        load(&path, tier(cache.path()), &first),
        0,
        "nothing from the source"
    );

    // The file is replaced: the old version's chunks are never served for it.
    std::thread::sleep(Duration::from_millis(20));
    let second = checkpoint(&path, 8);
    assert_ne!(first, second);
    let read = load(&path, tier(cache.path()), &second);
    assert!(
        read >= second.len() as u64 * 9 / 10,
        "a new version is read: {read}"
    );
}

/// A model that fits the budget is passed through from its whole copy in the tier, never from
/// the source: at the first mount the tier does not hold it yet (served by the cache, which
/// fills the tier); after a restart the copy is checked and handed over, every byte the
/// source's, with nothing read from the source; the copy is shared by the version's
/// passthrough handles and released with the last.
#[test]
fn a_model_that_fits_is_passed_through_from_its_whole_copy_after_a_restart() {
    let src = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let path = src.path().join("m.safetensors");
    let want = checkpoint(&path, 21);
    let fits = 64 << 20;
    {
        let tier = tier(cache.path());
        let (store, _) = counted_store_of(&tier, fits);
        let handle = store
            .open_handle(Path::new("m.safetensors"), &path)
            .unwrap();
        assert_eq!(store.choose_mode(&handle, true), ServeMode::Cache);
        assert_eq!(ModeReason::load(&handle.mode_reason), ModeReason::DiskTier);
        drop(handle);
        pass(&store, &path, &want);
        assert!(tier.settle(Duration::from_secs(20)));
    }
    let tier = tier(cache.path());
    let (store, counted) = counted_store_of(&tier, fits);
    let handle = store
        .open_handle(Path::new("m.safetensors"), &path)
        .unwrap();
    assert_eq!(store.choose_mode(&handle, true), ServeMode::Passthrough);
    assert_eq!(
        ModeReason::load(&handle.mode_reason),
        ModeReason::FromDiskTier
    );
    let mut copy = handle.tier_copy_file().unwrap().unwrap();
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut copy, &mut got).unwrap();
    assert!(got == want, "the copy is the source's bytes");
    assert_eq!(counted.load(Ordering::SeqCst), 0, "nothing from the source");
    assert!(
        store.force_passthrough(&handle),
        "a second handle shares it"
    );
    store.close_passthrough(&handle);
    assert!(
        handle.tier_copy_file().is_some(),
        "held by the other handle"
    );
    store.close_passthrough(&handle);
    assert!(handle.tier_copy_file().is_none(), "released with the last");
    assert_eq!(tier.stats().whole_copies, 1);
}
