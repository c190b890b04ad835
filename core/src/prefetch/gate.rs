//! How many reads of sources read in order are in flight, readers first.
//!
//! **Contract.** Every read of a chunk (or a run of chunks) from a source that is read in order
//! ([`super::Pacing::Ordered`]) holds a pass of the mount's [`SourceGate`] from before it claims
//! its chunks in the cache until its read is settled: read-ahead tasks of the lane and readers'
//! misses alike. At most `depth` passes are out at once (the lane's depth, which the
//! bandwidth-delay product of the source sets); a reader waiting for a pass gets the next one
//! before any read-ahead does. Holding a pass, a read may wait for a chunk another read is
//! loading: that read holds a pass already (or needs none), so it never waits for this one.
//!
//! Why: a source that charges per request serves two requests at two offsets by alternating
//! between them (a disk's head, a store's client fetching its own chunks for each), so a
//! reader's miss read beside the lane's request costs a seek for every piece of both
//! ([measured](../../../docs/PERFORMANCE.md#slow-and-network-sources)). Through the gate the
//! source sees one stream, the reader's miss served next, with the read-ahead queued after it
//! joined to it.

use crate::sync::{lock, wait, Condvar, Mutex};

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
        let mut passes = lock(&self.passes);
        if asker == Asker::Reader {
            passes.readers_waiting += 1;
        }
        loop {
            let full = passes.out >= passes.depth;
            let behind_a_reader = asker == Asker::ReadAhead && passes.readers_waiting > 0;
            if !full && !behind_a_reader {
                break;
            }
            passes = wait(&self.changed, passes);
        }
        if asker == Asker::Reader {
            passes.readers_waiting -= 1;
        }
        passes.out += 1;
        drop(passes);
        if asker == Asker::Reader {
            self.changed.notify_all(); // read-ahead held back for this reader may go
        }
        Pass { gate: self }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

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
