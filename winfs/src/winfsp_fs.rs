//! The WinFsp file system: WinFsp requests in, `tierfs_core` calls out (Windows only).
//!
//! It serves what the FUSE adapter serves, with the same core calls:
//! - **Model files** (`.safetensors`, `.sft`) through [`ModelStore`]: opened with
//!   [`ModelStore::open`], read with [`ModelStore::read`], so every byte comes from the chunk
//!   cache and the source is read unbuffered (`FILE_FLAG_NO_BUFFERING`, see
//!   `tierfs_core::source`).
//! - **Other files** with plain positional reads of the source.
//! - **`\.tierfs\stats`**, rendered at open ([`StatsDocument`], the Linux document; the
//!   `kernel_page_cache` window is 0: nothing is kept in a page cache of the mounted files, see
//!   `mount`), with the rendered size as its size for that handle.
//! - **`\.tierfs\control`**: one command per write ([`control::parse`], [`control::apply`]);
//!   opening it for reading is refused, as on Linux.
//! - **Everything else that writes** fails with `STATUS_MEDIA_WRITE_PROTECTED`: the volume
//!   cannot be marked read-only, since the control file takes writes.
//!
//! Every error is an [`FsError`], turned into an `NTSTATUS` by [`status::ntstatus`] only.
//! No security descriptors are kept (`PersistentAcls` off): access follows the mounting user's
//! drive mapping, and the source's own ACLs apply to this process's reads.

use std::ffi::c_void;
use std::fs::{File, Metadata};
use std::os::windows::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use tierfs_core::control;
use tierfs_core::kernel_cache::KernelCacheWindow;
use tierfs_core::models::{is_model_path, ModelStore, OpenModel};
use tierfs_core::source::read_full_at;
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
use crate::status::{self, FsError};

/// `DELETE` access (winnt.h): removing a file is a write.
const DELETE: u32 = 0x0001_0000;

/// `FILE_DIRECTORY_FILE` and `FILE_NON_DIRECTORY_FILE`, NtCreateFile's create options: the
/// caller wants only a directory, or only a file.
const FILE_DIRECTORY_FILE: u32 = 0x0000_0001;
const FILE_NON_DIRECTORY_FILE: u32 = 0x0000_0040;

/// Allocation unit reported for files: the sector size the volume announces (see `mount`).
const ALLOCATION_UNIT: u64 = 4096;

/// The tierfs WinFsp file system.
pub struct TierWinFs {
    source: PathBuf,
    mountpoint: String,
    store: Arc<ModelStore>,
    /// Always 0 bytes: WinFsp runs with its data cache off, so the mounted files have no page
    /// cache to bound. Kept so that the stats document is the Linux one.
    window: KernelCacheWindow,
    started: SystemTime,
}

/// One open handle.
pub enum Node {
    Dir { target: Target, listing: DirBuffer },
    /// Holds the version's source descriptors until closed (`tierfs_core::models::OpenModel`).
    Model(OpenModel),
    Plain(File),
    Stats(Vec<u8>),
    Control,
}

fn fsp(err: FsError) -> FspError {
    let code = status::ntstatus(&err);
    tracing::debug!(error = %err, status = format_args!("{:#010x}", code as u32), "request failed");
    FspError::NTSTATUS(code)
}

impl TierWinFs {
    pub fn new(source: PathBuf, mountpoint: String, store: Arc<ModelStore>) -> TierWinFs {
        TierWinFs {
            source,
            mountpoint,
            store,
            window: KernelCacheWindow::new(0),
            started: SystemTime::now(),
        }
    }

    fn abs(&self, rel: &Path) -> PathBuf {
        self.source.join(rel)
    }

    fn stats_json(&self) -> Vec<u8> {
        let doc = StatsDocument::collect(
            &self.store,
            &self.window,
            (&self.source, Path::new(&self.mountpoint)),
            false,
            self.started,
        );
        let mut json = serde_json_vec(&doc);
        json.push(b'\n');
        json
    }

    /// The attributes, size and times of `target` (`handle`'s, where one is open).
    fn info(&self, target: &Target, handle: Option<&Node>) -> Result<FileInfo, FsError> {
        let mut info = FileInfo::default();
        match target {
            Target::Source(rel) => fill_source(&mut info, &source_metadata(&self.abs(rel))?),
            Target::ControlDir => self.fill_virtual(&mut info, FILE_ATTRIBUTE_DIRECTORY, 0),
            Target::Stats => {
                let size = match handle {
                    Some(Node::Stats(json)) => json.len() as u64,
                    _ => 0,
                };
                self.fill_virtual(&mut info, FILE_ATTRIBUTE_READONLY, size)
            }
            Target::Control => self.fill_virtual(&mut info, FILE_ATTRIBUTE_NORMAL, 0),
        }
        Ok(info)
    }

    fn fill_virtual(&self, info: &mut FileInfo, attributes: u32, size: u64) {
        info.file_attributes = attributes;
        info.file_size = size;
        info.allocation_size = size.next_multiple_of(ALLOCATION_UNIT);
        let started = filetime(self.started);
        let now = filetime(SystemTime::now());
        info.creation_time = started;
        info.last_access_time = now;
        info.last_write_time = now;
        info.change_time = now;
    }

