//! The weight-map names of the directories shard discovery looks in ([`IndexNames`]), so that
//! the first opens of N model files in one folder list it once, not N times.
//!
//! **Contract.** [`IndexNames::of`] answers what a listing made now, with the caller's rights,
//! would: the names in the directory that look like an index.json (`*.index.*json`), sorted.
//! At every call the directory is opened with the caller's rights ([`PathAccess::dir_identity`]),
//! so it fails where a listing would; its names are listed again unless its identity (device,
//! inode, size, mtime, ctime) is the one of the kept listing **and** that listing was made at
//! least [`SETTLE`] after the directory's last change. A change made within one tick of the
//! file system's timestamps leaves the mtime as it was, so a listing made in the same tick as a
//! change is never trusted (git's rule for "racily clean" index entries).
//!
//! On Windows the identity's second time is the creation time (`SourceIdentity`): a folder
//! whose mtime a copy tool sets back after changing it (`robocopy /DCOPY:T`) keeps its listing
//! until its next change, and a shard whose index.json is missed is found by its name pattern
//! or served on its own.
//!
//! **Cost.** An open of the directory and an `fstat` per call, in place of a listing: in a
//! folder of 20 000 LoRAs the listing cost 15 ms at each first open, and the header scan of the
//! folder grew with the square of its size ([measured](../../../../docs/PERFORMANCE.md#a-folder-of-many-model-files)).

use std::ffi::OsString;
use std::io;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lru::LruCache;

use crate::source::{PathAccess, SourceIdentity};
use crate::sync::{lock, Mutex};

/// How long after a directory's last change a listing of it is trusted: longer than the
/// coarsest timestamps of the file systems models live on (FAT's 2 s; ext4, XFS, NTFS and NFS
/// keep finer ones).
pub const SETTLE: Duration = Duration::from_secs(3);

/// Directories whose listings are kept: each is a path and a few names, and a mount's model
/// folders are fewer than this.
const MAX_DIRS: usize = 1024;

/// One directory's listing.
#[derive(Debug)]
struct Listing {
    identity: SourceIdentity,
    names: Arc<[String]>,
    /// Made at least [`SETTLE`] after the directory's last change.
    settled: bool,
}

/// The index.json names of directories, as listed last (see the module docs).
pub struct IndexNames {
    dirs: Mutex<LruCache<PathBuf, Listing>>,
}

