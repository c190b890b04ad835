//! Reference-model property tests of [`TierFs`]: random sequences of filesystem operations
//! (lookup, getattr, readdir, open, read, release, forget) interleaved with changes to SOURCE
//! (write a new version, append in place, delete, rename, make a symbolic or a hard link), each
//! answer checked against a model of SOURCE: bytes bit-exact, sizes, kinds, errnos, listings,
//! inode numbers (one per object for the whole case however often it was forgotten and pruned,
//! never another object's, shared by hard links and by a link presented as its target, and the
//! source's own `st_ino`) and the inode table's size after every step (pruning).
//!
//! The model knows every object SOURCE ever held (a file version, a link) by its own id. The
//! test keeps a descriptor of each, so the disk cannot hand a freed inode number to a later
//! object within a case (the filesystem tells objects apart by device and inode number, as
//! the kernel does).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{symlink, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::Index;

use super::tests::{me, synth_model, Fixture, READER};
use super::*;
use crate::models::is_model_path;

/// Directories of SOURCE (fixed; the root is "").
const DIRS: [&str; 3] = ["", "sub", "sub/deep"];
/// Names files and links take in each directory: model files (cached), a malformed-prone
/// `.gguf`, plain files.
const NAMES: [&str; 4] = ["a.safetensors", "b.safetensors", "c.gguf", "d.bin"];

fn file_paths() -> Vec<String> {
    DIRS.iter()
        .flat_map(|d| NAMES.iter().map(move |n| join(d, n)))
        .collect()
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// What a new file version holds.
#[derive(Debug, Clone)]
enum Content {
    Bytes(Vec<u8>),
    /// One of a few small synthetic checkpoints.
    Synth(usize),
    /// A tiny well-formed safetensors file with these tensor bytes.
    Tiny(Vec<u8>),
}

impl Content {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Content::Bytes(b) => b.clone(),
            Content::Synth(i) => synth_bytes()[i % synth_bytes().len()].clone(),
            Content::Tiny(data) => tiny_safetensors(data),
        }
    }
}

fn synth_bytes() -> &'static Vec<Vec<u8>> {
    static SYNTH: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SYNTH.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        (0..2)
            .map(|seed| synth_model(&dir.path().join("s.safetensors"), seed))
            .collect()
    })
}

fn tiny_safetensors(data: &[u8]) -> Vec<u8> {
    let n = data.len();
    let mut header = format!(r#"{{"t":{{"dtype":"U8","shape":[{n}],"data_offsets":[0,{n}]}}}}"#);
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[derive(Debug, Clone)]
enum Step {
    Lookup(Index),
    Getattr(Index),
    Readdir(Index),
    Open(Index),
    /// A handle, where in its file (a fraction of its size) and how many bytes.
    Read(Index, Index, u32),
    Release(Index),
    Forget(Index, Index),
    Write(Index, Content),
    Append(Index, Vec<u8>),
    Delete(Index),
    Rename(Index, Index),
    Link(Index, Index),
    HardLink(Index, Index),
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..3000).prop_map(Content::Bytes),
        (0usize..2).prop_map(Content::Synth),
        prop::collection::vec(any::<u8>(), 1..5000).prop_map(Content::Tiny),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let i = any::<Index>;
    prop_oneof![
        4 => i().prop_map(Step::Lookup),
        2 => i().prop_map(Step::Getattr),
        1 => i().prop_map(Step::Readdir),
        4 => i().prop_map(Step::Open),
        8 => (i(), i(), prop_oneof![1u32..5000, 1u32..300_000]).prop_map(|(h, o, s)| Step::Read(h, o, s)),
        2 => i().prop_map(Step::Release),
        2 => (i(), i()).prop_map(|(a, n)| Step::Forget(a, n)),
        3 => (i(), content()).prop_map(|(p, c)| Step::Write(p, c)),
        1 => (i(), prop::collection::vec(any::<u8>(), 1..2000)).prop_map(|(p, b)| Step::Append(p, b)),
        1 => i().prop_map(Step::Delete),
        1 => (i(), i()).prop_map(|(a, b)| Step::Rename(a, b)),
        1 => (i(), i()).prop_map(|(a, b)| Step::Link(a, b)),
        1 => (i(), i()).prop_map(|(a, b)| Step::HardLink(a, b)),
    ]
}

/// An entry of SOURCE in the model (directories are fixed and not listed here).
#[derive(Debug, Clone)]
enum Node {
    File(usize),
    /// A link to this (absolute) target, and the link's own object.
    Link(String, usize),
}

/// What a path presents: the object, its kind and (for files and links) its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shown {
    object: usize,
    kind: Kind,
    size: Option<u64>,
}

