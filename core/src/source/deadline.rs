//! Source reads in bounded time: a reader gets its bytes or an error within the deadline, never
//! a hang, even when the source stops answering.
//!
//! **Contract.** [`SourceIo::read`] returns within `timeout` (plus the time to hand the result
//! over) whatever the source does: the result of the read, the last error after the retries of
//! [`RetryPolicy`] for transient errors, [`SourceError::TimedOut`], or at once
//! [`SourceError::Unresponsive`] when every I/O thread it may use is stuck in a read that never
//! returned. A `pread` blocked on a network filesystem whose server is gone cannot be
//! cancelled, so each try runs on a thread of a bounded pool while the caller waits on a
//! channel with a deadline; on timeout the caller gives up and the thread is *abandoned*:
//! - an abandoned read's late result goes into the channel of its own request, whose receiver
//!   is gone, and is dropped there: every try reads into a buffer of its own, so its bytes can
//!   never be served for another request, and as the caller returned an error, nothing of it
//!   is cached (the chunk cache keeps only what its load returns);
//! - abandoned threads are bounded: at most [`SourceIoConfig::max_threads`] per priority
//!   level; once all of them are stuck, a new read fails at once rather than starting another
//!   thread or queueing behind them. A stuck thread that returns serves again;
//! - the memory of abandoned reads (their buffers, at most a chunk each) is outside the cache
//!   budget, and bounded by `max_threads` chunks;
//! - the process exits on unmount or SIGTERM whatever its I/O threads do: they are never
//!   joined.
//!
//! Single flight is kept by the caller: the chunk cache's load is this call, so the waiters of
//! a read that timed out get its error, and the next request of the chunk reads it again.
//!
//! With no timeout (`--source-timeout 0`), tries run on the caller's own thread, as plain
//! reads; retries still apply.
//!
//! **Threads.** The pool starts threads on demand (a read never waits for a busy thread while
//! fewer than `max_threads` exist) and a thread idle for [`SourceIoConfig::idle_exit`] ends.
//! Threads inherit the nice value of the thread that started them, so there is one pool per
//! nice value of the callers: prefetches run at nice 10 (see `prefetch::executor`) and their
//! reads stay below the readers'.
//!
//! **Cost.** One channel hop per source read (a chunk of up to 4 MiB): 10–20 µs, under 0.1 % of
//! a 4 MiB read from a disk or a network source
//! ([measured](../../../docs/PERFORMANCE.md#source-reads-on-an-io-thread)).
//!
//! **Locks.** `SourceIo::pools` and each pool's `state` are leaves, never held across a read or
//! a wait.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, RecvTimeoutError, Sender};

use super::retry::{is_transient, needs_reopen, RetryPolicy};
use super::SourceError;
use crate::sync::{lock, Mutex};

/// How source reads are bounded in time and retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceIoConfig {
    /// The longest a read may take, its retries included (`--source-timeout`; `None`: no
    /// bound, tries run on the caller's thread). 30 s: two orders of magnitude over a healthy
    /// 4 MiB read on the slowest source class (a congested 1 GbE NAS, a seeking hard disk: well
    /// under a second), and long enough to ride out the hiccups that recover by themselves (a
    /// NAS or Ceph OSD failover, 20–30 s; a network volume's reconnect), while a user staring at
    /// a frozen loader gets an error in half a minute rather than never (an NFS soft mount
    /// gives up after about 3 minutes, a hard mount never;
    /// [why](../../../docs/RELIABILITY.md#a-source-that-fails-or-stops-answering)).
    pub timeout: Option<Duration>,
    /// Retries of transient errors ([`RetryPolicy`]).
    pub retry: RetryPolicy,
    /// I/O threads per priority level at most, stuck ones included: 32, over the request
    /// threads and prefetch workers that read at once (16 at most by default), so that healthy
    /// reads never wait for a thread; the bound on threads, and on the memory of abandoned
    /// reads (a chunk each), when the source hangs.
    pub max_threads: usize,
    /// An I/O thread idle this long ends: 60 s.
    pub idle_exit: Duration,
}

