//! Read faults of a source that stops answering or fails for a while: entries of the faults
//! file with a `read_fault` object (its range is its own, so the plain `start`/`end` EIO ranges
//! never see these entries):
//!
//! ```json
//! {"file": "m.safetensors", "read_fault": {"start": 0, "end": 4096, "hang": true}}
//! {"file": "m.safetensors", "read_fault": {"start": 0, "end": 4096, "fail_first": 2, "errno": 5}}
//! ```
//!
//! - `hang`: a read overlapping the range does not answer until the entry is gone from the
//!   faults file (a network filesystem whose server stopped); it then completes normally. The
//!   wait is polled every 20 ms and gives up after [`HANG_LIMIT`], so a forgotten fault cannot
//!   keep the process from ever exiting.
//! - `fail_first: N`: the first N reads overlapping the range fail with `errno` (default
//!   `EIO`), later ones succeed (a transient error that clears by itself); counted per entry
//!   (file, range, N, errno) for the life of the process.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The longest a hung read waits for its fault to be cleared.
pub const HANG_LIMIT: Duration = Duration::from_secs(300);
const POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
pub struct ReadFault {
    #[serde(default)]
    pub start: u64,
    #[serde(default)]
    pub end: u64,
    #[serde(default)]
    pub hang: bool,
    #[serde(default)]
    pub fail_first: u64,
    #[serde(default)]
    pub errno: Option<i32>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    file: String,
    #[serde(default)]
    read_fault: Option<ReadFault>,
}

impl ReadFault {
    fn overlaps(&self, offset: u64, len: u64) -> bool {
        self.start < offset.saturating_add(len) && offset < self.end
    }
}

/// The `read_fault` entries of one faults file, and how many reads each `fail_first` entry
/// failed so far.
pub struct ReadFaults {
    failed: Mutex<HashMap<(String, ReadFault), u64>>,
}

impl ReadFaults {
    pub fn new() -> ReadFaults {
        ReadFaults {
            failed: Mutex::new(HashMap::new()),
        }
    }

    /// The `read_fault` entries for `rel` in `text` (the faults file; none if unparsable:
    /// the plain parser reports that).
    fn entries(faults_path: &Path, rel: &Path) -> Vec<ReadFault> {
        let Ok(text) = std::fs::read(faults_path) else {
            return Vec::new();
        };
        serde_json::from_slice::<Vec<Entry>>(&text)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| Path::new(&e.file) == rel)
            .filter_map(|e| e.read_fault)
            .collect()
    }

    /// What a read of `[offset, offset + len)` of `rel` meets before it is served: `Some(errno)`
    /// to fail it with; `None` to serve it (after waiting out a hang).
    pub fn before_read(
        &self,
        faults_path: &Path,
        rel: &Path,
        offset: u64,
        len: u64,
    ) -> Option<i32> {
        let hangs =
            |entries: &[ReadFault]| entries.iter().any(|f| f.hang && f.overlaps(offset, len));
        let entries = Self::entries(faults_path, rel);
        if hangs(&entries) {
            eprintln!(
                "faultfs: hanging a read of {} [{offset}, +{len})",
                rel.display()
            );
            let since = Instant::now();
            while since.elapsed() < HANG_LIMIT && hangs(&Self::entries(faults_path, rel)) {
                std::thread::sleep(POLL);
            }
            eprintln!(
                "faultfs: hung read of {} [{offset}, +{len}) released",
                rel.display()
            );
        }
        let key = rel.to_string_lossy().into_owned();
        let mut failed = self.failed.lock().ok()?;
        for fault in entries
            .iter()
            .filter(|f| f.fail_first > 0 && f.overlaps(offset, len))
        {
            let count = failed.entry((key.clone(), fault.clone())).or_insert(0);
            if *count < fault.fail_first {
                *count += 1;
                let errno = fault.errno.unwrap_or(libc::EIO);
                eprintln!(
                    "faultfs: transient errno {errno} ({} of {}) for {} [{offset}, +{len})",
                    *count,
                    fault.fail_first,
                    rel.display()
                );
                return Some(errno);
            }
        }
        None
    }
}