/// What the model expects of a live inode.
#[derive(Debug, Clone)]
struct Ino {
    /// Where it was met, most recent first (as `inodes::Entry::paths`).
    paths: Vec<String>,
    object: usize,
    last: Shown,
    lookups: u64,
    handles: u64,
}

struct OpenFile {
    fh: u64,
    ino: u64,
    /// Plain handles read the object as it is now; model handles the version they opened.
    snapshot: Option<Vec<u8>>,
    object: usize,
}

impl std::fmt::Debug for OpenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let model = self.snapshot.as_ref().map(Vec::len);
        write!(
            f,
            "handle {} of inode {} (object {}, model snapshot of {model:?} bytes)",
            self.fh, self.ino, self.object
        )
    }
}

struct Model {
    fx: Fixture,
    /// Contents of every object ever made (links: their target text); ids 0..3 are DIRS.
    objects: Vec<Vec<u8>>,
    tree: BTreeMap<String, Node>,
    inos: HashMap<u64, Ino>,
    /// The number each object was first given, and the object of each number.
    numbers: HashMap<usize, u64>,
    owners: HashMap<u64, usize>,
    handles: Vec<OpenFile>,
    /// A descriptor of every object made, so no inode number is reused within a case.
    keep: Vec<File>,
    temp: u64,
    tally: Tally,
}

impl Model {
    fn new() -> Model {
        let fx = Fixture::new(false, false);
        for dir in &DIRS[1..] {
            fs::create_dir_all(fx.root().join(dir)).expect("mkdir");
        }
        let root = Ino {
            paths: vec![String::new()],
            object: 0,
            last: Shown {
                object: 0,
                kind: Kind::Directory,
                size: None,
            },
            lookups: 0,
            handles: 0,
        };
        Model {
            fx,
            objects: vec![Vec::new(); DIRS.len()],
            tree: BTreeMap::new(),
            inos: HashMap::from([(ROOT_INO, root)]),
            numbers: HashMap::new(),
            owners: HashMap::new(),
            handles: Vec::new(),
            keep: Vec::new(),
            temp: 0,
            tally: Tally::default(),
        }
    }

    fn abs(&self, rel: &str) -> std::path::PathBuf {
        self.fx.root().join(rel)
    }

    /// What `rel` presents now, following links (to files only) as the filesystem does.
    fn shown(&self, rel: &str) -> Option<Shown> {
        if let Some(d) = DIRS.iter().position(|d| *d == rel) {
            return Some(Shown {
                object: d,
                kind: Kind::Directory,
                size: None,
            });
        }
        match self.tree.get(rel)? {
            Node::File(o) => Some(self.file(*o)),
            Node::Link(target, o) => {
                let mut target = target.clone();
                for _ in 0..40 {
                    let rel_target = target
                        .strip_prefix(&format!("{}/", self.fx.root().display()))
                        .unwrap_or("")
                        .to_owned();
                    match self.tree.get(&rel_target) {
                        Some(Node::File(t)) => return Some(self.file(*t)),
                        Some(Node::Link(next, _)) => target = next.clone(),
                        None => break,
                    }
                }
                Some(Shown {
                    object: *o,
                    kind: Kind::Symlink,
                    size: Some(self.objects[*o].len() as u64),
                })
            }
        }
    }

    fn file(&self, object: usize) -> Shown {
        Shown {
            object,
            kind: Kind::File,
            size: Some(self.objects[object].len() as u64),
        }
    }

    fn new_object(&mut self, bytes: Vec<u8>) -> usize {
        self.objects.push(bytes);
        self.objects.len() - 1
    }

