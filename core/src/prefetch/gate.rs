//! How many reads of sources read in order are in flight, readers first.
//!
//! **Contract.** Every read of a chunk (or a run of chunks) from a source that is read in order
//! ([`super::Pacing::Ordered`]) holds a pass of the mount's [`SourceGate`] from before it claims
//! its chunks in the cache until the source has answered it (settling the chunks, cutting them
//! into their own buffers, needs none): read-ahead tasks of the lane and readers' misses
//! alike. At most `depth` passes are out at once (the lane's depth, which the
//! bandwidth-delay product of the source sets); a reader waiting for a pass gets the next one
//! before any read-ahead does. Holding a pass, a read may wait for a chunk another read is
//! loading: that read holds a pass already (or needs none), so it never waits for this one.
//! A reader waits for its pass at most the time it is given ([`SourceGate::pass_within`]: a
//! quarter of the source's deadline in the daemon, what one request is sized to take) and then
//! reads without one: behind a request stuck until its deadline, a reader would otherwise get
//! its error only after that deadline and then its own.
//!
//! Why: a source that charges per request serves two requests at two offsets by alternating
//! between them (a disk's head, a store's client fetching its own chunks for each), so a
//! reader's miss read beside the lane's request costs a seek for every piece of both
//! ([measured](../../../docs/PERFORMANCE.md#slow-and-network-sources)). Through the gate the
//! source sees one stream, the reader's miss served next, with the read-ahead queued after it
//! joined to it.

use std::time::{Duration, Instant};

use crate::sync::{lock, wait, wait_timeout, Condvar, Mutex};

#[derive(Debug, Default)]
struct Passes {
    out: usize,
    depth: usize,
    readers_waiting: usize,
}

/// The passes of the module docs.
#[derive(Debug)]
pub struct SourceGate {
    passes: Mutex<Passes>,
    changed: Condvar,
}

/// Who asks for a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A reader's miss: served before any read ahead waiting.
    Reader,
    /// A read ahead of a reader.
    ReadAhead,
}

/// A pass, given back when dropped.
#[must_use]
pub struct Pass<'a> {
    gate: &'a SourceGate,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut passes = lock(&self.gate.passes);
        passes.out -= 1;
        drop(passes);
        self.gate.changed.notify_all();
    }
}

impl Default for SourceGate {
    fn default() -> Self {
        SourceGate {
            passes: Mutex::new(Passes {
                depth: 1,
                ..Passes::default()
            }),
            changed: Condvar::new(),
        }
    }
}

impl SourceGate {
    /// Sets how many passes may be out (at least one).
    pub fn set_depth(&self, depth: usize) {
        let mut passes = lock(&self.passes);
        if passes.depth != depth.max(1) {
            passes.depth = depth.max(1);
            drop(passes);
            self.changed.notify_all();
        }
    }

    /// Waits for a pass (see the module docs).
    pub fn pass(&self, asker: Asker) -> Pass<'_> {
        loop {
            // Without a limit the wait ends only with a pass.
            if let Some(pass) = self.pass_within(asker, None) {
                return pass;
            }
        }
    }

    /// Waits for a pass at most `limit` (`None`: as long as it takes); `None` if none came.
    pub fn pass_within(&self, asker: Asker, limit: Option<Duration>) -> Option<Pass<'_>> {
        let until = limit.map(|l| Instant::now() + l);
        let mut passes = lock(&self.passes);
        if asker == Asker::Reader {
            passes.readers_waiting += 1;
        }
        let got = loop {
            let full = passes.out >= passes.depth;
            let behind_a_reader = asker == Asker::ReadAhead && passes.readers_waiting > 0;
            if !full && !behind_a_reader {
                break true;
            }
            passes = match until {
                None => wait(&self.changed, passes),
                Some(until) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break false;
                    }
                    wait_timeout(&self.changed, passes, left).0
                }
            };
        };
        if asker == Asker::Reader {
            passes.readers_waiting -= 1;
        }
        if got {
            passes.out += 1;
        }
        drop(passes);
        if asker == Asker::Reader {
            self.changed.notify_all(); // read-ahead held back for this reader may go
        }
        got.then(|| Pass { gate: self })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn no_more_than_the_depth_are_out_at_once() {
        let gate = Arc::new(SourceGate::default());
        gate.set_depth(2);
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let (gate, now, most) = (Arc::clone(&gate), Arc::clone(&now), Arc::clone(&most));
                std::thread::spawn(move || {
                    let asker = if i % 2 == 0 {
                        Asker::Reader
                    } else {
                        Asker::ReadAhead
                    };
                    let _pass = gate.pass(asker);
                    most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_waiting_reader_goes_before_waiting_read_ahead() {
        let gate = Arc::new(SourceGate::default());
        let held = gate.pass(Asker::ReadAhead);
        let order = Arc::new(Mutex::new(Vec::new()));
        let ahead = {
            let (gate, order) = (Arc::clone(&gate), Arc::clone(&order));
            std::thread::spawn(move || {
                let _pass = gate.pass(Asker::ReadAhead);
                lock(&order).push("read-ahead");
            })
        };
        // the read-ahead is waiting before the reader asks
        std::thread::sleep(Duration::from_millis(50));
        let reader = {
            let (gate, order) = (Arc::clone(&gate), Arc::clone(&order));
            std::thread::spawn(move || {
                let _pass = gate.pass(Asker::Reader);
                lock(&order).push("reader");
                std::thread::sleep(Duration::from_millis(20));
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        reader.join().unwrap();
        ahead.join().unwrap();
        assert_eq!(*lock(&order), ["reader", "read-ahead"]);
    }

    #[test]
    fn a_reader_waits_no_longer_than_its_limit() {
        let gate = SourceGate::default();
        let held = gate.pass(Asker::ReadAhead);
        let t0 = Instant::now();
        assert!(gate
            .pass_within(Asker::Reader, Some(Duration::from_millis(50)))
            .is_none());
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        // the reader that gave up holds nothing back: a read-ahead gets the pass once free
        drop(held);
        assert!(gate
            .pass_within(Asker::ReadAhead, Some(Duration::from_millis(50)))
            .is_some());
    }

    #[test]
    fn a_deeper_gate_lets_waiting_passes_go() {
        let gate = Arc::new(SourceGate::default());
        let held = gate.pass(Asker::Reader);
        let waiter = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || drop(gate.pass(Asker::ReadAhead)))
        };
        std::thread::sleep(Duration::from_millis(20));
        gate.set_depth(2);
        waiter.join().unwrap();
        drop(held);
    }
}
