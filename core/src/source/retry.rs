//! Which source errors are worth another try, and how long to wait before it.
//!
//! **Contract.** [`is_transient`] says whether an error may go away by itself (a network
//! filesystem's server restarting, a connection reset, a lease lost); [`RetryPolicy`] bounds
//! the tries of one read in count, and [`super::deadline`] bounds them in time: a retry is
//! never started when its backoff would end past the read's deadline. An error that says
//! something about the file itself (truncated, replaced, not a file, permission) is never
//! retried. [`needs_reopen`] picks the errors after which the descriptor itself is dead
//! (`ENOTCONN`: the network filesystem's connection is gone; `ESTALE`: its file handle
//! expired): the retry opens the file again by path, checked to be the very version indexed
//! ([`super::slot::SourceSlot`]).

use std::io;
use std::time::Duration;

use super::SourceError;

/// How often, and with what pauses, a read that failed with a transient error is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries of one read at most, the first included: 4, so a persistent error (a bad sector
    /// reported as `EIO`) reaches the reader after 0.7 s of pauses, while a network
    /// filesystem's blip of under a second is not seen at all.
    pub max_attempts: u32,
    /// Pause before the first retry: 100 ms, long enough for a reset connection to be
    /// re-established by the filesystem's client, short next to a chunk's read time on a slow
    /// source.
    pub first_backoff: Duration,
    /// Each pause is this many times the previous one: 2 (100, 200, 400 ms).
    pub backoff_factor: u32,
    /// No pause is longer than this: 5 s.
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// What the daemon runs with ([`Default`]), usable in constants.
    pub const DEFAULT: RetryPolicy = RetryPolicy {
        max_attempts: 4,
        first_backoff: Duration::from_millis(100),
        backoff_factor: 2,
        max_backoff: Duration::from_secs(5),
    };

    /// No retry at all.
    pub const NONE: RetryPolicy = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::DEFAULT
    };

    /// The pause before try `attempt + 1`, after try `attempt` (0-based) failed.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = self
            .backoff_factor
            .max(1)
            .checked_pow(attempt)
            .unwrap_or(u32::MAX);
        self.first_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::DEFAULT
    }
}

/// Whether `e` may go away by itself: an I/O error a network filesystem reports while its
/// server or connection is down (`EIO`, `ETIMEDOUT`, `ENOTCONN`, `ECONNRESET`, `ESTALE`, …),
/// or a call the OS asks to repeat (`EAGAIN`, `EINTR`). `EIO` is on the list although a local
/// disk's bad sector reports it too: the kernel has retried that one already, and the few
/// retries cost under a second before the reader gets the error anyway.
pub fn is_transient(e: &SourceError) -> bool {
    match e {
        SourceError::Read { source, .. } | SourceError::Open { source, .. } => {
            is_transient_io(source)
        }
        SourceError::TimedOut { .. }
        | SourceError::Remote { .. }
        | SourceError::Unresponsive { .. }
        | SourceError::Truncated { .. }
        | SourceError::Changed { .. }
        | SourceError::NotAFile { .. }
        | SourceError::Alloc { .. } => false,
    }
}

/// [`is_transient`] of an OS error.
pub fn is_transient_io(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    if matches!(
        e.kind(),
        Interrupted
            | WouldBlock
            | TimedOut
            | NotConnected
            | ConnectionReset
            | ConnectionAborted
            | ConnectionRefused
            | BrokenPipe
    ) {
        return true;
    }
    #[cfg(target_os = "linux")]
    {
        matches!(
            e.raw_os_error(),
            Some(
                libc::EIO
                    | libc::ESTALE
                    | libc::ENOTCONN
                    | libc::EHOSTUNREACH
                    | libc::EHOSTDOWN
                    | libc::ENETUNREACH
                    | libc::ENETDOWN
                    | libc::ENETRESET
                    | libc::EREMOTEIO
                    | libc::ECOMM
            )
        )
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Whether the descriptor `e` came from is dead and the retry must open the file again:
/// `ENOTCONN` (a FUSE client's connection is gone) and `ESTALE` (a network file handle
/// expired).
pub fn needs_reopen(e: &SourceError) -> bool {
    let SourceError::Read { source, .. } = e else {
        return false;
    };
    if source.kind() == io::ErrorKind::NotConnected {
        return true;
    }
    #[cfg(target_os = "linux")]
    {
        matches!(source.raw_os_error(), Some(libc::ESTALE | libc::ENOTCONN))
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    fn read_err(e: io::Error) -> SourceError {
        SourceError::Read {
            path: "f".into(),
            offset: 0,
            source: e,
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 10,
            first_backoff: Duration::from_millis(100),
            backoff_factor: 3,
            max_backoff: Duration::from_secs(1),
        };
        assert_eq!(p.backoff(0), Duration::from_millis(100));
        assert_eq!(p.backoff(1), Duration::from_millis(300));
        assert_eq!(p.backoff(2), Duration::from_millis(900));
        assert_eq!(p.backoff(3), Duration::from_secs(1));
        assert_eq!(p.backoff(60), Duration::from_secs(1), "no overflow");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn network_errors_are_transient_and_file_errors_are_not() {
        let os = |code| read_err(io::Error::from_raw_os_error(code));
        for code in [
            libc::EIO,
            libc::EAGAIN,
            libc::EINTR,
            libc::ETIMEDOUT,
            libc::ENOTCONN,
            libc::ECONNRESET,
            libc::ESTALE,
        ] {
            assert!(is_transient(&os(code)), "errno {code}");
        }
        for code in [libc::EACCES, libc::EBADF, libc::EINVAL, libc::ENOENT] {
            assert!(!is_transient(&os(code)), "errno {code}");
        }
        assert!(!is_transient(&SourceError::Changed { path: "f".into() }));
        assert!(!is_transient(&SourceError::Truncated {
            path: "f".into(),
            wanted_end: 2,
            got_end: 1
        }));
        assert!(needs_reopen(&os(libc::ESTALE)));
        assert!(needs_reopen(&os(libc::ENOTCONN)));
        assert!(!needs_reopen(&os(libc::EIO)));
    }
}
