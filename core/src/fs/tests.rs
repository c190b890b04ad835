//! Unit tests of the filesystem type, driven without FUSE: a temp SOURCE, calls in, answers
//! checked against the files themselves.
//!
//! They run on Linux and, under wine, on Windows; the few that are Linux only (errno values,
//! symbolic links, replacing a file another handle holds open, `user.*` attributes) say so.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
#[cfg(target_os = "linux")]
use std::os::unix::fs::symlink;
use std::path::Path;
#[cfg(target_os = "linux")]
use std::path::PathBuf;
use std::sync::Arc;

use crossbeam::channel::{unbounded, Receiver};

use super::*;

/// A reader's own `read()` call on a handle opened without `O_DIRECT`.
pub(super) const READER: ReadKind = ReadKind {
    from_reader: true,
    o_direct: false,
};
use crate::budget::{BudgetTarget, Governor};
use crate::kernel_cache::{InodeRange, KernelCacheWindow};
use crate::models::ModelStore;
use crate::prefetch::saved::SavedOrders;
use crate::synth::{write_checkpoint, Layout, SynthDtype, SynthSpec};

/// The passthrough backing object of these tests: the descriptor the kernel would get.
pub(super) type Backing = File;

/// A filesystem over a temp SOURCE, as the current user.
pub(super) struct Fixture {
    pub dir: tempfile::TempDir,
    pub fs: TierFs<Backing>,
    pub _invalidations: Receiver<InodeRange>,
}

impl Fixture {
    pub fn new(passthrough: bool, model_passthrough: bool) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let budget = 64 << 20;
        let store = Arc::new(ModelStore::new(budget, SavedOrders::default()));
        let target: Arc<dyn BudgetTarget> = store.clone();
        let governor = Arc::new(Governor::new(target, budget, budget / 4));
        let (tx, rx) = unbounded();
        let settings = Settings {
            source: dir.path().to_owned(),
            passthrough,
            sharing: Sharing::Single,
            model_passthrough,
            governor,
            remote: None,
        };
        let window = Arc::new(KernelCacheWindow::new(8 << 20));
        let render: RenderStats = Box::new(|view: &StatsView| {
            let doc = crate::stats_doc::CommonStats::collect(
                view.store,
                view.window,
                (view.source, Path::new("/mnt")),
                view.passthrough,
                view.started,
            );
            serde_json::to_vec(&doc).expect("stats render")
        });
        let fs = TierFs::new(settings, store, window, tx, render).unwrap();
        Fixture {
            dir,
            fs,
            _invalidations: rx,
        }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Looks `rel` up component by component from the root, as the kernel does.
    pub fn lookup_path(&self, rel: &Path) -> Result<Attr, FsError> {
        let mut ino = ROOT_INO;
        let mut attr = None;
        for name in rel.iter() {
            let (found, _) = self.fs.lookup(me(), ino, name)?;
            ino = found.ino;
            attr = Some(found);
        }
        attr.ok_or(FsError::NotFound)
    }

    pub fn open_ro(&self, ino: u64) -> Result<Opened<Backing>, FsError> {
        self.fs.open(me(), ino, oflag::RDONLY, &no_backing)
    }

    pub fn read_all(&self, ino: u64, fh: u64) -> Result<Vec<u8>, FsError> {
        read_all(&self.fs, ino, fh)
    }
}

/// Every byte of handle `fh` of `ino`, read as a reader's `read()` calls would.
pub(super) fn read_all(fs: &TierFs<Backing>, ino: u64, fh: u64) -> Result<Vec<u8>, FsError> {
    let mut out = Vec::new();
    loop {
        let bytes = fs.read(ino, fh, out.len() as u64, 100_000, READER)?;
        if bytes.is_empty() {
            return Ok(out);
        }
        out.extend_from_slice(&bytes);
    }
}

/// The current process as the requester.
pub(super) fn me() -> Requester {
    let (uid, gid) = platform::daemon_ids();
    Requester {
        uid,
        gid,
        pid: std::process::id(),
    }
}

