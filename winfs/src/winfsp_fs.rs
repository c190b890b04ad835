//! The WinFsp file system: WinFsp requests in, [`TierFs`] calls out (Windows only).
//!
//! Everything a mount serves is decided by the core filesystem type that the FUSE adapter
//! uses too ([`tierfs_core::fs`]): inodes, handles, the open policy (model files through the
//! chunk cache, other files with positional reads), `\.tierfs\stats` and `\.tierfs\control`,
//! read-only refusals. This file only translates:
//! - **Names to inodes.** WinFsp names files by path; the core by inode. A request's path
//!   ([`crate::path`]) is spelled as SOURCE spells it, then walked from the root with
//!   [`TierFs::lookup`], one component at a time, and the lookup references are given back
//!   ([`TierFs::forget`]) once the request is answered. An open file's core handle keeps its
//!   inode; an open directory keeps the lookup of its own inode until it is closed.
//! - **Directories are listed when enumerated**, not when opened (as before the port): Windows
//!   opens directories far more often than it lists them (every `isdir`-style query), and the
//!   core lists at `opendir`. The core's listing handle lives only while WinFsp's directory
//!   buffer is filled.
//! - **Spelling.** Windows names are case-insensitive; the core keys its cached versions by
//!   path. A path is spelled as the source file system spells it (`std::fs::canonicalize`,
//!   kept only when it stays inside SOURCE) so that `M.SAFETENSORS` and `m.safetensors`
//!   share one cached version, as before.
//! - **Access** ([`open_flags`]): WinFsp's granted access becomes the `O_*` flags
//!   [`TierFs::open`] takes; WinFsp has checked it against the volume's security descriptor
//!   already.
//! - **Attributes** ([`file_info`]): the core's [`Attr`] as WinFsp's `FileInfo`, every file
//!   read-only.
//! - **Errors**: every error is a [`WinError`], turned into an `NTSTATUS` by
//!   [`status::ntstatus`] only.
//!
//! The stats document is the Linux one (`tierfs_core::stats_doc`); its `kernel_page_cache`
//! window stays empty, since WinFsp runs with its data cache off (see `mount`), so reads go
//! straight to the reader: the core is told so with
//! [`TierFs::kernel_capabilities`]`(true, false)` (reads do not fill a page cache; no
//! passthrough). No security descriptors are kept (`PersistentAcls` off): access follows the
//! mounting user's drive mapping, and the source's own ACLs apply to this process's reads.