    /// Keeps the object now at `rel` (not following links) alive until the case ends.
    fn keep_alive(&mut self, rel: &str) {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(self.abs(rel))
            .expect("O_PATH open");
        self.keep.push(file);
    }

    /// Checks an answer for `(path, shown)` and records it: an object keeps one number for the
    /// whole case, and a live inode remembers where it was met.
    fn check_entry(
        &mut self,
        path: &str,
        shown: Shown,
        got: (u64, Kind, Option<u64>),
        lookup: bool,
    ) {
        let (got_ino, kind, size) = got;
        assert_eq!(kind, shown.kind, "{path}");
        if let (Some(expected), Some(size)) = (shown.size, size) {
            assert_eq!(size, expected, "{path}");
        }
        self.check_number(path, shown, got_ino);
        match self.inos.get_mut(&got_ino) {
            Some(ino) => {
                assert_eq!(ino.object, shown.object, "{path}: number {got_ino}");
                if !ino.paths.iter().any(|p| p == path) && ino.paths.len() == 1 {
                    self.tally.shared += 1;
                }
                ino.paths.retain(|p| p != path);
                ino.paths.insert(0, path.to_owned());
                ino.paths.truncate(inodes::MAX_PATHS);
                ino.last = shown;
                ino.lookups += u64::from(lookup);
            }
            None if lookup => {
                let fresh = Ino {
                    paths: vec![path.to_owned()],
                    object: shown.object,
                    last: shown,
                    lookups: 1,
                    handles: 0,
                };
                self.inos.insert(got_ino, fresh);
            }
            None => {}
        }
    }

    /// The number of the object `path` shows: the one it had before, wherever it was met and
    /// whatever was pruned since; no other object's; the source's own inode number.
    fn check_number(&mut self, path: &str, shown: Shown, got: u64) {
        match self.numbers.get(&shown.object) {
            Some(&number) => {
                assert_eq!(got, number, "{path}: object {} renumbered", shown.object);
                self.tally.kept_after_prune += u64::from(!self.inos.contains_key(&got));
            }
            None => {
                assert!(
                    got >= inodes::FIRST_SOURCE_INO,
                    "{path}: reserved number {got}"
                );
                if let Some(other) = self.owners.get(&got) {
                    panic!(
                        "{path}: number {got} of object {other} given to {}",
                        shown.object
                    );
                }
                self.numbers.insert(shown.object, got);
                self.owners.insert(got, shown.object);
            }
        }
        let meta = match shown.kind {
            Kind::Symlink => fs::symlink_metadata(self.abs(path)),
            _ => fs::metadata(self.abs(path)),
        };
        let source_ino = meta.expect("stat SOURCE").ino();
        if source_ino >= inodes::FIRST_SOURCE_INO {
            assert_eq!(got, source_ino, "{path}: not the source's own number");
        }
    }

    /// The path inode `ino` reaches its object by: the most recent one that still shows it,
    /// else the most recent one.
    fn live_path(&self, ino: &Ino) -> String {
        let shows = |p: &&String| self.shown(p).is_some_and(|s| s.object == ino.object);
        ino.paths
            .iter()
            .find(shows)
            .unwrap_or(&ino.paths[0])
            .clone()
    }

    fn prune(&mut self, ino: u64) {
        if ino != ROOT_INO
            && self
                .inos
                .get(&ino)
                .is_some_and(|i| i.lookups == 0 && i.handles == 0)
        {
            self.inos.remove(&ino);
            self.tally.pruned += 1;
        }
    }

    fn pick_ino(&self, i: &Index) -> u64 {
        let mut inos: Vec<u64> = self.inos.keys().copied().collect();
        inos.sort_unstable();
        *i.get(&inos)
    }

