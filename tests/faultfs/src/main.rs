//! `faultfs` — a tiny fault-injecting FUSE filesystem for tierfs's end-to-end tests.
//!
//! ```text
//! faultfs SOURCE MOUNTPOINT --faults FAULTS.json
//!         [--disk] [--seek-ms MS] [--disk-mbps MB_PER_S] [--disk-stats STATS.json]
//!         [--disk-trace TRACE]
//! ```
//!
//! Mirrors `SOURCE` read-only (nested directories, regular files, symlinks).
//! On **every** read it re-reads `FAULTS.json`, a JSON array such as
//! `[{"file": "sub/model.safetensors", "start": 0, "end": 4096}]` (`file` is the
//! path relative to `SOURCE`, `end` is exclusive); a read that overlaps a listed
//! range fails with `EIO`.  An entry may instead (or also) give `"stall_open_ms": N`:
//! every open of that file then takes N milliseconds before it succeeds (a stalled
//! network source; the other request threads keep serving other files).  A missing
//! or empty faults file means "no faults"; an unparsable one is treated as "no
//! faults" and logged to stderr.
//!
//! Entries with a `read_fault` object make reads hang until the entry is removed, or fail the
//! first N times: see `read_faults.rs`.
//!
//! Files are opened with `FOPEN_DIRECT_IO`, so every read by the client reaches
//! this process (no page cache in between) and clearing a fault takes effect
//! immediately.  `O_DIRECT` and other open flags from the client are accepted
//! and ignored.  Attribute and entry TTLs are zero, so changes in `SOURCE` are
//! visible at once.  Runs in the foreground; SIGTERM/SIGINT unmount and exit 0.
//!
//! **A hard disk's seeks** (`--disk`, or any of `--seek-ms` / `--disk-mbps`, which set its two
//! parameters; defaults 8 ms and 200 MB/s): every read is then served by one modelled disk head,
//! one request at a time; a request that does not start where the previous one ended on the same
//! file pays the seek, and every request's bytes are served at the rate (see [`disk`]).  So a
//! sequential reader streams at the rate, and readers at several offsets at once pay a seek per
//! request.  `--disk-stats FILE` receives the head's counters (requests, seeks, bytes, modelled
//! busy time) as JSON after every request; `--disk-trace FILE` one line per request served.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, LockOwner,
    MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry,
    ReplyOpen, Request, Session,
};
use serde::Deserialize;

mod read_faults;
use read_faults::ReadFaults;
mod disk;
use disk::{Disk, DiskModel};

/// Attributes are never cached by the kernel: the source may change under us.
const TTL: Duration = Duration::ZERO;

/// One faulty byte range `[start, end)` of `file` (relative to SOURCE), and how long each open
/// of it stalls.
#[derive(Debug, Deserialize)]
struct Fault {
    file: String,
    #[serde(default)]
    start: u64,
    #[serde(default)]
    end: u64,
    #[serde(default)]
    stall_open_ms: u64,
}

struct FaultFs {
    source: PathBuf,
    faults_path: PathBuf,
    /// inode number -> path relative to `source` (index 0 is unused, 1 is the root).
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, File>>,
    next_fh: AtomicU64,
    /// Hanging and transient reads (`read_faults.rs`).
    read_faults: ReadFaults,
    /// The hard-disk model every read goes through (`--disk`), if any.
    disk: Option<Disk>,
}

#[derive(Default)]
struct Inodes {
    paths: Vec<PathBuf>,
    by_path: HashMap<PathBuf, u64>,
}

impl Inodes {
    fn new() -> Self {
        let mut i = Inodes::default();
        i.paths.push(PathBuf::new()); // 0: unused
        i.paths.push(PathBuf::new()); // 1: root ("" relative path)
        i.by_path.insert(PathBuf::new(), 1);
        i
    }

    fn ino_for(&mut self, rel: &Path) -> u64 {
        if let Some(&ino) = self.by_path.get(rel) {
            return ino;
        }
        let ino = self.paths.len() as u64;
        self.paths.push(rel.to_path_buf());
        self.by_path.insert(rel.to_path_buf(), ino);
        ino
    }

    fn path_of(&self, ino: u64) -> Option<PathBuf> {
        if ino == 0 {
            return None;
        }
        self.paths.get(ino as usize).cloned()
    }
}

