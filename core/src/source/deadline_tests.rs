//! The deadline, the bound on stuck threads and the retries of [`SourceIo::read`], with a fake
//! source: closures that block on a gate the test opens, or fail a set number of times. No
//! sleep decides an outcome; every wait is bounded.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel;

use super::*;

/// A bound no healthy step of these tests comes near: a hang shows as a failure, not a stuck
/// test run.
const BOUND: Duration = Duration::from_secs(20);

fn io_with(timeout: Option<Duration>, max_threads: usize) -> SourceIo {
    SourceIo::new(SourceIoConfig {
        timeout,
        retry: RetryPolicy {
            max_attempts: 4,
            first_backoff: Duration::from_millis(1),
            backoff_factor: 2,
            max_backoff: Duration::from_millis(10),
        },
        max_threads,
        idle_exit: Duration::from_secs(60),
    })
}

/// A read error of `kind` (portable: the Windows checks run these tests too).
fn failed(kind: io::ErrorKind) -> SourceError {
    SourceError::Read {
        path: "f".into(),
        offset: 0,
        source: io::Error::from(kind),
    }
}

#[cfg(target_os = "linux")]
fn os(code: i32) -> SourceError {
    SourceError::Read {
        path: "f".into(),
        offset: 0,
        source: io::Error::from_raw_os_error(code),
    }
}

/// A source read that blocks until the gate is opened (its sender dropped or sent to).
fn gate() -> (channel::Sender<()>, channel::Receiver<()>) {
    channel::bounded(0)
}

/// Waits (bounded) until `done` holds.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < BOUND, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_read_that_never_returns_times_out_and_its_late_result_is_dropped() {
    let timeout = Duration::from_millis(100);
    let io = io_with(Some(timeout), 8);
    let (open, wait) = gate();
    let returned = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&returned);
    let started = Instant::now();
    let got = io.read((Path::new("f"), 4096), move |_| {
        let _ = wait.recv();
        flag.store(true, Ordering::SeqCst);
        Ok(vec![1u8; 16])
    });
    let took = started.elapsed();
    assert!(
        matches!(got, Err(SourceError::TimedOut { offset: 4096, .. })),
        "{got:?}"
    );
    assert!(took >= timeout, "gave up before its deadline: {took:?}");
    assert!(took < BOUND, "took {took:?}");
    let s = io.snapshot();
    assert_eq!((s.timeouts, s.stuck, s.errors, s.retries), (1, 1, 0, 0));

    // The source answers at last: its result goes nowhere, and the thread serves again.
    drop(open);
    eventually("the stuck read returned", || {
        returned.load(Ordering::SeqCst) && io.snapshot().stuck == 0
    });
    let again = io.read((Path::new("f"), 0), |_| Ok(vec![2u8; 4]));
    assert_eq!(again.unwrap(), vec![2u8; 4]);
    assert_eq!(io.snapshot().threads, 1, "the returned thread was reused");
}

#[test]
fn when_every_thread_is_stuck_new_reads_fail_at_once_and_recover_after() {
    let io = Arc::new(io_with(Some(Duration::from_millis(500)), 2));
    let (open, wait) = gate();
    for _ in 0..2 {
        let wait = wait.clone();
        let got = io.read((Path::new("f"), 0), move |_| {
            let _ = wait.recv();
            Ok(())
        });
        assert!(matches!(got, Err(SourceError::TimedOut { .. })), "{got:?}");
    }
    assert_eq!(io.snapshot().stuck, 2);
    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    let started = Instant::now();
    let refused = io.read((Path::new("f"), 0), move |_| {
        flag.store(true, Ordering::SeqCst);
        Ok(())
    });
    assert!(
        matches!(refused, Err(SourceError::Unresponsive { stuck: 2, .. })),
        "{refused:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "refused only at its deadline"
    );
    assert!(!ran.load(Ordering::SeqCst), "a refused read ran");
    let s = io.snapshot();
    assert_eq!((s.refused, s.threads), (1, 2), "no thread beyond the cap");

    drop(open);
    eventually("the stuck reads returned", || io.snapshot().stuck == 0);
    assert_eq!(io.read((Path::new("f"), 0), |_| Ok(7)).unwrap(), 7);
}