    fn run(&mut self, step: &Step) {
        let paths = file_paths();
        match step {
            Step::Lookup(i) => {
                let all: Vec<String> = DIRS[1..]
                    .iter()
                    .map(|d| d.to_string())
                    .chain(paths)
                    .collect();
                self.lookup(i.get::<String>(&all));
            }
            Step::Getattr(i) => self.getattr(self.pick_ino(i)),
            Step::Readdir(i) => self.readdir(i.get::<&str>(&DIRS)),
            Step::Open(i) => self.open(self.pick_ino(i)),
            Step::Read(h, offset, size) if !self.handles.is_empty() => {
                let handle = h.get(&self.handles);
                let now = &self.objects[handle.object];
                // Model handles read the version they opened, but every read here fills the
                // page cache the inode's handles share (the fixture's kernel has no `mmap` of
                // `direct_io` files): once the file changed in place, it is the file as it is.
                let content = match &handle.snapshot {
                    Some(bytes) if bytes == now => bytes,
                    Some(_) => {
                        self.tally.superseded_reads += 1;
                        now
                    }
                    None => now,
                };
                // Up to a little past the end.
                let start = offset.index(content.len() + 16);
                let end = (start + *size as usize).min(content.len());
                let start = start.min(end);
                let got = self
                    .fx
                    .fs
                    .read(handle.ino, handle.fh, start as u64, *size, READER);
                let got = got.unwrap_or_else(|e| panic!("read {handle:?}: {e}"));
                assert!(
                    got[..] == content[start..end],
                    "read {handle:?} at {start}+{size}"
                );
                let model = handle.snapshot.is_some();
                if !got.is_empty() {
                    self.tally.model_reads += u64::from(model);
                    self.tally.plain_reads += u64::from(!model);
                }
            }
            Step::Release(h) if !self.handles.is_empty() => {
                let handle = self.handles.remove(h.index(self.handles.len()));
                self.fx.fs.release(handle.fh);
                if let Some(ino) = self.inos.get_mut(&handle.ino) {
                    ino.handles -= 1;
                }
                self.prune(handle.ino);
            }
            Step::Forget(i, n) => {
                let ino = self.pick_ino(i);
                let lookups = self.inos[&ino].lookups;
                if ino != ROOT_INO && lookups > 0 {
                    let count = 1 + n.index(lookups as usize) as u64;
                    self.fx.fs.forget(ino, count);
                    if let Some(entry) = self.inos.get_mut(&ino) {
                        entry.lookups -= count;
                    }
                    self.prune(ino);
                }
            }
            Step::Write(i, content) => self.write(i.get::<String>(&paths), content.bytes()),
            Step::Append(i, bytes) => {
                let rel = i.get::<String>(&paths);
                if let Some(Node::File(o)) = self.tree.get(rel) {
                    let mut f = OpenOptions::new()
                        .append(true)
                        .open(self.abs(rel))
                        .expect("append");
                    f.write_all(bytes).expect("append");
                    self.objects[*o].extend_from_slice(bytes);
                }
            }
            Step::Delete(i) => {
                let rel = i.get::<String>(&paths);
                if self.tree.remove(rel).is_some() {
                    fs::remove_file(self.abs(rel)).expect("delete");
                }
            }
            Step::Rename(a, b) => {
                let (from, to) = (a.get::<String>(&paths), b.get::<String>(&paths));
                let same_file = match (self.tree.get(from), self.tree.get(to)) {
                    (Some(Node::File(x)), Some(Node::File(y))) => x == y,
                    _ => false,
                };
                // rename(2) between two hard links of one file does nothing.
                if from != to && self.tree.contains_key(from) && !same_file {
                    fs::rename(self.abs(from), self.abs(to)).expect("rename");
                    let node = self.tree.remove(from).expect("checked");
                    self.tree.insert(to.clone(), node);
                }
            }
            Step::Link(a, b) => {
                let (at, target) = (a.get::<String>(&paths), b.get::<String>(&paths));
                if !self.tree.contains_key(at) {
                    let target = self.abs(target).display().to_string();
                    symlink(&target, self.abs(at)).expect("symlink");
                    let o = self.new_object(target.clone().into_bytes());
                    self.tree.insert(at.clone(), Node::Link(target, o));
                    self.keep_alive(at);
                }
            }
            Step::HardLink(a, b) => {
                let (at, target) = (a.get::<String>(&paths), b.get::<String>(&paths));
                if let (None, Some(&Node::File(o))) = (self.tree.get(at), self.tree.get(target)) {
                    fs::hard_link(self.abs(target), self.abs(at)).expect("link");
                    self.tree.insert(at.clone(), Node::File(o));
                }
            }
            Step::Read(..) | Step::Release(_) => {}
        }
        let expected = self.inos.len();
        assert_eq!(
            self.fx.fs.inode_count(),
            expected,
            "inode table size after {step:?}"
        );
        assert_eq!(self.fx.fs.handle_count(), self.handles.len());
    }

