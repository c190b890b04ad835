use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use super::*;

const MIB: u64 = 1 << 20;
const SETTLE: Duration = Duration::from_secs(10);

/// Deterministic bytes of version `seed` at `[start, end)`.
fn bytes(seed: u64, start: u64, end: u64) -> Vec<u8> {
    (start..end)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(97)) as u8)
        .collect()
}

fn tier(dir: &Path, capacity: u64) -> Arc<DiskTier> {
    DiskTier::open(&DiskTierConfig::new(dir.to_owned(), capacity)).expect("the tier opens")
}

fn version(seed: u64, size: u64) -> TierVersion {
    TierVersion::named(&format!("test-{seed}"), size)
}

fn put(tier: &DiskTier, v: &TierVersion, seed: u64, start: u64, end: u64) {
    tier.offer(v, start, end, &bytes(seed, start, end));
    assert!(tier.settle(SETTLE));
}

fn read(tier: &DiskTier, v: &TierVersion, start: u64, end: u64) -> Option<Vec<u8>> {
    tier.read(v, start, end).map(|b| b.as_slice().to_vec())
}

fn data_file(dir: &Path, v: &TierVersion) -> PathBuf {
    dir.join(TIER_FOLDER).join(format!("{}.data", v.name))
}

#[test]
fn chunks_come_back_bit_exact_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let v = version(1, 10 * MIB);
    // Unaligned ranges, adjacent ones sharing a page.
    let ranges = [
        (0, 1_000_000),
        (1_000_000, 3_000_123),
        (5_000_001, 10 * MIB),
    ];
    {
        let tier = tier(dir.path(), 64 * MIB);
        for &(s, e) in &ranges {
            put(&tier, &v, 1, s, e);
        }
        for &(s, e) in &ranges {
            assert_eq!(read(&tier, &v, s, e), Some(bytes(1, s, e)), "{s}..{e}");
        }
        assert_eq!(read(&tier, &v, 3_000_123, 5_000_001), None);
        assert_eq!(read(&tier, &v, 0, 999_999), None, "only whole chunks");
        let stats = tier.stats();
        assert_eq!(stats.written, 3);
        assert_eq!(stats.hits, 3);
        assert_eq!(stats.used_bytes, tier.held_bytes(&v));
        assert_eq!(stats.versions, 1);
    }
    let tier = tier(dir.path(), 64 * MIB);
    for &(s, e) in &ranges {
        assert_eq!(
            read(&tier, &v, s, e),
            Some(bytes(1, s, e)),
            "after a restart"
        );
    }
    assert_eq!(tier.stats().damaged, 0);
}

#[test]
fn a_damaged_chunk_is_dropped_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let v = version(2, 4 * MIB);
    let tier = tier(dir.path(), 64 * MIB);
    put(&tier, &v, 2, 0, MIB);
    put(&tier, &v, 2, MIB, 3 * MIB);
    let mut data = OpenOptions::new()
        .read(true)
        .write(true)
        .open(data_file(dir.path(), &v))
        .unwrap();
    data.seek(SeekFrom::Start(2 * MIB + 12345)).unwrap();
    let mut b = [0u8; 1];
    data.read_exact(&mut b).unwrap();
    data.seek(SeekFrom::Start(2 * MIB + 12345)).unwrap();
    data.write_all(&[b[0] ^ 0x10]).unwrap();
    data.sync_all().unwrap();
    assert_eq!(read(&tier, &v, MIB, 3 * MIB), None);
    assert_eq!(tier.stats().damaged, 1);
    assert!(!tier.holds(&v, MIB, 3 * MIB));
    assert_eq!(read(&tier, &v, 0, MIB), Some(bytes(2, 0, MIB)));
    // Written again, it is served again.
    put(&tier, &v, 2, MIB, 3 * MIB);
    assert_eq!(read(&tier, &v, MIB, 3 * MIB), Some(bytes(2, MIB, 3 * MIB)));
    drop(tier);
    let tier = super::tests::tier(dir.path(), 64 * MIB);
    assert_eq!(read(&tier, &v, MIB, 3 * MIB), Some(bytes(2, MIB, 3 * MIB)));
}

