//! The ordered lane: reads ahead for sources that charge per request, started in the order
//! they were queued, at most `depth` at a time.
//!
//! **Contract.** Tasks start strictly in submission order (first in, first out); at most
//! [`OrderedLane::set_depth`] run at once (between 1 and the lane's threads), so with depth 1
//! the source sees one request after another in the order the prefetcher chose (file order,
//! [`super::pacing`]). A full queue refuses a task ([`Executor::submit`] gives it back), as the
//! worker pool does. A depth lowered while more tasks run lets those finish.
//!
//! Why a lane and not the worker pool with one thread: the depth follows the source's measured
//! bandwidth-delay product while the mount runs, and threads of a pool cannot be taken away.
//!
//! **Locks.** One mutex (the queue and the counts, through [`crate::sync`]), a leaf, never held
//! while a task runs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use super::executor::{Executor, Task};
use crate::sync::{lock, wait, Condvar, Mutex};

struct Queue {
    tasks: VecDeque<Task>,
    /// Tasks started and not finished.
    running: usize,
    /// False once the lane is dropped: threads exit when the queue is empty.
    open: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a task is queued, one finishes, or the depth changes.
    changed: Condvar,
    depth: AtomicUsize,
    capacity: usize,
}

/// See the module docs.
pub struct OrderedLane {
    shared: Arc<Shared>,
    threads: usize,
}

impl OrderedLane {
    /// A lane of `threads` threads (named `{name}-{i}`, the most that may run at once) and a
    /// queue of at most `capacity` tasks, starting at depth 1.
    pub fn new(name: &str, threads: usize, capacity: usize) -> OrderedLane {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                tasks: VecDeque::new(),
                running: 0,
                open: true,
            }),
            changed: Condvar::new(),
            depth: AtomicUsize::new(1),
            capacity,
        });
        let mut started = 0;
        for i in 0..threads.max(1) {
            let shared = Arc::clone(&shared);
            let spawned = thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&shared));
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a lane thread; running with fewer")
                }
            }
        }
        OrderedLane {
            shared,
            threads: started,
        }
    }

    /// Tasks that may run at once from now on (clamped to 1 and the lane's threads).
    pub fn set_depth(&self, depth: usize) {
        let depth = depth.clamp(1, self.threads.max(1));
        if self.shared.depth.swap(depth, Ordering::Relaxed) != depth {
            let _queue = lock(&self.shared.queue);
            self.shared.changed.notify_all();
        }
    }

    /// Tasks that may run at once.
    pub fn depth(&self) -> usize {
        self.shared.depth.load(Ordering::Relaxed)
    }
}

/// A lane thread: takes the oldest task whenever fewer than `depth` run.
fn work(shared: &Shared) {
    let mut queue = lock(&shared.queue);
    loop {
        let room = queue.running < shared.depth.load(Ordering::Relaxed);
        if room {
            if let Some(task) = queue.tasks.pop_front() {
                queue.running += 1;
                drop(queue);
                task();
                queue = lock(&shared.queue);
                queue.running -= 1;
                shared.changed.notify_all();
                continue;
            }
            if !queue.open {
                return;
            }
        }
        queue = wait(&shared.changed, queue);
    }
}

impl Executor for OrderedLane {
    fn submit(&self, task: Task) -> Result<(), Task> {
        let mut queue = lock(&self.shared.queue);
        if queue.tasks.len() >= self.shared.capacity || self.threads == 0 {
            return Err(task);
        }
        queue.tasks.push_back(task);
        self.shared.changed.notify_all();
        Ok(())
    }

    fn wait_idle(&self) {
        let mut queue = lock(&self.shared.queue);
        while !queue.tasks.is_empty() || queue.running > 0 {
            queue = wait(&self.shared.changed, queue);
        }
    }
}

impl Drop for OrderedLane {
    fn drop(&mut self) {
        lock(&self.shared.queue).open = false;
        self.shared.changed.notify_all();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn tasks_start_in_order_and_no_more_than_the_depth_run_at_once() {
        let lane = OrderedLane::new("test-lane", 4, 64);
        let started = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let submit_all = |from: usize, lane: &OrderedLane| {
            for i in from..from + 16 {
                let (started, running, most) = (
                    Arc::clone(&started),
                    Arc::clone(&running),
                    Arc::clone(&most),
                );
                let task: Task = Box::new(move || {
                    lock(&started).push(i);
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(2));
                    running.fetch_sub(1, Ordering::SeqCst);
                });
                assert!(lane.submit(task).is_ok());
            }
        };
        submit_all(0, &lane);
        lane.wait_idle();
        assert_eq!(most.load(Ordering::SeqCst), 1, "depth 1: one at a time");
        assert_eq!(*lock(&started), (0..16).collect::<Vec<_>>());

        lane.set_depth(3);
        submit_all(16, &lane);
        lane.wait_idle();
        let most = most.load(Ordering::SeqCst);
        assert!(
            (2..=3).contains(&most),
            "depth 3: up to three at once, saw {most}"
        );
        let order = lock(&started).clone();
        assert_eq!(order.len(), 32);
        // Started in order: each task starts before any later one may, up to two overtaking
        // at the lock with three threads; the first sixteen strictly.
        assert_eq!(&order[..16], &(0..16).collect::<Vec<_>>()[..]);
        lane.set_depth(99);
        assert_eq!(lane.depth(), 4, "clamped to the threads");
    }

    #[test]
    fn a_full_lane_refuses_and_gives_the_task_back() {
        let lane = OrderedLane::new("test-lane-full", 1, 2);
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let blocker = Arc::clone(&gate);
        let block: Task = Box::new(move || {
            let (open, cv) = &*blocker;
            let mut open = lock(open);
            while !*open {
                open = wait(cv, open);
            }
        });
        assert!(lane.submit(block).is_ok());
        // The blocker may not have started yet: fill until the lane refuses.
        let mut taken = 0;
        while lane.submit(Box::new(|| {})).is_ok() {
            taken += 1;
            assert!(taken <= 3, "a lane of capacity 2 took more");
        }
        let (open, cv) = &*gate;
        *lock(open) = true;
        cv.notify_all();
        lane.wait_idle();
    }
}
