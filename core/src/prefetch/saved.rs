//! Learned orders kept across remounts: one small JSON file in the daemon's state directory
//! (never in SOURCE, which is mounted read-only and may not be ours to write).
//!
//! Orders are keyed by the source file's canonical path, size and modification time: a file
//! replaced or rewritten starts fresh, and an order whose block count no longer
//! matches the file is ignored when loaded ([`crate::reader::ReaderTracker::new`]). The
//! file holds one short list of numbers per model, and, per model file, the model file opened
//! after it last time ([`NextModel`], `crate::models` "sequence"), under the key
//! `then|` + the file's key.
//!
//! **Writing.** A read that completes a pass learns an order ([`SavedOrders::put`]); the file is
//! not written on that (FUSE request) thread but by one background writer thread per mount,
//! which coalesces puts that arrive while it writes (so a burst of passes costs one write).
//! Each write is atomic and durable: a unique temporary name in the same directory
//! (`orders.json.<pid>.<n>.tmp`), `fsync`, `rename` over the file, `fsync` of the directory.
//!
//! **Two daemons, one state directory** (the default directory is per user, not per mount):
//! a write holds an exclusive `flock` on `orders.json.lock` while it re-reads the file, merges
//! its own orders over what is there and renames the result in. Neither daemon loses the
//! other's orders, and no reader ever sees a half-written file. Orders learned by another
//! daemon after this one loaded the file reach this one at its next mount.
//!
//! Dropping [`SavedOrders`] (at unmount) waits for the writer to finish the last write.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::reader::order::BlockOrder;
use crate::source::SourceIdentity;
use crate::sync::{lock, wait, Condvar, Mutex};

/// Orders kept at most; beyond this the alphabetically first keys are dropped. A models folder
/// has tens of files, so this only bounds a pathological state file.
const MAX_ORDERS: usize = 4096;

type Orders = BTreeMap<String, Entry>;

/// Prefix of the keys of [`NextModel`] entries.
const NEXT_PREFIX: &str = "then|";

/// One entry of the file: a learned block order, or the model file that follows one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Entry {
    Order(BlockOrder),
    Next(NextModel),
}

/// The model file a workflow opened after another one: where it is (relative to the mount
/// root, and in SOURCE) and the key of the version that was opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextModel {
    pub next_path: PathBuf,
    pub next_source: PathBuf,
    pub next_key: String,
}

/// Puts requested and written, counted, so [`SavedOrders::flush`] can wait for a given put.
#[derive(Default)]
struct Progress {
    requested: u64,
    written: u64,
    stop: bool,
}

struct Shared {
    orders: Mutex<Orders>,
    progress: Mutex<Progress>,
    /// Signalled on a new put, a finished write, and stop.
    changed: Condvar,
}

impl Shared {
    fn new(orders: Orders) -> Shared {
        Shared {
            orders: Mutex::new(orders),
            progress: Mutex::new(Progress::default()),
            changed: Condvar::new(),
        }
    }
}

/// The saved orders of a mount.
pub struct SavedOrders {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

impl Default for SavedOrders {
    /// Orders in memory only.
    fn default() -> SavedOrders {
        SavedOrders {
            shared: Arc::new(Shared::new(Orders::new())),
            writer: None,
        }
    }
}

impl std::fmt::Debug for SavedOrders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavedOrders")
            .field("orders", &lock(&self.shared.orders).len())
            .finish()
    }
}