    fn open_target(&self, target: &Target, access: u32) -> Result<Node, FsError> {
        let writes = access & (FILE_WRITE_DATA | FILE_APPEND_DATA | DELETE) != 0;
        match target {
            Target::Control if access & FILE_READ_DATA != 0 => Err(FsError::AccessDenied),
            Target::Control => Ok(Node::Control),
            _ if writes => Err(FsError::ReadOnly),
            Target::Stats => Ok(Node::Stats(self.stats_json())),
            Target::ControlDir => Ok(Node::Dir {
                target: target.clone(),
                listing: DirBuffer::new(),
            }),
            Target::Source(rel) => self.open_source(rel),
        }
    }

    fn open_source(&self, rel: &Path) -> Result<Node, FsError> {
        let abs = self.abs(rel);
        let meta = source_metadata(&abs)?;
        if meta.is_dir() {
            return Ok(Node::Dir {
                target: Target::Source(rel.to_owned()),
                listing: DirBuffer::new(),
            });
        }
        if is_model_path(rel) {
            // The store is keyed by path: use the source's own spelling of it, so that
            // `M.SAFETENSORS` and `m.safetensors` share one cached version.
            let rel = self.canonical_rel(&abs).unwrap_or_else(|| rel.to_owned());
            return Ok(Node::Model(self.store.open_handle(&rel, &abs)?));
        }
        Ok(Node::Plain(File::open(&abs)?))
    }

    /// `abs` relative to SOURCE as the source file system spells it.
    fn canonical_rel(&self, abs: &Path) -> Option<PathBuf> {
        let canonical = std::fs::canonicalize(abs).ok()?;
        canonical
            .strip_prefix(&self.source)
            .ok()
            .map(Path::to_path_buf)
    }

    fn read_node(&self, node: &Node, buffer: &mut [u8], offset: u64) -> Result<u32, FsError> {
        let want = u32::try_from(buffer.len()).unwrap_or(u32::MAX);
        let n = match node {
            Node::Model(model) => {
                if offset >= model.size() {
                    return Err(FsError::EndOfFile);
                }
                let bytes = self.store.read(model.file(), offset, want)?;
                buffer[..bytes.len()].copy_from_slice(&bytes);
                bytes.len()
            }
            Node::Plain(file) => read_full_at(file, buffer, offset).map_err(|(_, e)| e)?,
            Node::Stats(json) => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(json.len());
                let n = (json.len() - start).min(buffer.len());
                buffer[..n].copy_from_slice(&json[start..start + n]);
                n
            }
            Node::Control => return Err(FsError::AccessDenied),
            Node::Dir { .. } => return Err(FsError::IsDirectory),
        };
        if n == 0 && !buffer.is_empty() {
            return Err(FsError::EndOfFile);
        }
        Ok(n as u32)
    }

    /// The entries of directory `target`: name and information.
    fn list(&self, target: &Target) -> Result<Vec<(String, FileInfo)>, FsError> {
        let mut entries = Vec::new();
        let rel = match target {
            Target::ControlDir => {
                for (name, file) in [("stats", Target::Stats), ("control", Target::Control)] {
                    entries.push((name.to_owned(), self.info(&file, None)?));
                }
                return Ok(entries);
            }
            Target::Source(rel) => rel,
            _ => return Err(FsError::NotDirectory),
        };
        let here = self.info(target, None)?;
        if rel.as_os_str().is_empty() {
            entries.push((
                CONTROL_DIR.to_owned(),
                self.info(&Target::ControlDir, None)?,
            ));
        } else {
            entries.push((".".to_owned(), here.clone()));
            entries.push(("..".to_owned(), here));
        }
        for entry in std::fs::read_dir(self.abs(rel))? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue; // not UTF-16 representable as a String: cannot be named through here
            };
            if rel.as_os_str().is_empty() && name.eq_ignore_ascii_case(CONTROL_DIR) {
                continue; // hidden by the control directory
            }
            let Ok(meta) = source_metadata(&entry.path()) else {
                continue; // vanished since read_dir listed it, or a dangling link
            };
            let mut info = FileInfo::default();
            fill_source(&mut info, &meta);
            entries.push((name, info));
        }
        Ok(entries)
    }

    fn fill_listing(&self, target: &Target, listing: &DirBuffer) -> Result<(), FspError> {
        let entries = self.list(target).map_err(fsp)?;
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

    fn write_control(&self, data: &[u8]) -> Result<u32, FsError> {
        let command = control::parse(data)?;
        control::apply(&self.store, &self.source, command)?;
        Ok(data.len() as u32)
    }
}

/// `abs` as presented: links are followed (a link to a model file is that file).
fn source_metadata(abs: &Path) -> Result<Metadata, FsError> {
    Ok(std::fs::metadata(abs)?)
}

