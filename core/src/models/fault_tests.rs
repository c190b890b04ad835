//! Fault injection under the whole read path: short reads, `EINTR` and `EIO` from the layer that
//! reads the source, and files truncated, replaced or deleted while being read. Readers must get
//! either an error or the right bytes, never other bytes, and the cache must hold nothing
//! poisoned once the fault is gone.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::prefetch::saved::SavedOrders;
use crate::source::ReadAt;
use crate::stats::Counters;
use crate::synth::{write_checkpoint, Layout as SynthLayout, SynthDtype, SynthSpec};

/// What the faulty layer does to the reads overlapping `start..end`.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Fail with EIO.
    Eio { start: u64, end: u64 },
    /// Every other call fails with EINTR first.
    Eintr,
    /// No call returns more than this many bytes.
    Short(usize),
}

#[derive(Default)]
struct Faults {
    active: Mutex<Vec<Fault>>,
    calls: AtomicUsize,
}

struct FaultyFile {
    file: File,
    faults: Arc<Faults>,
}

impl ReadAt for FaultyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let call = self.faults.calls.fetch_add(1, Ordering::SeqCst);
        let mut len = buf.len();
        for fault in self.faults.active.lock().unwrap().iter() {
            match *fault {
                Fault::Eio { start, end } if offset < end && offset + len as u64 > start => {
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                }
                Fault::Eintr if call.is_multiple_of(2) => {
                    return Err(io::ErrorKind::Interrupted.into())
                }
                Fault::Short(max) => len = len.min(max),
                _ => {}
            }
        }
        ReadAt::read_at(&self.file, &mut buf[..len], offset)
    }
}

struct Setup {
    dir: tempfile::TempDir,
    bytes: Vec<u8>,
    store: Arc<ModelStore>,
    faults: Arc<Faults>,
}

/// A 12 MiB bf16 DiT checkpoint, `m.safetensors` in a temporary folder, and its bytes.
pub(super) fn dit_checkpoint(seed: u64) -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        layout: SynthLayout::Dit,
        target_bytes: 12 << 20,
        dtype: SynthDtype::BF16,
        seed,
    };
    write_checkpoint(&dir.path().join("m.safetensors"), &spec).unwrap();
    let bytes = std::fs::read(dir.path().join("m.safetensors")).unwrap();
    (dir, bytes)
}

fn setup(budget: u64, faults: &[Fault]) -> Setup {
    let (dir, bytes) = dit_checkpoint(9);
    let injected = Arc::new(Faults::default());
    injected.active.lock().unwrap().extend_from_slice(faults);
    let shared = Arc::clone(&injected);
    let store =
        ModelStore::new(budget, SavedOrders::default()).with_read_wrapper(Arc::new(move |file| {
            Arc::new(FaultyFile {
                file,
                faults: Arc::clone(&shared),
            }) as Arc<dyn ReadAt>
        }));
    Setup {
        dir,
        bytes,
        store: Arc::new(store),
        faults: injected,
    }
}

impl Setup {
    /// The file, held open like a reader's handle (its descriptors stay open).
    fn open_handle(&self) -> OpenModel {
        self.store
            .open_handle(
                Path::new("m.safetensors"),
                &self.dir.path().join("m.safetensors"),
            )
            .unwrap()
    }

    fn open(&self) -> Arc<ModelFile> {
        self.store
            .open(
                Path::new("m.safetensors"),
                &self.dir.path().join("m.safetensors"),
            )
            .unwrap()
    }

    /// Reads the whole file in `step`-byte reads; every read is checked against `expected`.
    fn read_all_checked(
        &self,
        file: &Arc<ModelFile>,
        expected: &[u8],
        step: u32,
    ) -> Vec<Result<(), String>> {
        self.read_checked(file, expected, expected.len() as u64, step)
    }

