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
        WorkerPool::with_nice(name, workers, depth, 0)
    }

    /// [`Self::new`] with threads at nice value `nice` (Linux; 0 keeps the daemon's priority).
    pub fn with_nice(name: &str, workers: usize, depth: usize, nice: i32) -> WorkerPool {
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
                    if nice != 0 {
                        lower_priority(nice);
                    }
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

/// Lowers the calling thread's CPU priority to `nice` (Linux; a no-op elsewhere). Raising one's
/// own nice value needs no privilege (lowering it back would); a failure only leaves the
/// priority as is.
fn lower_priority(nice: i32) {
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
    #[cfg(target_os = "linux")]
    {
        // SAFETY: setpriority(2) on this thread's own id reads and writes no memory of ours.
        let failed = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) != 0
        };
        if failed {
            tracing::debug!(error = %std::io::Error::last_os_error(), "prefetch worker keeps its priority");
        }
    }
}
