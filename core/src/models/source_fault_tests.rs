//! A source that stops answering or fails for a while, under the whole read path: reads that
//! hang get an error within the deadline (their waiters too) and cache nothing; what is cached
//! keeps being served meanwhile; the same reads give the exact bytes once the source is back;
//! dead descriptors are opened again only as the very version indexed. Every wait is bounded.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::cache::{ChunkCache, ChunkKey, Want};
use crate::prefetch::saved::SavedOrders;
use crate::prefetch::ManualExecutor;
use crate::source::deadline::{SourceIo, SourceIoConfig};
use crate::source::retry::RetryPolicy;
use crate::source::{AlignedBytes, ReadAt, SourceError};
use crate::stats::Counters;

/// Longer than any healthy step here: a wait past it fails the test instead of hanging it.
const BOUND: Duration = Duration::from_secs(20);

/// The source's misbehaviour, shared by every descriptor the store opens.
#[derive(Default)]
struct Misbehaviour {
    /// Reads overlapping this range block until it is cleared.
    hang: Mutex<Option<(u64, u64)>>,
    cleared: Condvar,
    /// Descriptors wrapped before this epoch fail every read with `ESTALE`.
    stale_before: AtomicUsize,
    wraps: AtomicUsize,
}

impl Misbehaviour {
    fn clear_hang(&self) {
        *self.hang.lock().unwrap() = None;
        self.cleared.notify_all();
    }

    /// Every descriptor open now is dead from here on (`ESTALE`); new ones work.
    fn kill_descriptors(&self) {
        self.stale_before
            .store(self.wraps.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

struct MisbehavingFile {
    file: File,
    epoch: usize,
    source: Arc<Misbehaviour>,
}

impl ReadAt for MisbehavingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if self.epoch < self.source.stale_before.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        let end = offset + buf.len() as u64;
        let mut hang = self.source.hang.lock().unwrap();
        let started = Instant::now();
        while hang.is_some_and(|(s, e)| offset < e && s < end) && started.elapsed() < BOUND {
            hang = self.source.cleared.wait_timeout(hang, BOUND).unwrap().0;
        }
        drop(hang);
        ReadAt::read_at(&self.file, buf, offset)
    }
}

struct Setup {
    dir: tempfile::TempDir,
    bytes: Vec<u8>,
    store: Arc<ModelStore>,
    source: Arc<Misbehaviour>,
}

fn config(timeout: Duration) -> SourceIoConfig {
    SourceIoConfig {
        timeout: Some(timeout),
        retry: RetryPolicy {
            first_backoff: Duration::from_millis(5),
            ..RetryPolicy::DEFAULT
        },
        ..SourceIoConfig::DEFAULT
    }
}

fn setup(timeout: Duration) -> Setup {
    let (dir, bytes) = super::fault_tests::dit_checkpoint(5);
    let source = Arc::new(Misbehaviour::default());
    let shared = Arc::clone(&source);
    // Prefetches run only when a test asks (never here): every source read is a reader's.
    let exec = Arc::new(ManualExecutor::new(1024));
    let store = ModelStore::with_executor(64 << 20, SavedOrders::default(), exec)
        .with_read_wrapper(Arc::new(move |file| {
            Arc::new(MisbehavingFile {
                file,
                epoch: shared.wraps.fetch_add(1, Ordering::SeqCst),
                source: Arc::clone(&shared),
            }) as Arc<dyn ReadAt>
        }))
        .with_source_io(config(timeout));
    Setup {
        dir,
        bytes,
        store: Arc::new(store),
        source,
    }
}

impl Setup {
    fn open_handle(&self) -> OpenModel {
        self.store
            .open_handle(
                Path::new("m.safetensors"),
                &self.dir.path().join("m.safetensors"),
            )
            .unwrap()
    }

    fn data_start(file: &ModelFile) -> u64 {
        match file.layout() {
            Layout::Indexed { index, .. } => index.header_bytes,
            Layout::Raw { .. } => unreachable!(),
        }
    }

