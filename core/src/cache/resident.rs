//! The resident chunks of the cache, indexed for eviction.
//!
//! The cache evicts the chunk whose block is needed furthest in the future, least recently
//! used among equals (`evict.rs`). How far ahead a block is needed moves with its
//! file's reader, so no order over chunks can be kept up to date; but every chunk of one block
//! of one file version is needed at the same distance. Chunks are therefore grouped by
//! (file version, block), each group keeping its chunks in recency order, and a victim is found
//! by looking at the *least recently used chunk of each group*: one step per resident block
//! (tens to a few hundred for the models this is for) instead of one per resident chunk (4 096
//! for a 16 GiB budget), and a large shrink is not quadratic in the number of chunks.
//!
//! Recency is a counter stamped on each chunk when it is put or hit. What the ranks compare is
//! the rule of `evict.rs`; this module only keeps the chunks so that it is cheap to apply.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;

use super::evict::{Needed, Ranking, Turn};
use super::{Chunk, ChunkKey};

/// Chunks of one block of one file version; `block` is `None` for chunks of unknown owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

    /// The chunk `key`, its recency unchanged.
    pub(super) fn peek(&self, key: &ChunkKey) -> Option<Arc<Chunk>> {
        self.chunks.get(key).map(|entry| Arc::clone(&entry.chunk))
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

    /// Puts `chunk` in place of the resident `key` (another form of the same chunk, for the
    /// compressed tier), its recency unchanged; returns the one it replaced, or `None` (and
    /// keeps nothing) if `key` is not resident.
    pub(super) fn replace(&mut self, key: ChunkKey, chunk: Arc<Chunk>) -> Option<Arc<Chunk>> {
        let entry = self.chunks.get_mut(&key)?;
        Some(std::mem::replace(&mut entry.chunk, chunk))
    }

    /// Every resident chunk with its key and recency stamp.
    pub(super) fn entries(&self) -> impl Iterator<Item = (ChunkKey, &Arc<Chunk>, u64)> {
        self.chunks
            .iter()
            .map(|(key, entry)| (*key, &entry.chunk, entry.stamp))
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

    /// The eviction order as of now, for one eviction or a batch of them (a shrink): ranks
    /// every group once (its distance is asked once per batch; readers moving meanwhile do not
    /// change a decision taken under one hold of the cache lock), then yields chunks in rank
    /// order at `log(groups)` each. See [`VictimQueue`].
    pub(super) fn victims(&self, ranking: Ranking) -> VictimQueue {
        let mut heap = BinaryHeap::new();
        for (&group, chunks) in &self.groups {
            let Some((&stamp, key)) = chunks.first_key_value() else {
                continue;
            };
            let Some(entry) = self.chunks.get(key) else {
                continue;
            };
            if entry.chunk.in_current_block() {
                // The block a reader is in mixes chunks it has consumed (needed last) with
                // chunks it has yet to read (needed now): ranked one by one. One block's
                // chunks, not the cache's.
                for (&stamp, key) in chunks {
                    if let Some(entry) = self.chunks.get(key) {
                        let rank = entry.chunk.rank(&ranking, stamp);
                        heap.push((rank, Candidate::Chunk(*key)));
                    }
                }
                continue;
            }
            heap.push((entry.chunk.rank(&ranking, stamp), Candidate::Group(group)));
        }
        VictimQueue { heap, ranking }
    }

    /// Every resident chunk's footprint summed (for invariant checks in tests).
    #[cfg(test)]
    pub(super) fn footprint(&self) -> u64 {
        self.chunks.values().map(|e| e.chunk.footprint()).sum()
    }
}

/// (idle, turn, when a waiting file was read, held by the tier below, distance, older first):
/// the highest is evicted first.
pub(super) type Rank = (bool, Turn, u64, bool, usize, Reverse<u64>);

/// What the eviction queue ranks: a group by its least recently used chunk, or (in a block a
/// reader is in) one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Candidate {
    Group(GroupKey),
    Chunk(ChunkKey),
}

/// Groups by the rank of their least recently used chunk ([`Resident::victims`]).
///
/// The victim is, among the least recently used chunk of each group, the one ranked highest by
/// `(idle, turn, held below, distance, older)`, where `idle` is `!may_be_in_use(recent)`,
/// `turn` (with when a waiting file was read) is [`Turn`] and `held below` whether the disk
/// tier holds the chunk (a group is ranked by its oldest chunk's: the disk tier keeps whole
/// runs of a file, so a block's chunks are held or not together but at a run's edge, where
/// a held chunk may wait behind its group's oldest). Every chunk of a block
/// the reader is not in is needed at the same distance; only a group's oldest chunk is asked
/// whether it may still be in use: in the block a reader just left, the oldest chunk is the one
/// its stragglers finished with first, so if it is busy the group waits its turn (at worst a
/// less distant chunk goes first). Chunks of the block a reader is in are ranked one by one
/// ([`super::Chunk::distance`]: consumed ones go first).
pub(super) struct VictimQueue {
    heap: BinaryHeap<(Rank, Candidate)>,
    ranking: Ranking,
}

impl VictimQueue {
    /// The next victim, with its idleness and when it is needed (turn, distance); the caller
    /// removes it from `resident` before asking for the next one.
    pub(super) fn next(&mut self, resident: &Resident) -> Option<(ChunkKey, bool, Needed)> {
        while let Some((rank, candidate)) = self.heap.pop() {
            let (idle, turn, read_at, held, distance, Reverse(stamp)) = rank;
            let group = match candidate {
                Candidate::Chunk(key) if resident.contains(&key) => {
                    return Some((key, idle, (turn, read_at, held, distance)));
                }
                Candidate::Chunk(_) => continue,
                Candidate::Group(group) => group,
            };
            let Some((&oldest, &key)) = resident
                .groups
                .get(&group)
                .and_then(|c| c.first_key_value())
            else {
                continue; // the group is gone
            };
            let Some(entry) = resident.chunks.get(&key) else {
                continue;
            };
            if oldest != stamp {
                // Its ranked chunk was evicted since: rank its oldest one now (at the
                // group's distance).
                let idle = !entry.chunk.may_be_in_use(self.ranking.recent);
                let (turn, read_at) = entry.chunk.turn(&self.ranking);
                let held = entry.chunk.held_below();
                let rank = (idle, turn, read_at, held, distance, Reverse(oldest));
                self.heap.push((rank, Candidate::Group(group)));
                continue;
            }
            // Back in the queue: once `key` is evicted, the group's next chunk is ranked.
            self.heap.push((rank, Candidate::Group(group)));
            return Some((key, idle, (turn, read_at, held, distance)));
        }
        None
    }
}