fn errno_of(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn kind_of(md: &Metadata) -> FileType {
    let ft = md.file_type();
    if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

fn attr_of(ino: u64, md: &Metadata) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: md.size(),
        blocks: md.blocks(),
        atime: time(md.atime(), md.atime_nsec()),
        mtime: time(md.mtime(), md.mtime_nsec()),
        ctime: time(md.ctime(), md.ctime_nsec()),
        crtime: time(md.mtime(), md.mtime_nsec()),
        kind: kind_of(md),
        perm: (md.mode() & 0o7777) as u16,
        nlink: md.nlink() as u32,
        uid: md.uid(),
        gid: md.gid(),
        rdev: md.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

impl FaultFs {
    fn rel_path(&self, ino: INodeNo) -> Option<PathBuf> {
        self.inodes.lock().ok()?.path_of(ino.0)
    }

    /// The faults file's entries (none if it is missing, empty or unparsable).
    fn faults(&self) -> Vec<Fault> {
        let text = match fs::read(&self.faults_path) {
            Ok(t) => t,
            Err(_) => return Vec::new(), // missing file = no faults
        };
        if text.iter().all(u8::is_ascii_whitespace) {
            return Vec::new();
        }
        serde_json::from_slice(&text).unwrap_or_else(|e| {
            eprintln!(
                "faultfs: ignoring unparsable {}: {e}",
                self.faults_path.display()
            );
            Vec::new()
        })
    }

    /// Is any byte of `[offset, offset+len)` of `rel` listed in the faults file?
    fn is_faulty(&self, rel: &Path, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len);
        self.faults()
            .iter()
            .any(|f| Path::new(&f.file) == rel && f.start < end && offset < f.end)
    }

    /// How long an open of `rel` stalls.
    fn open_stall(&self, rel: &Path) -> Duration {
        let ms = self
            .faults()
            .iter()
            .filter(|f| Path::new(&f.file) == rel)
            .map(|f| f.stall_open_ms)
            .max()
            .unwrap_or(0);
        Duration::from_millis(ms)
    }
}

impl Filesystem for FaultFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(dir) = self.rel_path(parent) else {
            return reply.error(Errno::ENOENT);
        };
        let rel = dir.join(name);
        match fs::symlink_metadata(self.source.join(&rel)) {
            Ok(md) => {
                let ino = match self.inodes.lock() {
                    Ok(mut i) => i.ino_for(&rel),
                    Err(_) => return reply.error(Errno::EIO),
                };
                reply.entry(&TTL, &attr_of(ino, &md), fuser::Generation(0));
            }
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let Some(rel) = self.rel_path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        match fs::symlink_metadata(self.source.join(&rel)) {
            Ok(md) => reply.attr(&TTL, &attr_of(ino.0, &md)),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let Some(rel) = self.rel_path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        match fs::read_link(self.source.join(&rel)) {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let Some(rel) = self.rel_path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        std::thread::sleep(self.open_stall(&rel));
        // O_DIRECT and friends are deliberately ignored: plain buffered open.
        match File::open(self.source.join(&rel)) {
            Ok(file) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                match self.handles.lock() {
                    Ok(mut h) => {
                        h.insert(fh, file);
                    }
                    Err(_) => return reply.error(Errno::EIO),
                }
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(rel) = self.rel_path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(errno) =
            self.read_faults
                .before_read(&self.faults_path, &rel, offset, u64::from(size))
        {
            return reply.error(Errno::from_i32(errno));
        }
        if self.is_faulty(&rel, offset, u64::from(size)) {
            eprintln!("faultfs: EIO for {} [{offset}, +{size})", rel.display());
            return reply.error(Errno::EIO);
        }
        let file = match self.handles.lock() {
            Ok(h) => match h.get(&fh.0).map(File::try_clone) {
                Some(Ok(f)) => f,
                Some(Err(e)) => return reply.error(errno_of(&e)),
                None => return reply.error(Errno::EBADF),
            },
            Err(_) => return reply.error(Errno::EIO),
        };
        let read = || -> io::Result<(Vec<u8>, u64)> {
            let mut buf = vec![0u8; size as usize];
            let mut filled = 0usize;
            while filled < buf.len() {
                match file.read_at(&mut buf[filled..], offset + filled as u64) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            buf.truncate(filled);
            Ok((buf, filled as u64))
        };
        let got = match &self.disk {
            Some(disk) => disk.serve(ino.0, offset, read),
            None => read().map(|(buf, _)| buf),
        };
        match got {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        if let Ok(mut h) = self.handles.lock() {
            h.remove(&fh.0);
        }
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(rel) = self.rel_path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let rd = match fs::read_dir(self.source.join(&rel)) {
            Ok(rd) => rd,
            Err(e) => return reply.error(errno_of(&e)),
        };
        let mut entries: Vec<(u64, FileType, OsString)> = vec![
            (ino.0, FileType::Directory, ".".into()),
            (1, FileType::Directory, "..".into()),
        ];
        let mut names: Vec<(OsString, FileType)> = Vec::new();
        for ent in rd.flatten() {
            let kind = match ent.file_type() {
                Ok(t) if t.is_dir() => FileType::Directory,
                Ok(t) if t.is_symlink() => FileType::Symlink,
                _ => FileType::RegularFile,
            };
            names.push((ent.file_name(), kind));
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        {
            let Ok(mut inodes) = self.inodes.lock() else {
                return reply.error(Errno::EIO);
            };
            for (name, kind) in names {
                let child = inodes.ino_for(&rel.join(&name));
                entries.push((child, kind, name));
            }
        }
        for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: faultfs SOURCE MOUNTPOINT --faults FAULTS.json");
    eprintln!(
        "               [--disk] [--seek-ms MS] [--disk-mbps MB_PER_S] [--disk-stats STATS.json]"
    );
    eprintln!("               [--disk-trace TRACE]");
    ExitCode::from(2)
}

/// Block SIGTERM/SIGINT in this (and every later) thread and return the set, so a
/// dedicated thread can `sigwait` for them.
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-mask calls on a zero-initialised sigset_t.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let (mut positional, mut faults) = (Vec::new(), None);
    let (mut disk_on, mut model, mut disk_stats) = (false, DiskModel::default(), None);
    let mut disk_trace = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--faults" {
            faults = it.next();
        } else if a == "--disk" {
            disk_on = true;
        } else if a == "--seek-ms" || a == "--disk-mbps" {
            let Some(n) = it.next().and_then(|v| v.to_str()?.parse::<u64>().ok()) else {
                return usage();
            };
            if a == "--seek-ms" {
                model.seek = Duration::from_millis(n);
            } else {
                model.bytes_per_s = n.saturating_mul(1_000_000);
            }
            disk_on = true;
        } else if a == "--disk-stats" {
            disk_stats = it.next().map(PathBuf::from);
        } else if a == "--disk-trace" {
            let Some(path) = it.next() else {
                return usage();
            };
            match fs::File::create(&path) {
                Ok(file) => disk_trace = Some(file),
                Err(e) => {
                    eprintln!("faultfs: disk trace {}: {e}", Path::new(&path).display());
                    return ExitCode::FAILURE;
                }
            }
            disk_on = true;
        } else if a == "-h" || a == "--help" {
            return usage();
        } else {
            positional.push(a);
        }
    }
    let (Some(faults), [source, mountpoint]) = (faults, positional.as_slice()) else {
        return usage();
    };
    let source = match fs::canonicalize(source) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("faultfs: source {}: {e}", Path::new(source).display());
            return ExitCode::FAILURE;
        }
    };

    let sigset = block_signals();
    let fs = FaultFs {
        source,
        faults_path: PathBuf::from(faults),
        inodes: Mutex::new(Inodes::new()),
        handles: Mutex::new(HashMap::new()),
        next_fh: AtomicU64::new(1),
        read_faults: ReadFaults::new(),
        disk: disk_on.then(|| Disk::new(model, disk_stats, disk_trace)),
    };
    let mut config = Config::default();
    config.mount_options = vec![MountOption::RO, MountOption::FSName("faultfs".into())];
    config.n_threads = Some(4);
    let mut session = match Session::new(fs, mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("faultfs: mount on {}: {e}", Path::new(mountpoint).display());
            return ExitCode::FAILURE;
        }
    };
    let mut unmounter = session.unmount_callable();
    let mnt = PathBuf::from(mountpoint);
    std::thread::spawn(move || {
        let mut sig: libc::c_int = 0;
        // SAFETY: sigwait on the set blocked above.
        unsafe { libc::sigwait(&sigset, &mut sig) };
        eprintln!("faultfs: signal {sig}, unmounting {}", mnt.display());
        if let Err(e) = unmounter.unmount() {
            eprintln!("faultfs: unmount failed ({e}); detaching");
            if let Ok(c) = std::ffi::CString::new(mnt.as_os_str().as_bytes()) {
                // SAFETY: valid NUL-terminated path.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    });
    if disk_on {
        eprintln!(
            "faultfs: disk model: seek {} ms, {} MB/s",
            model.seek.as_millis(),
            model.bytes_per_s / 1_000_000
        );
    }
    eprintln!("faultfs: mounted");
    match session.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("faultfs: session ended with error: {e}");
            ExitCode::FAILURE
        }
    }
}