    fn lookup(&mut self, rel: &str) {
        let mut parent = ROOT_INO;
        let mut walked = String::new();
        for name in rel.split('/') {
            walked = join(&walked, name);
            let got = self.fx.fs.lookup(me(), parent, OsStr::new(name));
            match (self.shown(&walked), got) {
                (Some(shown), Ok((attr, _))) => {
                    self.check_entry(&walked, shown, (attr.ino, attr.kind, Some(attr.size)), true);
                    parent = attr.ino;
                }
                (None, Err(e)) => {
                    assert_eq!(e.errno(), libc::ENOENT, "{walked}");
                    return;
                }
                (shown, got) => panic!("lookup {walked}: expected {shown:?}, got {got:?}"),
            }
        }
    }

    fn getattr(&mut self, ino: u64) {
        let entry = self.inos[&ino].clone();
        let (attr, _) = self
            .fx
            .fs
            .getattr(me(), ino)
            .unwrap_or_else(|e| panic!("getattr {entry:?}: {e}"));
        let expected = match self.shown(&self.live_path(&entry)) {
            Some(now) if now.object == entry.object => now,
            _ => {
                self.tally.old_attrs += 1;
                entry.last // replaced or deleted: the last attributes
            }
        };
        assert_eq!(attr.kind, expected.kind, "{entry:?}");
        if let Some(size) = expected.size {
            assert_eq!(attr.size, size, "{entry:?}");
        }
        if let Some(e) = self.inos.get_mut(&ino) {
            e.last = expected;
        }
    }

    fn readdir(&mut self, dir: &str) {
        let Some(ino) = self
            .inos
            .iter()
            .find(|(_, i)| i.paths[0] == dir && i.last.kind == Kind::Directory)
            .map(|(&ino, _)| ino)
        else {
            return; // not looked up (yet)
        };
        let fh = self.fx.fs.opendir(me(), ino).expect("opendir");
        let mut listed = Vec::new();
        self.fx
            .fs
            .readdir(fh, 0, |e, _| {
                listed.push(e.clone());
                false
            })
            .expect("readdir");
        self.fx.fs.releasedir(fh);
        self.tally.listings += 1;
        let mut expected: Vec<String> = vec![".".into(), "..".into()];
        if dir.is_empty() {
            expected.push(CONTROL_DIR.into());
        }
        let children = DIRS
            .iter()
            .copied()
            .chain(self.tree.keys().map(String::as_str))
            .filter(|p| !p.is_empty() && Path::new(p).parent() == Some(Path::new(dir)));
        expected.extend(children.map(|p| p.rsplit('/').next().unwrap_or(p).to_owned()));
        expected.sort();
        let mut names: Vec<String> = listed
            .iter()
            .map(|e| e.name.to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, expected, "listing of {dir:?}");
        let named = |e: &&DirEntry| e.name != "." && e.name != "..";
        for entry in listed
            .iter()
            .filter(named)
            .filter(|e| e.ino >= inodes::FIRST_SOURCE_INO)
        {
            let path = join(dir, &entry.name.to_string_lossy());
            let Some(shown) = self.shown(&path) else {
                panic!("listed {path} is not in SOURCE")
            };
            assert_eq!(entry.kind, shown.kind, "{path}");
            self.check_entry(&path, shown, (entry.ino, entry.kind, None), false);
        }
    }