impl SavedOrders {
    /// Orders from `path` (none if it is missing or unreadable, with a warning for the latter);
    /// `None` keeps orders in memory only.
    pub fn load(path: Option<PathBuf>) -> SavedOrders {
        let Some(path) = path else {
            return SavedOrders::default();
        };
        let shared = Arc::new(Shared::new(read_orders(&path)));
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("tierfs-orders".into())
                .spawn(move || run_writer(&shared, &path))
        };
        let writer = writer
            .map_err(|e| tracing::warn!(error = %e, "cannot start the order writer: learned orders will not be saved"))
            .ok();
        SavedOrders { shared, writer }
    }

    /// The key of a file's order: its canonical path (see `SourceFile::canonical_path`), size
    /// and mtime.
    pub fn key(canonical: &Path, identity: &SourceIdentity) -> String {
        format!(
            "{}|{}|{}",
            canonical.display(),
            identity.size,
            identity.mtime_ns
        )
    }

    pub fn get(&self, key: &str) -> Option<BlockOrder> {
        match lock(&self.shared.orders).get(key) {
            Some(Entry::Order(order)) => Some(order.clone()),
            _ => None,
        }
    }

    /// Records a learned order; the background writer saves it soon after.
    pub fn put(&self, key: String, order: BlockOrder) {
        self.insert(key, Entry::Order(order));
    }

    /// The model file opened after the file of `key` last time.
    pub fn next_model(&self, key: &str) -> Option<NextModel> {
        match lock(&self.shared.orders).get(&format!("{NEXT_PREFIX}{key}")) {
            Some(Entry::Next(next)) => Some(next.clone()),
            _ => None,
        }
    }

    /// Records that `next` was opened after the file of `key`.
    pub fn put_next_model(&self, key: &str, next: NextModel) {
        if self.next_model(key).as_ref() == Some(&next) {
            return; // a workflow repeats its sequence: nothing to write
        }
        self.insert(format!("{NEXT_PREFIX}{key}"), Entry::Next(next));
    }

    fn insert(&self, key: String, entry: Entry) {
        {
            let mut orders = lock(&self.shared.orders);
            orders.insert(key, entry);
            trim(&mut orders);
        }
        if self.writer.is_some() {
            lock(&self.shared.progress).requested += 1;
            self.shared.changed.notify_all();
        }
    }

    /// Waits until every put so far is on disk (or its write failed and was logged).
    pub fn flush(&self) {
        if self.writer.is_none() {
            return;
        }
        let mut progress = lock(&self.shared.progress);
        let wanted = progress.requested;
        while progress.written < wanted {
            progress = wait(&self.shared.changed, progress);
        }
    }
}

impl Drop for SavedOrders {
    fn drop(&mut self) {
        let Some(writer) = self.writer.take() else {
            return;
        };
        lock(&self.shared.progress).stop = true;
        self.shared.changed.notify_all();
        if writer.join().is_err() {
            tracing::warn!("the order writer panicked; the last learned orders may be unsaved");
        }
    }
}

/// The writer thread: writes whenever puts are pending, until stopped with none pending.
fn run_writer(shared: &Shared, path: &Path) {
    loop {
        let target = {
            let mut progress = lock(&shared.progress);
            while progress.written == progress.requested && !progress.stop {
                progress = wait(&shared.changed, progress);
            }
            if progress.written == progress.requested {
                return; // stopped, nothing pending
            }
            progress.requested
        };
        let ours = lock(&shared.orders).clone();
        if let Err(e) = merge_and_write(path, &ours) {
            tracing::warn!(path = %path.display(), error = %e, "cannot save learned block orders");
        }
        lock(&shared.progress).written = target;
        shared.changed.notify_all();
    }
}

fn trim(orders: &mut Orders) {
    while orders.len() > MAX_ORDERS {
        orders.pop_first();
    }
}

fn read_orders(path: &Path) -> Orders {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable saved block orders");
            BTreeMap::new()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read saved block orders");
            BTreeMap::new()
        }
    }
}

/// Under an exclusive lock shared by every daemon using this state file: reads what is there,
/// lays `ours` over it, and replaces the file atomically.
fn merge_and_write(path: &Path, ours: &Orders) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let lock_file = private(OpenOptions::new().create(true).truncate(false).write(true))
        .open(sibling(path, "lock"))?;
    // std's lock: flock(LOCK_EX) on Unix, LockFileEx on Windows; released when `lock_file`
    // is closed.
    lock_file.lock()?;
    let mut merged = read_orders(path);
    merged.extend(ours.iter().map(|(k, v)| (k.clone(), v.clone())));
    trim(&mut merged);
    let json = serde_json::to_vec(&merged).map_err(std::io::Error::other)?;
    write_atomically(dir, path, &json)
}

