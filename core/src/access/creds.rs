//! Switching one thread's filesystem credentials to a requester's, and back.
//!
//! Linux checks file access with the *filesystem* uid and gid and the supplementary groups of
//! the calling **thread**. `setfsuid`/`setfsgid` are per-thread system calls (glibc's wrappers
//! are plain calls). `setgroups` is per-thread in the kernel, but glibc's `setgroups()` makes
//! it process-wide by signalling every thread, which would change the credentials of the other
//! request threads mid-call; so it is called here with `syscall(SYS_setgroups, …)`. When the
//! fsuid leaves 0 the kernel drops the thread's file capabilities (`CAP_DAC_OVERRIDE`,
//! `CAP_DAC_READ_SEARCH`…), and gives them back when it returns to 0: the thread then really
//! is the user for every path lookup and open.
//!
//! The thread's **capabilities** are cut to the requester's too: clearing the fsuid takes away
//! only the file capabilities, and a root daemon's thread would otherwise keep
//! `CAP_SYS_PTRACE`, `CAP_SYS_ADMIN` and the rest, which widen what a path can reach (another
//! process's `/proc/PID/…`, for one). While switched, the effective set is the daemon's own
//! intersected with the requester's (`CapEff:`); the permitted set is left alone, so the
//! switch back can raise them again. The same cut serves a root requester that dropped
//! capabilities (a container, a hardened service): it is checked as uid 0 *without*
//! `CAP_DAC_OVERRIDE`, as the kernel checks it on SOURCE.
//!
//! The requester's supplementary groups and capabilities are not in the FUSE request; they
//! are read from `/proc/PID/status` (`Groups:`, `CapEff:`) and kept for [`GROUPS_TTL`]. A
//! process whose status cannot be read (it exited) is served with no supplementary groups
//! and no capabilities: fewer rights, never more.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::thread::{capabilities, set_capabilities, CapabilitySet, CapabilitySets};
use thiserror::Error;

use crate::sync::{lock, Mutex};

/// How long the supplementary groups read for a process are reused. A second covers the burst
/// of lookups, opens and reads of one loader opening a file (dozens of requests) with one
/// `/proc` read, and bounds how long a process that changed its groups is served with the old
/// ones.
pub const GROUPS_TTL: Duration = Duration::from_secs(1);

/// Processes whose groups are remembered at most; past this the table is cleared (a burst of
/// short-lived processes must not grow it).
pub const GROUPS_ENTRIES: usize = 4096;

/// Tuning of a [`GroupsCache`]; [`Default`] is what a mount uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupsCacheConfig {
    /// How long a process's status is reused ([`GROUPS_TTL`]).
    pub ttl: Duration,
    /// Processes remembered at most before the table is cleared ([`GROUPS_ENTRIES`]).
    pub max_entries: usize,
}

impl Default for GroupsCacheConfig {
    fn default() -> GroupsCacheConfig {
        GroupsCacheConfig {
            ttl: GROUPS_TTL,
            max_entries: GROUPS_ENTRIES,
        }
    }
}

/// The credentials could not be switched: the request is refused (`EACCES`), never served with
/// the daemon's rights.
#[derive(Debug, Error)]
pub enum AccessError {
    #[error("cannot switch to uid {uid} gid {gid}: {source}")]
    Switch {
        uid: u32,
        gid: u32,
        #[source]
        source: io::Error,
    },
}

/// Whom a request acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Arc<Vec<u32>>,
    /// The requester's effective capabilities (a `CapEff:` bit mask).
    pub caps: u64,
}

