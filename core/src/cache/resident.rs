//! The resident chunks of the cache, indexed for eviction.
//!
//! The cache evicts the chunk whose block is needed furthest in the future, least recently
//! used among equals ([`super::ChunkCache`]). How far ahead a block is needed moves with its
//! file's reader, so no order over chunks can be kept up to date; but every chunk of one block
//! of one file version is needed at the same distance. Chunks are therefore grouped by
//! (file version, block), each group keeping its chunks in recency order, and a victim is found
//! by looking at the *least recently used chunk of each group*: one step per resident block
//! (tens to a few hundred for the models this is for) instead of one per resident chunk (4 096
//! for a 16 GiB budget), and a large shrink is no longer quadratic in the number of chunks.
//!
//! Recency is a counter stamped on each chunk when it is put or hit (the `lru` crate did this
//! before, but cannot be grouped).

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{Chunk, ChunkKey};

/// Chunks of one block of one file version; `block` is `None` for chunks of unknown owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct GroupKey {
    file: u64,
    block: Option<usize>,
}

struct Entry {
    chunk: Arc<Chunk>,
    stamp: u64,
    group: GroupKey,
}

/// The resident chunks.
#[derive(Default)]
pub(super) struct Resident {
    chunks: HashMap<ChunkKey, Entry>,
    /// Per group, its chunks by recency stamp (oldest first).
    groups: HashMap<GroupKey, BTreeMap<u64, ChunkKey>>,
    /// The last recency stamp handed out.
    tick: u64,
}

impl Resident {
    pub(super) fn len(&self) -> usize {
        self.chunks.len()
    }

    pub(super) fn contains(&self, key: &ChunkKey) -> bool {
        self.chunks.contains_key(key)
    }

    /// The chunk `key`, made the most recently used of its group.
    pub(super) fn get(&mut self, key: &ChunkKey) -> Option<Arc<Chunk>> {
        let entry = self.chunks.get_mut(key)?;
        self.tick += 1;
        if let Some(group) = self.groups.get_mut(&entry.group) {
            group.remove(&entry.stamp);
            group.insert(self.tick, *key);
        }
        entry.stamp = self.tick;
        Some(Arc::clone(&entry.chunk))
    }

    /// Adds `chunk` as the most recently used; returns the chunk it replaced, if any.
    pub(super) fn put(&mut self, key: ChunkKey, chunk: Arc<Chunk>) -> Option<Arc<Chunk>> {
        let replaced = self.pop(&key);
        self.tick += 1;
        let group = GroupKey {
            file: key.file,
            block: chunk.owner.as_ref().map(|o| o.block),
        };
        self.groups.entry(group).or_default().insert(self.tick, key);
        self.chunks.insert(
            key,
            Entry {
                chunk,
                stamp: self.tick,
                group,
            },
        );
        replaced
    }

    pub(super) fn pop(&mut self, key: &ChunkKey) -> Option<Arc<Chunk>> {
        let entry = self.chunks.remove(key)?;
        if let Some(group) = self.groups.get_mut(&entry.group) {
            group.remove(&entry.stamp);
            if group.is_empty() {
                self.groups.remove(&entry.group);
            }
        }
        Some(entry.chunk)
    }

    /// Removes every chunk.
    pub(super) fn drain(&mut self) -> Vec<(ChunkKey, Arc<Chunk>)> {
        self.groups.clear();
        self.chunks.drain().map(|(k, e)| (k, e.chunk)).collect()
    }

    /// The keys of file version `file`'s chunks.
    pub(super) fn keys_of_file(&self, file: u64) -> Vec<ChunkKey> {
        self.groups
            .iter()
            .filter(|(group, _)| group.file == file)
            .flat_map(|(_, chunks)| chunks.values().copied())
            .collect()
    }

    /// The eviction candidate: among the least recently used chunk of each group, the one
    /// ranked highest by `(idle, distance, older)`, where `idle` is `!may_be_in_use(recent)`.
    /// Returns it with its idleness and distance.
    ///
    /// Only a group's oldest chunk is asked whether it may still be in use: in the block a
    /// reader just left, the oldest chunk is the one its stragglers finished with first, so if
    /// it is busy the group is passed over for now (at worst a less distant chunk goes first).
    pub(super) fn victim(&self, recent: u64) -> Option<(ChunkKey, bool, usize)> {
        // (idle, distance, older first), highest evicted first.
        type Rank = (bool, usize, Reverse<u64>);
        let mut best: Option<(Rank, ChunkKey)> = None;
        for chunks in self.groups.values() {
            let Some((&stamp, &key)) = chunks.first_key_value() else {
                continue;
            };
            let Some(entry) = self.chunks.get(&key) else {
                continue;
            };
            let rank = (
                !entry.chunk.may_be_in_use(recent),
                entry.chunk.distance(),
                Reverse(stamp),
            );
            if best.as_ref().is_none_or(|(old, _)| rank > *old) {
                best = Some((rank, key));
            }
        }
        best.map(|((idle, distance, _), key)| (key, idle, distance))
    }

    /// Every resident chunk's footprint summed (for invariant checks in tests).
    #[cfg(test)]
    pub(super) fn footprint(&self) -> u64 {
        self.chunks.values().map(|e| e.chunk.footprint()).sum()
    }
}
