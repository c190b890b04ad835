//! Where prefetch work runs: an [`Executor`] takes tasks and runs them later.
//!
//! The daemon uses a [`WorkerPool`] (threads fed by a bounded queue). Tests use a
//! [`ManualExecutor`], which only queues tasks and runs them when the test says so, on the
//! test's thread: what the prefetcher did is then decided by the test's steps, not by how long
//! a sleep let background threads run. [`Executor::wait_idle`] lets tests of the real pool wait
//! for it to finish its work instead of sleeping.

use std::collections::VecDeque;
use std::thread;

use crossbeam::channel::{bounded, Sender, TrySendError};

use crate::sync::{lock, wait, Condvar, Mutex};

/// One unit of work.
pub type Task = Box<dyn FnOnce() + Send>;

/// Runs tasks later.
pub trait Executor: Send + Sync {
    /// Takes `task` to run later, or gives it back when no more work can be taken now (the
    /// prefetcher then drops it: a reader that outruns the disk fetches its chunks itself).
    fn submit(&self, task: Task) -> Result<(), Task>;

    /// Returns once every task submitted so far has run.
    fn wait_idle(&self);
}

/// Tasks submitted and not yet finished, for [`Executor::wait_idle`].
struct Pending {
    count: Mutex<usize>,
    zero: Condvar,
}

impl Pending {
    fn add(&self) {
        *lock(&self.count) += 1;
    }

    fn done(&self) {
        let mut count = lock(&self.count);
        *count -= 1;
        if *count == 0 {
            self.zero.notify_all();
        }
    }

    fn wait_zero(&self) {
        let mut count = lock(&self.count);
        while *count > 0 {
            count = wait(&self.zero, count);
        }
    }
}

/// `workers` threads taking tasks from a queue of at most `depth`; a full queue refuses.
pub struct WorkerPool {
    queue: Sender<Task>,
    pending: std::sync::Arc<Pending>,
}

impl WorkerPool {
    /// Starts the threads (named `{name}-{i}`). A thread that cannot start is logged and the
    /// pool runs with fewer.
    pub fn new(name: &str, workers: usize, depth: usize) -> WorkerPool {
        let (queue, tasks) = bounded::<Task>(depth);
        let pending = std::sync::Arc::new(Pending {
            count: Mutex::new(0),
            zero: Condvar::new(),
        });
        for worker in 0..workers {
            let tasks = tasks.clone();
            let pending = std::sync::Arc::clone(&pending);
            let spawned = thread::Builder::new()
                .name(format!("{name}-{worker}"))
                .spawn(move || {
                    lower_priority();
                    for task in tasks {
                        task();
                        pending.done();
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a worker thread; running with fewer");
            }
        }
        WorkerPool { queue, pending }
    }
}

impl Executor for WorkerPool {
    fn submit(&self, task: Task) -> Result<(), Task> {
        self.pending.add();
        match self.queue.try_send(task) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(task)) | Err(TrySendError::Disconnected(task)) => {
                self.pending.done();
                Err(task)
            }
        }
    }

    fn wait_idle(&self) {
        self.pending.wait_zero();
    }
}

/// Queues tasks (up to `depth`) and runs them only in [`ManualExecutor::run_pending`] (or
/// [`Executor::wait_idle`]), on the caller's thread. For tests.
pub struct ManualExecutor {
    tasks: Mutex<VecDeque<Task>>,
    depth: usize,
}

impl ManualExecutor {
    pub fn new(depth: usize) -> ManualExecutor {
        ManualExecutor {
            tasks: Mutex::new(VecDeque::new()),
            depth,
        }
    }

    /// Tasks waiting.
    pub fn len(&self) -> usize {
        lock(&self.tasks).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs queued tasks in order (and any they queue) until none is left; returns how many ran.
    pub fn run_pending(&self) -> usize {
        let mut ran = 0;
        loop {
            // Not held while the task runs: a task may submit more.
            let next = lock(&self.tasks).pop_front();
            let Some(task) = next else { return ran };
            task();
            ran += 1;
        }
    }
}

impl Executor for ManualExecutor {
    fn submit(&self, task: Task) -> Result<(), Task> {
        let mut tasks = lock(&self.tasks);
        if tasks.len() >= self.depth {
            return Err(task);
        }
        tasks.push_back(task);
        Ok(())
    }

    fn wait_idle(&self) {
        self.run_pending();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_pool_runs_everything_it_took_and_refuses_past_its_depth() {
        let pool = WorkerPool::new("test-pool", 2, 4);
        let ran = Arc::new(AtomicUsize::new(0));
        let mut taken = 0;
        for _ in 0..100 {
            let ran = Arc::clone(&ran);
            if pool
                .submit(Box::new(move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                }))
                .is_ok()
            {
                taken += 1;
            }
        }
        pool.wait_idle();
        assert_eq!(ran.load(Ordering::SeqCst), taken);
    }

    #[test]
    fn a_manual_executor_runs_only_when_told() {
        let exec = ManualExecutor::new(2);
        let ran = Arc::new(AtomicUsize::new(0));
        for expect_ok in [true, true, false] {
            let ran = Arc::clone(&ran);
            let task: Task = Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            });
            assert_eq!(exec.submit(task).is_ok(), expect_ok);
        }
        assert_eq!((ran.load(Ordering::SeqCst), exec.len()), (0, 2));
        assert_eq!(exec.run_pending(), 2);
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }
}

/// Nice value of the daemon's prefetch workers: below the threads serving requests, so that a
/// reader's requests get the CPU first and prefetch runs in the time the reader leaves.
///
/// Reading the source costs CPU where it is a RAM-backed device (the benchmark's zram copies
/// every page in the reading thread) and on a small machine: on 2 cores, the prefetch of the
/// next 210 MB block ran while the reader read the current one, and that read took 44 ms against
/// 31 ms with nothing prefetching (tests/bench/issue11.py point 3). At nice 10 the cold pass
/// stalled 4.2–4.7 points above the pass from RAM instead of 5.3–6.8, and with 53 MB blocks 5.9
/// instead of 8.8; the prefetch still kept its lead, as the reader computes between blocks.
/// With the lead deferred to the reader's pauses (`pace::ReaderPace::wait_until_paused`) it
/// still matters, as reads of the current block's rest and the first chunks of a deferred block
/// overlap the reader's reading: 3 passes each, same session, 53 MB blocks 3.2 points at nice 10
/// against 5.1 at nice 0 (210 MB blocks: 3.1 and 1.5, within the run-to-run spread).
/// A reader that waits for a chunk a worker is reading stops using the CPU, which leaves it to
/// that worker: a low priority delays prefetch, it does not starve a reader.
#[cfg(target_os = "linux")]
const PREFETCH_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to [`PREFETCH_NICE`] (Linux; a no-op elsewhere).
/// Raising one's own nice value needs no privilege; a failure only leaves the priority as is.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: setpriority(2) on this thread's own id reads and writes no memory of ours.
        let failed = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, PREFETCH_NICE) != 0
        };
        if failed {
            tracing::debug!(error = %std::io::Error::last_os_error(), "prefetch worker keeps its priority");
        }
    }
}
