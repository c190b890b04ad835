//! The WinFsp front end's translation onto the core filesystem type, free of WinFsp's own
//! types so that it runs (and is tested) on any platform: WinFsp names files by path and
//! opens them with an access mask; [`TierFs`] takes inode numbers and `O_*` flags.
//!
//! - **Names to inodes** ([`Tree::walk`]): a request's path ([`crate::path`]) is spelled as
//!   SOURCE spells it, then walked from the root with [`TierFs::lookup`], one component at a
//!   time; the lookup references are given back ([`TierFs::forget`]) once the request is
//!   answered. An open file's core handle keeps its inode; an open directory keeps the lookup
//!   of its own inode until it is closed.
//! - **Spelling.** Windows names are case-insensitive; the core keys its cached versions by
//!   path. A path is spelled as the source file system spells it (`std::fs::canonicalize`,
//!   kept only when it stays inside SOURCE) so that `M.SAFETENSORS` and `m.safetensors`
//!   share one cached version.
//! - **Directories are listed when enumerated** ([`Tree::list`]), not when opened: Windows
//!   opens directories far more often than it lists them (every `isdir`-style query), and the
//!   core lists at `opendir`. The core's listing handle lives only while the entries are read.
//! - **Access** ([`open_flags`]): WinFsp's granted access becomes the `O_*` flags
//!   [`TierFs::open`] takes; WinFsp has checked it against the volume's security descriptor.
//! - The mount's reads go straight to the reader (WinFsp runs with its data cache off, see
//!   `mount`), which the core is told with [`TierFs::kernel_capabilities`] (`direct_io_mmap`,
//!   no `passthrough`): no page-cache window to keep, no passthrough.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crossbeam_channel::Receiver;
use tierfs_core::budget::Governor;
use tierfs_core::fs::{
    oflag, Attr, FsError, KernelCapabilities, Kind, Opened, ReadKind, Requester, Settings, Sharing,
    StatsView, TierFs, CONTROL_DIR_INO, CONTROL_INO, ROOT_INO, STATS_INO,
};
use tierfs_core::kernel_cache::{InodeRange, KernelCacheWindow};
use tierfs_core::models::ModelStore;
use tierfs_core::stats_doc::CommonStats;
use windows_sys::Win32::Storage::FileSystem::{FILE_APPEND_DATA, FILE_READ_DATA, FILE_WRITE_DATA};

use crate::path::{Target, CONTROL_DIR};
use crate::status::WinError;

/// `DELETE` access (winnt.h): removing a file is a write.
pub const DELETE: u32 = 0x0001_0000;

/// WinFsp does not pass the requesting process's identity: requests are the daemon's own
/// (the core's Windows access rule switches nothing; WinFsp checked the open already).
const REQUESTER: Requester = Requester {
    uid: 0,
    gid: 0,
    pid: 0,
};

/// WinFsp reads are the reader's own (no page-cache fill reaches the daemon as a read), and no
/// `O_DIRECT` flag comes with them.
const READER: ReadKind = ReadKind {
    from_reader: true,
    o_direct: false,
};

/// The filesystem's passthrough backing object: none (passthrough is a FUSE mode; the core
/// never asks for one with passthrough off).
pub enum NoBacking {}

/// The core filesystem of a WinFsp mount.
pub struct Tree {
    fs: TierFs<NoBacking>,
    source: PathBuf,
    /// The core's page-cache invalidations: none are sent (see the module docs), kept so the
    /// channel stays connected.
    _invalidations: Receiver<InodeRange>,
}

/// An open file or directory, of inode `ino`.
#[derive(Debug)]
pub struct Open {
    pub ino: u64,
    pub kind: OpenKind,
}

#[derive(Debug)]
pub enum OpenKind {
    /// A directory, with the lookup reference that keeps its inode (none for the root and
    /// `.tierfs`, which always stay).
    Dir { held: Option<u64> },
    /// A file: the core's handle `fh`; `size` overrides the inode's size (`\.tierfs\stats`:
    /// the rendered document's).
    File { fh: u64, size: Option<u64> },
}

/// The inode a name led to, and the lookups that reached it.
struct Walked {
    ino: u64,
    held: Vec<u64>,
}

impl Tree {
    pub fn new(
        source: PathBuf,
        mountpoint: String,
        store: Arc<ModelStore>,
        governor: Arc<Governor>,
    ) -> std::io::Result<Tree> {
        let settings = Settings {
            source: source.clone(),
            passthrough: false,
            sharing: Sharing::Single,
            model_passthrough: false,
            governor,
            remote: None,
        };
        let render = move |view: &StatsView| stats_json(view, &mountpoint);
        let (tx, rx) = crossbeam_channel::unbounded();
        // Empty: nothing is kept in a page cache of the mounted files (see the module docs).
        let window = Arc::new(KernelCacheWindow::new(0));
        let mut fs = TierFs::new(settings, store, window, tx, Box::new(render))?;
        fs.kernel_capabilities(KernelCapabilities {
            direct_io_mmap: true,
            passthrough: false,
        });
        Ok(Tree {
            fs,
            source,
            _invalidations: rx,
        })
    }