#[test]
fn a_truncated_data_file_is_detected_while_open_and_dropped_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let v = version(3, 4 * MIB);
    let tier = tier(dir.path(), 64 * MIB);
    put(&tier, &v, 3, 0, MIB);
    put(&tier, &v, 3, 3 * MIB, 4 * MIB);
    let data = OpenOptions::new()
        .write(true)
        .open(data_file(dir.path(), &v))
        .unwrap();
    data.set_len(3 * MIB + 100).unwrap();
    drop(data); // Windows deletes no file that is open
    assert_eq!(read(&tier, &v, 3 * MIB, 4 * MIB), None);
    assert_eq!(tier.stats().damaged, 1);
    drop(tier);
    let tier = super::tests::tier(dir.path(), 64 * MIB);
    assert!(
        !tier.holds(&v, 0, MIB),
        "a data file of another size is dropped whole"
    );
    assert_eq!(tier.stats().used_bytes, 0);
    assert!(!data_file(dir.path(), &v).exists());
}

#[test]
fn a_log_cut_mid_record_keeps_the_chunks_before_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let v = version(4, 4 * MIB);
    {
        let tier = tier(dir.path(), 64 * MIB);
        put(&tier, &v, 4, 0, MIB);
        put(&tier, &v, 4, MIB, 2 * MIB);
    }
    let log = dir.path().join(TIER_FOLDER).join(format!("{}.log", v.name));
    let len = std::fs::metadata(&log).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let tier = tier(dir.path(), 64 * MIB);
    assert_eq!(read(&tier, &v, 0, MIB), Some(bytes(4, 0, MIB)));
    assert!(
        !tier.holds(&v, MIB, 2 * MIB),
        "the chunk being recorded is lost"
    );
    assert_eq!(tier.stats().used_bytes, MIB);
    // The log was cut back to its valid records: appends after it are read at the next open.
    put(&tier, &v, 4, 2 * MIB, 3 * MIB);
    drop(tier);
    let tier = super::tests::tier(dir.path(), 64 * MIB);
    assert_eq!(
        read(&tier, &v, 2 * MIB, 3 * MIB),
        Some(bytes(4, 2 * MIB, 3 * MIB))
    );
}

#[test]
fn bytes_written_without_their_record_are_not_served() {
    // A crash after a chunk's bytes were written and before its record: the next open knows
    // nothing of them.
    let dir = tempfile::tempdir().unwrap();
    let v = version(5, 4 * MIB);
    {
        let tier = tier(dir.path(), 64 * MIB);
        put(&tier, &v, 5, 0, MIB);
    }
    let mut data = OpenOptions::new()
        .write(true)
        .open(data_file(dir.path(), &v))
        .unwrap();
    data.seek(SeekFrom::Start(MIB)).unwrap();
    data.write_all(&bytes(5, MIB, 2 * MIB)).unwrap();
    let tier = tier(dir.path(), 64 * MIB);
    assert!(!tier.holds(&v, MIB, 2 * MIB));
    assert_eq!(tier.stats().used_bytes, MIB);
}

#[test]
fn a_second_tier_on_the_same_folder_is_refused_with_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let first = tier(dir.path(), MIB);
    let err = DiskTier::open(&DiskTierConfig::new(dir.path().to_owned(), MIB)).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, DiskTierError::InUse { .. }), "{message}");
    assert!(
        message.contains(&std::process::id().to_string()),
        "{message}"
    );
    drop(first);
    assert!(DiskTier::open(&DiskTierConfig::new(dir.path().to_owned(), MIB)).is_ok());
}

#[test]
fn room_is_made_from_the_least_recent_version_from_its_end_and_a_pass_keeps_its_head() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tier(dir.path(), 4 * MIB);
    let (a, b) = (version(6, 8 * MIB), version(7, 8 * MIB));
    for i in 0..3 {
        put(&tier, &a, 6, i * MIB, (i + 1) * MIB);
    }
    for i in 0..3 {
        put(&tier, &b, 7, i * MIB, (i + 1) * MIB);
    }
    // B's second and third chunks took A's last two.
    assert!(tier.holds(&a, 0, MIB));
    assert!(!tier.holds(&a, MIB, 2 * MIB) && !tier.holds(&a, 2 * MIB, 3 * MIB));
    assert_eq!(tier.stats().evicted, 2);
    // B's fourth takes A's first; its fifth finds only B's own earlier chunks: not kept.
    put(&tier, &b, 7, 3 * MIB, 4 * MIB);
    put(&tier, &b, 7, 4 * MIB, 5 * MIB);
    assert!(!tier.holds(&a, 0, MIB));
    assert!(!tier.holds(&b, 4 * MIB, 5 * MIB));
    for i in 0..4 {
        assert_eq!(
            read(&tier, &b, i * MIB, (i + 1) * MIB),
            Some(bytes(7, i * MIB, (i + 1) * MIB))
        );
    }
    let stats = tier.stats();
    assert_eq!(stats.not_kept, 1);
    assert!(stats.used_bytes <= 4 * MIB);
    // A smaller tier at the next open drops the excess, from the end.
    drop(tier);
    let small = super::tests::tier(dir.path(), 2 * MIB);
    assert!(small.holds(&b, 0, MIB) && small.holds(&b, MIB, 2 * MIB));
    assert!(!small.holds(&b, 2 * MIB, 3 * MIB));
    assert_eq!(small.stats().used_bytes, 2 * MIB);
}