impl SourceIoConfig {
    /// What the daemon runs with ([`Default`]), usable in constants.
    pub const DEFAULT: SourceIoConfig = SourceIoConfig {
        timeout: Some(Duration::from_secs(30)),
        retry: RetryPolicy::DEFAULT,
        max_threads: 32,
        idle_exit: Duration::from_secs(60),
    };
}

impl Default for SourceIoConfig {
    fn default() -> Self {
        SourceIoConfig::DEFAULT
    }
}

/// Figures of source failures since the mount (`disk.source_*` in the stats).
#[derive(Debug, Default)]
pub struct SourceIoCounters {
    /// Tries that failed (each error the source returned, retried or not; timeouts apart).
    pub errors: AtomicU64,
    /// Tries started again after a transient error.
    pub retries: AtomicU64,
    /// Reads that gave up at their deadline.
    pub timeouts: AtomicU64,
    /// Descriptors opened again after `ENOTCONN` or `ESTALE`.
    pub reopens: AtomicU64,
    /// Reads refused at once because every I/O thread was stuck.
    pub refused: AtomicU64,
    /// Descriptors opened again for an ordered stream ([`super::slot::SourceSlot::read_stream`]).
    pub fresh_handles: AtomicU64,
}

/// [`SourceIoCounters`] read at one moment, with the threads now stuck.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceIoSnapshot {
    pub errors: u64,
    pub retries: u64,
    pub timeouts: u64,
    pub reopens: u64,
    pub refused: u64,
    pub fresh_handles: u64,
    /// Reads abandoned at their deadline whose thread is still blocked in the source.
    pub stuck: u64,
    /// I/O threads alive now, stuck ones included.
    pub threads: u64,
}

/// The mount's source reads: deadline, retries, I/O threads and their counters.
pub struct SourceIo {
    config: SourceIoConfig,
    /// One pool per nice value of the callers (see the module docs).
    pools: Mutex<Vec<(i32, Arc<Pool>)>>,
    counters: SourceIoCounters,
}

impl std::fmt::Debug for SourceIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceIo")
            .field("config", &self.config)
            .finish()
    }
}

impl Default for SourceIo {
    fn default() -> Self {
        SourceIo::new(SourceIoConfig::default())
    }
}

impl SourceIo {
    /// Source reads run by `config`; no thread starts before the first read.
    pub fn new(config: SourceIoConfig) -> SourceIo {
        SourceIo {
            config,
            pools: Mutex::new(Vec::new()),
            counters: SourceIoCounters::default(),
        }
    }

    pub fn config(&self) -> &SourceIoConfig {
        &self.config
    }

    pub fn counters(&self) -> &SourceIoCounters {
        &self.counters
    }

