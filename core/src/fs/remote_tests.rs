//! The filesystem over a remote SOURCE ([`RemoteTree`]), driven without FUSE: an in-memory
//! tree whose files are versions read conditionally (a replaced file fails the old version's
//! reads, as an object store's `If-Match` does), answers checked against the bytes put in.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam::channel::{unbounded, Receiver};

use super::inodes::ObjectId;
use super::tests::{me, no_backing, read_all, served_fh, Backing, READER};
use super::*;
use crate::budget::{BudgetTarget, Governor};
use crate::kernel_cache::{InodeRange, KernelCacheWindow};
use crate::models::ModelStore;
use crate::prefetch::saved::SavedOrders;
use crate::source::{ReadAt, RemoteFile, SourceIdentity};
use crate::stats::Counters;
use crate::synth::{write_checkpoint, Layout, SynthDtype, SynthSpec};

const DEV: u64 = 0x5eed;

/// One version of one file of the tree.
#[derive(Clone)]
struct Version {
    bytes: Arc<Vec<u8>>,
    etag: u64,
    mtime: SystemTime,
}

/// An in-memory remote tree: files by path, directories implied by them.
#[derive(Default)]
struct MemTree {
    files: crate::sync::Mutex<BTreeMap<PathBuf, Version>>,
    etags: std::sync::atomic::AtomicU64,
}

impl MemTree {
    fn put(&self, rel: &str, bytes: Vec<u8>) {
        let etag = self
            .etags
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let mtime = UNIX_EPOCH + Duration::from_secs(1_700_000_000 + etag);
        crate::sync::lock(&self.files).insert(
            PathBuf::from(rel),
            Version {
                bytes: Arc::new(bytes),
                etag,
                mtime,
            },
        );
    }

    fn file(&self, rel: &Path) -> Option<Version> {
        crate::sync::lock(&self.files).get(rel).cloned()
    }

    fn is_dir(&self, rel: &Path) -> bool {
        rel.as_os_str().is_empty()
            || crate::sync::lock(&self.files)
                .keys()
                .any(|k| k.starts_with(rel) && k != rel)
    }

    fn identity(rel: &Path, v: &Version) -> SourceIdentity {
        SourceIdentity {
            dev: DEV,
            ino: xxhash_rust::xxh3::xxh3_64(rel.as_os_str().as_encoded_bytes()),
            size: v.bytes.len() as u64,
            mtime_ns: v.mtime.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i128,
            ctime_ns: v.etag as i128,
        }
    }
}

/// A version of a [`MemTree`] file, read only while it is still the current one.
struct MemFile {
    tree: Arc<MemTree>,
    rel: PathBuf,
    version: Version,
}

impl ReadAt for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        match self.tree.file(&self.rel) {
            Some(now) if now.etag == self.version.etag => {}
            _ => return Err(io::Error::from_raw_os_error(libc_estale())),
        }
        let bytes = &self.version.bytes;
        let start = (offset as usize).min(bytes.len());
        let n = buf.len().min(bytes.len() - start);
        buf[..n].copy_from_slice(&bytes[start..start + n]);
        Ok(n)
    }
}

fn libc_estale() -> i32 {
    116 // ESTALE on Linux; any error fails the read on Windows
}

impl RemoteFile for MemFile {
    fn len(&self) -> u64 {
        self.version.bytes.len() as u64
    }
    fn identity(&self) -> SourceIdentity {
        MemTree::identity(&self.rel, &self.version)
    }
    fn kind(&self) -> &'static str {
        "memory"
    }
}

struct Remote(Arc<MemTree>, PathBuf);

impl RemoteTree for Remote {
    fn root(&self) -> &Path {
        &self.1
    }