/// A backing maker for mounts without passthrough: never called there.
pub(super) fn no_backing(_: File) -> io::Result<Backing> {
    Err(io::ErrorKind::Unsupported.into())
}

pub(super) fn served_fh(opened: Opened<Backing>) -> u64 {
    match opened {
        Opened::Served { fh, .. } => fh,
        Opened::Passthrough { .. } => panic!("expected a served handle"),
    }
}

pub(super) fn synth_model(path: &Path, seed: u64) -> Vec<u8> {
    let spec = SynthSpec {
        layout: Layout::Dit,
        target_bytes: 1 << 20,
        dtype: SynthDtype::BF16,
        seed,
    };
    write_checkpoint(path, &spec).expect("synthetic checkpoint");
    fs::read(path).expect("read back")
}

#[cfg(target_os = "linux")]
fn errno<T>(result: Result<T, FsError>) -> i32 {
    result.map(|_| ()).unwrap_err().errno()
}

fn names(fx: &Fixture, ino: u64) -> Vec<(String, Kind)> {
    let fh = fx.fs.opendir(me(), ino).unwrap();
    let mut out = Vec::new();
    fx.fs
        .readdir(fh, 0, |e, _| {
            out.push((e.name.to_string_lossy().into_owned(), e.kind));
            false
        })
        .unwrap();
    fx.fs.releasedir(fh);
    out.sort();
    out
}

#[test]
fn serves_plain_and_model_files_bit_exact() {
    let fx = Fixture::new(false, false);
    fs::create_dir(fx.root().join("sub")).unwrap();
    let plain: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(fx.root().join("sub/notes.bin"), &plain).unwrap();
    let model = synth_model(&fx.root().join("m.safetensors"), 3);

    for (rel, expected) in [("sub/notes.bin", &plain), ("m.safetensors", &model)] {
        let attr = fx.lookup_path(Path::new(rel)).unwrap();
        assert_eq!((attr.kind, attr.size), (Kind::File, expected.len() as u64));
        assert_eq!(fx.fs.getattr(me(), attr.ino).unwrap().0.size, attr.size);
        let fh = served_fh(fx.open_ro(attr.ino).unwrap());
        assert_eq!(&fx.read_all(attr.ino, fh).unwrap(), expected, "{rel}");
        let tail = fx
            .fs
            .read(attr.ino, fh, attr.size - 10, 4096, READER)
            .unwrap();
        assert_eq!(&tail[..], &expected[expected.len() - 10..]);
        fx.fs.release(fh);
    }
    assert_eq!(
        names(&fx, ROOT_INO),
        vec![
            (".".into(), Kind::Directory),
            ("..".into(), Kind::Directory),
            (".tierfs".into(), Kind::Directory),
            ("m.safetensors".into(), Kind::File),
            ("sub".into(), Kind::Directory),
        ]
    );
}

#[test]
fn errors_are_the_filesystems_own() {
    let fx = Fixture::new(false, false);
    fs::create_dir(fx.root().join("dir")).unwrap();
    fs::write(fx.root().join("f.txt"), b"x").unwrap();
    let err = |r: Result<(), FsError>| r.unwrap_err();
    let lookup = |name: &str| fx.fs.lookup(me(), ROOT_INO, OsStr::new(name)).map(drop);
    assert!(matches!(err(lookup("nope")), FsError::Io { .. }));
    assert!(matches!(err(lookup("..")), FsError::NotFound));
    assert!(matches!(err(lookup("a/b")), FsError::NotFound));
    let getattr = fx.fs.getattr(me(), 999_999).map(drop);
    assert!(matches!(err(getattr), FsError::NotFound));
    let dir = fx.lookup_path(Path::new("dir")).unwrap();
    assert!(matches!(
        err(fx.open_ro(dir.ino).map(drop)),
        FsError::IsDirectory
    ));
    let file = fx.lookup_path(Path::new("f.txt")).unwrap();
    let write = fx.fs.open(me(), file.ino, oflag::RDWR, &no_backing);
    assert!(matches!(err(write.map(drop)), FsError::ReadOnly));
    let read = fx.fs.read(file.ino, 12345, 0, 10, READER).map(drop);
    assert!(matches!(err(read), FsError::BadHandle));
    let read_control = fx.fs.open(me(), CONTROL_INO, oflag::RDONLY, &no_backing);
    assert!(matches!(err(read_control.map(drop)), FsError::Denied(_)));
    let stats = fx.fs.statfs().unwrap();
    assert!(
        stats.blocks > 0 && stats.bavail <= stats.blocks,
        "{stats:?}"
    );
}