    /// `[from, until)` in 1 MiB reads, each checked against the source's bytes.
    fn read_checked(&self, file: &Arc<ModelFile>, from: u64, until: u64) {
        let mut offset = from;
        while offset < until {
            let got = self.store.read(file, offset, 1 << 20).unwrap();
            let end = offset as usize + got.len();
            assert_eq!(
                &got[..],
                &self.bytes[offset as usize..end],
                "wrong bytes at {offset}"
            );
            offset = end as u64;
        }
    }
}

fn eventually(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < BOUND, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_hung_read_times_out_cached_chunks_still_serve_and_it_reads_exactly_once_back() {
    let timeout = Duration::from_millis(300);
    let s = setup(timeout);
    let handle = s.open_handle();
    let file = Arc::clone(handle.file());
    let data = Setup::data_start(&file);
    s.read_checked(&file, data, data + (4 << 20));

    let (hung_start, hung_end) = (data + (6 << 20), data + (7 << 20));
    *s.source.hang.lock().unwrap() = Some((hung_start, hung_end));
    let started = Instant::now();
    let failed = s.store.read(&file, hung_start, 1 << 20);
    let took = started.elapsed();
    let err = failed
        .err()
        .expect("a read of a hung source returned bytes");
    assert!(
        err.to_string().contains("timed out"),
        "not a timeout: {err}"
    );
    assert!(took >= timeout && took < BOUND, "took {took:?}");
    let io = s.store.source_io().snapshot();
    assert_eq!((io.timeouts, io.stuck), (1, 1));

    // While the source hangs, what is cached is served, exactly.
    let hits_before = Counters::get(&s.store.counters().hit_bytes);
    s.read_checked(&file, data, data + (4 << 20));
    assert!(Counters::get(&s.store.counters().hit_bytes) >= hits_before + (4 << 20) - 4096);

    // The source is back: the stuck read returns (its bytes go nowhere), the same read gives
    // the exact bytes.
    s.source.clear_hang();
    eventually("the stuck read returned", || {
        s.store.source_io().snapshot().stuck == 0
    });
    s.read_checked(&file, hung_start, hung_end);
    s.read_checked(&file, data, s.bytes.len() as u64);
    let used = s.store.cache().snapshot().used_bytes;
    assert!(used <= 64 << 20, "a reservation leaked: {used}");
}

#[test]
fn waiters_of_a_timed_out_load_get_its_error_and_the_next_request_reads_again() {
    let cache = ChunkCache::new(16 << 20, Arc::new(Counters::default()));
    let io = Arc::new(SourceIo::new(config(Duration::from_secs(2))));
    let key = ChunkKey { file: 1, chunk: 0 };
    let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    let loads = Arc::new(AtomicUsize::new(0));
    let (open, gate) = crossbeam::channel::bounded::<()>(0);
    let (late_tx, late) = crossbeam::channel::bounded::<()>(1);

    let hung = {
        let (cache, io, loads, bytes) = (&cache, Arc::clone(&io), Arc::clone(&loads), &bytes);
        let copy = bytes.clone();
        move || {
            cache.get_or_load(key, 1 << 20, Want::Read, None, move || {
                loads.fetch_add(1, Ordering::SeqCst);
                io.read((Path::new("f"), 0), move |_| {
                    let _ = gate.recv();
                    let late = AlignedBytes::copy_of(&copy).map_err(|source| SourceError::Alloc {
                        len: copy.len(),
                        source,
                    });
                    let _ = late_tx.send(());
                    late
                })
            })
        }
    };
    std::thread::scope(|scope| {
        let loader = scope.spawn(hung);
        eventually("the load started", || loads.load(Ordering::SeqCst) == 1);
        // A second reader of the same chunk waits for that load (single flight).
        let waiter = scope.spawn(|| {
            cache.get_or_load(key, 1 << 20, Want::Read, None, || {
                loads.fetch_add(1, Ordering::SeqCst);
                AlignedBytes::copy_of(&bytes).map_err(|source| SourceError::Alloc {
                    len: bytes.len(),
                    source,
                })
            })
        });
        let (first, second) = (loader.join().unwrap(), waiter.join().unwrap());
        assert!(first.is_err(), "the hung load returned bytes");
        assert!(second.is_err(), "its waiter did not get the error");
        assert_eq!(
            loads.load(Ordering::SeqCst),
            1,
            "the waiter read on its own"
        );
    });
    assert!(!cache.is_present(key));
    assert_eq!(cache.snapshot().used_bytes, 0, "the reservation was kept");

    // The late result of the abandoned read is dropped, never cached.
    drop(open);
    late.recv_timeout(BOUND).unwrap();
    eventually("the stuck read returned", || io.snapshot().stuck == 0);
    assert!(!cache.is_present(key), "a late result was cached");

    let (chunk, _) = cache
        .get_or_load(key, 1 << 20, Want::Read, None, || {
            io.read((Path::new("f"), 0), {
                let copy = bytes.clone();
                move |_| {
                    AlignedBytes::copy_of(&copy).map_err(|source| SourceError::Alloc {
                        len: copy.len(),
                        source,
                    })
                }
            })
        })
        .unwrap();
    assert_eq!(chunk.as_slice(), &bytes[..]);
}

#[test]
fn dead_descriptors_are_reopened_once_as_the_same_version() {
    let s = setup(BOUND);
    let handle = s.open_handle();
    let file = Arc::clone(handle.file());
    let data = Setup::data_start(&file);
    s.read_checked(&file, data, data + (2 << 20));
    let reopens = file.source().reopens();

    s.source.kill_descriptors();
    s.read_checked(&file, data + (4 << 20), data + (6 << 20));
    let io = s.store.source_io().snapshot();
    assert_eq!(io.reopens, 1, "{io:?}");
    assert!(io.retries >= 1);
    assert_eq!(file.source().reopens(), reopens + 1);
    // The handle's reads go through the new descriptors from now on: no reopen per read.
    s.read_checked(&file, data + (6 << 20), s.bytes.len() as u64);
    assert_eq!(s.store.source_io().snapshot().reopens, 1);
}

#[test]
fn a_dead_descriptor_of_a_replaced_file_is_never_reopened_as_the_old_version() {
    let s = setup(BOUND);
    let handle = s.open_handle();
    let file = Arc::clone(handle.file());
    let data = Setup::data_start(&file);
    s.read_checked(&file, data, data + (1 << 20));

    // SOURCE replaces the file (same size, other bytes), and the old descriptors die.
    let path = s.dir.path().join("m.safetensors");
    let other: Vec<u8> = s.bytes.iter().map(|b| !b).collect();
    std::fs::write(s.dir.path().join("new"), &other).unwrap();
    std::fs::rename(s.dir.path().join("new"), &path).unwrap();
    s.source.kill_descriptors();

    let got = s.store.read(&file, data + (4 << 20), 1 << 20);
    let err = got
        .err()
        .expect("the old version was read through the new file");
    assert!(err.to_string().contains("no longer the version"), "{err}");
    assert_eq!(s.store.source_io().snapshot().reopens, 1);
}
