//! What the disk tier holds, in memory, and which chunks make room for a new one.
//!
//! **Contract.** [`TierIndex`] counts every chunk held or being written against the capacity
//! and never lets the sum exceed it. Room is made by the rule the RAM cache follows for files
//! read in passes, the chunks needed soonest stay: a version read least recently gives way
//! first, from its end (a model's next load starts at its head); the version being written
//! gives way only for a chunk that comes before its own last one, so a pass over a model larger
//! than the tier keeps the model's head rather than cycling every chunk through the tier.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::log::{overlaps, Held};

/// One cached version in the index.
#[derive(Debug, Default)]
pub(super) struct TierEntry {
    /// The source version's size.
    pub size: u64,
    /// The ranges its data file holds, by start.
    pub held: BTreeMap<u64, Held>,
    /// When a chunk of it was last read or written ([`TierIndex::tick`]).
    pub last_use: u64,
    /// The starts of held chunks taken in at the tier's open whose bytes were not checked
    /// against their checksum since (a chunk written by this tier, or read back, was).
    pub unverified: BTreeSet<u64>,
    /// Whole copies of it in use ([`super::copy`]): while any is, none of its chunks gives way.
    pub pins: usize,
    /// It was handed to the kernel whole: a mapping may still read its data file after the
    /// last handle closed, so no hole is ever punched in it; it gives way whole
    /// ([`Victim::whole`]).
    pub sealed: bool,
}

/// Bytes of the ranges in `held`.
fn bytes_of(held: &BTreeMap<u64, Held>) -> u64 {
    held.iter().map(|(s, h)| h.end - s).sum()
}

/// A chunk to drop to make room: its version's name and range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Victim {
    pub name: String,
    pub start: u64,
    pub end: u64,
    /// Every chunk of the version goes at once, its files deleted rather than punched: it was
    /// handed to the kernel whole, which may still map it ([`TierEntry::sealed`]).
    pub whole: bool,
    /// The bytes and chunks it frees.
    pub bytes: u64,
    pub chunks: u64,
}

/// What [`TierIndex::reserve`] decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Room {
    /// Chunks dropped to make room.
    pub victims: Vec<Victim>,
    /// Why the chunk is not to be written (`None`: its room is reserved).
    pub refused: Option<NoRoom>,
}

/// Why a chunk is not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoRoom {
    /// Larger than the whole tier.
    TooLarge,
    /// Only chunks needed sooner than it are held.
    NeededLater,
    /// It overlaps a range held (a version's chunk plan changed with the mount's settings).
    Overlaps,
}

#[derive(Debug, Default)]
pub(super) struct TierIndex {
    pub entries: HashMap<String, TierEntry>,
    /// Bytes held or reserved for writes in progress.
    pub used: u64,
    pub capacity: u64,
    clock: u64,
}

impl TierIndex {
    pub fn new(capacity: u64) -> TierIndex {
        TierIndex {
            capacity,
            ..TierIndex::default()
        }
    }

    /// The next use time.
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Adds a version found on disk, with what it holds; last used at `order` (older first).
    pub fn adopt(&mut self, name: String, size: u64, held: BTreeMap<u64, Held>) {
        self.used += bytes_of(&held);
        let last_use = self.tick();
        let unverified = held.keys().copied().collect();
        self.entries.insert(
            name,
            TierEntry {
                size,
                held,
                last_use,
                unverified,
                pins: 0,
                sealed: false,
            },
        );
    }

    /// The range starting at `start` of version `name`, if held exactly as `[start, end)`.
    pub fn get(&self, name: &str, start: u64, end: u64) -> Option<Held> {
        self.entries
            .get(name)?
            .held
            .get(&start)
            .copied()
            .filter(|h| h.end == end)
    }

    /// The chunk of version `name` that starts the file, if held: its end and checksum.
    pub fn head(&self, name: &str) -> Option<Held> {
        self.entries.get(name)?.held.get(&0).copied()
    }

    /// Reserves `[start, end)` of version `name` for a write, dropping chunks to make room
    /// (removed from the index at once, their bytes no longer counted; the caller drops their
    /// bytes from disk). A granted reservation is counted in [`Self::used`] until
    /// [`Self::commit`] or [`Self::release`]. Chunks dropped before the room ran out stay
    /// dropped: they were the ones needed last.
    pub fn reserve(&mut self, name: &str, start: u64, end: u64) -> Room {
        let len = end - start;
        let mut room = Room::default();
        if len > self.capacity {
            room.refused = Some(NoRoom::TooLarge);
            return room;
        }
        if self
            .entries
            .get(name)
            .is_some_and(|e| overlaps(&e.held, start, end))
        {
            room.refused = Some(NoRoom::Overlaps);
            return room;
        }
        while self.used + len > self.capacity {
            match self.victim(name, start) {
                Some(v) => {
                    self.used -= v.bytes;
                    room.victims.push(v);
                }
                None => {
                    room.refused = Some(NoRoom::NeededLater);
                    return room;
                }
            }
        }
        self.used += len;
        room
    }

    /// Drops chunks until what is held fits the capacity (a tier taken in with a smaller size,
    /// or shrunk by a full disk): least recently used versions first, from their end.
    pub fn trim(&mut self) -> Vec<Victim> {
        let mut victims = Vec::new();
        while self.used > self.capacity {
            match self.victim("", u64::MAX) {
                Some(v) => {
                    self.used -= v.bytes;
                    victims.push(v);
                }
                None => break,
            }
        }
        victims
    }