    /// The core filesystem.
    pub fn fs(&self) -> &TierFs<NoBacking> {
        &self.fs
    }

    /// Runs `f` on the inode `target` names, holding the lookups that reached it until `f`
    /// returns.
    pub fn with_inode<T>(
        &self,
        target: &Target,
        f: impl FnOnce(u64) -> Result<T, WinError>,
    ) -> Result<T, WinError> {
        let walked = self.walk(target)?;
        let result = f(walked.ino);
        self.give_back(&walked.held);
        result
    }

    /// The attributes of `ino`.
    pub fn attr(&self, ino: u64) -> Result<Attr, WinError> {
        Ok(self.fs.getattr(REQUESTER, ino)?.0)
    }

    /// Opens what `target` names, with WinFsp's `directory` / `non_directory` create options
    /// and granted `access`; also returns its attributes.
    pub fn open(
        &self,
        target: &Target,
        (directory, non_directory): (bool, bool),
        access: u32,
    ) -> Result<(Open, Attr), WinError> {
        let Walked { ino, mut held } = self.walk(target)?;
        let opened = self.open_inode(ino, (directory, non_directory), access);
        // An open directory keeps the lookup of its own inode (the last one) until closed.
        if let Ok((
            Open {
                kind: OpenKind::Dir { held: Some(kept) },
                ..
            },
            _,
        )) = &opened
        {
            let last = held.pop();
            debug_assert_eq!(last, Some(*kept));
        }
        self.give_back(&held);
        opened
    }

    /// Closes `open`.
    pub fn close(&self, open: Open) {
        match open.kind {
            OpenKind::Dir { held } => self.give_back(held.as_slice()),
            OpenKind::File { fh, .. } => self.fs.release(fh),
        }
    }

    /// Reads into `buffer` from `offset` of the file `open`; fewer bytes only at the end of
    /// the file, and [`WinError::EndOfFile`] at or past it.
    pub fn read(&self, open: &Open, buffer: &mut [u8], offset: u64) -> Result<u32, WinError> {
        let OpenKind::File { fh, .. } = open.kind else {
            return Err(FsError::IsDirectory.into());
        };
        let want = u32::try_from(buffer.len()).unwrap_or(u32::MAX);
        let bytes = self.fs.read(open.ino, fh, offset, want, READER)?;
        if bytes.is_empty() && !buffer.is_empty() {
            return Err(WinError::EndOfFile);
        }
        Ok(bytes.copy_into(buffer) as u32)
    }

    /// Writes a control command to `open`; returns the bytes taken.
    pub fn write(&self, open: &Open, data: &[u8]) -> Result<u32, WinError> {
        let OpenKind::File { fh, .. } = open.kind else {
            return Err(FsError::ReadOnly.into());
        };
        let written = self.fs.write(open.ino, fh, data)?;
        Ok(u32::try_from(written).unwrap_or(u32::MAX))
    }

    /// The entries of directory `ino` now, with their attributes. The root has no `.` and
    /// `..` (WinFsp's rule for the root directory); names that are not valid UTF-16 are left
    /// out (they cannot be named through WinFsp).
    pub fn list(&self, ino: u64) -> Result<Vec<(String, Attr)>, WinError> {
        let fh = self.fs.opendir(REQUESTER, ino)?;
        let listed = self.list_handle(ino, fh);
        self.fs.releasedir(fh);
        listed
    }

    /// Looks `target` up from the root, component by component.
    fn walk(&self, target: &Target) -> Result<Walked, WinError> {
        let fixed = |ino| Ok(Walked { ino, held: vec![] });
        let rel = match target {
            Target::ControlDir => return fixed(CONTROL_DIR_INO),
            Target::Stats => return fixed(STATS_INO),
            Target::Control => return fixed(CONTROL_INO),
            Target::Source(rel) => self.spelled(rel),
        };
        let mut held = Vec::new();
        let mut ino = ROOT_INO;
        for name in rel.iter() {
            match self.fs.lookup(REQUESTER, ino, name) {
                Ok((attr, _)) => {
                    ino = attr.ino;
                    held.push(ino);
                }
                Err(e) => {
                    self.give_back(&held);
                    return Err(e.into());
                }
            }
        }
        Ok(Walked { ino, held })
    }

