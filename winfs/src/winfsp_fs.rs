//! The WinFsp file system: WinFsp requests in, [`Tree`] calls out (Windows only).
//!
//! Everything a mount serves is decided by the core filesystem type that the FUSE adapter
//! uses too ([`tierfs_core::fs::TierFs`]): inodes, handles, the open policy (model files
//! through the chunk cache, other files with positional reads), `\.tierfs\stats` and
//! `\.tierfs\control`, read-only refusals. [`crate::tree`] translates WinFsp's paths and
//! access masks into its calls; this file only adds WinFsp's types:
//! - **File contexts** ([`Node`]): the open [`Open`] and, for a directory, WinFsp's buffer of
//!   its listing, filled at each enumeration from the start.
//! - **Attributes** ([`file_info`]): the core's [`Attr`] as WinFsp's `FileInfo`, every file
//!   read-only but the control file.
//! - **Errors**: every error is a [`WinError`], turned into an `NTSTATUS` by
//!   [`status::ntstatus`] only.
//!
//! The stats document is the Linux one (`tierfs_core::stats_doc`); its `kernel_page_cache`
//! window stays empty (see [`crate::tree`]). No security descriptors are kept
//! (`PersistentAcls` off): access follows the mounting user's drive mapping, and the source's
//! own ACLs apply to this process's reads.

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tierfs_core::budget::Governor;
use tierfs_core::fs::{Attr, FsError, Kind, CONTROL_INO};
use tierfs_core::models::ModelStore;
use windows_sys::Win32::Storage::FileSystem::{
    FILE_ATTRIBUTE_DIRECTORY, FILE_ATTRIBUTE_NORMAL, FILE_ATTRIBUTE_READONLY,
};
use winfsp::filesystem::{
    DirBuffer, DirInfo, DirMarker, FileInfo, FileSecurity, FileSystemContext, OpenFileInfo,
    VolumeInfo, WideNameInfo,
};
use winfsp::{FspError, U16CStr};

use crate::path::{resolve, Target};
use crate::status::{self, WinError};
use crate::tree::{Open, OpenKind, Tree};

/// `FILE_DIRECTORY_FILE` and `FILE_NON_DIRECTORY_FILE`, NtCreateFile's create options: the
/// caller wants only a directory, or only a file.
const FILE_DIRECTORY_FILE: u32 = 0x0000_0001;
const FILE_NON_DIRECTORY_FILE: u32 = 0x0000_0040;

/// Allocation unit reported for files: the sector size the volume announces (see `mount`).
const ALLOCATION_UNIT: u64 = 4096;

/// The tierfs WinFsp file system.
pub struct TierWinFs {
    tree: Tree,
}

/// One open file or directory.
pub struct Node {
    open: Open,
    /// A directory's listing (unused for files).
    listing: DirBuffer,
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
    ) -> std::io::Result<TierWinFs> {
        Ok(TierWinFs {
            tree: Tree::new(source, mountpoint, store, governor)?,
        })
    }

    fn node_info(&self, open: &Open, attr: &Attr) -> FileInfo {
        let mut info = file_info(attr);
        if let OpenKind::File {
            size: Some(size), ..
        } = open.kind
        {
            info.file_size = size;
            info.allocation_size = size.next_multiple_of(ALLOCATION_UNIT);
        }
        info
    }

    fn fill_listing(&self, ino: u64, listing: &DirBuffer) -> Result<(), FspError> {
        let entries = self.tree.list(ino).map_err(fsp)?;
        let lock = listing.acquire(true, None)?;
        for (name, attr) in entries {
            let mut entry: DirInfo = DirInfo::new();
            if entry.set_name(name.as_str()).is_err() {
                tracing::warn!(name, "name too long for a directory entry; not listed");
                continue;
            }
            *entry.file_info_mut() = file_info(&attr);
            lock.write(&mut entry)?;
        }
        Ok(())
    }
}

/// The core's attributes as WinFsp's: every file read-only, but `\.tierfs\control` (WinFsp
/// refuses write opens of read-only files). `index_number` stays 0: the core's inode numbers
/// are not stable across requests here (each request's lookups are given back), so they must
/// not pass for file identities.
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
            .tree
            .with_inode(&name_of(file_name)?, |ino| self.tree.attr(ino))
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
        let wants = (
            create_options & FILE_DIRECTORY_FILE != 0,
            create_options & FILE_NON_DIRECTORY_FILE != 0,
        );
        let (open, attr) = self
            .tree
            .open(&target, wants, granted_access)
            .map_err(fsp)?;
        *file_info.as_mut() = self.node_info(&open, &attr);
        Ok(Node {
            open,
            listing: DirBuffer::new(),
        })
    }

    fn close(&self, context: Node) {
        self.tree.close(context.open);
    }

    fn get_file_info(&self, context: &Node, file_info: &mut FileInfo) -> winfsp::Result<()> {
        let attr = self.tree.attr(context.open.ino).map_err(fsp)?;
        *file_info = self.node_info(&context.open, &attr);
        Ok(())
    }

    fn read(&self, context: &Node, buffer: &mut [u8], offset: u64) -> winfsp::Result<u32> {
        self.tree.read(&context.open, buffer, offset).map_err(fsp)
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
        let written = self.tree.write(&context.open, buffer).map_err(fsp)?;
        self.get_file_info(context, file_info)?;
        Ok(written)
    }

    fn read_directory(
        &self,
        context: &Node,
        _pattern: Option<&U16CStr>,
        marker: DirMarker,
        buffer: &mut [u8],
    ) -> winfsp::Result<u32> {
        let OpenKind::Dir { .. } = context.open.kind else {
            return Err(fsp(WinError::NotDirectory));
        };
        if marker.is_none() {
            self.fill_listing(context.open.ino, &context.listing)?;
        }
        Ok(context.listing.read(marker, buffer))
    }

    fn get_volume_info(&self, out_volume_info: &mut VolumeInfo) -> winfsp::Result<()> {
        // Zeros if the volume cannot be queried: only Explorer's bar shows them.
        let (total, free) = self
            .tree
            .fs()
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
