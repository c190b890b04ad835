//! Tests of [`super::SourceFile`]: exact aligned and buffered reads, the page two chunks
//! share, truncation, identity, spare buffers.

use super::*;
use std::io::Write;

fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    f
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn dropped_buffers_are_reused_and_fully_overwritten() {
    // A footprint no other test uses, so that only this test takes these spares.
    let len = 2 * SpareBuffersConfig::DEFAULT.min_bytes + 5 * 4096;
    // Two files of different bytes: a buffer that held one file's chunk must show only the
    // other's bytes once reused.
    let first = pattern(len + 4096);
    let second: Vec<u8> = first.iter().map(|b| !b).collect();
    let (f1, f2) = (file_with(&first), file_with(&second));
    let (s1, s2) = (
        SourceFile::open(f1.path()).unwrap(),
        SourceFile::open(f2.path()).unwrap(),
    );
    let (start, end) = (100u64, 100 + len as u64 - 4096);
    let base = |bytes: &AlignedBytes| bytes.as_slice().as_ptr() as usize - start as usize;
    // Other tests dropping big buffers at the same moment can push the spare out: retry.
    let reused = (0..10).any(|_| {
        let held = s1.read_aligned(start, end).unwrap();
        let address = base(&held);
        drop(held);
        let got = s2.read_aligned(start, end).unwrap();
        assert_eq!(got.as_slice(), &second[start as usize..end as usize]);
        base(&got) == address
    });
    assert!(reused, "a dropped chunk's mapping was not reused");
}

#[test]
fn aligned_reads_return_exact_bytes_at_any_offset() {
    let data = pattern(3 * 4096 + 123);
    let f = file_with(&data);
    let src = SourceFile::open(f.path()).unwrap();
    for (start, end) in [
        (0, 10),
        (1, 4097),
        (4095, 8193),
        (100, data.len()),
        (12000, 12411),
    ] {
        let got = src.read_aligned(start as u64, end as u64).unwrap();
        assert_eq!(got.as_slice(), &data[start..end], "range {start}..{end}");
        assert!(got.footprint() >= (end - start) as u64);
        assert_eq!(got.footprint() % DIRECT_IO_ALIGN, 0);
    }
}

type ReadLog = Arc<std::sync::Mutex<Vec<(u64, usize)>>>;

/// A descriptor that may refuse reads with `EINVAL` (an `O_DIRECT` one, as FUSE and network
/// filesystems do) and may record the reads it is asked for.
struct Recorded {
    file: File,
    refuse: bool,
    reads: Option<ReadLog>,
}

impl ReadAt for Recorded {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if self.refuse {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if let Some(reads) = &self.reads {
            reads.lock().unwrap().push((offset, buf.len()));
        }
        self.file.read_at(buf, offset)
    }
}

/// A wrapper recording the reads of the `O_DIRECT` descriptor (`direct`) or, with its
/// direct reads refused, of the plain one; and the log.
#[cfg(target_os = "linux")]
fn recording(direct: bool) -> (ReadWrapper, ReadLog) {
    use std::os::fd::AsRawFd;
    let reads = ReadLog::default();
    let log = Arc::clone(&reads);
    let wrap: ReadWrapper = Arc::new(move |file: File| {
        // SAFETY: F_GETFL only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        let is_direct = flags & libc::O_DIRECT != 0;
        Arc::new(Recorded {
            file,
            refuse: is_direct && !direct,
            reads: (is_direct == direct).then(|| Arc::clone(&log)),
        }) as Arc<dyn ReadAt>
    });
    (wrap, reads)
}

#[cfg(target_os = "linux")]
#[test]
fn buffered_reads_ask_for_the_range_only_not_its_whole_pages() {
    let data = pattern(5 * 4096);
    let f = file_with(&data);
    let (wrap, reads) = recording(false);
    let src = SourceFile::open_with(&PlainPaths, f.path(), Some(&wrap)).unwrap();
    // Two adjacent chunks sharing a page, read one after the other: the bytes of the
    // shared page before the second's start are not asked for again.
    for (start, end) in [(5000u64, 9000u64), (9000, 14000)] {
        reads.lock().unwrap().clear();
        let got = src.read_aligned(start, end).unwrap();
        assert_eq!(got.as_slice(), &data[start as usize..end as usize]);
        assert_eq!(got.footprint(), aligned_footprint(start, end));
        let asked = reads.lock().unwrap().clone();
        assert_eq!(asked.first().map(|r| r.0), Some(start), "{asked:?}");
        let bytes: usize = asked.iter().map(|r| r.1).sum();
        assert_eq!(bytes as u64, end - start, "{asked:?}");
    }
    assert!(!src.uses_direct_io());
}

#[cfg(target_os = "linux")]
#[test]
fn a_direct_read_of_the_next_chunk_does_not_read_the_shared_page_again() {
    let data = pattern(6 * 4096);
    let f = file_with(&data);
    let (wrap, reads) = recording(true);
    let src = SourceFile::open_with(&PlainPaths, f.path(), Some(&wrap)).unwrap();
    // Three adjacent chunks, read in order; the second's start shares the first's last page.
    let mut asked_from = Vec::new();
    for (start, end) in [(100u64, 9000u64), (9000, 17000), (17000, 6 * 4096)] {
        reads.lock().unwrap().clear();
        let got = src.read_aligned(start, end).unwrap();
        assert_eq!(got.as_slice(), &data[start as usize..end as usize]);
        asked_from.push(reads.lock().unwrap().first().map(|r| r.0));
    }
    assert!(
        src.uses_direct_io(),
        "this test needs a filesystem with O_DIRECT"
    );
    assert_eq!(asked_from, [Some(0), Some(3 * 4096), Some(5 * 4096)]);
    // Out of order, the page is read from the source as before.
    reads.lock().unwrap().clear();
    let got = src.read_aligned(9000, 17000).unwrap();
    assert_eq!(got.as_slice(), &data[9000..17000]);
    assert_eq!(reads.lock().unwrap().first().map(|r| r.0), Some(2 * 4096));
}

#[test]
fn reading_past_the_end_is_reported_as_truncation() {
    let f = file_with(&pattern(5000));
    let src = SourceFile::open(f.path()).unwrap();
    let err = src.read_aligned(4000, 6000).unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::Truncated {
                wanted_end: 6000,
                got_end: 5000,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn identity_changes_when_the_file_is_rewritten() {
    let f = file_with(&pattern(100));
    let before = SourceIdentity::of_path(f.path()).unwrap();
    std::fs::write(f.path(), pattern(101)).unwrap();
    let after = SourceIdentity::of_path(f.path()).unwrap();
    assert_ne!(before, after);
}