    /// Reads `[0, until)` in `step`-byte reads, each checked against `expected` (the whole file).
    fn read_checked(
        &self,
        file: &Arc<ModelFile>,
        expected: &[u8],
        until: u64,
        step: u32,
    ) -> Vec<Result<(), String>> {
        (0..until)
            .step_by(step as usize)
            .map(|offset| match self.store.read(file, offset, step) {
                Ok(got) => {
                    let end = (offset as usize + step as usize).min(expected.len());
                    assert_eq!(
                        &got[..],
                        &expected[offset as usize..end],
                        "wrong bytes at {offset}"
                    );
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            })
            .collect()
    }
}

#[test]
fn short_reads_and_eintr_still_give_exact_bytes() {
    for fault in [Fault::Short(1000), Fault::Short(4097), Fault::Eintr] {
        let s = setup(4 << 20, &[fault]);
        let file = s.open();
        let results = s.read_all_checked(&file, &s.bytes, 300_000);
        assert!(results.iter().all(Result::is_ok), "{fault:?}: {results:?}");
        assert!(
            s.faults.calls.load(Ordering::SeqCst) > 10,
            "the faulty layer was used"
        );
    }
}

#[test]
fn eio_fails_only_the_reads_that_touch_it_and_poisons_nothing() {
    let s = setup(64 << 20, &[]);
    let file = s.open();
    let data_start = match file.layout() {
        Layout::Indexed { index, .. } => index.header_bytes,
        Layout::Raw { .. } => unreachable!(),
    };
    let (bad_start, bad_end) = (data_start + (5 << 20), data_start + (5 << 20) + 4096);
    s.faults.active.lock().unwrap().push(Fault::Eio {
        start: bad_start,
        end: bad_end,
    });
    let results = s.read_all_checked(&file, &s.bytes, 1 << 20);
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert!(
        (1..=3).contains(&failed),
        "only the reads near the fault fail: {results:?}"
    );
    let errors = Counters::get(&s.store.counters().disk_errors);
    assert!(errors >= 1);
    // Nothing half-read was kept, and no reservation leaked.
    let used = s.store.cache().snapshot().used_bytes;
    assert!(used <= 64 << 20);
    // Once the fault is gone the same ranges read correctly.
    s.faults.active.lock().unwrap().clear();
    let results = s.read_all_checked(&file, &s.bytes, 1 << 20);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

#[test]
fn a_file_truncated_mid_read_gives_errors_or_right_bytes_never_others() {
    let s = setup(4 << 20, &[]);
    let handle = s.open_handle();
    let file = Arc::clone(handle.file());
    let half = s.bytes.len() as u64 / 2;
    // Read the first part (some of it now cached), then cut the file in half.
    assert!(s
        .read_checked(&file, &s.bytes, half, 1 << 20)
        .iter()
        .all(Result::is_ok));
    std::fs::OpenOptions::new()
        .write(true)
        .open(s.dir.path().join("m.safetensors"))
        .unwrap()
        .set_len(half)
        .unwrap();
    // The open version: every byte it returns is the old content; past the cut it fails.
    for offset in (0..s.bytes.len() as u64).step_by(700_000) {
        if let Ok(got) = s.store.read(&file, offset, 700_000) {
            let end = offset as usize + got.len();
            assert_eq!(
                &got[..],
                &s.bytes[offset as usize..end],
                "wrong bytes at {offset}"
            );
        }
    }
    // A new open sees the truncated file as it is now: a malformed file, served byte-exact.
    let now = s.open();
    assert!(now.is_raw());
    let got = s.store.read(&now, 0, u32::MAX).unwrap();
    assert_eq!(&got[..], &s.bytes[..half as usize]);
}

#[test]
#[cfg_attr(
    windows,
    ignore = "Wine 8 cannot rename over a file another handle has open (no POSIX rename semantics)"
)]
fn replaced_or_deleted_files_keep_serving_the_version_that_was_opened() {
    let s = setup(4 << 20, &[]);
    let path = s.dir.path().join("m.safetensors");
    let handle = s.open_handle();
    let old = Arc::clone(handle.file());
    // Replace it by a file of the same size with other bytes, then delete that one too.
    let other: Vec<u8> = s.bytes.iter().map(|b| b.wrapping_add(1)).collect();
    std::fs::write(s.dir.path().join("new"), &other).unwrap();
    std::fs::rename(s.dir.path().join("new"), &path).unwrap();
    assert!(s
        .read_all_checked(&old, &s.bytes, 1 << 20)
        .iter()
        .all(Result::is_ok));
    std::fs::remove_file(&path).unwrap();
    assert!(s
        .read_all_checked(&old, &s.bytes, 777_777)
        .iter()
        .all(Result::is_ok));
    assert!(
        s.store.open(Path::new("m.safetensors"), &path).is_err(),
        "a deleted file cannot be opened anew"
    );
}