#[test]
fn offers_beyond_the_pending_bound_are_skipped_not_queued() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DiskTierConfig::new(dir.path().to_owned(), 64 * MIB);
    config.max_pending_bytes = MIB;
    let tier = DiskTier::open(&config).unwrap();
    let v = version(8, 8 * MIB);
    tier.offer(&v, 0, 2 * MIB, &bytes(8, 0, 2 * MIB));
    assert!(tier.settle(SETTLE));
    assert_eq!(tier.stats().skipped_busy, 1);
    assert!(!tier.holds(&v, 0, 2 * MIB));
}

#[test]
fn versions_of_one_file_never_mix() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tier(dir.path(), 64 * MIB);
    let (old, new) = (version(9, 2 * MIB), version(10, 2 * MIB));
    put(&tier, &old, 9, 0, MIB);
    assert_eq!(read(&tier, &new, 0, MIB), None);
    put(&tier, &new, 10, 0, MIB);
    assert_eq!(read(&tier, &old, 0, MIB), Some(bytes(9, 0, MIB)));
    assert_eq!(read(&tier, &new, 0, MIB), Some(bytes(10, 0, MIB)));
}

#[test]
fn empty_or_out_of_bounds_ranges_are_not_kept_and_the_log_stays_whole() {
    let dir = tempfile::tempdir().unwrap();
    let v = version(11, 2 * MIB);
    {
        let tier = tier(dir.path(), 64 * MIB);
        tier.offer(&v, 100, 100, &[]);
        tier.offer(&v, MIB, 3 * MIB, &bytes(11, MIB, 3 * MIB));
        put(&tier, &v, 11, 0, MIB);
        assert_eq!(tier.stats().written, 1);
    }
    let tier = tier(dir.path(), 64 * MIB);
    assert_eq!(read(&tier, &v, 0, MIB), Some(bytes(11, 0, MIB)));
}

/// The bytes of `file` from its start.
fn read_all(mut file: &File, len: u64) -> Vec<u8> {
    let mut got = vec![0u8; len as usize];
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_exact(&mut got).unwrap();
    got
}

#[test]
fn a_whole_copy_is_given_only_for_a_version_held_whole_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3 * MIB + 12_345;
    let v = version(8, size);
    {
        let tier = tier(dir.path(), 64 * MIB);
        put(&tier, &v, 8, 0, 100);
        put(&tier, &v, 8, 100, MIB);
        put(&tier, &v, 8, 2 * MIB, size);
        assert!(tier.whole_copy(&v).is_none(), "a hole in the middle");
        put(&tier, &v, 8, MIB, 2 * MIB);
        let copy = tier.whole_copy(&v).expect("held whole");
        assert_eq!(read_all(copy.file(), size), bytes(8, 0, size));
        assert_eq!(tier.stats().whole_copies, 1);
    }
    // After a restart its chunks are checked first: a flipped byte gives no copy, drops the
    // chunk, and the version is no longer whole.
    {
        let mut data = OpenOptions::new()
            .write(true)
            .open(data_file(dir.path(), &v))
            .unwrap();
        data.seek(SeekFrom::Start(MIB + 7)).unwrap();
        data.write_all(&[!bytes(8, MIB + 7, MIB + 8)[0]]).unwrap();
    }
    let tier = tier(dir.path(), 64 * MIB);
    assert!(tier.whole_copy(&v).is_none(), "a damaged byte");
    let stats = tier.stats();
    assert_eq!((stats.damaged, stats.whole_copies), (1, 0));
    assert!(!tier.holds(&v, MIB, 2 * MIB));
    put(&tier, &v, 8, MIB, 2 * MIB);
    let copy = tier.whole_copy(&v).expect("whole again");
    assert_eq!(read_all(copy.file(), size), bytes(8, 0, size));
}

