//! The hard-disk model of `faultfs --disk`: one head, seeks, and a bandwidth cap.
//!
//! Contract: every read request that reaches faultfs is served through one [`Disk`], one at a
//! time (one head serves one request), and takes at least [`DiskModel::cost`] of wall time from
//! the moment it gets the head. Requests waiting for the head are served as a disk's command
//! queue (NCQ) and the kernel's elevator serve them: first the one that starts where the head
//! is (the continuation of the last request, which costs no seek), else the oldest. So the
//! pieces of one large read that arrive together are read in one sweep, while requests at
//! scattered offsets still pay a seek each:
//!
//! - a **seek** (`seek`, default 8 ms: an average seek plus half a rotation of a 7 200 rpm disk)
//!   when the request does not start where the previous request served by the disk ended, on the
//!   same file (another file, another offset, or the first request of the run);
//! - then its bytes at `bytes_per_s` (default 200 MB/s: the sequential rate of a recent 3.5"
//!   disk's outer tracks).
//!
//! So one sequential reader pays one seek and then streams at the cap, while readers at several
//! offsets at once (or requests served out of order) pay a seek for almost every request: the
//! order and the concurrency of reads count, as on a real disk.  The time the real read of the
//! backing file took is part of the request's time, not added to it.
//!
//! The counters ([`DiskStats`]) are written as JSON to `--disk-stats FILE` after every request
//! (written to a temporary name and renamed, so a reader never sees half a document), so that
//! tests compare the seeks of two read patterns rather than their wall-clock times.
//! `--disk-trace FILE` appends one line per request served, in the order the head served them:
//! microseconds since the disk started, file (faultfs inode), offset, length, and 1 if it paid
//! a seek, else 0; benchmarks read it to see where the seeks of a load come from.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The default seek: an average seek (~4 ms) plus half a rotation at 7 200 rpm (~4.2 ms).
pub const DEFAULT_SEEK: Duration = Duration::from_millis(8);
/// The default sequential rate of the modelled disk (bytes per second).
pub const DEFAULT_BYTES_PER_S: u64 = 200_000_000;

/// The modelled disk's two parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskModel {
    /// Paid by every request that is not contiguous with the previous one.
    pub seek: Duration,
    /// The transfer rate every request's bytes are served at (0: no cap).
    pub bytes_per_s: u64,
}

impl Default for DiskModel {
    fn default() -> Self {
        DiskModel {
            seek: DEFAULT_SEEK,
            bytes_per_s: DEFAULT_BYTES_PER_S,
        }
    }
}

impl DiskModel {
    /// The time a request of `len` bytes takes, with a seek first or not.
    pub fn cost(&self, seek: bool, len: u64) -> Duration {
        let transfer = if self.bytes_per_s == 0 {
            Duration::ZERO
        } else {
            // nanoseconds = len * 1e9 / rate, in u128 so that no size overflows
            let ns = u128::from(len) * 1_000_000_000 / u128::from(self.bytes_per_s);
            Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
        };
        if seek {
            self.seek + transfer
        } else {
            transfer
        }
    }
}

/// What the disk has served so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Read requests served.
    pub requests: u64,
    /// Requests that paid a seek.
    pub seeks: u64,
    /// Bytes served.
    pub bytes: u64,
    /// The modelled time of all requests (seeks and transfers), in nanoseconds.
    pub busy_ns: u64,
}

impl DiskStats {
    /// The counters as one line of JSON.
    pub fn to_json(self) -> String {
        format!(
            "{{\"requests\": {}, \"seeks\": {}, \"bytes\": {}, \"busy_us\": {}}}\n",
            self.requests,
            self.seeks,
            self.bytes,
            self.busy_ns / 1000
        )
    }
}

/// Where the head is: the file (faultfs inode) and the offset the last request ended at.
#[derive(Debug, Default)]
pub struct Head {
    at: Option<(u64, u64)>,
    pub stats: DiskStats,
}

impl Head {
    /// Moves the head over a request of `len` bytes at `offset` of file `ino` and counts it;
    /// returns the request's modelled time.
    pub fn serve(&mut self, model: &DiskModel, ino: u64, offset: u64, len: u64) -> Duration {
        let seek = self.seeks_to(ino, offset);
        self.at = Some((ino, offset.saturating_add(len)));
        let cost = model.cost(seek, len);
        self.stats.requests += 1;
        self.stats.seeks += u64::from(seek);
        self.stats.bytes += len;
        self.stats.busy_ns = self
            .stats
            .busy_ns
            .saturating_add(u64::try_from(cost.as_nanos()).unwrap_or(u64::MAX));
        cost
    }

    /// Whether a request at `offset` of file `ino` pays a seek.
    pub fn seeks_to(&self, ino: u64, offset: u64) -> bool {
        self.at != Some((ino, offset))
    }
}

