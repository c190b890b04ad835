use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use super::creds::{parse_caps, parse_groups};
use super::*;

/// `nobody` on Debian; any unprivileged id works, it needs no account.
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A file readable by all, behind a 0700 directory, and one readable by group `gid` only.
fn private_tree() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let private = dir.path().join("private");
    fs::create_dir(&private).unwrap();
    fs::write(private.join("secret"), b"secret").unwrap();
    fs::set_permissions(private.join("secret"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let group_only = dir.path().join("group-only");
    fs::write(&group_only, b"group").unwrap();
    std::os::unix::fs::chown(&group_only, Some(0), Some(4242)).unwrap();
    fs::set_permissions(&group_only, fs::Permissions::from_mode(0o640)).unwrap();
    let secret = private.join("secret");
    (dir, secret, group_only)
}

#[test]
fn switched_thread_has_the_users_rights_and_gets_its_own_back() {
    if !is_root() {
        eprintln!("skipped: needs root to switch credentials");
        return;
    }
    let (_dir, secret, group_only) = private_tree();
    let rule = AccessRule::new(Sharing::SwitchCredentials);
    // Started before the switch: a new thread would inherit the switched credentials.
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn({
        let secret = secret.clone();
        move || wait.recv().map(|()| fs::read(secret).map(|b| b.len()))
    });
    {
        let acting = rule.act_for(NOBODY, NOBODY, 0).unwrap();
        assert!(acting.is_switched());
        let err = fs::read(&secret).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
        assert!(fs::read(&group_only).is_err(), "not in group 4242");
        // Another thread keeps the daemon's rights meanwhile.
        go.send(()).unwrap();
        assert_eq!(other.join().unwrap().unwrap().unwrap(), 6);
    }
    assert_eq!(
        fs::read(&secret).unwrap(),
        b"secret",
        "root's rights are back"
    );

    let with_group = Credentials {
        uid: NOBODY,
        gid: NOBODY,
        groups: Arc::new(vec![4242]),
        caps: 0,
    };
    let switched = Switched::to(&with_group).unwrap();
    assert_eq!(
        fs::read(&group_only).unwrap(),
        b"group",
        "supplementary group counts"
    );
    drop(switched);
}

#[test]
fn root_and_single_user_mounts_are_not_switched() {
    let single = AccessRule::new(Sharing::Single)
        .act_for(NOBODY, NOBODY, 0)
        .unwrap();
    assert!(!single.is_switched() && single.follow_links());
    if is_root() {
        // Root with the daemon's capabilities (this very process) acts with the daemon's rights.
        let root = AccessRule::new(Sharing::SwitchCredentials)
            .act_for(0, 0, std::process::id())
            .unwrap();
        assert!(!root.is_switched() && root.follow_links());
    }
    let rule = AccessRule::new(Sharing::for_mount(true, 1000));
    assert!(rule.act_for(1000, 1000, 0).unwrap().follow_links());
    assert!(!rule.act_for(1001, 1001, 0).unwrap().follow_links());
    assert_eq!(Sharing::for_mount(false, 0), Sharing::Single);
    assert_eq!(Sharing::for_mount(true, 0), Sharing::SwitchCredentials);
}

#[test]
fn groups_come_from_proc_status() {
    let status = "Name:\tx\nUid:\t1\t1\t1\t1\nGroups:\t27 100 4242 \nNgid:\t0\n";
    assert_eq!(parse_groups(status), Some(vec![27, 100, 4242]));
    assert_eq!(parse_groups("Groups:\t\n"), Some(vec![]));
    assert_eq!(parse_groups("Groups:\tx\n"), None);
    let own = GroupsCache::default().status_of(std::process::id(), 0, 0);
    let mine = std::fs::read_to_string("/proc/self/status").unwrap();
    assert_eq!(Some((*own.groups).clone()), parse_groups(&mine));
    assert_eq!(Some(own.caps), parse_caps(&mine));
    let gone = GroupsCache::default().status_of(u32::MAX, 0, 0);
    assert!(gone.groups.is_empty() && gone.caps == 0);
    assert_eq!(
        parse_caps("CapEff:\t000001ffffffffff\n"),
        Some(0x1ff_ffff_ffff)
    );
}

#[test]
fn no_follow_open_refuses_links_anywhere_on_the_path() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("d")).unwrap();
    fs::write(dir.path().join("d/f"), b"f").unwrap();
    std::os::unix::fs::symlink("d", dir.path().join("dl")).unwrap();
    std::os::unix::fs::symlink("f", dir.path().join("d/fl")).unwrap();
    let root = SourceRoot::open(&dir.path().canonicalize().unwrap()).unwrap();
    assert!(root.open_file(Path::new("d/f"), false).is_ok());
    for linked in ["dl/f", "d/fl"] {
        let err = root.open_file(Path::new(linked), false).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{linked}: {err}");
        assert!(root.open_file(Path::new(linked), true).is_ok());
    }
    // Nor for stat or listing: a link on the way is refused, a last one is shown as itself.
    assert!(root.stat(Path::new("dl/f"), false).is_err());
    assert!(root.stat(Path::new("d/fl"), false).unwrap().is_symlink());
    assert!(root.list_dir(Path::new("dl"), false).is_err());
    assert_eq!(root.list_dir(Path::new("dl"), true).unwrap().len(), 2);
}

#[test]
fn a_source_behind_a_closed_directory_is_reached_from_below() {
    if !is_root() {
        eprintln!("skipped: needs root to switch credentials");
        return;
    }
    let (dir, _, _) = private_tree();
    let source = dir.path().join("private");
    fs::set_permissions(source.join("pub"), fs::Permissions::from_mode(0o755)).ok();
    fs::create_dir_all(source.join("pub")).unwrap();
    fs::set_permissions(&source, fs::Permissions::from_mode(0o711)).unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(source.join("pub/open.txt"), b"open").unwrap();
    fs::write(source.join("mine"), b"x").unwrap();
    fs::set_permissions(source.join("mine"), fs::Permissions::from_mode(0o600)).unwrap();
    let root = SourceRoot::open(&source).unwrap();
    let rule = AccessRule::new(Sharing::SwitchCredentials);
    let acting = rule.act_for(NOBODY, NOBODY, 0).unwrap();
    let read = |rel: &str| {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut root.open_file(Path::new(rel), true)?, &mut bytes)?;
        Ok::<_, std::io::Error>(bytes)
    };
    // The parent of SOURCE is 0700: the plain path is closed, the path below SOURCE is not.
    assert!(fs::read(source.join("pub/open.txt")).is_err());
    assert_eq!(read("pub/open.txt").unwrap(), b"open");
    // Below SOURCE the user's rights still apply: a 0644 file reads, a 0600 one does not.
    assert_eq!(read("secret").unwrap(), b"secret");
    let err = read("mine").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES));
    drop(acting);
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
}
