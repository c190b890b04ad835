//! How a source entry is presented through the mount.
//!
//! Symbolic links are the one place where "mirror SOURCE" needs a decision:
//! - a link to a **regular file** is presented as that file (its size, mode, owner and times),
//!   so a model linked in from another disk (`models/x.safetensors -> /mnt/big/x.safetensors`)
//!   is read through the mount, and so through the cache, like any other file;
//! - a link to a **directory** is presented as that directory (ComfyUI walks with
//!   `followlinks=True` anyway), unless the link points at one of its own ancestors: following
//!   that would make an endless tree, so it stays a symlink and the walker's own loop handling
//!   applies;
//! - a dangling link, or a link to anything else, stays a symlink (its target text is returned
//!   as is by `readlink`);
//! - a link whose target the requester cannot reach stays a symlink too: the lookups of a
//!   shared mount run with the requester's credentials ([`crate::access`]), and a mount whose
//!   daemon cannot switch credentials follows no links for other users at all
//!   (`follow_links == false`), so their kernel follows them outside the mount, with their own
//!   rights.

use std::io;
use std::path::Path;

use super::attr::Kind;
use super::inodes::ObjectId;
use super::source_tree::{SourceMeta, SourceTree};

/// The metadata to show for `rel` (relative to SOURCE) and the kind to show it as, following
/// links only if `follow_links`; the flag returned says whether `rel` is a link presented as
/// its target. A link whose target cannot be reached (dangling, unreadable, or refused by
/// [`super::platform::SourceRoot`]: a `/proc` magic link, procfs, the mount itself) stays a
/// link. A remote tree has no links.
pub fn present_as(
    root: &SourceTree,
    rel: &Path,
    follow_links: bool,
) -> io::Result<(SourceMeta, Kind, bool)> {
    let link = root.lstat(rel, follow_links)?;
    if !link.is_symlink() {
        let kind = link.kind();
        return Ok((link, kind, false));
    }
    if !follow_links {
        return Ok((link, Kind::Symlink, false));
    }
    match root.stat(rel, true) {
        Ok(target) if target.is_file() => Ok((target, Kind::File, true)),
        Ok(target) if target.is_dir() && !root.link_points_at_ancestor(rel) => {
            Ok((target, Kind::Directory, true))
        }
        _ => Ok((link, Kind::Symlink, false)),
    }
}

/// [`present_as`], with the identity of the source object presented.
pub fn present_object(
    root: &SourceTree,
    rel: &Path,
    follow_links: bool,
) -> io::Result<(ObjectId, SourceMeta, Kind, bool)> {
    let (meta, kind, via_link) = present_as(root, rel, follow_links)?;
    let abs = root.abs().join(rel);
    Ok((meta.object_id(&abs, kind)?, meta, kind, via_link))
}

// Symbolic links on Windows need a privilege the test user (and wine) may not have.
#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::fs::platform::SourceRoot;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::sync::Arc;

    #[test]
    fn links_to_files_and_dirs_are_followed_but_loops_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let source = SourceTree::Local(Arc::new(SourceRoot::open(&root).unwrap()));
        let present = |rel: &str| present_as(&source, Path::new(rel), true).map(|(m, k, _)| (m, k));
        fs::create_dir(root.join("sub")).unwrap();
        fs::write(root.join("real.safetensors"), b"12345").unwrap();
        symlink(root.join("real.safetensors"), root.join("link.safetensors")).unwrap();
        symlink("sub", root.join("subdir-link")).unwrap();
        symlink("..", root.join("sub/loop")).unwrap();
        symlink("missing", root.join("dangling")).unwrap();

        let (meta, kind) = present("link.safetensors").unwrap();
        assert_eq!((kind, meta.len()), (Kind::File, 5));
        assert_eq!(present("subdir-link").unwrap().1, Kind::Directory);
        assert_eq!(present("sub/loop").unwrap().1, Kind::Symlink);
        assert_eq!(present("dangling").unwrap().1, Kind::Symlink);
        assert_eq!(present("sub").unwrap().1, Kind::Directory);
        assert!(present("nope").is_err());
        let as_link = present_as(&source, Path::new("link.safetensors"), false).unwrap();
        assert_eq!((as_link.1, as_link.2), (Kind::Symlink, false));
        assert!(
            present_as(&source, Path::new("subdir-link"), true)
                .unwrap()
                .2
        );
        assert!(!present_as(&source, Path::new("sub"), true).unwrap().2);
        // Through a directory presented by a link: the loop inside it is still a loop.
        assert_eq!(present("subdir-link/loop").unwrap().1, Kind::Symlink);
    }
}
