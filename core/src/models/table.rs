//! The known model files of a mount, with their headers and indexes held to a byte cap.
//!
//! Each known file keeps its header bytes (up to 100 MB for a legal safetensors header, plus
//! the 64 KiB after it), its parsed tensor index, its chunk plan and its reader tracker in
//! memory, outside the chunk budget. Left alone, a folder of many (or hostile) model files
//! would grow the daemon without bound, so the table counts an estimate of each file's memory
//! ([`footprint`]) against a cap (`--index-cache`, [`DEFAULT_INDEX_CAP`]) and evicts the least
//! recently opened files past it. An evicted file is simply indexed again at its next open (one
//! header read), as a new version, and its cached chunks are dropped with it (nobody could read
//! them any more).
//!
//! **The cap holds for open files too.** A file that is open (a handle or a prefetch job holds
//! it) cannot be evicted, so a new file is indexed only if it fits beside the open ones (after
//! evicting the others): otherwise it is served as plain bytes, uncached, with no header or
//! index held ([`RawReason::IndexCapFull`], shown in the stats), until a later open finds room.
//! Without this, N open files with padded headers grew the daemon by N × 100 MB outside any
//! budget. A header larger than the whole cap is not even read in full
//! (`ModelFile::open`). A version replaced while still open stays counted (as *retired*) until
//! its last holder lets go: its memory is as real as anyone's. What the table counts is what the
//! budget governor adds to the daemon's other memory under pressure
//! ([`crate::budget::BudgetTarget::unmanaged`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use lru::LruCache;

use super::{Layout, ModelFile, RawReason};
use crate::stats::IndexSnapshot;

/// Default cap on header and index memory. 256 MiB keeps a thousand typical checkpoints
/// (header of 10–200 KiB plus the 64 KiB tail each), or two of the largest legal headers,
/// while staying small next to any chunk budget worth having.
pub const DEFAULT_INDEX_CAP: u64 = 256 << 20;

/// Evicted bytes after which the allocator is asked to return free memory to the OS
/// (`malloc_trim`): glibc keeps the headers freed by each request thread in that thread's
/// arena ([measured](../../../docs/PERFORMANCE.md#heap-trimming-after-index-evictions)).
pub const TRIM_AFTER_EVICTED_BYTES: u64 = 16 << 20;

/// Memory of a known file besides its header and index: the `ModelFile`, its reader tracker,
/// its table entry and its source slot (no descriptor: see `crate::source::slot`). Rounded up
/// from the struct sizes.
const ENTRY_OVERHEAD: u64 = 2 << 10;

struct Known {
    file: Arc<ModelFile>,
    bytes: u64,
}

/// Model files by path relative to the mount root, least recently opened first out.
pub struct ModelTable {
    files: LruCache<PathBuf, Known>,
    /// Versions replaced while something still held them, with their footprints.
    retired: Vec<(Weak<ModelFile>, u64)>,
    /// Footprints of `files` and `retired`.
    bytes: u64,
    cap: u64,
    evictions: u64,
    /// Files served as plain bytes because their index did not fit.
    refusals: u64,
    /// Bytes evicted since the allocator was last trimmed.
    untrimmed: u64,
    /// Evicted bytes after which the allocator is trimmed ([`TRIM_AFTER_EVICTED_BYTES`] by
    /// default).
    trim_after: u64,
}

impl ModelTable {
    pub fn new(cap: u64) -> ModelTable {
        ModelTable {
            files: LruCache::unbounded(),
            retired: Vec::new(),
            bytes: 0,
            cap,
            evictions: 0,
            refusals: 0,
            untrimmed: 0,
            trim_after: TRIM_AFTER_EVICTED_BYTES,
        }
    }

    /// Trims the allocator after `bytes` of evictions instead.
    pub fn set_trim_after(&mut self, bytes: u64) {
        self.trim_after = bytes;
    }