    fn open(&mut self, ino: u64) {
        let entry = self.inos[&ino].clone();
        let got = self.fx.open_ro(ino);
        let path = self.live_path(&entry);
        let now = self.shown(&path);
        let expected_errno = match now {
            None => Some(libc::ENOENT),
            Some(now) if ino != ROOT_INO && now.object != entry.object => Some(libc::ESTALE),
            Some(now) if now.kind == Kind::Directory => Some(libc::EISDIR),
            Some(now) if now.kind == Kind::Symlink => Some(libc::EACCES),
            Some(_) => None,
        };
        match (expected_errno, got) {
            (Some(errno), Err(e)) => {
                assert_eq!(e.errno(), errno, "open {entry:?}: {e}");
                self.tally.stale_opens += u64::from(errno == libc::ESTALE);
                self.tally.missing_opens += u64::from(errno == libc::ENOENT);
            }
            (None, Ok(Opened::Served { fh, .. })) => {
                let bytes = self.objects[entry.object].clone();
                let snapshot = is_model_path(Path::new(&path)).then_some(bytes);
                self.handles.push(OpenFile {
                    fh,
                    ino,
                    snapshot,
                    object: entry.object,
                });
                if let Some(e) = self.inos.get_mut(&ino) {
                    e.handles += 1;
                }
            }
            (expected, got) => panic!("open {entry:?}: expected {expected:?}, got {got:?}"),
        }
    }

    /// A new version of `rel`: written beside it and renamed over it, as downloaders do.
    fn write(&mut self, rel: &str, bytes: Vec<u8>) {
        self.temp += 1;
        let temp = format!("tmp-{}", self.temp);
        fs::write(self.abs(&temp), &bytes).expect("write");
        fs::rename(self.abs(&temp), self.abs(rel)).expect("rename over");
        let o = self.new_object(bytes);
        self.tree.insert(rel.to_owned(), Node::File(o));
        self.keep_alive(rel);
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        for handle in self.handles.drain(..) {
            self.fx.fs.release(handle.fh);
        }
    }
}

/// Cases run, and steps per case: 1024 cases of up to 100 steps take 4 to 10 s in release on
/// the shared 2-core build machine (`cargo test -p tierfs-core --release fs::reference`);
/// most of it is writing SOURCE files.
const CASES: u32 = 1024;
const MAX_STEPS: usize = 100;

/// How often the interesting answers came up over a run: the test fails if a kind never
/// did, so a generator that stopped reaching them cannot pass unnoticed.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    model_reads: u64,
    plain_reads: u64,
    stale_opens: u64,
    missing_opens: u64,
    old_attrs: u64,
    pruned: u64,
    listings: u64,
    /// An inode met at a second path (a hard link, a link shown as its target).
    shared: u64,
    /// A number given again to its object after its inode was pruned.
    kept_after_prune: u64,
    /// Reads of a model handle whose file changed in place since it opened.
    superseded_reads: u64,
}

#[test]
fn filesystem_answers_like_the_model_of_source() {
    let config = proptest::test_runner::Config {
        cases: CASES,
        failure_persistence: None,
        ..Default::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let total = std::cell::RefCell::new(Tally::default());
    let steps = prop::collection::vec(step(), 1..MAX_STEPS);
    let result = runner.run(&steps, |steps| {
        let mut model = Model::new();
        for step in &steps {
            model.run(step);
        }
        let t = model.tally;
        let mut total = total.borrow_mut();
        total.model_reads += t.model_reads;
        total.plain_reads += t.plain_reads;
        total.stale_opens += t.stale_opens;
        total.missing_opens += t.missing_opens;
        total.old_attrs += t.old_attrs;
        total.pruned += t.pruned;
        total.listings += t.listings;
        total.shared += t.shared;
        total.kept_after_prune += t.kept_after_prune;
        total.superseded_reads += t.superseded_reads;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let t = *total.borrow();
    eprintln!("reference model: {t:?}");
    let counts = [t.model_reads, t.plain_reads, t.stale_opens, t.missing_opens];
    let more = [
        t.old_attrs,
        t.pruned,
        t.listings,
        t.shared,
        t.kept_after_prune,
        t.superseded_reads,
    ];
    let counts = [counts.as_slice(), &more].concat();
    assert!(
        counts.iter().all(|&n| n > 0),
        "some answers never came up: {t:?}"
    );
}
