//! The Windows side of [`super`].

use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;
use windows_sys::Win32::Storage::FileSystem::{
    GetDiskFreeSpaceExW, FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT,
    FILE_READ_ATTRIBUTES, FILE_SHARE_DELETE, FILE_SHARE_READ, FILE_SHARE_WRITE,
};

use crate::models::{ModelStore, OpenError, OpenModel};
use crate::source::{SourceFile, SourceIdentity};

use super::super::attr::{Attr, Kind};
use super::super::inodes::{generation_of, ObjectId};
use super::super::StatFs;
use super::born;

/// The `open` flags [`TierFs::open`](crate::fs::TierFs::open) looks at: Linux's values (the
/// filesystem's own vocabulary); the front end builds them from the access it was granted.
pub mod oflag {
    pub const RDONLY: i32 = 0;
    pub const WRONLY: i32 = 1;
    pub const RDWR: i32 = 2;
    pub const ACCMODE: i32 = 3;
    pub const TRUNC: i32 = 0o1000;
}

/// Who may use the mount: WinFsp checks every open against the volume's security descriptor
/// before the file system sees it, so there is one mode only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    Single,
}

impl Sharing {
    /// Never: see the type's docs.
    pub fn is_shared(self) -> bool {
        false
    }
}

/// Taking on a requester's rights never fails on Windows (nothing is switched).
#[derive(Debug, Error)]
pub enum AccessError {}

/// A request, served with the daemon's own rights (see [`Sharing`]).
#[derive(Debug)]
pub struct Acting {
    _private: (),
}

impl Acting {
    /// Links in SOURCE are presented as their targets.
    pub fn follow_links(&self) -> bool {
        true
    }
}

/// The access rule of a Windows mount: WinFsp's own checks (see [`Sharing`]).
#[derive(Debug)]
pub struct AccessRule;

impl AccessRule {
    pub fn new(_sharing: Sharing) -> AccessRule {
        AccessRule
    }

    pub fn sharing(&self) -> Sharing {
        Sharing::Single
    }

    pub fn act_for(&self, _uid: u32, _gid: u32, _pid: u32) -> Result<Acting, AccessError> {
        Ok(Acting { _private: () })
    }
}

/// SOURCE: paths below it are joined to it and reached with the daemon's own rights (the
/// Linux resolver's guards are about `/proc` and FUSE, which Windows has not).
#[derive(Debug)]
pub struct SourceRoot {
    abs: PathBuf,
}

impl SourceRoot {
    pub fn open(abs: &Path) -> io::Result<SourceRoot> {
        std::fs::metadata(abs)?;
        Ok(SourceRoot {
            abs: abs.to_owned(),
        })
    }

    pub fn abs(&self) -> &Path {
        &self.abs
    }

    pub fn lstat(&self, rel: &Path, _follow_links: bool) -> io::Result<Metadata> {
        std::fs::symlink_metadata(self.abs.join(rel))
    }

    pub fn stat(&self, rel: &Path, _follow_links: bool) -> io::Result<Metadata> {
        std::fs::metadata(self.abs.join(rel))
    }

    pub fn open_file(&self, rel: &Path, _follow_links: bool) -> io::Result<File> {
        File::open(self.abs.join(rel))
    }

    /// Opens `rel` if it is a regular file, with its metadata (a directory: `IsADirectory`).
    pub fn open_regular(&self, rel: &Path, _follow_links: bool) -> io::Result<(File, Metadata)> {
        let abs = self.abs.join(rel);
        let meta = std::fs::metadata(&abs)?;
        if meta.is_dir() {
            return Err(io::ErrorKind::IsADirectory.into());
        }
        if !meta.is_file() {
            return Err(io::ErrorKind::PermissionDenied.into());
        }
        let file = File::open(&abs)?;
        let meta = file.metadata()?;
        Ok((file, meta))
    }

    pub fn list_dir(&self, rel: &Path, _follow_links: bool) -> io::Result<Vec<OsString>> {
        std::fs::read_dir(self.abs.join(rel))?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect()
    }

