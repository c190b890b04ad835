//! Tests of the passthrough tier's budget bookkeeping, on real files (their page cache is
//! what the tier measures and drops). Files live under /var/tmp: tmpfs has no droppable page
//! cache.

use std::io::{Read, Write};
use std::path::PathBuf;

use super::*;

const MIB: u64 = 1 << 20;

struct TempFile {
    path: PathBuf,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn temp_file(name: &str, size: u64) -> (TempFile, SourceIdentity) {
    let path = PathBuf::from("/var/tmp").join(format!("tierfs-pt-{}-{name}", std::process::id()));
    let mut file = std::fs::File::create(&path).expect("create");
    file.write_all(&vec![7u8; size as usize]).expect("write");
    file.sync_all().expect("sync");
    let identity = SourceIdentity::of_file(&file).expect("stat");
    (TempFile { path }, identity)
}

fn read_all(path: &Path) {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut buf))
        .expect("read");
}

#[test]
fn admits_what_fits_and_counts_each_file_once() {
    let tier = PassthroughTier::default();
    let (a, id_a) = temp_file("a", 4 * MIB);
    let (b, id_b) = temp_file("b", 4 * MIB);
    assert!(tier.admit(&a.path, &id_a, 6 * MIB));
    assert!(
        tier.admit(&a.path, &id_a, 6 * MIB),
        "second handle of an open file"
    );
    assert_eq!(tier.held_bytes(), 4 * MIB);
    assert!(!tier.admit(&b.path, &id_b, 6 * MIB), "4 + 4 MiB > 6 MiB");
    let snap = tier.snapshot();
    assert_eq!((snap.open_files, snap.admitted, snap.refused), (1, 2, 1));
}

#[test]
fn last_release_parks_the_measured_page_cache() {
    let tier = PassthroughTier::default();
    let (a, id_a) = temp_file("park", 8 * MIB);
    read_all(&a.path);
    assert!(tier.admit(&a.path, &id_a, 64 * MIB));
    tier.release(&id_a);
    let snap = tier.snapshot();
    assert_eq!(snap.open_files, 0);
    assert_eq!(snap.parked_files, 1);
    assert!(
        snap.parked_bytes > 0 && snap.parked_bytes <= 8 * MIB,
        "{snap:?}"
    );
    assert_eq!(tier.held_bytes(), snap.parked_bytes);
}

#[test]
fn make_room_drops_parked_page_cache() {
    let tier = PassthroughTier::default();
    let (a, id_a) = temp_file("room", 8 * MIB);
    read_all(&a.path);
    assert!(tier.admit(&a.path, &id_a, 64 * MIB));
    tier.release(&id_a);
    assert!(tier.held_bytes() > 0);
    let freed = tier.make_room(16 * MIB, 16 * MIB);
    assert!(freed > 0);
    assert_eq!(tier.held_bytes(), 0);
    let file = std::fs::File::open(&a.path).expect("open");
    assert_eq!(residency::cached_pages(&file).expect("cachestat"), 0);
}

#[test]
fn admission_drops_parked_files_it_needs_room_from() {
    let tier = PassthroughTier::default();
    let (a, id_a) = temp_file("old", 6 * MIB);
    let (b, id_b) = temp_file("new", 6 * MIB);
    read_all(&a.path);
    assert!(tier.admit(&a.path, &id_a, 8 * MIB));
    tier.release(&id_a);
    assert!(
        tier.admit(&b.path, &id_b, 8 * MIB),
        "parked bytes do not block admission"
    );
    let snap = tier.snapshot();
    assert_eq!((snap.open_files, snap.parked_files), (1, 0));
    assert_eq!(tier.held_bytes(), 6 * MIB);
}