    fn entry(&self, rel: &Path) -> io::Result<RemoteEntry> {
        if let Some(v) = self.0.file(rel) {
            let identity = MemTree::identity(rel, &v);
            return Ok(RemoteEntry {
                kind: Kind::File,
                size: identity.size,
                mtime: v.mtime,
                object: ObjectId {
                    dev: DEV,
                    ino: identity.ino,
                    born: v.etag,
                },
                identity: Some(identity),
            });
        }
        if !self.0.is_dir(rel) {
            return Err(io::ErrorKind::NotFound.into());
        }
        Ok(RemoteEntry {
            kind: Kind::Directory,
            size: 0,
            mtime: UNIX_EPOCH,
            object: ObjectId {
                dev: DEV,
                ino: xxhash_rust::xxh3::xxh3_64(rel.as_os_str().as_encoded_bytes()) | 1,
                born: 0,
            },
            identity: None,
        })
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<OsString>> {
        if !self.0.is_dir(rel) {
            return Err(io::ErrorKind::NotFound.into());
        }
        let mut names: Vec<OsString> = crate::sync::lock(&self.0.files)
            .keys()
            .filter_map(|k| k.strip_prefix(rel).ok())
            .filter_map(|rest| rest.iter().next().map(|n| n.to_owned()))
            .collect();
        names.dedup();
        Ok(names)
    }

    fn open(&self, rel: &Path) -> io::Result<Arc<dyn RemoteFile>> {
        let version = self.0.file(rel).ok_or(io::ErrorKind::NotFound)?;
        Ok(Arc::new(MemFile {
            tree: Arc::clone(&self.0),
            rel: rel.to_owned(),
            version,
        }))
    }

    fn statfs(&self) -> io::Result<StatFs> {
        let files = crate::sync::lock(&self.0.files);
        Ok(StatFs {
            blocks: files.values().map(|v| v.bytes.len() as u64).sum::<u64>() / 4096,
            bfree: 0,
            bavail: 0,
            files: files.len() as u64,
            ffree: 0,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        })
    }

    fn stats(&self) -> crate::stats::RemoteSourceSnapshot {
        crate::stats::RemoteSourceSnapshot {
            kind: "memory".into(),
            url: "memory://tree/".into(),
            ..Default::default()
        }
    }
}

struct RemoteFixture {
    tree: Arc<MemTree>,
    fs: TierFs<Backing>,
    _invalidations: Receiver<InodeRange>,
}

impl RemoteFixture {
    fn new(tree: Arc<MemTree>) -> RemoteFixture {
        RemoteFixture::with_budget(tree, 64 << 20)
    }

    fn with_budget(tree: Arc<MemTree>, budget: u64) -> RemoteFixture {
        let store = Arc::new(ModelStore::new(budget, SavedOrders::default()));
        let target: Arc<dyn BudgetTarget> = store.clone();
        let governor = Arc::new(Governor::new(target, budget, budget / 4));
        let (tx, rx) = unbounded();
        let root = PathBuf::from("s3://bucket/models");
        let settings = Settings {
            source: root.clone(),
            // Passthrough on, and allowed for models: a remote file must still never get it.
            passthrough: true,
            sharing: Sharing::Single,
            model_passthrough: true,
            governor,
            remote: Some(Arc::new(Remote(Arc::clone(&tree), root))),
        };
        let window = Arc::new(KernelCacheWindow::new(8 << 20));
        let render: RenderStats = Box::new(|_view: &StatsView| Vec::new());
        let fs = TierFs::new(settings, store, window, tx, render).unwrap();
        RemoteFixture {
            tree,
            fs,
            _invalidations: rx,
        }
    }

    fn lookup(&self, rel: &str) -> Result<Attr, FsError> {
        let mut ino = ROOT_INO;
        let mut attr = Err(FsError::NotFound);
        for name in Path::new(rel).iter() {
            let (found, _) = self.fs.lookup(me(), ino, name)?;
            ino = found.ino;
            attr = Ok(found);
        }
        attr
    }

    fn read_all(&self, ino: u64, fh: u64) -> Result<Vec<u8>, FsError> {
        read_all(&self.fs, ino, fh)
    }