/// After a restart a copy of many chunks is checked whole: one flipped byte near its end is
/// found, its chunk dropped, and the copy whole again once that chunk is put back.
#[test]
fn a_copy_of_many_chunks_is_checked_whole_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let chunks = 40;
    let size = chunks * (256 << 10);
    let v = version(10, size);
    {
        let tier = tier(dir.path(), 64 * MIB);
        for c in 0..chunks {
            put(&tier, &v, 10, c * (256 << 10), (c + 1) * (256 << 10));
        }
    }
    {
        let tier = tier(dir.path(), 64 * MIB);
        let copy = tier.whole_copy(&v).expect("every chunk checks out");
        assert_eq!(read_all(copy.file(), size), bytes(10, 0, size));
    }
    let at = 37 * (256 << 10) + 5;
    {
        let mut data = OpenOptions::new()
            .write(true)
            .open(data_file(dir.path(), &v))
            .unwrap();
        data.seek(SeekFrom::Start(at)).unwrap();
        data.write_all(&[!bytes(10, at, at + 1)[0]]).unwrap();
    }
    let tier = tier(dir.path(), 64 * MIB);
    assert!(tier.whole_copy(&v).is_none(), "a damaged byte in chunk 37");
    assert_eq!(tier.stats().damaged, 1);
    assert!(!tier.holds(&v, 37 * (256 << 10), 38 * (256 << 10)));
    put(&tier, &v, 10, 37 * (256 << 10), 38 * (256 << 10));
    let copy = tier.whole_copy(&v).expect("whole again");
    assert_eq!(read_all(copy.file(), size), bytes(10, 0, size));
}

#[test]
fn a_truncated_copy_is_not_given() {
    let dir = tempfile::tempdir().unwrap();
    let v = version(9, 2 * MIB);
    {
        let tier = tier(dir.path(), 64 * MIB);
        put(&tier, &v, 9, 0, MIB);
        put(&tier, &v, 9, MIB, 2 * MIB);
    }
    OpenOptions::new()
        .write(true)
        .open(data_file(dir.path(), &v))
        .unwrap()
        .set_len(2 * MIB - 1)
        .unwrap();
    let tier = tier(dir.path(), 64 * MIB);
    assert!(tier.whole_copy(&v).is_none(), "cut at the next open");
    assert!(!tier.holds(&v, MIB, 2 * MIB));
    // Cut while the tier holds it whole.
    put(&tier, &v, 9, 0, MIB);
    put(&tier, &v, 9, MIB, 2 * MIB);
    assert!(tier.holds(&v, 0, MIB) && tier.holds(&v, MIB, 2 * MIB));
    OpenOptions::new()
        .write(true)
        .open(data_file(dir.path(), &v))
        .unwrap()
        .set_len(2 * MIB - 1)
        .unwrap();
    assert!(tier.whole_copy(&v).is_none(), "cut while held");
    assert_eq!(tier.stats().damaged, 1);
}

/// While a copy is in use none of its chunks gives way; once it was handed over, it gives way
/// whole, its files deleted, and a descriptor the kernel (here: the test) still holds reads
/// every byte as it was, never a punched hole.
#[test]
fn a_copy_in_use_keeps_its_chunks_and_a_handed_over_copy_goes_whole() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tier(dir.path(), 4 * MIB);
    let (a, b) = (version(10, 2 * MIB), version(11, 8 * MIB));
    put(&tier, &a, 10, 0, MIB);
    put(&tier, &a, 10, MIB, 2 * MIB);
    let copy = tier.whole_copy(&a).expect("held whole");
    for i in 0..4 {
        put(&tier, &b, 11, i * MIB, (i + 1) * MIB);
    }
    assert!(
        tier.holds(&a, 0, MIB) && tier.holds(&a, MIB, 2 * MIB),
        "pinned"
    );
    assert!(!tier.holds(&b, 2 * MIB, 3 * MIB), "no room for B's third");
    let kept = copy.file().try_clone().unwrap();
    drop(copy);
    put(&tier, &b, 11, 2 * MIB, 3 * MIB);
    assert!(
        !tier.holds(&a, 0, MIB) && !tier.holds(&a, MIB, 2 * MIB),
        "A went whole for B's third"
    );
    assert_eq!(read_all(&kept, 2 * MIB), bytes(10, 0, 2 * MIB));
    let stats = tier.stats();
    assert_eq!(stats.used_bytes, 3 * MIB);
    assert_eq!(
        (stats.evicted, stats.evicted_bytes),
        (2, 2 * MIB),
        "A's two chunks"
    );
    // (Windows deletes a file once its last handle closes.)
    drop(kept);
    assert!(!data_file(dir.path(), &a).exists());
    // A version kept again after going whole starts a file of its own.
    put(&tier, &a, 10, 0, MIB);
    assert_eq!(read(&tier, &a, 0, MIB), Some(bytes(10, 0, MIB)));
}
