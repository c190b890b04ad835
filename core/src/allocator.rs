//! The daemon's use of the C allocator: at most [`MAX_ARENAS`] malloc arenas under the
//! io_uring transport.
//!
//! **Contract.** [`limit_arenas`] is called at the start of a mount that asks for the io_uring
//! transport (`--io-uring on` or `auto`), before any of its threads. With glibc it caps the arenas (`mallopt(M_ARENA_MAX)`) unless the user set
//! `MALLOC_ARENA_MAX`, which glibc then follows; with another C library, or on another system,
//! it does nothing. The `/dev/fuse` transport keeps glibc's default.
//!
//! Why: glibc gives threads that contend for the heap arenas of their own, up to eight per CPU,
//! and keeps what is freed in each. The ring threads, pinned one set per CPU, index headers that
//! other threads later evict, so freed headers pile up in every arena between the trims of
//! [`crate::models`] (`TRIM_AFTER_EVICTED_BYTES`): opening 10 000 model files of 32 KiB headers
//! under a 32 MiB index cap through the rings peaked at 98–104 MiB of RSS with the default
//! arenas on a loaded machine, 72–75 MiB with two. Through `/dev/fuse` two arenas raised the
//! stress test's peak instead (128.6 against 122.3 MiB), so they are not used there
//! ([measured](../../docs/PERFORMANCE.md#malloc-arenas)).

/// Arenas the daemon's threads share: two, so that a request thread rarely waits for another's
/// allocation (most small ones never reach an arena: glibc's per-thread cache serves them),
/// while what the threads free stays in two heaps that a trim returns
/// ([measured](../../docs/PERFORMANCE.md#malloc-arenas)).
pub const MAX_ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at [`MAX_ARENAS`] (see the module docs). Returns whether it did.
pub fn limit_arenas() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return false;
        }
        // SAFETY: mallopt only sets one of glibc's malloc parameters; M_ARENA_MAX bounds the
        // arenas created from now on and is safe to set while other threads allocate.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, MAX_ARENAS) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_cap_unless_the_user_set_one() {
        let user_set = std::env::var_os("MALLOC_ARENA_MAX").is_some();
        assert_eq!(super::limit_arenas(), !user_set);
    }
}
