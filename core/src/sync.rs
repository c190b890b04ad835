//! Every lock of the core goes through this module: no `Mutex`, `RwLock` or `Condvar` of
//! `tierfs-core` is taken anywhere else, and no other file handles poisoning.
//!
//! Why one place:
//! - **Model checking.** Built with `RUSTFLAGS="--cfg loom"`, `Mutex`, `Condvar` and `RwLock`
//!   here are [`loom`](https://docs.rs/loom)'s, and `cargo test -p tierfs-core --release loom`
//!   runs the model-checked tests (`core/src/cache/loom_tests.rs`, and [`Gates`]' below), which
//!   explore every interleaving of their threads up to a bounded number of preemptions. A lock
//!   taken around this module would be invisible to them. In ordinary builds these are the
//!   standard library's types, at no cost.
//! - **Poisoning** is ignored everywhere ([`lock`], [`wait`], [`read`], [`write()`],
//!   [`lock_static`]): every critical section in the core leaves its state consistent before
//!   any call that could panic, so a panicking thread cannot leave it half-updated, and one
//!   panicking request must not take the mount down with it.
//!
//! Process-wide statics (the spare chunk buffers in [`crate::source`]) need a `const`
//! constructor, which loom's types lack: they use [`StaticMutex`], always the standard one, and
//! [`lock_static`]. They guard leaf state (a list of spare buffers, no other lock taken under
//! them), which needs no model.

#[cfg(loom)]
pub use loom::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(loom))]
pub use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A mutex for `static`s (never swapped for loom's; see the module docs).
pub use std::sync::Mutex as StaticMutex;

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, PoisonError, Weak};

/// Locks `mutex`, ignoring poisoning (see the module docs).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks the process-wide `mutex`, ignoring poisoning (see the module docs).
pub fn lock_static<T>(mutex: &StaticMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `condvar`, ignoring poisoning.
pub fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `condvar` for at most `timeout`, ignoring poisoning; the guard and whether the
/// wait timed out.
pub fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> (MutexGuard<'a, T>, bool) {
    let (guard, result) = condvar
        .wait_timeout(guard, timeout)
        .unwrap_or_else(PoisonError::into_inner);
    (guard, result.timed_out())
}

/// Read-locks `rwlock`, ignoring poisoning.
pub fn read<T>(rwlock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    rwlock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `rwlock`, ignoring poisoning.
pub fn write<T>(rwlock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    rwlock.write().unwrap_or_else(PoisonError::into_inner)
}

/// One mutex per key, made on demand and dropped when nobody holds it: orders the work done for
/// one key (the opens of one inode, the discovery of one directory's sharded models) while the
/// work for other keys goes on, where one mutex for all would let a source that stalls on one
/// key stall them all. The map's own lock is only held to find or make a gate, never while one
/// is held; so a gate may be taken with any other lock free, and the map's lock is a leaf.
pub struct Gates<K> {
    gates: Mutex<HashMap<K, Weak<Mutex<()>>>>,
}

impl<K: Eq + Hash + Clone> Gates<K> {
    pub fn new() -> Gates<K> {
        Gates {
            gates: Mutex::new(HashMap::new()),
        }
    }

    /// The gate of `key`: the same mutex for every caller while any of them holds it.
    pub fn gate(&self, key: &K) -> Arc<Mutex<()>> {
        let mut gates = lock(&self.gates);
        if let Some(gate) = gates.get(key).and_then(Weak::upgrade) {
            return gate;
        }
        let gate = Arc::new(Mutex::new(()));
        // Gates nobody holds any more are dropped as new ones are made: the map stays the size
        // of the work in progress (a retain over it per new gate).
        gates.retain(|_, g| g.strong_count() > 0);
        gates.insert(key.clone(), Arc::downgrade(&gate));
        gate
    }
}

impl<K: Eq + Hash + Clone> Default for Gates<K> {
    fn default() -> Gates<K> {
        Gates::new()
    }
}

impl<K> std::fmt::Debug for Gates<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gates").finish_non_exhaustive()
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Model-checked: callers of one key never overlap inside its gate, whatever the
    //! interleaving of making, finding and dropping it; callers of two keys never deadlock.
    use super::*;
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::thread;

    fn model(body: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(body);
    }

    #[test]
    fn loom_one_key_one_holder_at_a_time() {
        model(|| {
            let gates = Arc::new(Gates::<u32>::new());
            let inside = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (gates, inside) = (Arc::clone(&gates), Arc::clone(&inside));
                    thread::spawn(move || {
                        let gate = gates.gate(&7);
                        let _held = lock(&gate);
                        assert!(
                            !inside.swap(true, Ordering::SeqCst),
                            "two holders of one gate"
                        );
                        inside.store(false, Ordering::SeqCst);
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("no panic");
            }
        });
    }

    #[test]
    fn loom_two_keys_with_another_lock_taken_inside() {
        model(|| {
            let gates = Arc::new(Gates::<u32>::new());
            let registry = Arc::new(Mutex::new(0u32));
            let threads: Vec<_> = (0..2u32)
                .map(|key| {
                    let (gates, registry) = (Arc::clone(&gates), Arc::clone(&registry));
                    thread::spawn(move || {
                        let gate = gates.gate(&key);
                        let _held = lock(&gate);
                        *lock(&registry) += 1; // the lock order: gate, then the registry
                        drop(_held);
                        drop(gate);
                        // Made again once nobody holds it.
                        let again = gates.gate(&key);
                        drop(lock(&again));
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("no panic");
            }
            assert_eq!(*lock(&registry), 2);
        });
    }
}
