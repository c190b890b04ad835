//! The daemon's descriptor limit.
//!
//! The daemon holds up to two source descriptors per model file version that readers have open
//! ([`super::slot`]), one per other file open without passthrough, and a few of its own. Most
//! systems start processes with a soft `RLIMIT_NOFILE` of 1024 for the sake of `select(2)`,
//! which cannot watch higher descriptors, and a hard limit of 2^19 or more. tierfs never calls
//! `select` (fuser reads `/dev/fuse` with blocking reads, everything else is threads), so at
//! startup it raises its soft limit to the hard one, as systemd recommends for such programs:
//! with 1024, readers holding about 500 model files open at once would already exhaust it.
//! Descriptors do not grow with the files ever opened, so the raise is headroom for readers
//! that hold many files open at once.

use std::io;

/// Raises the soft descriptor limit to the hard limit. Returns the limit now in force.
#[cfg(target_os = "linux")]
pub fn raise_descriptor_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the valid struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the valid struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        let raised = super::raise_descriptor_limit().unwrap();
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(limit.rlim_cur, limit.rlim_max);
        assert_eq!(raised, limit.rlim_cur);
    }
}