use std::ffi::{c_void, OsStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crossbeam_channel::Receiver;
use tierfs_core::budget::Governor;
use tierfs_core::fs::{
    oflag, Attr, FsError, Kind, Opened, Requester, Settings, Sharing, StatsView, TierFs,
    CONTROL_DIR_INO, CONTROL_INO, ROOT_INO, STATS_INO,
};
use tierfs_core::kernel_cache::{InodeRange, KernelCacheWindow};
use tierfs_core::models::ModelStore;
use tierfs_core::stats_doc::StatsDocument;
use windows_sys::Win32::Storage::FileSystem::{
    FILE_APPEND_DATA, FILE_ATTRIBUTE_DIRECTORY, FILE_ATTRIBUTE_NORMAL, FILE_ATTRIBUTE_READONLY,
    FILE_READ_DATA, FILE_WRITE_DATA,
};
use winfsp::filesystem::{
    DirBuffer, DirInfo, DirMarker, FileInfo, FileSecurity, FileSystemContext, OpenFileInfo,
    VolumeInfo, WideNameInfo,
};
use winfsp::{FspError, U16CStr};

use crate::path::{resolve, Target, CONTROL_DIR};
use crate::status::{self, WinError};

/// `DELETE` access (winnt.h): removing a file is a write.
const DELETE: u32 = 0x0001_0000;

/// `FILE_DIRECTORY_FILE` and `FILE_NON_DIRECTORY_FILE`, NtCreateFile's create options: the
/// caller wants only a directory, or only a file.
const FILE_DIRECTORY_FILE: u32 = 0x0000_0001;
const FILE_NON_DIRECTORY_FILE: u32 = 0x0000_0040;

/// Allocation unit reported for files: the sector size the volume announces (see `mount`).
const ALLOCATION_UNIT: u64 = 4096;

/// WinFsp does not pass the requesting process's identity: requests are the daemon's own
/// (the core's Windows access rule switches nothing; WinFsp checked the open already).
const REQUESTER: Requester = Requester {
    uid: 0,
    gid: 0,
    pid: 0,
};

/// The filesystem's passthrough backing object: none on Windows (passthrough is a FUSE mode;
/// the core never asks for one with passthrough off).
pub enum NoBacking {}

/// The tierfs WinFsp file system.
pub struct TierWinFs {
    fs: TierFs<NoBacking>,
    source: PathBuf,
    /// The core's page-cache invalidations: none are sent (see the module docs), kept so the
    /// channel stays connected.
    _invalidations: Receiver<InodeRange>,
}

/// One open file or directory, of inode `ino`.
pub struct Node {
    ino: u64,
    kind: NodeKind,
}

enum NodeKind {
    /// A directory: its listing, filled at each enumeration from the start, and the lookup
    /// reference that keeps its inode (none for the root and `.tierfs`, which always stay).
    Dir {
        listing: DirBuffer,
        held: Option<u64>,
    },
    /// A file: the core's handle `fh`; `size` overrides the inode's size (`\.tierfs\stats`:
    /// the rendered document's).
    File { fh: u64, size: Option<u64> },
}

/// The inode a name led to, and the lookups that reached it (each given back with
/// [`TierFs::forget`]).
struct Walked {
    ino: u64,
    held: Vec<u64>,
}

fn fsp(err: impl Into<WinError>) -> FspError {
    let err = err.into();
    let code = status::ntstatus(&err);
    tracing::debug!(error = %err, status = format_args!("{:#010x}", code as u32), "request failed");
    FspError::NTSTATUS(code)
}

impl TierWinFs {
    pub fn new(
        source: PathBuf,
        mountpoint: String,
        store: Arc<ModelStore>,
        governor: Arc<Governor>,
    ) -> TierWinFs {
        let settings = Settings {
            source: source.clone(),
            passthrough: false,
            sharing: Sharing::Single,
            model_passthrough: false,
            governor,
        };
        let render = move |view: &StatsView| stats_json(view, &mountpoint);
        let (tx, rx) = crossbeam_channel::unbounded();
        // Empty: nothing is kept in a page cache of the mounted files (see the module docs).
        let window = Arc::new(KernelCacheWindow::new(0));
        let mut fs = TierFs::new(settings, store, window, tx, Box::new(render));
        fs.kernel_capabilities(true, false);
        TierWinFs {
            fs,
            source,
            _invalidations: rx,
        }
    }

    /// Runs `f` on the inode `target` names, holding the lookups that reached it until `f`
    /// returns.
    fn with_inode<T>(
        &self,
        target: &Target,
        f: impl FnOnce(u64) -> Result<T, WinError>,
    ) -> Result<T, WinError> {
        let walked = self.walk(target)?;
        let result = f(walked.ino);
        self.give_back(&walked.held);
        result
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

    fn attr(&self, ino: u64) -> Result<Attr, WinError> {
        Ok(self.fs.getattr(REQUESTER, ino)?.0)
    }

    fn open_target(
        &self,
        target: &Target,
        create_options: u32,
        access: u32,
    ) -> Result<(Node, FileInfo), WinError> {
        let Walked { ino, mut held } = self.walk(target)?;
        let opened = self.open_inode(ino, create_options, access);
        // An open directory keeps the lookup of its own inode (the last one) until closed.
        let keep = match &opened {
            Ok((
                Node {
                    kind: NodeKind::Dir { held: Some(_), .. },
                    ..
                },
                _,
            )) => held.pop(),
            _ => None,
        };
        debug_assert!(keep.is_none_or(|kept| kept == ino));
        self.give_back(&held);
        opened
    }

    fn open_inode(
        &self,
        ino: u64,
        create_options: u32,
        access: u32,
    ) -> Result<(Node, FileInfo), WinError> {
        let attr = self.attr(ino)?;
        let is_dir = attr.kind == Kind::Directory;
        if create_options & FILE_DIRECTORY_FILE != 0 && !is_dir {
            return Err(WinError::NotDirectory);
        }
        if create_options & FILE_NON_DIRECTORY_FILE != 0 && is_dir {
            return Err(FsError::IsDirectory.into());
        }
        let node = if is_dir {
            self.fs.access(ino, writes(access))?;
            let held = (ino != ROOT_INO && ino != CONTROL_DIR_INO).then_some(ino);
            let listing = DirBuffer::new();
            Node {
                ino,
                kind: NodeKind::Dir { listing, held },
            }
        } else {
            self.open_file(ino, access)?
        };
        let info = self.node_info(&node, attr);
        Ok((node, info))
    }

    fn open_file(&self, ino: u64, access: u32) -> Result<Node, WinError> {
        let flags = open_flags(ino, access);
        let fh = match self.fs.open(REQUESTER, ino, flags, &|_| {
            Err(std::io::ErrorKind::Unsupported.into())
        })? {
            Opened::Served { fh, .. } => fh,
            Opened::Passthrough { backing, .. } => match *backing {},
        };
        // The stats document is rendered at open; its size is that of this handle's copy.
        let size = match ino {
            STATS_INO => Some(self.read_to_end(ino, fh)?),
            _ => None,
        };
        Ok(Node {
            ino,
            kind: NodeKind::File { fh, size },
        })
    }

    /// The length of what handle `fh` serves (the stats document: a few KiB).
    fn read_to_end(&self, ino: u64, fh: u64) -> Result<u64, WinError> {
        let mut len = 0;
        loop {
            let bytes = self.fs.read(ino, fh, len, 1 << 20, true)?;
            if bytes.is_empty() {
                return Ok(len);
            }
            len += bytes.len() as u64;
        }
    }

    fn node_info(&self, node: &Node, attr: Attr) -> FileInfo {
        let mut info = file_info(&attr);
        if let NodeKind::File {
            size: Some(size), ..
        } = node.kind
        {
            info.file_size = size;
            info.allocation_size = size.next_multiple_of(ALLOCATION_UNIT);
        }
        info
    }

    fn read_node(&self, node: &Node, buffer: &mut [u8], offset: u64) -> Result<u32, WinError> {
        let NodeKind::File { fh, .. } = node.kind else {
            return Err(FsError::IsDirectory.into());
        };
        let want = u32::try_from(buffer.len()).unwrap_or(u32::MAX);
        let bytes = self.fs.read(node.ino, fh, offset, want, true)?;
        if bytes.is_empty() && !buffer.is_empty() {
            return Err(WinError::EndOfFile);
        }
        buffer[..bytes.len()].copy_from_slice(&bytes);
        Ok(bytes.len() as u32)
    }

    /// The entries of directory `ino` now: name and information. The root has no `.` and
    /// `..` (WinFsp's rule for the root directory).
    fn list(&self, ino: u64) -> Result<Vec<(String, FileInfo)>, WinError> {
        let fh = self.fs.opendir(REQUESTER, ino)?;
        let listed = self.list_handle(ino, fh);
        self.fs.releasedir(fh);
        listed
    }

    /// The entries of the core's listing `fh` of directory `ino`, while it holds the inodes
    /// it numbered.
    fn list_handle(&self, ino: u64, fh: u64) -> Result<Vec<(String, FileInfo)>, WinError> {
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
                continue; // not valid UTF-16: cannot be named through here
            };
            let Ok(attr) = self.attr(entry.ino) else {
                continue; // vanished since the listing was taken
            };
            out.push((name, file_info(&attr)));
        }
        Ok(out)
    }

    fn fill_listing(&self, ino: u64, listing: &DirBuffer) -> Result<(), FspError> {
        let entries = self.list(ino).map_err(fsp)?;
        let lock = listing.acquire(true, None)?;
        for (name, info) in entries {
            let mut entry: DirInfo = DirInfo::new();
            if entry.set_name(name.as_str()).is_err() {
                tracing::warn!(name, "name too long for a directory entry; not listed");
                continue;
            }
            *entry.file_info_mut() = info;
            lock.write(&mut entry)?;
        }
        Ok(())
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
/// that stat-like opens of it succeed as before; the I/O manager still refuses a write on such
/// a handle, since no write access was granted.
fn open_flags(ino: u64, access: u32) -> i32 {
    let reads = access & FILE_READ_DATA != 0;
    match (reads, writes(access)) {
        (true, true) => oflag::RDWR,
        (false, true) => oflag::WRONLY,
        (false, false) if ino == CONTROL_INO => oflag::WRONLY,
        _ => oflag::RDONLY,
    }
}

/// The core's attributes as WinFsp's: every file read-only.
/// `\.tierfs\control` is not marked read-only: WinFsp refuses write opens of read-only
/// files. `index_number` stays 0: the core's inode numbers are not stable across requests here
/// (each request's lookups are given back), so they must not pass for file identities.
fn file_info(attr: &Attr) -> FileInfo {
    FileInfo {
        file_attributes: match attr.kind {
            Kind::Directory => FILE_ATTRIBUTE_DIRECTORY | FILE_ATTRIBUTE_READONLY,
            _ if attr.ino == CONTROL_INO => FILE_ATTRIBUTE_NORMAL,
            _ => FILE_ATTRIBUTE_READONLY,
        },
        file_size: attr.size,
        allocation_size: attr.size.next_multiple_of(ALLOCATION_UNIT),
        creation_time: filetime(attr.crtime),
        last_access_time: filetime(attr.atime),
        last_write_time: filetime(attr.mtime),
        change_time: filetime(attr.ctime),
        ..FileInfo::default()
    }
}

/// 100 ns ticks since 1601 (a `FILETIME`) of `t` (0 before 1601, which nothing has).
fn filetime(t: SystemTime) -> u64 {
    /// From 1601-01-01 to 1970-01-01.
    const EPOCH_DIFFERENCE: Duration = Duration::from_secs(11_644_473_600);
    let since_1601 = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => after + EPOCH_DIFFERENCE,
        Err(before) => EPOCH_DIFFERENCE.saturating_sub(before.duration()),
    };
    u64::try_from(since_1601.as_nanos() / 100).unwrap_or(u64::MAX)
}

/// The stats document of this front end: the Linux one, at `mountpoint`.
fn stats_json(view: &StatsView, mountpoint: &str) -> Vec<u8> {
    let doc = StatsDocument::collect(
        view.store,
        view.window,
        (view.source, Path::new(mountpoint)),
        view.passthrough,
        view.started,
    );
    let mut json = serde_json::to_vec_pretty(&doc)
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot render stats: {e}\"}}").into_bytes());
    json.push(b'\n');
    json
}

