//! The resolver against real links: magic links, procfs, a stand-in for the served mount,
//! links to another file system (the walk), loops.
//!
//! The walk is only taken for paths that leave SOURCE's file system, so these tests put a
//! second tree on another one: `/dev/shm` (tmpfs) when SOURCE's temporary directory is not
//! tmpfs itself, else the test skips the cross-device rows (it says so).

use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};

use super::{mount_device, SourceRoot};
use crate::access::{AccessRule, Sharing};

struct World {
    _source: tempfile::TempDir,
    source: PathBuf,
    /// A directory on another file system than SOURCE, if there is one.
    other: Option<tempfile::TempDir>,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().canonicalize().unwrap();
    fs::write(source.join("plain.bin"), b"plain").unwrap();
    let other = tempfile::tempdir_in("/dev/shm")
        .ok()
        .filter(|o| fs::metadata(o.path()).unwrap().dev() != fs::metadata(&source).unwrap().dev());
    if other.is_none() {
        eprintln!("no second file system: the cross-device rows are skipped");
    }
    World {
        _source: dir,
        source,
        other,
    }
}

fn read(root: &SourceRoot, rel: &str) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    root.open_file(Path::new(rel), true)?
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn errno(result: std::io::Result<impl Sized>) -> Option<i32> {
    result.err().and_then(|e| e.raw_os_error())
}

#[test]
fn magic_links_are_never_followed() {
    let w = world();
    let secret = tempfile::NamedTempFile::new().unwrap();
    fs::write(secret.path(), b"the daemon's open file").unwrap();
    let held = fs::File::open(secret.path()).unwrap();
    symlink(
        format!("/proc/self/fd/{}", held.as_raw_fd()),
        w.source.join("fd.bin"),
    )
    .unwrap();
    symlink("/proc/self/cwd", w.source.join("cwd")).unwrap();
    symlink(
        format!("/proc/{}/root", std::process::id()),
        w.source.join("root"),
    )
    .unwrap();
    let root = SourceRoot::open(&w.source).unwrap();
    // Refused as procfs by the walk (the link leaves SOURCE's file system), or by the
    // kernel's RESOLVE_NO_MAGICLINKS where a resolution meets one.
    let refused = |e| matches!(e, Some(libc::EACCES | libc::ELOOP));
    assert!(refused(errno(read(&root, "fd.bin"))));
    assert!(root.stat(Path::new("fd.bin"), true).is_err());
    assert!(root.lstat(Path::new("fd.bin"), true).unwrap().is_symlink());
    assert!(errno(root.list_dir(Path::new("cwd"), true)).is_some());
    assert!(errno(read(&root, "root/etc/hostname")).is_some());
    assert_eq!(read(&root, "plain.bin").unwrap(), b"plain");
}

#[test]
fn nothing_in_procfs_is_reached() {
    let w = world();
    symlink("/proc/self/environ", w.source.join("environ")).unwrap();
    symlink("/proc", w.source.join("proc")).unwrap();
    symlink(
        "../../../../../../../../proc/self/status",
        w.source.join("status"),
    )
    .unwrap();
    let root = SourceRoot::open(&w.source).unwrap();
    assert_eq!(errno(read(&root, "environ")), Some(libc::EACCES));
    assert_eq!(errno(read(&root, "status")), Some(libc::EACCES));
    assert_eq!(
        errno(root.list_dir(Path::new("proc"), true)),
        Some(libc::EACCES)
    );
    assert_eq!(errno(read(&root, "proc/self/status")), Some(libc::EACCES));
    assert_eq!(
        errno(root.stat(Path::new("proc/1"), true)),
        Some(libc::EACCES)
    );
    // The link itself is still there to see.
    assert!(root.lstat(Path::new("proc"), true).unwrap().is_symlink());
}