#[cfg(target_os = "linux")] // errno values and a symbolic link
#[test]
fn errors_are_the_ones_the_kernel_expects() {
    let fx = Fixture::new(false, false);
    fs::create_dir(fx.root().join("dir")).unwrap();
    fs::write(fx.root().join("f.txt"), b"x").unwrap();
    symlink("nowhere", fx.root().join("dangling")).unwrap();

    assert_eq!(
        errno(fx.fs.lookup(me(), ROOT_INO, OsStr::new("nope"))),
        libc::ENOENT
    );
    assert_eq!(
        errno(fx.fs.lookup(me(), ROOT_INO, OsStr::new(".."))),
        libc::ENOENT
    );
    assert_eq!(errno(fx.fs.getattr(me(), 999_999)), libc::ENOENT);
    let dir = fx.lookup_path(Path::new("dir")).unwrap();
    assert_eq!(errno(fx.open_ro(dir.ino)), libc::EISDIR);
    let file = fx.lookup_path(Path::new("f.txt")).unwrap();
    let write = fx.fs.open(me(), file.ino, libc::O_RDWR, &no_backing);
    assert_eq!(errno(write), libc::EROFS);
    let trunc = fx
        .fs
        .open(me(), file.ino, libc::O_RDONLY | libc::O_TRUNC, &no_backing);
    assert_eq!(errno(trunc), libc::EROFS);
    assert_eq!(
        errno(fx.fs.read(file.ino, 12345, 0, 10, READER)),
        libc::EBADF
    );
    assert_eq!(errno(fx.fs.access(file.ino, true)), libc::EROFS);
    assert!(fx.fs.access(file.ino, false).is_ok());
    let link = fx.lookup_path(Path::new("dangling")).unwrap();
    assert_eq!(link.kind, Kind::Symlink);
    assert_eq!(
        fx.fs.readlink(me(), link.ino).unwrap(),
        PathBuf::from("nowhere")
    );
    let read_control = fx.fs.open(me(), CONTROL_INO, libc::O_RDONLY, &no_backing);
    assert_eq!(errno(read_control), libc::EACCES);
    let change = SetAttr {
        size: Some(0),
        changes_mode_or_owner: false,
    };
    assert_eq!(errno(fx.fs.setattr(file.ino, change)), libc::EROFS);
    assert!(fx.fs.setattr(CONTROL_INO, change).is_ok());
    assert!(fx.fs.statfs().unwrap().blocks > 0);
}

#[test]
fn control_file_takes_commands_and_refuses_bad_ones() {
    let fx = Fixture::new(false, false);
    let opened = fx
        .fs
        .open(me(), CONTROL_INO, oflag::WRONLY, &no_backing)
        .unwrap();
    let Opened::Served { fh, flags } = opened else {
        panic!("control is served here");
    };
    assert!(flags.direct_io);
    assert_eq!(
        fx.fs.write(CONTROL_INO, fh, b"ram-cache 32M\n").unwrap(),
        14
    );
    assert_eq!(fx.fs.store().budget(), 32 << 20);
    let bad = fx.fs.write(CONTROL_INO, fh, b"explode now\n").unwrap_err();
    assert!(matches!(bad, FsError::Control(_)), "{bad}");
    assert_eq!(
        fx.fs.store().budget(),
        32 << 20,
        "a refused command changes nothing"
    );
    fx.fs.release(fh);

    let stats = served_fh(fx.open_ro(STATS_INO).unwrap());
    let json = fx.read_all(STATS_INO, stats).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert!(doc.get("cache").is_some(), "{doc}");
    fx.fs.release(stats);
}