/// Creates files readable by their owner only: the orders name model files, which other users
/// of a shared mount may not be able to list.
fn private(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(options, 0o600);
    options
}

/// Process-wide counter making temporary names unique among the writers of one process.
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = sibling(path, &format!("{}.{seq}.tmp", std::process::id()));
    let written = (|| {
        let mut file = private(OpenOptions::new().write(true).create_new(true)).open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // The rename is durable once the directory is; failing to sync it only risks the old file.
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        tracing::debug!(dir = %dir.display(), error = %e, "cannot fsync the state directory");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_survive_a_reload_and_bad_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/orders.json");
        let saved = SavedOrders::load(Some(path.clone()));
        let mut order = BlockOrder::new(8);
        for block in [3, 2, 1, 0, 4, 5, 6, 7, 3] {
            order.touch(block);
        }
        assert!(order.is_learned());
        saved.put("m|1".into(), order.clone());
        saved.flush();
        let reloaded = SavedOrders::load(Some(path.clone()));
        assert_eq!(
            reloaded.get("m|1").map(|o| o.order().to_vec()),
            Some(order.order().to_vec())
        );
        std::fs::write(&path, b"{not json").unwrap();
        assert!(SavedOrders::load(Some(path)).get("m|1").is_none());
    }

    fn learned(first: usize) -> BlockOrder {
        let mut order = BlockOrder::new(4);
        for block in [first, 0, 1, 2, 3, first] {
            order.touch(block);
        }
        order
    }

    /// `put` never writes on the caller's thread: with another writer holding the state file's
    /// lock, it returns at once, and the file appears once the lock is released.
    #[test]
    #[cfg(unix)]
    fn puts_return_while_the_file_is_locked_by_another_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.json");
        let saved = SavedOrders::load(Some(path.clone()));
        let held = File::create(sibling(&path, "lock")).unwrap();
        held.lock().unwrap();
        saved.put("m|1".into(), learned(2));
        assert!(!path.exists());
        drop(held);
        saved.flush();
        // Readable by its owner only: it names model files.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        assert!(SavedOrders::load(Some(path)).get("m|1").is_some());
    }

    /// Two daemons sharing one state directory, each putting its own orders from several
    /// threads while a third party keeps reading the file: every read parses, no temporary
    /// file is left, and the file ends with every order of both.
    #[test]
    #[cfg_attr(
        windows,
        ignore = "Wine 8 cannot rename over a file another handle has open (the reader's); 25 of 100 orders landed"
    )]
    fn two_daemons_sharing_a_state_directory_keep_each_others_orders() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.json");
        let daemons = [
            Arc::new(SavedOrders::load(Some(path.clone()))),
            Arc::new(SavedOrders::load(Some(path.clone()))),
        ];
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, done) = (path.clone(), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut reads = 0;
                // Reads while the writers run, and once more after they flushed, so that at
                // least one read happens even when this thread is scheduled late.
                loop {
                    let finished = done.load(Ordering::SeqCst);
                    if let Ok(bytes) = std::fs::read(&path) {
                        serde_json::from_slice::<Orders>(&bytes).expect("a whole file");
                        reads += 1;
                    }
                    if finished {
                        break reads;
                    }
                }
            })
        };
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let saved = Arc::clone(&daemons[t % 2]);
                std::thread::spawn(move || {
                    for i in 0..25 {
                        saved.put(format!("d{}|t{t}|{i}", t % 2), learned(i % 4));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        for d in &daemons {
            d.flush();
        }
        done.store(true, Ordering::SeqCst);
        assert!(reader.join().unwrap() > 0);
        let on_disk = read_orders(&path);
        assert_eq!(on_disk.len(), 100);
        for d in &daemons {
            d.put("last".into(), learned(1));
            d.flush();
        }
        assert_eq!(read_orders(&path).len(), 101);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