#[test]
fn reopening_a_parked_file_moves_it_back() {
    let tier = PassthroughTier::default();
    let (a, id_a) = temp_file("reopen", 4 * MIB);
    read_all(&a.path);
    assert!(tier.admit(&a.path, &id_a, 8 * MIB));
    tier.release(&id_a);
    assert!(tier.admit(&a.path, &id_a, 8 * MIB));
    let snap = tier.snapshot();
    assert_eq!(
        (snap.open_files, snap.parked_files, snap.open_bytes),
        (1, 0, 4 * MIB)
    );
    assert_eq!(snap.dropped_bytes, 0, "its own page cache is not dropped");
}

#[test]
fn a_replaced_file_is_neither_measured_nor_dropped() {
    let (a, id_a) = temp_file("replaced", 4 * MIB);
    let stale = SourceIdentity {
        size: id_a.size + 1,
        ..id_a
    };
    assert!(residency::resident_bytes(&a.path, &stale).is_err());
    assert!(residency::drop_page_cache(&a.path, &stale).is_err());
}

/// Two models taking turns that do not fit together: the one dropped to make room for the
/// other is not admitted again (the chunk cache shares the budget between them), while a
/// `drop` or a budget change marks nothing.
#[test]
fn a_file_dropped_to_make_room_for_another_competes() {
    let tier = PassthroughTier::default();
    let (a, id_a) = temp_file("turn-a", 6 * MIB);
    let (b, id_b) = temp_file("turn-b", 6 * MIB);
    let (c, id_c) = temp_file("turn-c", 2 * MIB);
    read_all(&a.path);
    assert!(tier.admit(&a.path, &id_a, 8 * MIB));
    tier.release(&id_a);
    assert!(tier.admit(&b.path, &id_b, 8 * MIB), "the first switch");
    tier.release(&id_b);
    assert!(tier.is_competing(&id_a) && !tier.is_competing(&id_b));
    assert!(tier.refuses_competing(&id_a), "a competes with b");
    assert!(!tier.refuses_competing(&id_b));
    let snap = tier.snapshot();
    assert_eq!((snap.competing_files, snap.refused_competing), (1, 1));
    assert!(
        tier.admit(&a.path, &id_a, u64::MAX) && tier.held_bytes() >= 6 * MIB,
        "a handle of an inode already served by passthrough is admitted and counted, competing or not"
    );
    tier.release(&id_a);

    read_all(&c.path);
    assert!(tier.admit(&c.path, &id_c, 8 * MIB));
    tier.release(&id_c);
    tier.make_room(8 * MIB, 8 * MIB);
    assert!(!tier.is_competing(&id_c), "a drop is not competition");
    tier.forget(&id_a);
    assert!(!tier.is_competing(&id_a), "a new version starts afresh");
}

/// A model refused because another one is still open (a loader that keeps the first mapped
/// until it is collected): the open one competes from then on, its next open goes to the chunk
/// cache. A file too large for the budget alone marks nothing.
#[test]
fn files_open_when_a_fitting_model_is_refused_compete_with_it() {
    let tier = PassthroughTier::default();
    let (a, id_a) = temp_file("held-a", 6 * MIB);
    let (b, id_b) = temp_file("held-b", 6 * MIB);
    let (big, id_big) = temp_file("held-big", 10 * MIB);
    assert!(tier.admit(&a.path, &id_a, 8 * MIB));
    assert!(
        !tier.admit(&big.path, &id_big, 8 * MIB),
        "larger than the room"
    );
    assert!(
        !tier.is_competing(&id_a),
        "a file that never fits competes with nobody"
    );
    assert!(!tier.admit(&b.path, &id_b, 8 * MIB), "a is still open");
    assert!(tier.is_competing(&id_a));
    tier.release(&id_a);
    assert!(
        tier.refuses_competing(&id_a),
        "a's next open is the chunk cache's"
    );
}