    pub fn set_cap(&mut self, cap: u64) {
        self.cap = cap;
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Header and index bytes held now, open files and retired versions included.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The known version of `path`, marked as just used.
    pub fn get(&mut self, path: &Path) -> Option<&Arc<ModelFile>> {
        self.files.get(path).map(|known| &known.file)
    }

    /// Records `file` as the version of `path`, served as plain bytes if its header and index
    /// do not fit the cap beside the files nobody can evict; returns it, the version it
    /// replaced and the files evicted to make room (their cached chunks are the caller's to
    /// drop).
    pub fn insert_within_cap(
        &mut self,
        path: &Path,
        file: ModelFile,
    ) -> (Arc<ModelFile>, Option<Arc<ModelFile>>, Vec<Arc<ModelFile>>) {
        self.prune_retired();
        let replaced = self.files.pop(path).map(|old| {
            if Arc::strong_count(&old.file) > 1 {
                self.retired.push((Arc::downgrade(&old.file), old.bytes)); // still counted
            } else {
                self.bytes -= old.bytes;
            }
            old.file
        });
        let needed = footprint(&file);
        let evicted = self.evict(needed);
        let (file, bytes) = if self.bytes + needed > self.cap {
            self.refusals += 1;
            let why = RawReason::IndexCapFull {
                needed,
                cap: self.cap,
            };
            let raw = file.into_raw(why);
            let bytes = footprint(&raw);
            (raw, bytes)
        } else {
            (file, needed)
        };
        let file = Arc::new(file);
        self.bytes += bytes;
        self.files.put(
            path.to_owned(),
            Known {
                file: Arc::clone(&file),
                bytes,
            },
        );
        (file, replaced, evicted)
    }

    /// Evicts least recently used files that nobody holds until `extra` more bytes fit the
    /// cap, or none is left to evict.
    fn evict(&mut self, extra: u64) -> Vec<Arc<ModelFile>> {
        if self.bytes + extra <= self.cap {
            return Vec::new();
        }
        let mut over = self.bytes + extra - self.cap;
        let victims: Vec<PathBuf> = self
            .files
            .iter()
            .rev()
            .filter(|(_, known)| Arc::strong_count(&known.file) == 1)
            .take_while(|(_, known)| {
                let take = over > 0;
                over = over.saturating_sub(known.bytes);
                take
            })
            .map(|(path, _)| path.clone())
            .collect();
        let mut evicted = Vec::with_capacity(victims.len());
        for path in victims {
            if let Some(known) = self.files.pop(&path) {
                self.bytes -= known.bytes;
                self.untrimmed += known.bytes;
                self.evictions += 1;
                evicted.push(known.file);
            }
        }
        evicted
    }

    /// Stops counting retired versions nobody holds any more.
    fn prune_retired(&mut self) {
        let mut freed = 0;
        self.retired.retain(|(file, bytes)| {
            let held = file.strong_count() > 0;
            if !held {
                freed += bytes;
            }
            held
        });
        self.bytes -= freed;
        self.untrimmed += freed;
    }

    /// Forgets `file` if it is the known version of `path` (a version pruned on close).
    pub fn remove_version(&mut self, path: &Path, file: &Arc<ModelFile>) {
        if self
            .files
            .peek(path)
            .is_some_and(|known| Arc::ptr_eq(&known.file, file))
        {
            if let Some(known) = self.files.pop(path) {
                self.bytes -= known.bytes;
            }
        }
    }

    /// Whether enough was evicted since the last call that returned true to trim the heap.
    pub fn take_trim_due(&mut self) -> bool {
        let due = self.untrimmed >= self.trim_after;
        if due {
            self.untrimmed = 0;
        }
        due
    }

    pub fn files(&self) -> impl Iterator<Item = &Arc<ModelFile>> {
        self.files.iter().map(|(_, known)| &known.file)
    }

    pub fn snapshot(&self) -> IndexSnapshot {
        IndexSnapshot {
            index_bytes: self.bytes,
            index_cap_bytes: self.cap,
            index_entries: self.files.len() as u64,
            index_evictions: self.evictions,
            index_refusals: self.refusals,
        }
    }
}

/// Estimated memory of one known file: its header copy, and its index, plan and reader tracker
/// counted from their element counts and string lengths.
pub fn footprint(file: &ModelFile) -> u64 {
    use std::mem::size_of;
    let header = file.header.capacity() as u64;
    let layout = match &file.layout {
        Layout::Indexed { index, plan } => {
            let tensors: usize = index
                .tensors
                .iter()
                .map(|t| {
                    size_of::<crate::index::TensorInfo>()
                        + t.name.len()
                        + t.dtype.len()
                        + 8 * t.shape.len()
                })
                .sum();
            let blocks: usize = index
                .blocks
                .iter()
                .map(|b| {
                    size_of::<crate::index::BlockInfo>()
                        + b.name.len()
                        + b.family.as_ref().map_or(0, String::len)
                        // reader tracker and saved order, per block
                        + 64
                })
                .sum();
            let metadata: usize = index
                .metadata
                .iter()
                .flatten()
                .map(|(k, v)| k.len() + v.len() + 64)
                .sum();
            let chunks = std::mem::size_of_val(plan.chunks());
            (tensors + blocks + metadata + chunks) as u64
        }
        Layout::Raw { .. } => 0,
    };
    header + layout + ENTRY_OVERHEAD + file.path.as_os_str().len() as u64
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use std::sync::Arc;

    use crate::models::ModelStore;
    use crate::prefetch::saved::SavedOrders;
    use crate::synth::{write_checkpoint, Layout as SynthLayout, SynthDtype, SynthSpec};

    #[test]
    fn index_memory_stays_under_the_cap_and_open_files_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let names = checkpoints(dir.path(), 40);
        let first = ModelStore::new(64 << 20, SavedOrders::default())
            .open(Path::new(&names[0]), &dir.path().join(&names[0]))
            .unwrap();
        let one = super::footprint(&first);
        let cap = one * 10;
        let store = ModelStore::new(64 << 20, SavedOrders::default()).with_index_cap(cap);
        let open = |name: &str| store.open(Path::new(name), &dir.path().join(name)).unwrap();
        let held = open(&names[0]); // stays open all along: never evicted
        for name in &names[1..] {
            open(name);
            let s = store.index_snapshot();
            assert!(s.index_bytes <= cap + one, "{s:?}");
        }
        let s = store.index_snapshot();
        assert!(s.index_evictions >= 25 && s.index_entries <= 11, "{s:?}");
        assert!(
            Arc::ptr_eq(&held, &open(&names[0])),
            "an open file was evicted"
        );
        // An evicted file opens again, as a new version with the same bytes.
        let again = open(&names[1]);
        assert_eq!(
            again.size(),
            std::fs::metadata(dir.path().join(&names[1])).unwrap().len()
        );
    }