#[cfg(target_os = "linux")] // `user.*` attributes, errno values
#[test]
fn source_xattr_names_the_source_file_and_checks_the_buffer() {
    let fx = Fixture::new(false, false);
    fs::write(fx.root().join("a.bin"), b"abc").unwrap();
    let a = fx.lookup_path(Path::new("a.bin")).unwrap();
    let name = OsStr::new(SOURCE_XATTR);
    let value = fx.root().join("a.bin").into_os_string().into_vec();
    let len = value.len() as u32;
    assert_eq!(
        fx.fs.getxattr(me(), a.ino, name, 0).unwrap(),
        Xattr::Size(len)
    );
    assert_eq!(
        fx.fs.getxattr(me(), a.ino, name, len).unwrap(),
        Xattr::Data(value)
    );
    let small = fx.fs.getxattr(me(), a.ino, name, len - 1).unwrap_err();
    assert_eq!(small.errno(), libc::ERANGE);
    let other = fx
        .fs
        .getxattr(me(), a.ino, OsStr::new("user.x"), 0)
        .unwrap_err();
    assert_eq!(other.errno(), libc::ENODATA);
    let root = fx.fs.getxattr(me(), ROOT_INO, name, 0).unwrap_err();
    assert_eq!(root.errno(), libc::ENODATA);
    let list = format!("{SOURCE_XATTR}\0").into_bytes();
    assert_eq!(
        fx.fs.listxattr(me(), a.ino, 100).unwrap(),
        Xattr::Data(list)
    );
    assert_eq!(fx.fs.listxattr(me(), ROOT_INO, 0).unwrap(), Xattr::Size(0));
}

#[cfg(target_os = "linux")]
use std::os::unix::ffi::OsStringExt;

// Linux only: renaming over a file another handle holds open is refused by Windows unless
// every opener shares delete access, and ESTALE is an errno.
#[cfg(target_os = "linux")]
#[test]
fn a_replaced_file_is_a_new_inode_and_the_old_one_keeps_its_attributes() {
    let fx = Fixture::new(false, false);
    let path = fx.root().join("x.bin");
    fs::write(&path, b"old bytes").unwrap();
    let old = fx.lookup_path(Path::new("x.bin")).unwrap();
    let old_fh = served_fh(fx.open_ro(old.ino).unwrap());
    let keep = File::open(&path).unwrap(); // keeps the inode number taken
    fs::write(fx.root().join("tmp"), b"new, longer bytes").unwrap();
    fs::rename(fx.root().join("tmp"), &path).unwrap();

    let new = fx.lookup_path(Path::new("x.bin")).unwrap();
    // The source numbers the new object as it likes (lower or higher); what matters is that
    // the old number, still held, is not given to it.
    assert_ne!(new.ino, old.ino, "a replaced object gets another number");
    let own = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap());
    assert_eq!(new.ino, own, "and it is the source object's own");
    assert_eq!(new.size, 17);
    assert_eq!(fx.fs.getattr(me(), old.ino).unwrap().0.size, 9);
    assert_eq!(fx.open_ro(old.ino).unwrap_err().errno(), libc::ESTALE);
    assert_eq!(fx.read_all(old.ino, old_fh).unwrap(), b"old bytes");
    fx.fs.release(old_fh);
    drop(keep);
}