fn name_of(file_name: &U16CStr) -> Result<Target, FspError> {
    resolve(&file_name.to_string_lossy()).map_err(fsp)
}

impl FileSystemContext for TierWinFs {
    type FileContext = Node;

    fn get_security_by_name(
        &self,
        file_name: &U16CStr,
        _security_descriptor: Option<&mut [c_void]>,
        _reparse_point_resolver: impl FnOnce(&U16CStr) -> Option<FileSecurity>,
    ) -> winfsp::Result<FileSecurity> {
        let attr = self
            .with_inode(&name_of(file_name)?, |ino| self.attr(ino))
            .map_err(fsp)?;
        Ok(FileSecurity {
            reparse: false,
            sz_security_descriptor: 0,
            attributes: file_info(&attr).file_attributes,
        })
    }

    fn open(
        &self,
        file_name: &U16CStr,
        create_options: u32,
        granted_access: u32,
        file_info: &mut OpenFileInfo,
    ) -> winfsp::Result<Node> {
        let target = name_of(file_name)?;
        let (node, info) = self
            .open_target(&target, create_options, granted_access)
            .map_err(fsp)?;
        *file_info.as_mut() = info;
        Ok(node)
    }

    fn close(&self, context: Node) {
        match context.kind {
            NodeKind::Dir { held, .. } => self.give_back(held.as_slice()),
            NodeKind::File { fh, .. } => self.fs.release(fh),
        }
    }