#[test]
fn a_file_parked_twice_by_racing_closes_is_counted_once() {
    // The last close measures the page cache without the tier's lock; another open and close
    // of the same file in that window parks it first, and the late close parks it again.
    let tier = std::sync::Arc::new(PassthroughTier::default());
    let (a, id_a) = temp_file("race", 8 * MIB);
    read_all(&a.path);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                for _ in 0..300 {
                    if tier.admit(&a.path, &id_a, 64 * MIB) {
                        tier.release(&id_a);
                    }
                }
            });
        }
    });
    let snap = tier.snapshot();
    assert_eq!(snap.open_files, 0);
    assert_eq!(snap.parked_files, 1);
    assert_eq!(
        snap.parked_bytes,
        tier.parked_bytes_of(&id_a),
        "parked bytes of no parked file"
    );
    assert!(snap.parked_bytes <= 8 * MIB, "{snap:?}");
}

#[test]
fn a_file_read_after_its_close_is_counted_at_the_next_admission() {
    // A loader that maps the file, closes it and then copies every tensor: the tier sees the
    // close before the reads.
    let tier = PassthroughTier::default();
    let (a, id_a) = temp_file("mapped-a", 8 * MIB);
    let (b, id_b) = temp_file("mapped-b", 8 * MIB);
    residency::drop_page_cache(&a.path, &id_a).expect("drop");
    residency::drop_page_cache(&b.path, &id_b).expect("drop");
    assert!(tier.admit(&a.path, &id_a, 12 * MIB));
    tier.release(&id_a);
    assert_eq!(tier.held_bytes(), 0, "nothing resident at the close");
    read_all(&a.path);
    assert_eq!(
        residency::resident_bytes(&a.path, &id_a).expect("cachestat"),
        8 * MIB
    );
    assert!(tier.admit(&b.path, &id_b, 12 * MIB));
    assert_eq!(
        residency::resident_bytes(&a.path, &id_a).expect("cachestat"),
        0,
        "8 + 8 MiB > 12 MiB: the earlier model gave its page cache back"
    );
    assert!(tier.is_competing(&id_a));
    assert_eq!(tier.held_bytes(), 8 * MIB);
}

#[test]
fn a_dropped_file_still_mapped_stays_parked_until_unmapped() {
    let tier = PassthroughTier::default();
    let (a, id_a) = temp_file("still-mapped", 8 * MIB);
    read_all(&a.path);
    assert!(tier.admit(&a.path, &id_a, 64 * MIB));
    let file = std::fs::File::open(&a.path).expect("open");
    // SAFETY: the test owns the file and nobody truncates it while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.expect("mmap");
    let touched: u64 = map.iter().step_by(4096).map(|&b| u64::from(b)).sum();
    assert_eq!(touched, 7 * 2048);
    tier.release(&id_a);
    assert_eq!(tier.held_bytes(), 8 * MIB);

    tier.make_room(16 * MIB, 16 * MIB);
    assert_eq!(
        residency::resident_bytes(&a.path, &id_a).expect("cachestat"),
        8 * MIB,
        "mapped pages stay"
    );
    assert_eq!(tier.held_bytes(), 8 * MIB, "and stay counted");
    assert_eq!(tier.snapshot().parked_files, 1);

    drop(map);
    let freed = tier.make_room(16 * MIB, 16 * MIB);
    assert_eq!(freed, 8 * MIB);
    assert_eq!(
        residency::resident_bytes(&a.path, &id_a).expect("cachestat"),
        0
    );
    assert_eq!(tier.held_bytes(), 0);
}

#[test]
fn max_parked_bounds_the_files_remembered() {
    let tier = PassthroughTier::with_config(PassthroughConfig {
        max_parked: 1,
        ..PassthroughConfig::default()
    });
    let (a, id_a) = temp_file("bound-a", MIB);
    let (b, id_b) = temp_file("bound-b", MIB);
    for (file, id) in [(&a, &id_a), (&b, &id_b)] {
        assert!(tier.admit(&file.path, id, 8 * MIB));
        tier.release(id);
    }
    assert_eq!(
        tier.snapshot().parked_files,
        1,
        "one parked file remembered"
    );
    assert_eq!(tier.parked_bytes_of(&id_a), 0, "the older one forgotten");
}