#[test]
fn forget_and_release_prune_inodes_and_an_object_keeps_its_number() {
    let fx = Fixture::new(false, false);
    fs::create_dir(fx.root().join("d")).unwrap();
    for i in 0..50 {
        fs::write(fx.root().join(format!("d/f{i}")), [i as u8; 10]).unwrap();
    }
    let base = fx.fs.inode_count();
    // A listing numbers its entries, and gives back those no lookup holds.
    let d = fx.lookup_path(Path::new("d")).unwrap();
    assert_eq!(names(&fx, d.ino).len(), 52);
    assert_eq!(fx.fs.inode_count(), base + 1, "only `d` is held");

    let f = fx.fs.lookup(me(), d.ino, OsStr::new("f1")).unwrap().0;
    assert_eq!(
        fx.fs.lookup(me(), d.ino, OsStr::new("f1")).unwrap().0.ino,
        f.ino
    );
    fx.fs.forget(f.ino, 1);
    assert!(fx.fs.getattr(me(), f.ino).is_ok(), "one lookup still held");
    let fh = served_fh(fx.open_ro(f.ino).unwrap());
    fx.fs.forget(f.ino, 1);
    assert_eq!(
        fx.read_all(f.ino, fh).unwrap(),
        [1u8; 10],
        "an open handle holds it"
    );
    assert!(fx.fs.getattr(me(), f.ino).is_ok());
    fx.fs.release(fh);
    assert!(matches!(
        fx.fs.getattr(me(), f.ino).unwrap_err(),
        FsError::NotFound
    ));
    let again = fx.fs.lookup(me(), d.ino, OsStr::new("f1")).unwrap().0;
    assert_eq!(
        again.ino, f.ino,
        "a forgotten object comes back with its number"
    );
    fx.fs.forget(again.ino, 1);
    fx.fs.forget(d.ino, 1);
    fx.fs.forget(ROOT_INO, 1); // the root is never pruned
    assert_eq!(fx.fs.inode_count(), base);
    assert_eq!(fx.fs.handle_count(), 0);
}

#[test]
fn passthrough_shares_one_backing_per_inode_until_the_last_release() {
    let fx = Fixture::new(true, true);
    fs::write(fx.root().join("p.bin"), b"passthrough").unwrap();
    let p = fx.lookup_path(Path::new("p.bin")).unwrap();
    let backing = |file: File| Ok(file);
    let open = || match fx.fs.open(me(), p.ino, oflag::RDONLY, &backing).unwrap() {
        Opened::Passthrough { fh, backing } => (fh, backing),
        Opened::Served { .. } => panic!("expected passthrough"),
    };
    let (fh1, b1) = open();
    let (fh2, b2) = open();
    assert!(Arc::ptr_eq(&b1, &b2), "one backing id per inode");
    let weak = Arc::downgrade(&b1);
    drop((b1, b2));
    fx.fs.release(fh1);
    assert!(weak.upgrade().is_some(), "the second handle still uses it");
    fx.fs.release(fh2);
    assert!(weak.upgrade().is_none(), "released with the last handle");

    // A model that fits the budget goes by passthrough too; a failed backing falls back to
    // the cache, bit-exact. (Linux only: a model's backing reopens its version through
    // /proc/self/fd, and passthrough is a FUSE mode.)
    #[cfg(target_os = "linux")]
    {
        let model = synth_model(&fx.root().join("m.safetensors"), 9);
        let m = fx.lookup_path(Path::new("m.safetensors")).unwrap();
        let refused = |_: File| Err(io::ErrorKind::PermissionDenied.into());
        let fh = match fx.fs.open(me(), m.ino, oflag::RDONLY, &refused).unwrap() {
            Opened::Served { fh, .. } => fh,
            Opened::Passthrough { .. } => panic!("the backing was refused"),
        };
        assert_eq!(fx.read_all(m.ino, fh).unwrap(), model);
        fx.fs.release(fh);
        match fx.fs.open(me(), m.ino, oflag::RDONLY, &backing).unwrap() {
            Opened::Passthrough { fh, .. } => fx.fs.release(fh),
            Opened::Served { .. } => panic!("a model that fits goes by passthrough"),
        }
    }
}

#[test]
fn concurrent_lookups_and_forgets_leave_the_table_as_the_counts_say() {
    let fx = Fixture::new(false, false);
    for i in 0..4 {
        fs::write(fx.root().join(format!("f{i}")), [i as u8; 3]).unwrap();
    }
    let base = fx.fs.inode_count();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let fx = &fx;
            scope.spawn(move || {
                for round in 0..500u64 {
                    let name = format!("f{}", (t + round) % 4);
                    let attr = fx.fs.lookup(me(), ROOT_INO, OsStr::new(&name)).unwrap().0;
                    let fh = served_fh(fx.open_ro(attr.ino).unwrap());
                    fx.fs.forget(attr.ino, 1);
                    // Still held by the handle, whatever the other threads forgot meanwhile.
                    assert_eq!(
                        fx.read_all(attr.ino, fh).unwrap(),
                        [((t + round) % 4) as u8; 3]
                    );
                    fx.fs.release(fh);
                }
            });
        }
    });
    assert_eq!(fx.fs.inode_count(), base, "every reference was given back");
    assert_eq!(fx.fs.handle_count(), 0);
}