    fn get_file_info(&self, context: &Node, file_info: &mut FileInfo) -> winfsp::Result<()> {
        let attr = self.attr(context.ino).map_err(fsp)?;
        *file_info = self.node_info(context, attr);
        Ok(())
    }

    fn read(&self, context: &Node, buffer: &mut [u8], offset: u64) -> winfsp::Result<u32> {
        self.read_node(context, buffer, offset).map_err(fsp)
    }

    fn write(
        &self,
        context: &Node,
        buffer: &[u8],
        _offset: u64,
        _write_to_eof: bool,
        _constrained_io: bool,
        file_info: &mut FileInfo,
    ) -> winfsp::Result<u32> {
        let NodeKind::File { fh, .. } = context.kind else {
            return Err(fsp(FsError::ReadOnly));
        };
        let written = self.fs.write(context.ino, fh, buffer).map_err(fsp)?;
        self.get_file_info(context, file_info)?;
        Ok(u32::try_from(written).unwrap_or(u32::MAX))
    }

    fn read_directory(
        &self,
        context: &Node,
        _pattern: Option<&U16CStr>,
        marker: DirMarker,
        buffer: &mut [u8],
    ) -> winfsp::Result<u32> {
        let NodeKind::Dir { listing, .. } = &context.kind else {
            return Err(fsp(WinError::NotDirectory));
        };
        if marker.is_none() {
            self.fill_listing(context.ino, listing)?;
        }
        Ok(listing.read(marker, buffer))
    }