    /// The counters, with the threads stuck and alive now.
    pub fn snapshot(&self) -> SourceIoSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (mut stuck, mut threads) = (0, 0);
        for (_, pool) in lock(&self.pools).iter() {
            let state = lock(&pool.state);
            stuck += state.abandoned as u64;
            threads += state.threads as u64;
        }
        SourceIoSnapshot {
            errors: get(&self.counters.errors),
            retries: get(&self.counters.retries),
            timeouts: get(&self.counters.timeouts),
            reopens: get(&self.counters.reopens),
            refused: get(&self.counters.refused),
            fresh_handles: get(&self.counters.fresh_handles),
            stuck,
            threads,
        }
    }

    /// Reads by `attempt` within the deadline, retrying transient errors. `attempt(reopen)`
    /// does one try; `reopen` is true when the previous try's descriptor is dead
    /// ([`needs_reopen`]) and the try must open the file again. `(path, offset)` name the read
    /// in errors and logs.
    pub fn read<T, F>(&self, (path, offset): (&Path, u64), attempt: F) -> Result<T, SourceError>
    where
        T: Send + 'static,
        F: Fn(bool) -> Result<T, SourceError> + Send + Sync + 'static,
    {
        let started = Instant::now();
        let deadline = self.config.timeout.map(|t| started + t);
        let attempt = Arc::new(attempt);
        let mut reopen = false;
        let mut tried = 0;
        loop {
            let one = Arc::clone(&attempt);
            let result = self.try_once(move || one(reopen), deadline, (path, offset, started));
            tried += 1;
            let e = match result {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            if matches!(
                e,
                SourceError::TimedOut { .. } | SourceError::Unresponsive { .. }
            ) {
                return Err(e);
            }
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            if tried >= self.config.retry.max_attempts || !is_transient(&e) {
                return Err(e);
            }
            let pause = self.config.retry.backoff(tried - 1);
            if deadline.is_some_and(|d| Instant::now() + pause >= d) {
                return Err(e); // no time left for another try
            }
            reopen = needs_reopen(&e);
            if reopen {
                self.counters.reopens.fetch_add(1, Ordering::Relaxed);
            }
            tracing::debug!(file = %path.display(), offset, error = %e, attempt = tried, ?pause, "transient source error: trying again");
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(pause);
        }
    }

    /// One try of `job`: on an I/O thread until `deadline`, or on this thread without one.
    fn try_once<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
        deadline: Option<Instant>,
        (path, offset, started): (&Path, u64, Instant),
    ) -> Result<T, SourceError> {
        let Some(deadline) = deadline else {
            return job();
        };
        let (tx, rx) = channel::bounded(1);
        let task = Task {
            state: Arc::new(AtomicU8::new(QUEUED)),
            run: Box::new(move || {
                // The receiver is gone when the caller gave up: the result is dropped here.
                let _ = tx.send(job());
            }),
        };
        let state = Arc::clone(&task.state);
        let pool = self.pool();
        if let Err(refusal) = pool.submit(task) {
            return Err(match refusal {
                Refusal::AllStuck(stuck) => {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(file = %path.display(), offset, stuck, "every source I/O thread is stuck in a read that does not return: failing this read at once");
                    SourceError::Unresponsive {
                        path: path.to_owned(),
                        stuck,
                    }
                }
                Refusal::Spawn(source) => SourceError::Read {
                    path: path.to_owned(),
                    offset,
                    source,
                },
            });
        }
        match rx.recv_deadline(deadline) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => {
                pool.abandon(&state);
                // The result may have come in just now.
                if let Ok(result) = rx.try_recv() {
                    return result;
                }
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                let after = started.elapsed();
                tracing::warn!(file = %path.display(), offset, ?after, "source read timed out: the source does not answer");
                Err(SourceError::TimedOut {
                    path: path.to_owned(),
                    offset,
                    after,
                })
            }
            Err(RecvTimeoutError::Disconnected) => Err(SourceError::Read {
                path: path.to_owned(),
                offset,
                source: std::io::Error::other("the source read ended without a result"),
            }),
        }
    }

    /// The pool of the calling thread's nice value.
    fn pool(&self) -> Arc<Pool> {
        let nice = current_nice();
        let mut pools = lock(&self.pools);
        if let Some((_, pool)) = pools.iter().find(|(n, _)| *n == nice) {
            return Arc::clone(pool);
        }
        let (tx, rx) = channel::unbounded();
        let pool = Arc::new(Pool {
            state: Mutex::new(PoolState::default()),
            tx,
            rx,
            max_threads: self.config.max_threads.max(1),
            idle_exit: self.config.idle_exit,
        });
        pools.push((nice, Arc::clone(&pool)));
        pool
    }
}

/// The nice value of the calling thread (Linux; 0 elsewhere).
fn current_nice() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpriority(2) of this thread's own id reads and writes no memory of ours.
        // (-1 is also a valid nice value; an error, which cannot happen for oneself, reads so.)
        unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// A try waiting for a thread.