#[test]
fn links_to_another_file_system_are_followed_but_never_into_the_served_mount() {
    let w = world();
    let Some(other) = &w.other else { return };
    let mnt = other.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    fs::write(mnt.join("a.safetensors"), b"on the other disk").unwrap();
    symlink(mnt.join("a.safetensors"), w.source.join("abs.safetensors")).unwrap();
    symlink(&mnt, w.source.join("dir")).unwrap();
    let up = "../".repeat(w.source.components().count());
    let relative = format!("{up}{}", mnt.join("a.safetensors").display());
    symlink(&relative, w.source.join("rel.safetensors")).unwrap();
    let root = SourceRoot::open(&w.source).unwrap();
    for rel in ["abs.safetensors", "rel.safetensors", "dir/a.safetensors"] {
        assert_eq!(read(&root, rel).unwrap(), b"on the other disk", "{rel}");
    }
    assert_eq!(
        root.list_dir(Path::new("dir"), true).unwrap(),
        vec![std::ffi::OsString::from("a.safetensors")]
    );
    assert!(!root.link_points_at_ancestor(Path::new("dir")));
    // The same paths once that file system stands for the daemon's own mount.
    root.served_device()
        .set(mount_device(other.path()).unwrap());
    for rel in ["abs.safetensors", "rel.safetensors", "dir/a.safetensors"] {
        assert_eq!(errno(read(&root, rel)), Some(libc::ELOOP), "{rel}");
    }
    assert_eq!(
        errno(root.list_dir(Path::new("dir"), true)),
        Some(libc::ELOOP)
    );
    assert!(root.lstat(Path::new("dir"), true).unwrap().is_symlink());
    // Not following links refuses them before anything is reached.
    assert_eq!(errno(read(&root, "plain.bin")), None);
    assert_eq!(
        errno(root.open_file(Path::new("abs.safetensors"), false)),
        Some(libc::ELOOP)
    );
}

#[test]
fn loops_across_file_systems_end_in_eloop() {
    let w = world();
    let Some(other) = &w.other else { return };
    symlink(other.path().join("b"), w.source.join("a")).unwrap();
    symlink(w.source.join("a"), other.path().join("b")).unwrap();
    let root = SourceRoot::open(&w.source).unwrap();
    assert_eq!(errno(read(&root, "a")), Some(libc::ELOOP));
    // A directory link to an ancestor across the walk is a loop too.
    symlink(&w.source, other.path().join("back")).unwrap();
    symlink(other.path().join("back"), w.source.join("up")).unwrap();
    assert!(root.link_points_at_ancestor(Path::new("up")));
}

#[test]
fn a_walk_checks_each_directory_with_the_callers_rights() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to switch credentials");
        return;
    }
    let w = world();
    let Some(other) = &w.other else { return };
    use std::os::unix::fs::PermissionsExt;
    let closed = other.path().join("closed");
    fs::create_dir(&closed).unwrap();
    fs::write(closed.join("f"), b"behind a closed door").unwrap();
    fs::set_permissions(&closed, fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(other.path(), fs::Permissions::from_mode(0o755)).unwrap();
    symlink(closed.join("f"), w.source.join("f")).unwrap();
    let root = SourceRoot::open(&w.source).unwrap();
    assert_eq!(read(&root, "f").unwrap(), b"behind a closed door");
    let rule = AccessRule::new(Sharing::SwitchCredentials);
    let acting = rule.act_for(65534, 65534, 0).unwrap();
    assert!(acting.is_switched());
    assert_eq!(errno(read(&root, "f")), Some(libc::EACCES));
    drop(acting);
    assert_eq!(read(&root, "f").unwrap(), b"behind a closed door");
}

#[test]
fn refusals_are_logged_at_most_once_per_interval() {
    use super::RefusalLog;
    use std::time::Duration;

    let default = RefusalLog::default();
    assert!(default.log(Path::new("a"), "test"));
    assert!(!default.log(Path::new("a"), "test"), "within the second");
    let every = RefusalLog::with_interval(Duration::ZERO);
    assert!(every.log(Path::new("a"), "test"));
    assert!(every.log(Path::new("a"), "test"));
}