    fn names(&self, ino: u64) -> Vec<String> {
        let fh = self.fs.opendir(me(), ino).unwrap();
        let mut names = Vec::new();
        self.fs
            .readdir(fh, 0, |e, _| {
                names.push(e.name.to_string_lossy().into_owned());
                false
            })
            .unwrap();
        self.fs.releasedir(fh);
        names.retain(|n| n != "." && n != "..");
        names.sort();
        names
    }
}

fn model_bytes(seed: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("m.safetensors");
    let spec = SynthSpec {
        layout: Layout::Dit,
        target_bytes: 1 << 20,
        dtype: SynthDtype::BF16,
        seed,
    };
    write_checkpoint(&path, &spec).expect("synthetic checkpoint");
    std::fs::read(&path).expect("read back")
}

#[test]
fn a_remote_tree_is_walked_and_its_files_read_bit_exact_read_only() {
    let tree = Arc::new(MemTree::default());
    let model = model_bytes(3);
    let config = b"{\"_class_name\": \"Transformer\"}".to_vec();
    tree.put("unet/dit.safetensors", model.clone());
    tree.put("unet/config.json", config.clone());
    tree.put("vae/sub/vae.safetensors", model_bytes(4));
    let f = RemoteFixture::new(tree);

    let mut root_names = f.names(ROOT_INO);
    root_names.retain(|n| n != CONTROL_DIR);
    assert_eq!(root_names, ["unet", "vae"]);
    let unet = f.lookup("unet").unwrap();
    assert_eq!((unet.kind, unet.perm), (Kind::Directory, 0o555));
    assert_eq!(f.names(unet.ino), ["config.json", "dit.safetensors"]);
    let attr = f.lookup("unet/dit.safetensors").unwrap();
    assert_eq!(
        (attr.kind, attr.perm, attr.size),
        (Kind::File, 0o444, model.len() as u64)
    );
    assert!(f.lookup("unet/missing.safetensors").is_err());

    // The model is served from the cache (never passthrough: there is no local file), exact.
    let fh = served_fh(
        f.fs.open(me(), attr.ino, oflag::RDONLY, &no_backing)
            .unwrap(),
    );
    assert_eq!(f.read_all(attr.ino, fh).unwrap(), model);
    assert_eq!(
        f.read_all(attr.ino, fh).unwrap(),
        model,
        "second pass, from the cache"
    );
    f.fs.release(fh);

    // Another file: read with positional reads of the remote version.
    let cfg = f.lookup("unet/config.json").unwrap();
    let fh = served_fh(
        f.fs.open(me(), cfg.ino, oflag::RDONLY, &no_backing)
            .unwrap(),
    );
    assert_eq!(f.read_all(cfg.ino, fh).unwrap(), config);
    f.fs.release(fh);

    // Read-only, no links, figures from the tree.
    assert!(f.fs.open(me(), cfg.ino, oflag::RDWR, &no_backing).is_err());
    assert!(f.fs.readlink(me(), cfg.ino).is_err());
    let st = f.fs.statfs().unwrap();
    assert_eq!(st.files, 3);
}

#[test]
fn a_replaced_remote_file_is_a_new_object_never_a_mix_of_versions() {
    let tree = Arc::new(MemTree::default());
    let old = model_bytes(5);
    tree.put("dit.safetensors", old.clone());
    let f = RemoteFixture::new(Arc::clone(&tree));
    let attr = f.lookup("dit.safetensors").unwrap();
    let fh = served_fh(
        f.fs.open(me(), attr.ino, oflag::RDONLY, &no_backing)
            .unwrap(),
    );
    let head = f.fs.read(attr.ino, fh, 0, 4096, READER).unwrap();
    assert_eq!(&head[..], &old[..4096]);

    let new = model_bytes(6);
    assert_eq!(
        new.len(),
        old.len(),
        "same size: only the version tells them apart"
    );
    f.tree.put("dit.safetensors", new.clone());

    // The handle on the old version gets the old bytes or an error, never the new ones.
    let mut at = 0u64;
    while (at as usize) < old.len() {
        match f.fs.read(attr.ino, fh, at, 100_000, READER) {
            Ok(bytes) if bytes.is_empty() => break,
            Ok(bytes) => {
                assert_eq!(
                    &bytes[..],
                    &old[at as usize..at as usize + bytes.len()],
                    "at {at}"
                );
                at += bytes.len() as u64;
            }
            Err(_) => break,
        }
    }
    f.fs.release(fh);

    // Looked up again, it is another object (another generation of the number, or another
    // number); opened, it reads the new version exactly.
    let again = f.lookup("dit.safetensors").unwrap();
    assert!(
        (again.ino, again.generation) != (attr.ino, attr.generation),
        "the replaced file is still the same object: {attr:?} {again:?}"
    );
    let fh = served_fh(
        f.fs.open(me(), again.ino, oflag::RDONLY, &no_backing)
            .unwrap(),
    );
    assert_eq!(f.read_all(again.ino, fh).unwrap(), new);
    f.fs.release(fh);
}

/// ComfyUI's view phase on a remote model that fits the budget: a 4 KiB touch at the start of
/// every tensor, in name order. Each request to a store waits a round trip, so after the first
/// few touches the model is warmed into the cache in file order, in parallel, and the touches
/// are served from it: far fewer source reads than touches, every byte exact, and
/// the copies after them read nothing more from the store.
#[test]
fn the_touches_of_a_remote_model_that_fits_warm_it_and_are_served_through_the_cache() {
    let tree = Arc::new(MemTree::default());
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("m.safetensors");
    let spec = SynthSpec {
        layout: Layout::Dit,
        target_bytes: 24 << 20,
        dtype: SynthDtype::BF16,
        seed: 9,
    };
    write_checkpoint(&path, &spec).expect("synthetic checkpoint");
    let model = std::fs::read(&path).expect("read back");
    tree.put("dit.safetensors", model.clone());
    let f = RemoteFixture::new(tree);
    let attr = f.lookup("dit.safetensors").unwrap();
    let fh = served_fh(
        f.fs.open(me(), attr.ino, oflag::RDONLY, &no_backing)
            .unwrap(),
    );
    let index = crate::index::TensorIndex::parse(&model, model.len() as u64).expect("index");
    let mut starts: Vec<(&str, u64)> = index
        .tensors
        .iter()
        .filter(|t| t.end > t.start)
        .map(|t| (t.name.as_str(), t.start))
        .collect();
    starts.sort();
    for &(name, start) in &starts {
        let got = f.fs.read(attr.ino, fh, start, 4096, READER).unwrap();
        let end = (start as usize + 4096).min(model.len());
        assert!(got[..] == model[start as usize..end], "touch of {name}");
    }
    let c = f.fs.store().counters();
    let touched = starts.len() as u64;
    let warm = crate::models::WARM_AFTER_TOUCHES;
    assert!(touched > 4 * warm, "{touched} touches");
    assert_eq!(
        Counters::get(&c.probe_bytes),
        (warm - 1) * 4096,
        "only the touches before the warm read the store exactly"
    );
    let through_cache = Counters::get(&c.hit_bytes) + Counters::get(&c.miss_bytes);
    assert!(
        through_cache >= (touched - (warm - 1)) * 4096,
        "every later touch went through the cache: {through_cache} of {} bytes",
        (touched - (warm - 1)) * 4096
    );
    assert!(
        Counters::get(&c.disk_reads) * 4 <= touched,
        "{} source reads for {touched} touches",
        Counters::get(&c.disk_reads)
    );
    assert_eq!(f.read_all(attr.ino, fh).unwrap(), model);
    f.fs.store().wait_prefetch_idle();
    let read = Counters::get(&c.disk_read_bytes);
    assert!(
        read <= model.len() as u64 + warm * 4096,
        "the model once and the first touches: {read} bytes for {}",
        model.len()
    );
    f.fs.release(fh);
}

/// A model of `n` tensors of `len` bytes each, in name order in the file (as writers sort
/// them): every tensor's first page is far enough from the next that each touch is a probe.
fn large_tensor_model(n: usize, len: u64) -> Vec<u8> {
    let mut fields = Vec::new();
    for i in 0..n as u64 {
        fields.push(format!(
            "\"blocks.{i:03}.weight\":{{\"dtype\":\"U8\",\"shape\":[{len}],\"data_offsets\":[{},{}]}}",
            i * len,
            (i + 1) * len
        ));
    }
    let json = format!("{{{}}}", fields.join(","));
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    bytes.extend((0..n as u64 * len).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u8
    }));
    bytes
}

