//! Who may see what through a shared mount: the rule, and the credential switch that enforces it.
//! "Access" here is always a user's right to reach a file in SOURCE; the FUSE `access`
//! operation is [`TierFs::access`](crate::fs::TierFs::access), and a reader's position in a
//! file is `crate::reader`'s (its `ReaderTracker`).
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
//! - `--allow-other` with a root daemon: credentials (and capabilities) are switched for every
//!   requester but a root process holding every capability the daemon holds;
//! - `--allow-other` with a non-root daemon (which cannot switch): for other users, links are
//!   not followed (presented as links, which their kernel then follows with their own rights,
//!   outside the mount), so the kernel's `default_permissions` check of the presented path is
//!   the check of the real path. That check knows only mode bits: a file or directory on the
//!   way that carries a POSIX ACL is refused to other users ([`resolve`]), since an ACL may deny
//!   what the bits allow.
//!
//! Whatever the mode, every path is resolved by [`SourceRoot`] ([`resolve`]): never through a
//! `/proc` magic link, into a procfs, or into the mount itself, for every requester.

pub mod creds;
pub mod resolve;

pub use creds::{AccessError, Credentials, GroupsCache, GroupsCacheConfig, Switched};
pub use resolve::{mount_device, ServedDevice, SourceRoot};

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
    /// Acting for another user than the mounting one on a mount whose daemon cannot switch
    /// (see the module docs: objects with ACLs are refused to them).
    unswitched_other: bool,
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

    /// Whether the request is another user's, served with the daemon's own rights (a non-root
    /// daemon with `--allow-other`).
    pub fn is_unswitched_other(&self) -> bool {
        self.unswitched_other
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
        let plain = |follow_links, unswitched_other| Acting {
            _switched: None,
            follow_links,
            unswitched_other,
        };
        match self.sharing {
            Sharing::Single => Ok(plain(true, false)),
            Sharing::NoLinksForOthers { owner } => Ok(plain(uid == owner, uid != owner)),
            Sharing::SwitchCredentials => {
                let status = self.groups.status_of(pid, uid, gid);
                // Root holding every capability the daemon holds reaches what the daemon does.
                let own = creds::own_effective_caps();
                if uid == 0 && status.caps & own == own {
                    return Ok(plain(true, false));
                }
                let creds = Credentials {
                    uid,
                    gid,
                    groups: status.groups,
                    caps: status.caps,
                };
                Ok(Acting {
                    _switched: Some(Switched::to(&creds)?),
                    follow_links: true,
                    unswitched_other: false,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