#[test]
fn numbers_are_the_source_objects_own_and_hard_links_share_one() {
    let fx = Fixture::new(false, false);
    fs::write(fx.root().join("a.bin"), b"shared bytes").unwrap();
    fs::hard_link(fx.root().join("a.bin"), fx.root().join("b.bin")).unwrap();
    let a = fx.lookup_path(Path::new("a.bin")).unwrap();
    let b = fx.lookup_path(Path::new("b.bin")).unwrap();
    assert_eq!(a.ino, b.ino);
    // On Linux, the source's own number (NTFS file indexes carry a sequence number in their
    // top bits, which take a slot of their own).
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let source_ino = fs::metadata(fx.root().join("a.bin")).unwrap().ino();
        assert_eq!(a.ino, source_ino);
    }
    assert_eq!(fx.fs.inode_count(), 2, "one inode for both links");
    // The link met last is gone: the inode still reaches its object through the other.
    fs::remove_file(fx.root().join("b.bin")).unwrap();
    let fh = served_fh(fx.open_ro(a.ino).unwrap());
    assert_eq!(fx.read_all(a.ino, fh).unwrap(), b"shared bytes");
    assert_eq!(fx.fs.getattr(me(), a.ino).unwrap().0.nlink, 1);
    fx.fs.release(fh);
}

#[test]
fn a_replaced_file_gets_another_number_even_if_its_inode_number_is_recycled() {
    let fx = Fixture::new(false, false);
    let path = fx.root().join("m.bin");
    fs::write(&path, b"old").unwrap();
    let old = fx.lookup_path(Path::new("m.bin")).unwrap();
    // Deleted and made again: the filesystem may well give the new file the same inode number.
    fs::remove_file(&path).unwrap();
    fs::write(&path, b"new!").unwrap();
    let new = fx.lookup_path(Path::new("m.bin")).unwrap();
    assert_ne!(new.ino, old.ino, "the kernel still holds the old number");
    assert_eq!(
        fx.fs.getattr(me(), old.ino).unwrap().0.size,
        3,
        "old answers as it was"
    );
    let fh = served_fh(fx.open_ro(new.ino).unwrap());
    assert_eq!(fx.read_all(new.ino, fh).unwrap(), b"new!");
    fx.fs.release(fh);
    fx.fs.forget(old.ino, 1);
    fx.fs.forget(new.ino, 1);
    let later = fx.lookup_path(Path::new("m.bin")).unwrap();
    assert_eq!(later.size, 4);
    if later.ino == old.ino {
        assert_ne!(
            later.generation, old.generation,
            "a reused number has a new generation"
        );
    }
}

#[test]
fn attr_ttl_is_the_configured_one() {
    let fixture = Fixture::new(false, false);
    fs::write(fixture.root().join("plain.txt"), b"hello").expect("write");
    let (_, ttl) = fixture
        .fs
        .lookup(me(), ROOT_INO, OsStr::new("plain.txt"))
        .expect("lookup");
    assert_eq!(ttl, ATTR_TTL);

    let Fixture {
        dir,
        fs: tierfs,
        _invalidations,
    } = fixture;
    let config = FsConfig {
        attr_ttl: Duration::from_secs(7),
        ..FsConfig::default()
    };
    let tierfs = tierfs.with_config(config);
    let (attr, ttl) = tierfs
        .lookup(me(), ROOT_INO, OsStr::new("plain.txt"))
        .expect("lookup");
    assert_eq!(ttl, Duration::from_secs(7));
    let (_, ttl) = tierfs.getattr(me(), attr.ino).expect("getattr");
    assert_eq!(ttl, Duration::from_secs(7));
    let (_, ttl) = tierfs.getattr(me(), STATS_INO).expect("getattr");
    assert_eq!(ttl, Duration::from_secs(7));
    drop(dir);
}