/// ComfyUI's view phase on a remote model larger than the budget: an `mmap` fault's 128 KiB
/// read-around at the first page of every tensor, in name order. The touches stay exact (the
/// model cannot be warmed), but each one that reaches the store reads the next sixteen
/// touches ahead, in parallel: nearly every touch is then served from them, every byte
/// exact, what is held stays within its bound, and the copies after them read the model
/// through the cache as before.
#[test]
fn the_next_touches_of_a_remote_model_larger_than_the_budget_are_read_ahead() {
    let tree = Arc::new(MemTree::default());
    let (n, len) = (48usize, 1u64 << 20);
    let model = large_tensor_model(n, len);
    tree.put("dit.safetensors", model.clone());
    let f = RemoteFixture::with_budget(tree, 16 << 20);
    let attr = f.lookup("dit.safetensors").unwrap();
    let fh = served_fh(
        f.fs.open(me(), attr.ino, oflag::RDONLY, &no_backing)
            .unwrap(),
    );
    let index = crate::index::TensorIndex::parse(&model, model.len() as u64).expect("index");
    let window = 128u64 << 10;
    for t in &index.tensors {
        let page = t.start / 4096 * 4096;
        let start = page.saturating_sub(window / 2);
        let got =
            f.fs.read(attr.ino, fh, start, window as u32, READER)
                .unwrap();
        let end = (start + window).min(model.len() as u64) as usize;
        assert!(got[..] == model[start as usize..end], "touch of {}", t.name);
    }
    let c = f.fs.store().counters();
    let served = Counters::get(&c.touch_ahead_served_bytes);
    let exact = Counters::get(&c.probe_bytes);
    assert!(
        served >= (n as u64 - 2) * window,
        "touches served from ranges read ahead: {served} bytes, {exact} read exactly"
    );
    assert!(exact <= 2 * window, "{exact} bytes of touches read exactly");
    f.fs.store().wait_prefetch_idle();
    let ahead = Counters::get(&c.touch_ahead_bytes);
    assert!(
        ahead <= (n as u64 + 1) * window,
        "each touch read once: {ahead} bytes read ahead for {n} touches"
    );
    assert_eq!(f.read_all(attr.ino, fh).unwrap(), model);
    f.fs.release(fh);
}
