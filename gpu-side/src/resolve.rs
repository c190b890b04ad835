//! From a path the user gives (on a tierfs mount or anywhere else) to the file whose bytes we
//! read, and its tensor index.
//!
//! GPUDirect Storage cannot read through FUSE, and even the bounce-buffer path is faster reading
//! the source file than going through the mount's daemon. A tierfs mount therefore names, on each
//! of its regular files, the SOURCE file behind it in the extended attribute
//! [`SOURCE_XATTR`] (`user.tierfs.source`, an absolute path). A path without it — `ENODATA` on
//! an ordinary filesystem, `ENOTSUP` on one without extended attributes — is its own source. The
//! lookup repeats (at most [`MAX_HOPS`] times) so a tierfs mount of another tierfs mount resolves
//! to the bottom file.
//!
//! The header is parsed by `tierfs_core::index`, the same parser the mount uses, so a file the
//! mount serves as a model is one this crate can load, and vice versa.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use tierfs_core::index::{IndexError, TensorIndex};

use crate::io::{ReadError, SourceReader};

/// The extended attribute a tierfs mount puts on its files (see the module docs).
pub const SOURCE_XATTR: &str = "user.tierfs.source";

/// Resolutions followed before giving up: more than any sane stack of mounts.
pub const MAX_HOPS: usize = 8;

/// Why a path cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("cannot read the {SOURCE_XATTR} attribute of {path}: {source}")]
    Xattr { path: PathBuf, source: io::Error },
    #[error("{path} names a source file through more than {MAX_HOPS} tierfs mounts (a loop?)")]
    TooManyHops { path: PathBuf },
    #[error(transparent)]
    Open(#[from] ReadError),
    #[error("{path} is not a usable safetensors file: {source}")]
    Index { path: PathBuf, source: IndexError },
    #[error("{mounted} is {mounted_size} bytes but its source {source_path} is {source_size}: the file changed while being resolved")]
    Changed {
        mounted: PathBuf,
        mounted_size: u64,
        source_path: PathBuf,
        source_size: u64,
    },
}

/// An opened source file and its tensor index.
#[derive(Debug)]
pub struct Source {
    /// The path as given.
    pub requested: PathBuf,
    /// The file read (equal to `requested` unless it is on a tierfs mount).
    pub path: PathBuf,
    pub index: TensorIndex,
    pub reader: SourceReader,
}

impl Source {
    /// Whether `requested` was resolved through a tierfs mount.
    pub fn via_mount(&self) -> bool {
        self.requested != self.path
    }
}

/// Resolves `path`, opens the file behind it and parses its header.
pub fn open(path: &Path) -> Result<Source, ResolveError> {
    let source = source_path(path)?;
    let reader = SourceReader::open(&source)?;
    let index = TensorIndex::read_from(reader.file()).map_err(|e| ResolveError::Index {
        path: source.clone(),
        source: e,
    })?;
    if source != path {
        check_same_size(path, &source, index.file_size)?;
    }
    Ok(Source {
        requested: path.to_owned(),
        path: source,
        index,
        reader,
    })
}

/// The file behind `path`: follows [`SOURCE_XATTR`] until a path without it.
pub fn source_path(path: &Path) -> Result<PathBuf, ResolveError> {
    let mut current = path.to_owned();
    for _ in 0..=MAX_HOPS {
        match read_xattr(&current)? {
            Some(next) => current = next,
            None => return Ok(current),
        }
    }
    Err(ResolveError::TooManyHops {
        path: path.to_owned(),
    })
}

/// The mounted file and its source must agree on the size (the mount presents the source's).
fn check_same_size(mounted: &Path, source: &Path, source_size: u64) -> Result<(), ResolveError> {
    let mounted_size = std::fs::metadata(mounted)
        .map_err(|e| {
            ResolveError::Open(ReadError::Open {
                path: mounted.to_owned(),
                source: e,
            })
        })?
        .len();
    if mounted_size != source_size {
        return Err(ResolveError::Changed {
            mounted: mounted.to_owned(),
            mounted_size,
            source_path: source.to_owned(),
            source_size,
        });
    }
    Ok(())
}