#[test]
fn reads_queued_behind_busy_threads_still_finish() {
    // More concurrent healthy reads than threads: they queue, none is refused.
    let io = Arc::new(io_with(Some(BOUND), 2));
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let io = Arc::clone(&io);
            std::thread::spawn(move || io.read((Path::new("f"), i), move |_| Ok(i)))
        })
        .collect();
    for (i, reader) in readers.into_iter().enumerate() {
        assert_eq!(reader.join().unwrap().unwrap(), i as u64);
    }
    let s = io.snapshot();
    assert!(s.threads <= 2);
    assert_eq!((s.refused, s.timeouts), (0, 0));
}

#[test]
fn transient_errors_are_retried_until_they_clear() {
    let io = io_with(Some(BOUND), 4);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let got = io.read((Path::new("f"), 0), move |_| {
        match counted.fetch_add(1, Ordering::SeqCst) {
            0 => Err(failed(io::ErrorKind::TimedOut)),
            1 => Err(failed(io::ErrorKind::ConnectionReset)),
            _ => Ok(b"bytes".to_vec()),
        }
    });
    assert_eq!(got.unwrap(), b"bytes");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let s = io.snapshot();
    assert_eq!((s.errors, s.retries, s.timeouts), (2, 2, 0));
}

#[test]
fn errors_about_the_file_are_not_retried_and_persistent_ones_stop_at_the_count() {
    let io = io_with(Some(BOUND), 4);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let got: Result<(), _> = io.read((Path::new("f"), 0), move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Err(failed(io::ErrorKind::PermissionDenied))
    });
    assert!(matches!(got, Err(SourceError::Read { .. })));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a permission error was retried"
    );

    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let got: Result<(), _> = io.read((Path::new("f"), 0), move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Err(failed(io::ErrorKind::ConnectionReset))
    });
    let Err(SourceError::Read { source, .. }) = got else {
        panic!("{got:?}");
    };
    assert_eq!(
        source.kind(),
        io::ErrorKind::ConnectionReset,
        "the last error goes back"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4, "max_attempts tries");
    assert_eq!(io.snapshot().retries, 3);
}

#[test]
fn no_retry_starts_when_its_pause_would_end_past_the_deadline() {
    let io = SourceIo::new(SourceIoConfig {
        timeout: Some(Duration::from_millis(200)),
        retry: RetryPolicy {
            first_backoff: Duration::from_secs(60),
            ..RetryPolicy::DEFAULT
        },
        ..SourceIoConfig::DEFAULT
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let got: Result<(), _> = io.read((Path::new("f"), 0), move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Err(failed(io::ErrorKind::TimedOut))
    });
    assert!(matches!(got, Err(SourceError::Read { .. })));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(io.snapshot().retries, 0);
}

#[test]
#[cfg(target_os = "linux")] // ESTALE
fn a_dead_descriptor_is_reopened_on_the_retry() {
    let io = io_with(Some(BOUND), 4);
    let seen = Arc::new(crate::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let got = io.read((Path::new("f"), 0), move |reopen| {
        let mut log = crate::sync::lock(&log);
        log.push(reopen);
        match log.len() {
            1 => Err(os(libc::ESTALE)),
            2 => Err(os(libc::EIO)),
            _ => Ok(()),
        }
    });
    assert!(got.is_ok());
    assert_eq!(*crate::sync::lock(&seen), vec![false, true, false]);
    assert_eq!(io.snapshot().reopens, 1);
}

#[test]
fn without_a_timeout_reads_run_on_the_callers_thread() {
    let io = io_with(None, 4);
    let caller = std::thread::current().id();
    let ran_on = io
        .read((Path::new("f"), 0), |_| Ok(std::thread::current().id()))
        .unwrap();
    assert_eq!(ran_on, caller);
    assert_eq!(io.snapshot().threads, 0);
}

#[test]
fn a_read_that_panics_gives_an_error_and_the_thread_serves_on() {
    let io = io_with(Some(BOUND), 1);
    let got: Result<(), _> = io.read((Path::new("f"), 0), |_| panic!("a bug in a read"));
    assert!(got.is_err());
    assert_eq!(io.read((Path::new("f"), 0), |_| Ok(3)).unwrap(), 3);
    assert_eq!(io.snapshot().threads, 1);
}

#[test]
fn idle_threads_end() {
    let io = SourceIo::new(SourceIoConfig {
        idle_exit: Duration::from_millis(20),
        ..SourceIoConfig::DEFAULT
    });
    io.read((Path::new("f"), 0), |_| Ok(())).unwrap();
    eventually("the idle thread ended", || io.snapshot().threads == 0);
    // And a new one starts for the next read.
    io.read((Path::new("f"), 0), |_| Ok(())).unwrap();
}