    pub fn read_link(&self, rel: &Path, _follow_links: bool) -> io::Result<PathBuf> {
        std::fs::read_link(self.abs.join(rel))
    }

    /// Whether link `rel` resolves to a directory holding the link itself.
    pub fn link_points_at_ancestor(&self, rel: &Path) -> bool {
        let abs = self.abs.join(rel);
        let (Ok(target), Some(parent)) = (std::fs::canonicalize(&abs), abs.parent()) else {
            return true;
        };
        std::fs::canonicalize(parent).map_or(true, |parent| parent.starts_with(&target))
    }

    /// Never asked: see [`is_unswitched_other`].
    pub fn acl_on_path(&self, _rel: &Path) -> io::Result<bool> {
        Ok(false)
    }
}

impl crate::source::PathAccess for SourceRoot {
    fn open(&self, abs: &Path) -> io::Result<crate::source::Opened> {
        crate::source::PlainPaths.open(abs)
    }

    fn identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
        crate::source::PlainPaths.identity(abs)
    }

    fn list_dir(&self, abs: &Path) -> io::Result<Vec<OsString>> {
        crate::source::PlainPaths.list_dir(abs)
    }

    fn dir_identity(&self, abs: &Path) -> io::Result<crate::source::SourceIdentity> {
        crate::source::PlainPaths.dir_identity(abs)
    }

    fn link_target(&self, abs: &Path) -> io::Result<Option<PathBuf>> {
        crate::source::PlainPaths.link_target(abs)
    }
}

/// Requests are served with the daemon's rights for the one user WinFsp lets in.
pub fn is_unswitched_other(_acting: &Acting) -> bool {
    false
}

/// Opens a handle of the model file at `rel` (source `abs`). The store opens its own
/// descriptors by path (adopting the requester's is Linux only) and checks they are the
/// version it indexed; the caller compares that with `_opened`'s identity.
pub fn open_model(
    store: &std::sync::Arc<ModelStore>,
    rel: &Path,
    abs: &Path,
    _opened: File,
) -> Result<Option<OpenModel>, OpenError> {
    store.open_handle(rel, abs).map(Some)
}

/// Passthrough is a FUSE mode: never asked for on Windows.
pub fn reopen(_source: &SourceFile) -> io::Result<File> {
    Err(io::ErrorKind::Unsupported.into())
}

/// Requests carry no uid on Windows: the daemon is 0, as they are.
pub fn daemon_ids() -> (u32, u32) {
    (0, 0)
}

/// The source object at `abs` (presented as `kind`): volume serial number and file index.
/// Opened with attribute access only and every sharing mode, so that a file another process
/// holds open without sharing still answers; directories need `FILE_FLAG_BACKUP_SEMANTICS`,
/// and an entry presented as a link is the link itself.
pub fn object_id(abs: &Path, meta: &Metadata, kind: Kind) -> io::Result<ObjectId> {
    let mut flags = FILE_FLAG_BACKUP_SEMANTICS;
    if kind == Kind::Symlink {
        flags |= FILE_FLAG_OPEN_REPARSE_POINT;
    }
    let file = OpenOptions::new()
        .access_mode(FILE_READ_ATTRIBUTES)
        .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE)
        .custom_flags(flags)
        .open(abs)?;
    file_object_id(&file, meta)
}

/// The source object open as `file` (`meta` its metadata): volume serial number, file index
/// and creation time (NTFS's file index carries a sequence number of its own, but other
/// filesystems, and wine, recycle indexes).
pub fn file_object_id(file: &File, meta: &Metadata) -> io::Result<ObjectId> {
    let identity = SourceIdentity::of_file(file)?;
    Ok(ObjectId {
        dev: identity.dev,
        ino: identity.ino,
        born: born(meta),
    })
}

/// The identity (version) of the open source file `file`.
pub fn file_identity(file: &File, _meta: &Metadata) -> io::Result<SourceIdentity> {
    SourceIdentity::of_file(file)
}

/// Directories, links (reparse points the metadata was not followed through) and files.
pub fn kind_of(meta: &Metadata) -> Kind {
    let t = meta.file_type();
    match () {
        _ if t.is_dir() => Kind::Directory,
        _ if t.is_symlink() => Kind::Symlink,
        _ => Kind::File,
    }
}