const QUEUED: u8 = 0;
/// A try running on a thread.
const RUNNING: u8 = 1;
/// A try over (its result sent, or dropped).
const DONE: u8 = 2;
/// A try whose caller gave up while it was queued: never run.
const CANCELLED: u8 = 3;
/// A try whose caller gave up while it ran: its thread is stuck until it returns.
const ABANDONED: u8 = 4;

struct Task {
    state: Arc<AtomicU8>,
    run: Box<dyn FnOnce() + Send>,
}

/// Why a try was not started.
enum Refusal {
    /// Every thread is stuck in an abandoned read (how many).
    AllStuck(usize),
    /// No thread could be started.
    Spawn(std::io::Error),
}

/// I/O threads of one priority level.
struct Pool {
    state: Mutex<PoolState>,
    tx: Sender<Task>,
    rx: Receiver<Task>,
    max_threads: usize,
    idle_exit: Duration,
}

/// Counts of a pool's threads. Invariant: every task in the channel was sent either to an idle
/// thread it claimed (`idle` was decremented) or as `queued`, so `idle` threads are free for
/// new tasks and a thread that finishes takes a queued one before it counts as idle.
#[derive(Default)]
struct PoolState {
    threads: usize,
    idle: usize,
    queued: usize,
    /// Threads running a try whose caller gave up.
    abandoned: usize,
}

impl Pool {
    fn submit(self: &Arc<Pool>, task: Task) -> Result<(), Refusal> {
        let mut state = lock(&self.state);
        if state.idle > 0 {
            state.idle -= 1;
            // Sent under the lock, so that an idle thread ending sees it (see `worker`).
            return self.send(task, state);
        }
        if state.threads < self.max_threads {
            state.threads += 1;
            drop(state);
            let pool = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("tierfs-source-io".into())
                .spawn(move || pool.worker(task));
            return spawned.map(drop).map_err(|e| {
                lock(&self.state).threads -= 1;
                Refusal::Spawn(e)
            });
        }
        if state.abandoned >= state.threads {
            return Err(Refusal::AllStuck(state.abandoned));
        }
        state.queued += 1;
        self.send(task, state)
    }

    fn send(
        &self,
        task: Task,
        _state: crate::sync::MutexGuard<'_, PoolState>,
    ) -> Result<(), Refusal> {
        // The pool holds the receiver, so the channel is never disconnected.
        self.tx
            .send(task)
            .map_err(|_| Refusal::Spawn(std::io::Error::other("source I/O queue closed")))
    }

    /// The caller of the try `state` gave up: a queued try is cancelled, a running one counted
    /// stuck until it returns.
    fn abandon(&self, state: &AtomicU8) {
        let mut counts = lock(&self.state);
        match state.compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => counts.abandoned += 1,
            Err(QUEUED) => {
                let _ =
                    state.compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire);
            }
            Err(_) => {}
        }
    }

    fn worker(self: Arc<Pool>, first: Task) {
        let mut next = Some(first);
        loop {
            let task = match next.take() {
                Some(task) => task,
                None => match self.rx.recv_timeout(self.idle_exit) {
                    Ok(task) => task,
                    Err(_) => {
                        let mut state = lock(&self.state);
                        if !self.rx.is_empty() {
                            continue; // a task claimed this thread meanwhile
                        }
                        state.idle = state.idle.saturating_sub(1);
                        state.threads = state.threads.saturating_sub(1);
                        return;
                    }
                },
            };
            let runs = task
                .state
                .compare_exchange(QUEUED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if runs {
                let run = task.run;
                if std::panic::catch_unwind(AssertUnwindSafe(run)).is_err() {
                    tracing::error!("a source read panicked; its reader gets an error");
                }
            }
            let mut state = lock(&self.state);
            if task.state.swap(DONE, Ordering::AcqRel) == ABANDONED {
                state.abandoned = state.abandoned.saturating_sub(1);
                tracing::info!("a source read abandoned at its deadline returned");
            }
            if state.queued > 0 {
                state.queued -= 1;
            } else {
                state.idle += 1;
            }
        }
    }
}

#[cfg(test)]
#[path = "deadline_tests.rs"]
mod tests;