    fn get_volume_info(&self, out_volume_info: &mut VolumeInfo) -> winfsp::Result<()> {
        // Zeros if the volume cannot be queried: only Explorer's bar shows them.
        let (total, free) = self
            .fs
            .statfs()
            .map(|s| {
                let unit = u64::from(s.frsize);
                (s.blocks * unit, s.bavail * unit)
            })
            .unwrap_or((0, 0));
        out_volume_info.total_size = total;
        out_volume_info.free_size = free;
        out_volume_info.set_volume_label("tierfs");
        Ok(())
    }

    fn overwrite(
        &self,
        _context: &Node,
        _file_attributes: u32,
        _replace_file_attributes: bool,
        _allocation_size: u64,
        _extra_buffer: Option<&[u8]>,
        _file_info: &mut FileInfo,
    ) -> winfsp::Result<()> {
        Err(fsp(FsError::ReadOnly))
    }

    fn set_delete(
        &self,
        _context: &Node,
        _file_name: &U16CStr,
        _delete: bool,
    ) -> winfsp::Result<()> {
        Err(fsp(FsError::ReadOnly))
    }

    fn rename(
        &self,
        _context: &Node,
        _file_name: &U16CStr,
        _new_file_name: &U16CStr,
        _replace_if_exists: bool,
    ) -> winfsp::Result<()> {
        Err(fsp(FsError::ReadOnly))
    }

    fn set_file_size(
        &self,
        _context: &Node,
        _new_size: u64,
        _set_allocation_size: bool,
        _file_info: &mut FileInfo,
    ) -> winfsp::Result<()> {
        Err(fsp(FsError::ReadOnly))
    }
}