impl Default for IndexNames {
    fn default() -> Self {
        Self {
            dirs: Mutex::new(LruCache::new(
                NonZeroUsize::new(MAX_DIRS).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }
}

impl std::fmt::Debug for IndexNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexNames")
            .field("dirs", &lock(&self.dirs).len())
            .finish()
    }
}

impl IndexNames {
    /// The names in `dir` that look like an index.json, sorted, through `paths` (the caller's
    /// rights).
    pub fn of(&self, paths: &dyn PathAccess, dir: &Path) -> io::Result<Arc<[String]>> {
        // The identity is taken before the listing: a change between the two makes the next
        // call's identity differ from the one kept, so it lists again.
        let identity = paths.dir_identity(dir)?;
        if let Some(kept) = lock(&self.dirs).get(dir) {
            if kept.settled && kept.identity == identity {
                return Ok(Arc::clone(&kept.names));
            }
        }
        let listed_at = SystemTime::now();
        let mut names: Vec<String> = paths
            .list_dir(dir)?
            .into_iter()
            .filter_map(|n: OsString| n.into_string().ok())
            .filter(|n| is_index_name(n))
            .collect();
        names.sort();
        let names: Arc<[String]> = names.into();
        let settled = identity
            .modified()
            .and_then(|changed| listed_at.duration_since(changed).ok())
            .is_some_and(|age| age >= SETTLE);
        lock(&self.dirs).put(
            dir.to_owned(),
            Listing {
                identity,
                names: Arc::clone(&names),
                settled,
            },
        );
        Ok(names)
    }
}

/// Whether `name` looks like a weight map's file (`NAME.safetensors.index.json`,
/// `NAME.safetensors.index.fp16.json`).
fn is_index_name(name: &str) -> bool {
    name.contains(".index.") && name.ends_with(".json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::PlainPaths;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// [`PlainPaths`] counting its listings.
    #[derive(Default)]
    struct CountedListings(AtomicUsize);

    impl PathAccess for CountedListings {
        fn open(&self, abs: &Path) -> io::Result<crate::source::Opened> {
            PlainPaths.open(abs)
        }
        fn identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
            PlainPaths.identity(abs)
        }
        fn list_dir(&self, abs: &Path) -> io::Result<Vec<OsString>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            PlainPaths.list_dir(abs)
        }
        fn dir_identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
            PlainPaths.dir_identity(abs)
        }
        fn link_target(&self, abs: &Path) -> io::Result<Option<PathBuf>> {
            PlainPaths.link_target(abs)
        }
    }

    /// Sets `dir`'s mtime to `when`.
    fn set_mtime(dir: &Path, when: SystemTime) {
        let mut open = std::fs::OpenOptions::new();
        #[cfg(unix)]
        open.read(true);
        #[cfg(windows)]
        {
            use std::os::windows::fs::OpenOptionsExt;
            const FILE_FLAG_BACKUP_SEMANTICS: u32 = 0x0200_0000;
            open.write(true).custom_flags(FILE_FLAG_BACKUP_SEMANTICS);
        }
        open.open(dir)
            .and_then(|d| d.set_times(std::fs::FileTimes::new().set_modified(when)))
            .unwrap();
    }

    /// Sets `dir`'s mtime `ago` in the past, as if its last change were that old.
    fn changed_ago(dir: &Path, ago: Duration) {
        set_mtime(dir, SystemTime::now() - ago);
    }

    fn names(list: &[String]) -> Vec<&str> {
        list.iter().map(String::as_str).collect()
    }

    #[test]
    fn a_settled_directory_is_listed_once_and_again_after_each_change() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.safetensors.index.json"), "{}").unwrap();
        std::fs::write(dir.path().join("lora.safetensors"), "x").unwrap();
        changed_ago(dir.path(), Duration::from_secs(60));
        let paths = CountedListings::default();
        let cache = IndexNames::default();
        for _ in 0..5 {
            let got = cache.of(&paths, dir.path()).unwrap();
            assert_eq!(names(&got), ["m.safetensors.index.json"]);
        }
        assert_eq!(paths.0.load(Ordering::SeqCst), 1);

        // A new index.json changes the directory: listed again, and it is seen.
        std::fs::write(dir.path().join("a.safetensors.index.fp16.json"), "{}").unwrap();
        let got = cache.of(&paths, dir.path()).unwrap();
        assert_eq!(
            names(&got),
            ["a.safetensors.index.fp16.json", "m.safetensors.index.json"]
        );
        assert_eq!(paths.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_change_whose_mtime_is_set_back_is_seen_by_its_ctime() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.safetensors.index.json"), "{}").unwrap();
        changed_ago(dir.path(), Duration::from_secs(60));
        let paths = CountedListings::default();
        let cache = IndexNames::default();
        assert_eq!(cache.of(&paths, dir.path()).unwrap().len(), 1);
        // As `rsync -t` does to a folder it synced: the mtime is the source's, not the change's.
        let mtime = std::fs::metadata(dir.path()).unwrap().modified().unwrap();
        std::fs::remove_file(dir.path().join("m.safetensors.index.json")).unwrap();
        set_mtime(dir.path(), mtime);
        assert!(cache.of(&paths, dir.path()).unwrap().is_empty());
        assert_eq!(paths.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_directory_changed_just_before_its_listing_is_listed_at_every_call() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.safetensors.index.json"), "{}").unwrap();
        let paths = CountedListings::default();
        let cache = IndexNames::default();
        for _ in 0..3 {
            cache.of(&paths, dir.path()).unwrap();
        }
        assert_eq!(paths.0.load(Ordering::SeqCst), 3);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_directory_the_caller_cannot_list_fails_even_when_its_listing_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.safetensors.index.json"), "{}").unwrap();
        changed_ago(dir.path(), Duration::from_secs(60));
        let cache = IndexNames::default();
        cache.of(&PlainPaths, dir.path()).unwrap();

        /// Whose `dir_identity` fails as an open without read permission does.
        struct NoReadRight;
        impl PathAccess for NoReadRight {
            fn open(&self, abs: &Path) -> io::Result<crate::source::Opened> {
                PlainPaths.open(abs)
            }
            fn identity(&self, abs: &Path) -> io::Result<SourceIdentity> {
                PlainPaths.identity(abs)
            }
            fn list_dir(&self, _abs: &Path) -> io::Result<Vec<OsString>> {
                Err(io::Error::from_raw_os_error(libc::EACCES))
            }
            fn dir_identity(&self, _abs: &Path) -> io::Result<SourceIdentity> {
                Err(io::Error::from_raw_os_error(libc::EACCES))
            }
            fn link_target(&self, abs: &Path) -> io::Result<Option<PathBuf>> {
                PlainPaths.link_target(abs)
            }
        }
        let err = cache.of(&NoReadRight, dir.path()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES));
    }
}
