//! The chunk log of one cached version: which byte ranges its data file holds, and their
//! checksums.
//!
//! **Contract.** A log is a sequence of fixed-size records, each with a checksum of its own: a
//! header (the source version's size), then `Add` (the data file holds `[start, end)`, whose
//! bytes hash to `hash`) and `Drop` (it no longer does). [`replay`] returns the ranges held and
//! the length of the log's valid prefix: a record cut short or damaged (a crash mid-append, a
//! bad sector) ends the log there, so at most the chunk being recorded is lost. Nothing a log
//! says is trusted beyond that: every chunk is checked against its `hash` when it is read back.

use std::collections::BTreeMap;

/// Bytes of one record.
pub(super) const RECORD_BYTES: usize = 48;

/// First bytes of every record: the format, so that a log of another format is not misread.
const MAGIC: [u8; 4] = *b"TFC1";

/// What a record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Record {
    /// The first record: the size of the source version the data file mirrors.
    Header { size: u64 },
    /// The data file holds `[start, end)`, whose bytes hash to `hash` ([`chunk_hash`]).
    Add { start: u64, end: u64, hash: u64 },
    /// The data file no longer holds `[start, end)`.
    Drop { start: u64, end: u64 },
}

/// A range the data file holds, and its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub end: u64,
    pub hash: u64,
}

/// What a log says, replayed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Replayed {
    /// The source version's size (`None`: no valid header).
    pub size: Option<u64>,
    /// The ranges held, by start.
    pub held: BTreeMap<u64, Held>,
    /// Bytes of the log's valid prefix (what follows is cut off).
    pub valid_len: usize,
    /// Records that undo others (`Drop`, or an `Add` over a range held): the log is worth
    /// rewriting.
    pub superseded: usize,
}

/// The checksum of a chunk's bytes.
pub(super) fn chunk_hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

impl Record {
    pub(super) fn encode(self) -> [u8; RECORD_BYTES] {
        let (kind, a, b, c) = match self {
            Record::Header { size } => (0u8, size, 0, 0),
            Record::Add { start, end, hash } => (1, start, end, hash),
            Record::Drop { start, end } => (2, start, end, 0),
        };
        let mut out = [0u8; RECORD_BYTES];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = kind;
        out[8..16].copy_from_slice(&a.to_le_bytes());
        out[16..24].copy_from_slice(&b.to_le_bytes());
        out[24..32].copy_from_slice(&c.to_le_bytes());
        let check = xxhash_rust::xxh3::xxh3_64(&out[..40]);
        out[40..48].copy_from_slice(&check.to_le_bytes());
        out
    }

    /// The record in `bytes`, or `None` when it is damaged or of another format.
    pub(super) fn decode(bytes: &[u8]) -> Option<Record> {
        let bytes: &[u8; RECORD_BYTES] = bytes.try_into().ok()?;
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        if bytes[0..4] != MAGIC || xxhash_rust::xxh3::xxh3_64(&bytes[..40]) != word(40) {
            return None;
        }
        let (a, b, c) = (word(8), word(16), word(24));
        match bytes[4] {
            0 => Some(Record::Header { size: a }),
            1 if a < b => Some(Record::Add {
                start: a,
                end: b,
                hash: c,
            }),
            2 if a < b => Some(Record::Drop { start: a, end: b }),
            _ => None,
        }
    }
}

/// Replays `log`: the header first, then every add and drop, up to the first record that is
/// damaged, out of the version's bounds, or overlapping a range held (which no writer makes).
pub(super) fn replay(log: &[u8]) -> Replayed {
    let mut out = Replayed::default();
    let mut records = log.chunks(RECORD_BYTES);
    let Some(Record::Header { size }) = records.next().and_then(Record::decode) else {
        return out;
    };
    out.size = Some(size);
    out.valid_len = RECORD_BYTES;
    for bytes in records {
        match Record::decode(bytes) {
            Some(Record::Add { start, end, hash }) if end <= size => {
                if out.held.remove(&start).is_some() {
                    out.superseded += 1;
                }
                if overlaps(&out.held, start, end) {
                    break;
                }
                out.held.insert(start, Held { end, hash });
            }
            Some(Record::Drop { start, end }) => {
                if out.held.get(&start).is_some_and(|h| h.end == end) {
                    out.held.remove(&start);
                }
                out.superseded += 1;
            }
            _ => break,
        }
        out.valid_len += RECORD_BYTES;
    }
    out
}

/// Whether `[start, end)` overlaps a range in `held`.
pub(super) fn overlaps(held: &BTreeMap<u64, Held>, start: u64, end: u64) -> bool {
    let before = held
        .range(..start)
        .next_back()
        .is_some_and(|(_, h)| h.end > start);
    let after = held.range(start..end).next().is_some();
    before || after
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_of(records: &[Record]) -> Vec<u8> {
        records.iter().flat_map(|r| r.encode()).collect()
    }

    #[test]
    fn adds_and_drops_replay_to_what_is_held() {
        let log = log_of(&[
            Record::Header { size: 1000 },
            Record::Add {
                start: 0,
                end: 100,
                hash: 7,
            },
            Record::Add {
                start: 100,
                end: 300,
                hash: 8,
            },
            Record::Drop { start: 0, end: 100 },
        ]);
        let got = replay(&log);
        assert_eq!(got.size, Some(1000));
        assert_eq!(got.valid_len, log.len());
        assert_eq!(got.superseded, 1);
        assert_eq!(
            got.held.into_iter().collect::<Vec<_>>(),
            vec![(100, Held { end: 300, hash: 8 })]
        );
    }

    #[test]
    fn a_record_cut_short_or_damaged_ends_the_log_there() {
        let log = log_of(&[
            Record::Header { size: 1000 },
            Record::Add {
                start: 0,
                end: 100,
                hash: 7,
            },
            Record::Add {
                start: 100,
                end: 200,
                hash: 9,
            },
        ]);
        for cut in RECORD_BYTES * 2..log.len() {
            let got = replay(&log[..cut]);
            assert_eq!(got.held.len(), 1, "cut at {cut}");
            assert_eq!(got.valid_len, RECORD_BYTES * 2);
        }
        for bit in 0..RECORD_BYTES * 8 {
            let mut bad = log.clone();
            bad[RECORD_BYTES * 2 + bit / 8] ^= 1 << (bit % 8);
            let got = replay(&bad);
            assert_eq!(got.held.len(), 1, "bit {bit}");
        }
        let mut no_header = log.clone();
        no_header[3] ^= 1;
        assert_eq!(replay(&no_header), Replayed::default());
    }

    #[test]
    fn ranges_out_of_bounds_or_overlapping_end_the_log() {
        let log = log_of(&[
            Record::Header { size: 100 },
            Record::Add {
                start: 0,
                end: 50,
                hash: 1,
            },
            Record::Add {
                start: 40,
                end: 60,
                hash: 2,
            },
        ]);
        assert_eq!(replay(&log).held.len(), 1);
        let log = log_of(&[
            Record::Header { size: 100 },
            Record::Add {
                start: 50,
                end: 101,
                hash: 1,
            },
        ]);
        assert!(replay(&log).held.is_empty());
    }
}