/// This thread acts with other credentials until the value is dropped.
#[derive(Debug)]
pub struct Switched {
    /// The daemon's own credentials, restored on drop.
    own_uid: u32,
    own_gid: u32,
    own_groups: Vec<libc::gid_t>,
    own_caps: CapabilitySets,
    /// Not `Send`: credentials belong to the thread that switched them.
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl Switched {
    /// Switches this thread to `creds` for file access.
    pub fn to(creds: &Credentials) -> Result<Switched, AccessError> {
        let fail = |source| AccessError::Switch {
            uid: creds.uid,
            gid: creds.gid,
            source,
        };
        // SAFETY: geteuid/getegid cannot fail.
        let (own_uid, own_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let own_groups = current_groups().map_err(fail)?;
        let own_caps = capabilities(None).map_err(|e| fail(e.into()))?;
        let switched = Switched {
            own_uid,
            own_gid,
            own_groups,
            own_caps,
            _thread_bound: std::marker::PhantomData,
        };
        // Groups and gid first: once the fsuid is not 0, changing them needs nothing more, but
        // doing them while still root keeps every step permitted. Capabilities last: leaving
        // fsuid 0 clears the file capabilities, which the requester may hold itself. If any
        // step fails, dropping `switched` puts back whatever was changed.
        set_groups(&creds.groups).map_err(fail)?;
        set_fsgid(creds.gid).map_err(fail)?;
        set_fsuid(creds.uid).map_err(fail)?;
        let effective = own_caps.effective & CapabilitySet::from_bits_retain(creds.caps);
        set_capabilities(
            None,
            CapabilitySets {
                effective,
                ..own_caps
            },
        )
        .map_err(|e| fail(e.into()))?;
        Ok(switched)
    }
}

impl Drop for Switched {
    fn drop(&mut self) {
        // Capabilities first: restoring the groups needs CAP_SETGID in the effective set.
        let restored = set_capabilities(None, self.own_caps)
            .map_err(io::Error::from)
            .and_then(|()| set_fsuid(self.own_uid))
            .and_then(|()| set_fsgid(self.own_gid))
            .and_then(|()| set_groups(&self.own_groups));
        if let Err(e) = restored {
            // A request thread left with a user's credentials would serve the next request
            // with them: stopping the daemon is the only safe answer. Cannot happen while the
            // daemon keeps CAP_SETUID/CAP_SETGID, which switching the fsuid does not touch.
            tracing::error!(error = %e, "cannot restore the daemon's credentials: aborting");
            std::process::abort();
        }
    }
}

fn current_groups() -> io::Result<Vec<libc::gid_t>> {
    // SAFETY: a zero-sized call only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0; n as usize];
    // SAFETY: `groups` has room for `n` entries.
    let got = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(got as usize);
    Ok(groups)
}

fn set_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: the pointer and length describe a live slice; the raw system call changes this
    // thread's groups only (see the module docs).
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `setfsuid` reports no errors; success shows in the value it returns for an invalid id
/// (which changes nothing and returns the current one).
fn set_fsuid(uid: u32) -> io::Result<()> {
    // SAFETY: plain per-thread system calls on integers.
    let now = unsafe {
        libc::syscall(libc::SYS_setfsuid, uid);
        libc::syscall(libc::SYS_setfsuid, u32::MAX)
    };
    if now != i64::from(uid) {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

fn set_fsgid(gid: u32) -> io::Result<()> {
    // SAFETY: as in `set_fsuid`.
    let now = unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsgid, u32::MAX)
    };
    if now != i64::from(gid) {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

/// What a process's status said, and when it was read.
type ReadStatus = (Instant, ProcessStatus);

/// The supplementary groups and effective capabilities of a requesting process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessStatus {
    pub groups: Arc<Vec<u32>>,
    pub caps: u64,
}

/// [`ProcessStatus`] per requesting process, read from `/proc` and kept briefly. Keyed by pid
/// *and* the request's uid and gid, so that a pid reused within its TTL ([`GROUPS_TTL`]) by another
/// user's process is read afresh.
#[derive(Debug, Default)]
pub struct GroupsCache {
    config: GroupsCacheConfig,
    entries: Mutex<HashMap<(u32, u32, u32), ReadStatus>>,
}

impl GroupsCache {
    /// An empty cache tuned by `config`.
    pub fn with_config(config: GroupsCacheConfig) -> GroupsCache {
        GroupsCache {
            config,
            entries: Mutex::default(),
        }
    }

    /// The groups and capabilities of process `pid`, which sent a request as `uid`/`gid` (none
    /// if they cannot be read).
    pub fn status_of(&self, pid: u32, uid: u32, gid: u32) -> ProcessStatus {
        let key = (pid, uid, gid);
        let mut entries = lock(&self.entries);
        if let Some((read, status)) = entries.get(&key) {
            if read.elapsed() < self.config.ttl {
                return status.clone();
            }
        }
        let status = read_status(pid).unwrap_or_default();
        if entries.len() >= self.config.max_entries {
            entries.clear();
        }
        entries.insert(key, (Instant::now(), status.clone()));
        status
    }
}

/// The `Groups:` and `CapEff:` lines of `/proc/PID/status`.
fn read_status(pid: u32) -> Option<ProcessStatus> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcessStatus {
        groups: Arc::new(parse_groups(&status)?),
        caps: parse_caps(&status)?,
    })
}

pub(crate) fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    line.split_whitespace().map(|g| g.parse().ok()).collect()
}

pub(crate) fn parse_caps(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(line.trim(), 16).ok()
}

/// This thread's effective capabilities (a `CapEff:` bit mask; none if they cannot be read).
pub fn own_effective_caps() -> u64 {
    capabilities(None).map_or(0, |sets| sets.effective.bits())
}

#[cfg(test)]
mod config_tests {
    use super::*;

    fn remembered(cache: &GroupsCache) -> usize {
        lock(&cache.entries).len()
    }

    #[test]
    fn the_table_is_cleared_past_max_entries() {
        let pid = std::process::id();
        let default = GroupsCache::default();
        let small = GroupsCache::with_config(GroupsCacheConfig {
            max_entries: 2,
            ..GroupsCacheConfig::default()
        });
        for uid in 0..3 {
            assert_eq!(default.status_of(pid, uid, 0), small.status_of(pid, uid, 0));
        }
        assert_eq!(remembered(&default), 3);
        assert_eq!(
            remembered(&small),
            1,
            "cleared at the third process, then it alone"
        );
    }
}