/// [`SOURCE_XATTR`] of `path` (following symlinks), `None` if it has none.
fn read_xattr(path: &Path) -> Result<Option<PathBuf>, ResolveError> {
    let err = |source| ResolveError::Xattr {
        path: path.to_owned(),
        source,
    };
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| err(io::Error::from_raw_os_error(libc::EINVAL)))?;
    let name = CString::new(SOURCE_XATTR).map_err(|_| err(io::ErrorKind::InvalidInput.into()))?;
    // The value can change size between the size query and the read: retry a few times.
    for _ in 0..3 {
        match getxattr(&c_path, &name, &mut [])? {
            XattrResult::Absent => return Ok(None),
            XattrResult::Len(len) => {
                let mut buf = vec![0u8; len];
                match getxattr(&c_path, &name, &mut buf)? {
                    XattrResult::Absent => return Ok(None),
                    XattrResult::Len(n) => {
                        buf.truncate(n);
                        return Ok(Some(PathBuf::from(std::ffi::OsString::from_vec(buf))));
                    }
                    XattrResult::TooSmall => continue,
                }
            }
            XattrResult::TooSmall => continue,
        }
    }
    Err(err(io::Error::from_raw_os_error(libc::ERANGE)))
}

enum XattrResult {
    Absent,
    Len(usize),
    TooSmall,
}

/// One `getxattr(2)` call: the value's length (into `buf` when it is not empty).
fn getxattr(path: &CString, name: &CString, buf: &mut [u8]) -> Result<XattrResult, ResolveError> {
    // SAFETY: both strings are NUL-terminated; `buf` is valid for `buf.len()` bytes (a null
    // pointer with size 0 asks for the length only).
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            if buf.is_empty() {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            buf.len(),
        )
    };
    if n >= 0 {
        return Ok(XattrResult::Len(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENODATA | libc::ENOTSUP) => Ok(XattrResult::Absent),
        // A path that cannot be opened either: opening it reports that in the usual words.
        Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES | libc::ELOOP | libc::ENAMETOOLONG) => {
            Ok(XattrResult::Absent)
        }
        Some(libc::ERANGE) => Ok(XattrResult::TooSmall),
        _ => Err(ResolveError::Xattr {
            path: PathBuf::from(std::ffi::OsStr::from_bytes(path.as_bytes())),
            source: e,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{file_bytes, temp_file};

    #[test]
    fn a_plain_file_is_its_own_source() {
        let bytes = file_bytes(&[("a", "F32", &[4]), ("b", "BF16", &[3, 3])], None, 1);
        let f = temp_file(&bytes);
        let source = open(f.path()).unwrap();
        assert_eq!(source.path, f.path());
        assert!(!source.via_mount());
        assert_eq!(source.index.tensors.len(), 2);
        assert_eq!(source.index.file_size, bytes.len() as u64);
    }

    #[test]
    fn the_attribute_is_followed_to_the_bottom_file() {
        let bytes = file_bytes(&[("a", "F32", &[4])], None, 2);
        let bottom = temp_file(&bytes);
        let dir = tempfile::tempdir().unwrap();
        let middle = dir.path().join("middle.safetensors");
        let top = dir.path().join("top.safetensors");
        std::fs::write(&middle, &bytes).unwrap();
        std::fs::write(&top, &bytes).unwrap();
        assert!(
            set_xattr(&middle, bottom.path()),
            "temp dir needs user xattrs"
        );
        assert!(set_xattr(&top, &middle));
        assert_eq!(source_path(&top).unwrap(), bottom.path());
        let source = open(&top).unwrap();
        assert!(source.via_mount());
        assert_eq!(source.path, bottom.path());
    }

    #[test]
    fn loops_and_size_mismatches_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.safetensors");
        let b = dir.path().join("b.safetensors");
        let bytes = file_bytes(&[("a", "F32", &[4])], None, 3);
        std::fs::write(&a, &bytes).unwrap();
        std::fs::write(&b, &bytes[..bytes.len() - 4]).unwrap();
        assert!(set_xattr(&a, &a), "temp dir needs user xattrs");
        assert!(matches!(
            source_path(&a),
            Err(ResolveError::TooManyHops { .. })
        ));
        let c = dir.path().join("c.safetensors");
        std::fs::write(&c, &bytes).unwrap();
        assert!(set_xattr(&b, &c));
        assert!(
            matches!(open(&b), Err(ResolveError::Changed { mounted_size, source_size, .. })
                if mounted_size + 4 == source_size)
        );
    }

    #[test]
    fn a_missing_file_is_reported_with_its_path() {
        let err = open(Path::new("/nonexistent/model.safetensors")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/model.safetensors"),
            "{err}"
        );
    }

    fn set_xattr(path: &Path, value: &Path) -> bool {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        let n = CString::new(SOURCE_XATTR).unwrap();
        let v = value.as_os_str().as_bytes();
        // SAFETY: valid strings and buffer.
        unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) == 0 }
    }
}