/// Block size reported (`st_blksize` and the unit of `blocks`' rounding): the sector size the
/// WinFsp volume announces and `crate::source` aligns to.
const BLOCK: u64 = 4096;

/// The attributes of source object `meta`: the portable fields, read-only permissions (the
/// mount is read-only; Windows ACLs do not map to a mode) and the daemon as owner.
pub fn attr_of(ino: u64, meta: &Metadata, kind: Kind) -> Attr {
    let time = |t: io::Result<SystemTime>| t.unwrap_or(UNIX_EPOCH);
    let mtime = time(meta.modified());
    Attr {
        ino,
        generation: generation_of(born(meta)),
        size: meta.len(),
        blocks: meta.len().div_ceil(BLOCK) * (BLOCK / 512),
        atime: time(meta.accessed()),
        mtime,
        ctime: mtime,
        crtime: time(meta.created()),
        kind,
        perm: if kind == Kind::Directory {
            0o555
        } else {
            0o444
        },
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLOCK as u32,
    }
}

/// Whether a name from the front end contains a path separator (either slash).
pub fn name_has_separator(name: &OsStr) -> bool {
    name.encode_wide()
        .any(|c| c == u16::from(b'/') || c == u16::from(b'\\'))
}

/// `path` as UTF-8 bytes (lossy: a name that is not valid UTF-16 keeps a replacement char).
pub fn path_bytes(path: &Path) -> Vec<u8> {
    path.to_string_lossy().into_owned().into_bytes()
}

/// Longest name component NTFS takes.
const NAME_MAX: u32 = 255;

/// The figures of the volume holding `path` (`GetDiskFreeSpaceExW`); the file counts are 0,
/// as Windows does not report them.
pub fn statfs(path: &Path) -> io::Result<StatFs> {
    let wide: Vec<u16> = path.as_os_str().encode_wide().chain([0]).collect();
    let (mut free_to_caller, mut total, mut free) = (0u64, 0u64, 0u64);
    // SAFETY: `wide` is NUL-terminated and outlives the call; the out-pointers are valid u64s.
    let ok =
        unsafe { GetDiskFreeSpaceExW(wide.as_ptr(), &mut free_to_caller, &mut total, &mut free) };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(StatFs {
        blocks: total / BLOCK,
        bfree: free / BLOCK,
        bavail: free_to_caller / BLOCK,
        files: 0,
        ffree: 0,
        bsize: BLOCK as u32,
        namelen: NAME_MAX,
        frsize: BLOCK as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_told_apart_and_one_object_keeps_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"same").unwrap();
        std::fs::write(&b, b"same").unwrap();
        let id = |p: &Path| {
            let meta = std::fs::metadata(p).unwrap();
            object_id(p, &meta, kind_of(&meta)).unwrap()
        };
        assert_eq!(id(&a), id(&a));
        assert_ne!(id(&a), id(&b));
        let file = File::open(&a).unwrap();
        assert_eq!(
            file_object_id(&file, &file.metadata().unwrap()).unwrap(),
            id(&a)
        );
        assert_ne!(id(dir.path()), id(&a), "directories have ids too");
        // Replaced at its path (write to a temp name, rename over): a new object.
        let before = id(&a);
        drop(file);
        std::fs::write(dir.path().join("tmp"), b"new").unwrap();
        std::fs::rename(dir.path().join("tmp"), &a).unwrap();
        assert_ne!(id(&a), before);
    }

    #[test]
    fn statfs_reports_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let s = statfs(dir.path()).unwrap();
        assert!(s.blocks > 0 && s.bfree <= s.blocks, "{s:?}");
        assert!(statfs(&dir.path().join("missing/dir")).is_err());
    }

    #[test]
    fn both_slashes_separate_names() {
        assert!(name_has_separator(OsStr::new("a\\b")));
        assert!(name_has_separator(OsStr::new("a/b")));
        assert!(!name_has_separator(OsStr::new("m.safetensors")));
    }
}