    /// The next chunk to drop for a chunk of `name` at `start`, removed from the index. A
    /// version whose whole copy is in use gives nothing.
    fn victim(&mut self, name: &str, start: u64) -> Option<Victim> {
        let other = self
            .entries
            .iter()
            .filter(|(n, e)| n.as_str() != name && !e.held.is_empty() && e.pins == 0)
            .min_by_key(|(_, e)| e.last_use)
            .map(|(n, _)| n.clone());
        let from = match other {
            Some(n) => n,
            None => {
                let own = self.entries.get(name).filter(|e| e.pins == 0)?;
                let (&last, _) = own.held.last_key_value()?;
                if last < start {
                    return None;
                }
                name.to_owned()
            }
        };
        if self.entries.get(&from).is_some_and(|e| e.sealed) {
            return self.take_whole(&from);
        }
        let entry = self.entries.get_mut(&from)?;
        let (s, held) = entry.held.pop_last()?;
        entry.unverified.remove(&s);
        Some(Victim {
            name: from,
            start: s,
            end: held.end,
            whole: false,
            bytes: held.end - s,
            chunks: 1,
        })
    }

    /// Removes version `name` whole from the index (its bytes still counted in `used`: the
    /// caller takes [`Victim::bytes`] off).
    fn take_whole(&mut self, name: &str) -> Option<Victim> {
        let entry = self.entries.remove(name)?;
        Some(Victim {
            name: name.to_owned(),
            start: 0,
            end: entry.size,
            whole: true,
            bytes: bytes_of(&entry.held),
            chunks: entry.held.len() as u64,
        })
    }

    /// Whether version `name` is sealed ([`TierEntry::sealed`]).
    pub fn sealed(&self, name: &str) -> bool {
        self.entries.get(name).is_some_and(|e| e.sealed)
    }

    /// Drops sealed version `name` whole unless a copy of it is in use (a damaged chunk found
    /// in it): its bytes are no longer counted.
    pub fn drop_sealed(&mut self, name: &str) -> Option<Victim> {
        self.entries.get(name).filter(|e| e.sealed && e.pins == 0)?;
        let victim = self.take_whole(name)?;
        self.used = self.used.saturating_sub(victim.bytes);
        Some(victim)
    }

    /// Records the write reserved for `[start, end)` of `name` (size `size`) as done.
    pub fn commit(&mut self, name: &str, size: u64, start: u64, held: Held) {
        let now = self.tick();
        let entry = self.entries.entry(name.to_owned()).or_default();
        entry.size = size;
        entry.last_use = now;
        entry.held.insert(start, held);
    }

    /// Gives back a reservation of `len` bytes whose write failed.
    pub fn release(&mut self, len: u64) {
        self.used = self.used.saturating_sub(len);
    }

    /// Drops `[start, ...)` of `name` if held with checksum `hash` (a chunk found damaged);
    /// returns its end when it was.
    pub fn forget(&mut self, name: &str, start: u64, hash: u64) -> Option<u64> {
        let entry = self.entries.get_mut(name)?;
        let held = entry.held.get(&start).filter(|h| h.hash == hash)?.end;
        entry.held.remove(&start);
        entry.unverified.remove(&start);
        self.used = self.used.saturating_sub(held - start);
        Some(held)
    }

    /// Notes that the chunk of `name` at `start` matched its checksum.
    pub fn verified(&mut self, name: &str, start: u64) {
        if let Some(entry) = self.entries.get_mut(name) {
            entry.unverified.remove(&start);
        }
    }

    /// Every chunk of version `name` of `size` bytes, in order, when they cover it from its
    /// first byte to its last with nothing missing, each with whether it is yet to be checked.
    pub fn whole(&self, name: &str, size: u64) -> Option<Vec<(u64, Held, bool)>> {
        let entry = self.entries.get(name).filter(|e| e.size == size)?;
        let mut next = 0;
        let mut chunks = Vec::with_capacity(entry.held.len());
        for (&start, &held) in &entry.held {
            if start != next {
                return None;
            }
            chunks.push((start, held, entry.unverified.contains(&start)));
            next = held.end;
        }
        (next == size && size > 0).then_some(chunks)
    }

    /// One more whole copy of `name` in use: none of its chunks gives way until
    /// [`Self::unpin`].
    pub fn pin(&mut self, name: &str) {
        if let Some(entry) = self.entries.get_mut(name) {
            entry.pins += 1;
        }
    }

    /// Version `name` was handed to the kernel whole ([`TierEntry::sealed`]).
    pub fn seal(&mut self, name: &str) {
        if let Some(entry) = self.entries.get_mut(name) {
            entry.sealed = true;
        }
    }

    /// A whole copy of `name` no longer in use.
    pub fn unpin(&mut self, name: &str) {
        if let Some(entry) = self.entries.get_mut(name) {
            entry.pins = entry.pins.saturating_sub(1);
        }
    }

    /// Notes a read of version `name`.
    pub fn touch(&mut self, name: &str) {
        let now = self.tick();
        if let Some(entry) = self.entries.get_mut(name) {
            entry.last_use = now;
        }
    }

    /// Bytes held for version `name`.
    pub fn held_bytes(&self, name: &str) -> u64 {
        self.entries.get(name).map_or(0, |e| bytes_of(&e.held))
    }
}
