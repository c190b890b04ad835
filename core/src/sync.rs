//! Every lock of the core goes through this module, so that model-checked tests can swap in
//! [`loom`](https://docs.rs/loom)'s versions: built with `RUSTFLAGS="--cfg loom"`, `Mutex`,
//! `Condvar` and `RwLock` here are loom's, and `cargo test -p tierfs-core --release loom` runs
//! the model-checked tests (`core/src/cache/loom_tests.rs`), which explore every interleaving
//! of their threads up to a bounded number of preemptions. In ordinary builds these are the
//! standard library's types, at no cost.
//!
//! Poisoning is ignored everywhere ([`lock`], [`wait`]): every critical section in the core
//! leaves its state consistent before any call that could panic, so a panicking thread cannot
//! leave it half-updated, and one panicking request must not take the mount down with it.
//!
//! Process-wide statics (the spare chunk buffers in [`crate::source`]) need a `const`
//! constructor, which loom's types lack: they use [`StaticMutex`], always the standard one.
//! They guard leaf state (a list of spare buffers, no other lock taken under them), which
//! needs no model.

#[cfg(loom)]
pub use loom::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(loom))]
pub use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A mutex for `static`s (never swapped for loom's; see the module docs).
pub use std::sync::Mutex as StaticMutex;

use std::sync::PoisonError;

/// Locks `mutex`, ignoring poisoning (see the module docs).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `condvar`, ignoring poisoning.
pub fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `rwlock`, ignoring poisoning.
pub fn read<T>(rwlock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    rwlock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `rwlock`, ignoring poisoning.
pub fn write<T>(rwlock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    rwlock.write().unwrap_or_else(PoisonError::into_inner)
}