/// The head and the requests waiting for it.
#[derive(Debug, Default)]
struct Queue {
    head: Head,
    /// A request holds the head.
    busy: bool,
    /// Requests waiting: (ticket, file, offset), tickets in arrival order.
    waiting: Vec<(u64, u64, u64)>,
    next_ticket: u64,
}

impl Queue {
    /// The ticket of the request the head serves next: the oldest of those that start where the
    /// head is, else the oldest.
    fn next(&self) -> Option<u64> {
        let continues = self
            .waiting
            .iter()
            .filter(|&&(_, ino, offset)| self.head.at == Some((ino, offset)))
            .map(|&(ticket, _, _)| ticket)
            .min();
        continues.or_else(|| self.waiting.iter().map(|&(ticket, _, _)| ticket).min())
    }
}

/// The disk: the model, the head and its queue, and where the counters go.
pub struct Disk {
    model: DiskModel,
    queue: Mutex<Queue>,
    /// Signalled when the head is released.
    free: Condvar,
    stats_path: Option<PathBuf>,
    /// `--disk-trace`: the file each served request is appended to, and when the disk started.
    trace: Option<(Mutex<File>, Instant)>,
}

impl Disk {
    pub fn new(model: DiskModel, stats_path: Option<PathBuf>, trace: Option<File>) -> Self {
        let disk = Disk {
            model,
            queue: Mutex::new(Queue::default()),
            free: Condvar::new(),
            stats_path,
            trace: trace.map(|file| (Mutex::new(file), Instant::now())),
        };
        disk.write_stats(&DiskStats::default());
        disk
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        match self.queue.lock() {
            Ok(q) => q,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Serves one request: waits for the head (see the module docs), holds it while `read`
    /// runs (it returns the bytes it read, or an error), then until the request's modelled time
    /// has passed.
    pub fn serve<T, E>(
        &self,
        ino: u64,
        offset: u64,
        read: impl FnOnce() -> Result<(T, u64), E>,
    ) -> Result<T, E> {
        let mut queue = self.lock();
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.waiting.push((ticket, ino, offset));
        while queue.busy || queue.next() != Some(ticket) {
            queue = match self.free.wait(queue) {
                Ok(q) => q,
                Err(poisoned) => poisoned.into_inner(),
            };
        }
        queue.waiting.retain(|&(t, _, _)| t != ticket);
        queue.busy = true;
        drop(queue);
        let t0 = Instant::now();
        let result = read();
        let mut queue = self.lock();
        let served = result.map(|(out, len)| {
            let seek = queue.head.seeks_to(ino, offset);
            let cost = queue.head.serve(&self.model, ino, offset, len);
            self.write_trace(t0, ino, offset, len, seek);
            (out, cost, queue.head.stats)
        });
        drop(queue);
        let out = match served {
            Ok((out, cost, stats)) => {
                self.write_stats(&stats);
                let left = cost.saturating_sub(t0.elapsed());
                if !left.is_zero() {
                    std::thread::sleep(left);
                }
                Ok(out)
            }
            Err(e) => Err(e),
        };
        self.lock().busy = false;
        self.free.notify_all();
        out
    }

    /// Appends one request to the `--disk-trace` file (called with the queue held, so lines are
    /// in the order the head served them).
    fn write_trace(&self, t0: Instant, ino: u64, offset: u64, len: u64, seek: bool) {
        let Some((file, started)) = &self.trace else {
            return;
        };
        let at = t0.saturating_duration_since(*started).as_micros();
        let line = format!("{at} {ino} {offset} {len} {}\n", u8::from(seek));
        let mut file = match file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!("faultfs: writing the disk trace: {e}");
        }
    }

    fn write_stats(&self, stats: &DiskStats) {
        let Some(path) = &self.stats_path else {
            return;
        };
        let tmp = tmp_name(path);
        if let Err(e) =
            std::fs::write(&tmp, stats.to_json()).and_then(|()| std::fs::rename(&tmp, path))
        {
            eprintln!("faultfs: writing {}: {e}", path.display());
        }
    }
}

fn tmp_name(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    #[test]
    fn cost_is_a_seek_plus_the_bytes_at_the_rate() {
        let m = DiskModel::default();
        assert_eq!(m.cost(false, 200 * MB), Duration::from_secs(1));
        assert_eq!(m.cost(false, 2 * MB), Duration::from_millis(10));
        assert_eq!(m.cost(true, 2 * MB), Duration::from_millis(18));
        assert_eq!(m.cost(true, 0), Duration::from_millis(8));
        let free = DiskModel {
            seek: Duration::ZERO,
            bytes_per_s: 0,
        };
        assert_eq!(free.cost(true, u64::MAX), Duration::ZERO);
        // no overflow for the largest request
        assert!(m.cost(false, u64::MAX) > Duration::from_secs(1 << 30));
    }

    #[test]
    fn the_queue_serves_the_continuation_first_then_the_oldest() {
        let mut q = Queue::default();
        q.head.serve(&DiskModel::default(), 1, 0, 100); // the head is at (1, 100)
        q.waiting = vec![(5, 1, 900), (6, 2, 100), (7, 1, 100), (8, 1, 100)];
        assert_eq!(
            q.next(),
            Some(7),
            "the oldest request continuing where the head is"
        );
        q.waiting.retain(|&(t, _, _)| t != 7 && t != 8);
        assert_eq!(q.next(), Some(5), "none continues: the oldest");
        q.waiting.clear();
        assert_eq!(q.next(), None);
    }

    #[test]
    fn a_sequential_stream_pays_one_seek() {
        let m = DiskModel::default();
        let mut h = Head::default();
        let chunk = 128 * 1024;
        let total: Duration = (0..100).map(|i| h.serve(&m, 2, i * chunk, chunk)).sum();
        assert_eq!(h.stats.requests, 100);
        assert_eq!(h.stats.seeks, 1);
        assert_eq!(h.stats.bytes, 100 * chunk);
        assert_eq!(total, m.cost(true, 0) + m.cost(false, 100 * chunk));
        assert_eq!(h.stats.busy_ns, u64::try_from(total.as_nanos()).unwrap());
    }

    #[test]
    fn interleaved_streams_seek_on_every_switch() {
        // 8 readers of 2 MiB pieces, each reading its piece in 128 KiB requests, the requests
        // of the readers taking turns: every request lands away from where the last one ended
        let m = DiskModel::default();
        let (piece, req) = (2u64 << 20, 128u64 << 10);
        let mut h = Head::default();
        for k in 0..piece / req {
            for r in 0..8 {
                h.serve(&m, 2, r * piece + k * req, req);
            }
        }
        assert_eq!(h.stats.requests, 8 * 16);
        assert_eq!(h.stats.seeks, 8 * 16);
        let mut seq = Head::default();
        for k in 0..8 * 16 {
            seq.serve(&m, 2, k * req, req);
        }
        assert_eq!(seq.stats.seeks, 1);
        assert_eq!(seq.stats.bytes, h.stats.bytes);
        // the same bytes: 128 seeks against 1
        assert_eq!(
            h.stats.busy_ns - seq.stats.busy_ns,
            127 * u64::try_from(m.seek.as_nanos()).unwrap()
        );
    }

    #[test]
    fn another_file_or_a_backward_request_is_a_seek() {
        let m = DiskModel::default();
        let mut h = Head::default();
        h.serve(&m, 2, 0, 4096); // first request: seek
        h.serve(&m, 2, 4096, 4096); // contiguous
        h.serve(&m, 3, 8192, 4096); // another file at the same offset: seek
        h.serve(&m, 3, 12288, 4096); // contiguous
        h.serve(&m, 3, 0, 4096); // backward: seek
        h.serve(&m, 3, 8192, 4096); // a gap ahead: seek
        assert_eq!(h.stats.requests, 6);
        assert_eq!(h.stats.seeks, 4);
    }

    #[test]
    fn a_short_read_moves_the_head_by_what_was_read() {
        let m = DiskModel::default();
        let mut h = Head::default();
        h.serve(&m, 2, 0, 1000); // asked for more, got 1000 (end of file)
        h.serve(&m, 2, 1000, 0);
        assert_eq!(h.stats.seeks, 1);
    }

    #[test]
    fn the_disk_serves_one_request_at_a_time_for_at_least_its_cost() {
        let m = DiskModel {
            seek: Duration::from_millis(20),
            bytes_per_s: 0,
        };
        let dir = std::env::temp_dir().join(format!("faultfs-disk-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stats = dir.join("stats.json");
        let trace = dir.join("trace");
        let trace_file = File::create(&trace).unwrap();
        let disk = std::sync::Arc::new(Disk::new(m, Some(stats.clone()), Some(trace_file)));
        let t0 = Instant::now();
        let threads: Vec<_> = (0..4u64)
            .map(|i| {
                let d = disk.clone();
                std::thread::spawn(move || {
                    d.serve(2, i * 1_000_000, || Ok::<_, ()>(((), 10))).unwrap()
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // four seeks of 20 ms, one after the other
        assert!(
            t0.elapsed() >= Duration::from_millis(80),
            "{:?}",
            t0.elapsed()
        );
        let text = std::fs::read_to_string(&stats).unwrap();
        assert_eq!(
            text,
            "{\"requests\": 4, \"seeks\": 4, \"bytes\": 40, \"busy_us\": 80000}\n"
        );
        // the trace: one line per request, in the order served, each a seek of 10 bytes
        let trace = std::fs::read_to_string(&trace).unwrap();
        let mut offsets: Vec<u64> = trace
            .lines()
            .map(|line| {
                let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
                assert_eq!((f.len(), f[1], f[3], f[4]), (5, 2, 10, 1), "{line}");
                f[2]
            })
            .collect();
        offsets.sort_unstable();
        assert_eq!(offsets, [0, 1_000_000, 2_000_000, 3_000_000]);
        let err = disk.serve(2, 0, || Err::<((), u64), _>("eio"));
        assert_eq!(err, Err("eio"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