    fn give_back(&self, held: &[u64]) {
        for &ino in held {
            self.fs.forget(ino, 1);
        }
    }

    /// `rel` as the source file system spells it, if that can be told and stays in SOURCE.
    fn spelled(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            return PathBuf::new();
        }
        std::fs::canonicalize(self.source.join(rel))
            .ok()
            .and_then(|c| c.strip_prefix(&self.source).ok().map(Path::to_path_buf))
            .unwrap_or_else(|| rel.to_owned())
    }

    fn open_inode(
        &self,
        ino: u64,
        (directory, non_directory): (bool, bool),
        access: u32,
    ) -> Result<(Open, Attr), WinError> {
        let attr = self.attr(ino)?;
        let is_dir = attr.kind == Kind::Directory;
        if directory && !is_dir {
            return Err(WinError::NotDirectory);
        }
        if non_directory && is_dir {
            return Err(FsError::IsDirectory.into());
        }
        if is_dir {
            self.fs.access(ino, writes(access))?;
            let held = (ino != ROOT_INO && ino != CONTROL_DIR_INO).then_some(ino);
            let open = Open {
                ino,
                kind: OpenKind::Dir { held },
            };
            return Ok((open, attr));
        }
        let flags = open_flags(ino, access);
        let no_backing = |_| Err(std::io::ErrorKind::Unsupported.into());
        let fh = match self.fs.open(REQUESTER, ino, flags, &no_backing)? {
            Opened::Served { fh, .. } => fh,
            Opened::Passthrough { backing, .. } => match *backing {},
        };
        // The stats document is rendered at open; its size is that of this handle's copy.
        let size = match ino {
            STATS_INO => Some(self.read_to_end(ino, fh)?),
            _ => None,
        };
        let open = Open {
            ino,
            kind: OpenKind::File { fh, size },
        };
        Ok((open, attr))
    }

    /// The length of what handle `fh` serves (the stats document: a few KiB).
    fn read_to_end(&self, ino: u64, fh: u64) -> Result<u64, WinError> {
        let mut len = 0;
        loop {
            let bytes = self.fs.read(ino, fh, len, 1 << 20, READER)?;
            if bytes.is_empty() {
                return Ok(len);
            }
            len += bytes.len() as u64;
        }
    }

    fn list_handle(&self, ino: u64, fh: u64) -> Result<Vec<(String, Attr)>, WinError> {
        let mut entries = Vec::new();
        self.fs.readdir(fh, 0, |entry, _| {
            entries.push(entry.clone());
            false
        })?;
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let dot = entry.name == "." || entry.name == "..";
            if ino == ROOT_INO && (dot || hides_control_dir(&entry.name, entry.ino)) {
                continue;
            }
            let Ok(name) = entry.name.into_string() else {
                continue;
            };
            // The listing holds the inodes it numbered until it is released.
            let Ok(attr) = self.attr(entry.ino) else {
                continue; // vanished since the listing was taken
            };
            out.push((name, attr));
        }
        Ok(out)
    }
}

/// Whether `name` in the root is a SOURCE entry hidden by the control directory (Windows
/// matches names case-insensitively; the core hides only the exact name).
fn hides_control_dir(name: &OsStr, ino: u64) -> bool {
    ino != CONTROL_DIR_INO
        && name
            .to_str()
            .is_some_and(|n| n.eq_ignore_ascii_case(CONTROL_DIR))
}

/// Whether WinFsp granted an access that changes something.
fn writes(access: u32) -> bool {
    access & (FILE_WRITE_DATA | FILE_APPEND_DATA | DELETE) != 0
}

/// The `O_*` flags of an open granted `access`. An open without data access (attributes
/// only: Explorer, `dir`) reads nothing; for the control file it is taken as write-only, so
/// that stat-like opens of it succeed; the I/O manager still refuses a write on such a
/// handle, since no write access was granted.
pub fn open_flags(ino: u64, access: u32) -> i32 {
    let reads = access & FILE_READ_DATA != 0;
    match (reads, writes(access)) {
        (true, true) => oflag::RDWR,
        (false, true) => oflag::WRONLY,
        (false, false) if ino == CONTROL_INO => oflag::WRONLY,
        _ => oflag::RDONLY,
    }
}

/// The stats document of this front end: the Linux one, at `mountpoint`.
fn stats_json(view: &StatsView, mountpoint: &str) -> Vec<u8> {
    let doc = CommonStats::collect(
        view.store,
        view.window,
        (view.source, Path::new(mountpoint)),
        view.passthrough,
        view.started,
    );
    let mut json = tierfs_core::stats_doc::render_json(&doc);
    json.push(b'\n');
    json
}

#[cfg(test)]
mod tests;