    fn checkpoints(dir: &Path, count: usize) -> Vec<String> {
        let names: Vec<String> = (0..count).map(|i| format!("m{i}.safetensors")).collect();
        for (i, name) in names.iter().enumerate() {
            let spec = SynthSpec {
                layout: SynthLayout::Dit,
                target_bytes: 1 << 20,
                dtype: SynthDtype::BF16,
                seed: i as u64,
            };
            write_checkpoint(&dir.join(name), &spec).unwrap();
        }
        names
    }

    #[test]
    fn open_files_never_take_the_index_past_its_cap_a_file_that_does_not_fit_is_served_raw() {
        use crate::models::{Layout, RawReason};
        let dir = tempfile::tempdir().unwrap();
        let names = checkpoints(dir.path(), 8);
        let one = super::footprint(
            &ModelStore::new(64 << 20, SavedOrders::default())
                .open(Path::new(&names[0]), &dir.path().join(&names[0]))
                .unwrap(),
        );
        let cap = one * 3 + one / 2;
        let store = ModelStore::new(64 << 20, SavedOrders::default()).with_index_cap(cap);
        let open = |name: &str| store.open(Path::new(name), &dir.path().join(name)).unwrap();
        // Every file stays open: none can be evicted.
        let held: Vec<_> = names.iter().map(|name| open(name)).collect();
        let s = store.index_snapshot();
        assert!(s.index_bytes <= cap, "{s:?}");
        assert_eq!(s.index_refusals, 5, "{s:?}");
        for (i, file) in held.iter().enumerate() {
            let raw = i >= 3;
            assert_eq!(file.is_raw(), raw, "file {i}");
            if raw {
                let Layout::Raw {
                    why: RawReason::IndexCapFull { needed, cap: told },
                } = file.layout()
                else {
                    panic!("file {i}: {:?}", file.layout())
                };
                assert_eq!((*needed, *told), (one, cap));
            }
            // Raw or indexed, the bytes are the file's.
            let bytes = std::fs::read(dir.path().join(&names[i])).unwrap();
            let got = super::super::tests::read_all(&store, file, 1 << 20);
            assert!(got == bytes, "file {i}: bytes differ");
        }
        // Closed, they make room: the next open of a raw file indexes it.
        drop(held);
        let again = open(&names[5]);
        assert!(!again.is_raw());
        assert!(store.index_snapshot().index_bytes <= cap);
    }

    #[test]
    fn a_header_larger_than_the_cap_is_not_read_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("padded.safetensors");
        // A legal header padded with spaces to 8 MiB, then 16 bytes of data.
        let json = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        let mut header = json.to_vec();
        header.resize(8 << 20, b' ');
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(&[7u8; 16]);
        std::fs::write(&path, &bytes).unwrap();
        let store = ModelStore::new(64 << 20, SavedOrders::default()).with_index_cap(1 << 20);
        let file = store.open(Path::new("padded.safetensors"), &path).unwrap();
        assert!(file.is_raw());
        assert!(store.index_snapshot().index_bytes < 64 << 10);
        let got = super::super::tests::read_all(&store, &file, 1 << 20);
        assert!(got == bytes);
        // With room, the same file is indexed.
        let roomy = ModelStore::new(64 << 20, SavedOrders::default()).with_index_cap(64 << 20);
        assert!(!roomy
            .open(Path::new("padded.safetensors"), &path)
            .unwrap()
            .is_raw());
    }
}
