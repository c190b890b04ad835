//! Who may see what through a shared mount: the rule, and the credential switch that enforces it.
//!
//! **The rule.** A request through the mount may do exactly what the requesting user could do
//! by following the same path through SOURCE themselves, links included. A root daemon
//! enforces it by doing every source access made on behalf of a request (lookup, `stat`,
//! `open`, `readlink`, directory listing, the `user.tierfs.source` attribute) *with the
//! requester's credentials*: the serving thread switches its filesystem uid and gid and its
//! supplementary groups to the requester's ([`creds`]) around the source call and back to root
//! after. The kernel then checks every directory on the resolved path, every link target and
//! the file's own mode, exactly as for `cat SOURCE/path` run by that user, so
//! - a link out of SOURCE to a file behind a `0700` directory opens for whoever can traverse
//!   that directory, and for no one else;
//! - races cannot widen access: a link or directory swapped between lookup and open is resolved
//!   by the `open` call itself, with the requester's rights, whatever it points at by then;
//! - the check starts at SOURCE ([`SourceRoot`]): the mount root stands for SOURCE, and who
//!   may reach the mount is decided where it is mounted, so a SOURCE inside a `0700` home
//!   still serves the users the mount is shared with. SOURCE itself must be searchable by them.
//!
//! Cached bytes are shared between users only after such a per-request `open` succeeded on the
//! same file version (same device, inode, size and times), so the cache never serves a file to
//! a user who could not open it.
//!
//! Which mode applies ([`Sharing`]):
//! - without `--allow-other` only the mounting user (the kernel refuses everyone else), so
//!   nothing is switched: the daemon's own rights are the user's;
//! - `--allow-other` with a root daemon: credentials are switched for every requester but root;
//! - `--allow-other` with a non-root daemon (which cannot switch): for other users, links are
//!   not followed (presented as links, which their kernel then follows with their own rights,
//!   outside the mount), so the kernel's `default_permissions` check of the presented path is
//!   the check of the real path.

pub mod creds;

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub use creds::{AccessError, Credentials, GroupsCache, Switched};

/// How a mount shares its files between users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Only the mounting user can enter: serve with the daemon's rights.
    Single,
    /// Root daemon with `--allow-other`: act with each requester's credentials.
    SwitchCredentials,
    /// Non-root daemon with `--allow-other`: do not follow links for other users.
    NoLinksForOthers { owner: u32 },
}

impl Sharing {
    /// The mode for a mount by a daemon running as `daemon_uid`.
    pub fn for_mount(allow_other: bool, daemon_uid: u32) -> Sharing {
        match (allow_other, daemon_uid) {
            (false, _) => Sharing::Single,
            (true, 0) => Sharing::SwitchCredentials,
            (true, owner) => Sharing::NoLinksForOthers { owner },
        }
    }

    /// Whether other users may be served (their lookups must not be cached as someone else's).
    pub fn is_shared(self) -> bool {
        self != Sharing::Single
    }
}

/// What a request may do, decided once per request.
pub struct Acting {
    /// Holds the switched credentials until dropped.
    _switched: Option<Switched>,
    follow_links: bool,
}

impl Acting {
    /// Whether links in SOURCE are presented as their targets for this request.
    pub fn follow_links(&self) -> bool {
        self.follow_links
    }

    /// Whether the request acts with someone else's credentials than the daemon's.
    pub fn is_switched(&self) -> bool {
        self._switched.is_some()
    }
}

/// The access rule of one mount.
#[derive(Debug)]
pub struct AccessRule {
    sharing: Sharing,
    groups: GroupsCache,
}

impl AccessRule {
    pub fn new(sharing: Sharing) -> AccessRule {
        AccessRule {
            sharing,
            groups: GroupsCache::default(),
        }
    }

    pub fn sharing(&self) -> Sharing {
        self.sharing
    }

    /// Starts acting for a request of `uid`/`gid` from process `pid`: switches this thread's
    /// credentials where the rule needs it, until the returned value is dropped.
    pub fn act_for(&self, uid: u32, gid: u32, pid: u32) -> Result<Acting, AccessError> {
        match self.sharing {
            Sharing::Single => Ok(Acting {
                _switched: None,
                follow_links: true,
            }),
            Sharing::NoLinksForOthers { owner } => Ok(Acting {
                _switched: None,
                follow_links: uid == owner,
            }),
            Sharing::SwitchCredentials if uid == 0 => Ok(Acting {
                _switched: None,
                follow_links: true,
            }),
            Sharing::SwitchCredentials => {
                let groups = self.groups.groups_of(pid, uid, gid);
                let creds = Credentials { uid, gid, groups };
                Ok(Acting {
                    _switched: Some(Switched::to(&creds)?),
                    follow_links: true,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;

/// Opens `abs` for reading on behalf of a request: as the thread's current credentials allow,
/// and, when links are not to be followed, refusing a link anywhere on the path
/// (`openat2(RESOLVE_NO_SYMLINKS)`, which also covers a directory swapped for a link after the
/// lookup; SOURCE itself is canonical, so its own path holds none).
pub fn open_for_request(abs: &Path, follow_links: bool) -> io::Result<File> {
    if follow_links {
        return File::open(abs);
    }
    let c_path = CString::new(abs.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: the path is NUL-terminated and `how` is a valid open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// SOURCE, held open so that requests acting as a user reach paths *below* it without the
/// kernel checking SOURCE's ancestors with the user's rights. They go through
/// `/proc/self/fd/N/REL`: the kernel lets a process follow its own descriptors there whatever
/// its fsuid (`proc_fd_permission`, `ptrace_may_access` on its own thread group), and checks
/// each component of `REL`, and every link met on the way, with the thread's credentials.
/// Without `/proc`, or when acting with the daemon's own rights, the plain path is used (with
/// no `/proc`, users then also need to reach SOURCE itself: fewer rights, never more).
#[derive(Debug)]
pub struct SourceRoot {
    abs: PathBuf,
    via_fd: Option<(OwnedFd, PathBuf)>,
}

impl SourceRoot {
    pub fn open(abs: &Path) -> SourceRoot {
        let via_fd = File::open(abs).ok().map(OwnedFd::from).and_then(|fd| {
            let base = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            // `/proc` must be there and show SOURCE at that path.
            let same = std::fs::metadata(&base).ok()?;
            let real = std::fs::metadata(abs).ok()?;
            use std::os::unix::fs::MetadataExt;
            ((same.dev(), same.ino()) == (real.dev(), real.ino())).then_some((fd, base))
        });
        if via_fd.is_none() {
            tracing::info!(source = %abs.display(), "cannot reach SOURCE through /proc/self/fd: other users need search permission on its parents too");
        }
        SourceRoot {
            abs: abs.to_owned(),
            via_fd,
        }
    }

    /// The path of `rel` (relative to SOURCE) for a request acting as `acting`.
    pub fn path_for(&self, rel: &Path, acting: &Acting) -> PathBuf {
        match &self.via_fd {
            Some((_, base)) if acting.is_switched() => base.join(rel),
            _ => self.abs.join(rel),
        }
    }
}