fn fill_source(info: &mut FileInfo, meta: &Metadata) {
    info.file_attributes = if meta.is_dir() {
        FILE_ATTRIBUTE_DIRECTORY | FILE_ATTRIBUTE_READONLY
    } else {
        FILE_ATTRIBUTE_READONLY
    };
    info.file_size = meta.file_size();
    info.allocation_size = meta.file_size().next_multiple_of(ALLOCATION_UNIT);
    info.creation_time = meta.creation_time();
    info.last_access_time = meta.last_access_time();
    info.last_write_time = meta.last_write_time();
    info.change_time = meta.last_write_time();
}

/// 100 ns ticks since 1601 (a `FILETIME`) of `t`.
fn filetime(t: SystemTime) -> u64 {
    /// Seconds from 1601-01-01 to 1970-01-01.
    const EPOCH_DIFFERENCE_SECS: u64 = 11_644_473_600;
    let since_unix = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    (since_unix.as_secs() + EPOCH_DIFFERENCE_SECS) * 10_000_000
        + u64::from(since_unix.subsec_nanos() / 100)
}

fn serde_json_vec(doc: &StatsDocument) -> Vec<u8> {
    serde_json::to_vec_pretty(doc)
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot render stats: {e}\"}}").into_bytes())
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
        let info = self.info(&name_of(file_name)?, None).map_err(fsp)?;
        Ok(FileSecurity {
            reparse: false,
            sz_security_descriptor: 0,
            attributes: info.file_attributes,
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
        let node = self.open_target(&target, granted_access).map_err(fsp)?;
        let is_dir = matches!(node, Node::Dir { .. });
        if create_options & FILE_DIRECTORY_FILE != 0 && !is_dir {
            return Err(fsp(FsError::NotDirectory));
        }
        if create_options & FILE_NON_DIRECTORY_FILE != 0 && is_dir {
            return Err(fsp(FsError::IsDirectory));
        }
        *file_info.as_mut() = self.info(&target, Some(&node)).map_err(fsp)?;
        if let Node::Model(model) = &node {
            // The version opened, which may differ from what `info` just saw if the source
            // was replaced in between.
            file_info.as_mut().file_size = model.size();
        }
        Ok(node)
    }

    fn close(&self, _context: Node) {}

    fn get_file_info(&self, context: &Node, file_info: &mut FileInfo) -> winfsp::Result<()> {
        *file_info = match context {
            Node::Model(model) => {
                let mut info = self
                    .info(&Target::Source(model.path().to_owned()), None)
                    .unwrap_or_default();
                info.file_attributes = FILE_ATTRIBUTE_READONLY;
                info.file_size = model.size();
                info.allocation_size = model.size().next_multiple_of(ALLOCATION_UNIT);
                info
            }
            Node::Plain(file) => {
                let mut info = FileInfo::default();
                fill_source(&mut info, &file.metadata().map_err(|e| fsp(e.into()))?);
                info
            }
            Node::Stats(_) => self.info(&Target::Stats, Some(context)).map_err(fsp)?,
            Node::Control => self.info(&Target::Control, None).map_err(fsp)?,
            Node::Dir { target, .. } => self.info(target, None).map_err(fsp)?,
        };
        Ok(())
    }

    fn read(&self, context: &Node, buffer: &mut [u8], offset: u64) -> winfsp::Result<u32> {
        self.read_node(context, buffer, offset).map_err(|e| {
            if matches!(e, FsError::Read(_) | FsError::Io(_)) {
                tracing::warn!(offset, error = %e, "read failed");
            }
            fsp(e)
        })
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
        let Node::Control = context else {
            return Err(fsp(FsError::ReadOnly));
        };
        let written = self.write_control(buffer).map_err(|e| {
            tracing::warn!(error = %e, "control command refused");
            fsp(e)
        })?;
        *file_info = self.info(&Target::Control, None).map_err(fsp)?;
        Ok(written)
    }

    fn read_directory(
        &self,
        context: &Node,
        _pattern: Option<&U16CStr>,
        marker: DirMarker,
        buffer: &mut [u8],
    ) -> winfsp::Result<u32> {
        let Node::Dir { target, listing } = context else {
            return Err(fsp(FsError::NotDirectory));
        };
        if marker.is_none() {
            self.fill_listing(target, listing)?;
        }
        Ok(listing.read(marker, buffer))
    }

    fn get_volume_info(&self, out_volume_info: &mut VolumeInfo) -> winfsp::Result<()> {
        let (total, free) = disk_space(&self.source);
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

/// Total and free bytes of the volume holding `source` (zeros if it cannot be queried: only
/// Explorer's bar shows them).
fn disk_space(source: &Path) -> (u64, u64) {
    use std::os::windows::ffi::OsStrExt;
    use windows_sys::Win32::Storage::FileSystem::GetDiskFreeSpaceExW;
    let wide: Vec<u16> = source.as_os_str().encode_wide().chain([0]).collect();
    let (mut free_to_caller, mut total, mut free) = (0u64, 0u64, 0u64);
    // SAFETY: `wide` is NUL-terminated and outlives the call; the out-pointers are valid u64s.
    let ok =
        unsafe { GetDiskFreeSpaceExW(wide.as_ptr(), &mut free_to_caller, &mut total, &mut free) };
    if ok == 0 {
        return (0, 0);
    }
    (total, free)
}
