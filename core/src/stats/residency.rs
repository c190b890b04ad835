//! A file's blocks as one line of characters, in the order its reader walks them
//! (`files[].residency` and, for a sharded model, `models[].residency` in the stats): what a
//! script or a terminal draws as a strip.
//!
//! One character per block, in the learned order (the default order until one is learned). A
//! file's strip leaves out the blocks without bytes in it (a shard holds only some of its
//! model's blocks); a sharded model's strip has every block of the model, over all its shards.
//!
//! - `#` every chunk of the block is in the chunk cache;
//! - `>` some chunk of it is being read from the disk for a reader that waits for it;
//! - `~` some chunk of it is being prefetched (read ahead, nobody waiting yet);
//! - `+` part of it is in the cache, nothing of it being read;
//! - `-` none of it is in the cache, some of it was before (evicted, dropped, or read uncached);
//! - `.` none of it was ever read from the disk.
//!
//! The first that applies, in this order. The reader's current block is given as its index in
//! the strip ([`Residency::current`]). The states are the chunk cache's only
//! ([`crate::cache::ChunkMarks`], read without its lock): a passthrough file's bytes live in
//! the kernel's page cache, which this does not see.

use crate::cache::plan::ChunkPlan;
use crate::cache::ChunkState;

/// A block all of whose chunks are resident.
pub const RESIDENT: char = '#';
/// A block some of whose chunks a reader waits for.
pub const READING: char = '>';
/// A block some of whose chunks are being prefetched.
pub const PREFETCHING: char = '~';
/// A block partly resident, nothing of it being read.
pub const PARTLY: char = '+';
/// A block none of whose chunks is resident, some of them read before.
pub const EVICTED: char = '-';
/// A block none of whose chunks was ever read.
pub const NEVER_READ: char = '.';

/// The strip of one file and where its reader is in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Residency {
    pub strip: String,
    /// Index in `strip` of the block the reader is in, or was in last (`None`: no block read
    /// yet, or since a warm rewound the reader).
    pub current: Option<usize>,
    /// Index in `strip` of the block furthest ahead of the reader that prefetch read into.
    pub prefetch_front: Option<usize>,
}

/// One file version's part of a strip: its plan and where each of its chunks is.
pub struct Part<'a> {
    pub plan: &'a ChunkPlan,
    pub states: Vec<ChunkState>,
}

/// Which blocks a strip has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocks {
    /// Only those with bytes in the parts (a file's strip).
    Held,
    /// Every block of the order (a sharded model's strip, whose shards not opened yet have no
    /// part: their blocks were never read).
    All,
}

/// The strip of the blocks walked in `order`, cut into chunks by `parts`; `current` is the
/// reader's block and `front` the block furthest ahead that prefetch read into.
pub fn strip(
    order: &[usize],
    parts: &[Part<'_>],
    (current, front): (Option<usize>, Option<usize>),
    blocks: Blocks,
) -> Residency {
    let mut strip = String::with_capacity(order.len());
    let (mut at, mut front_at) = (None, None);
    for &block in order {
        let states: Vec<ChunkState> = parts
            .iter()
            .flat_map(|part| {
                part.plan
                    .block_chunks(block)
                    .iter()
                    .map(|&c| part.states.get(c).copied().unwrap_or(ChunkState::NeverRead))
            })
            .collect();
        if states.is_empty() && blocks == Blocks::Held {
            continue;
        }
        if current == Some(block) {
            at = Some(strip.chars().count());
        }
        if front == Some(block) {
            front_at = Some(strip.chars().count());
        }
        strip.push(block_char(&states));
    }
    Residency {
        strip,
        current: at,
        prefetch_front: front_at,
    }
}

fn block_char(states: &[ChunkState]) -> char {
    let any = |want: ChunkState| states.contains(&want);
    if !states.is_empty() && states.iter().all(|&s| s == ChunkState::Resident) {
        RESIDENT
    } else if any(ChunkState::Reading) {
        READING
    } else if any(ChunkState::Prefetching) {
        PREFETCHING
    } else if any(ChunkState::Resident) {
        PARTLY
    } else if any(ChunkState::Evicted) {
        EVICTED
    } else {
        NEVER_READ
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{Format, TensorIndex};

    /// A file of `blocks` blocks of two 4 MiB chunks each (one 8 MiB tensor per block).
    fn plan(blocks: usize) -> ChunkPlan {
        let mut header = serde_json::Map::new();
        for b in 0..blocks {
            let start = b * (8 << 20);
            header.insert(
                format!("model.layers.{b}.weight"),
                serde_json::json!({"dtype": "U8", "shape": [8 << 20],
                                   "data_offsets": [start, start + (8 << 20)]}),
            );
        }
        let json = serde_json::to_vec(&header).unwrap_or_default();
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&json);
        let size = bytes.len() as u64 + (blocks as u64) * (8 << 20);
        let index: TensorIndex = match Format::Safetensors.parse(&bytes, size) {
            Ok(index) => index,
            Err(e) => panic!("test header does not parse: {e:?}"),
        };
        ChunkPlan::for_index(&index)
    }

    #[test]
    fn one_character_per_block_in_the_order_with_the_reader_marked() {
        use ChunkState::*;
        let plan = plan(7);
        assert_eq!(plan.len(), 14);
        let mut states = vec![NeverRead; plan.len()];
        let mut set = |block: usize, pair: [ChunkState; 2]| {
            for (c, state) in plan.block_chunks(block).iter().zip(pair) {
                states[*c] = state;
            }
        };
        set(0, [Resident, Resident]);
        set(1, [Resident, Evicted]);
        set(2, [Evicted, Reading]);
        set(3, [Prefetching, Resident]);
        set(4, [Evicted, NeverRead]);
        set(5, [NeverRead, NeverRead]);
        set(6, [Reading, Prefetching]);
        let order: Vec<usize> = (0..7).rev().collect();
        let parts = [Part {
            plan: &plan,
            states,
        }];
        let got = strip(&order, &parts, (Some(2), Some(1)), Blocks::Held);
        assert_eq!(got.strip, ">.-~>+#");
        assert_eq!((got.current, got.prefetch_front), (Some(4), Some(5)));
        let none = strip(&order, &parts, (None, None), Blocks::Held);
        assert_eq!((none.current, none.prefetch_front), (None, None));
    }

    /// A model's strip spans its shards' parts, and a block no opened shard holds is never read;
    /// a file's strip leaves it out.
    #[test]
    fn a_model_strip_spans_its_shards_and_keeps_blocks_no_part_holds() {
        let plan = plan(2);
        let resident = vec![ChunkState::Resident; plan.len()];
        let parts = [Part {
            plan: &plan,
            states: resident,
        }];
        let order = [0, 1, 2, 3];
        let model = strip(&order, &parts, (Some(3), None), Blocks::All);
        assert_eq!((model.strip.as_str(), model.current), ("##..", Some(3)));
        let file = strip(&order, &parts, (Some(3), None), Blocks::Held);
        assert_eq!((file.strip.as_str(), file.current), ("##", None));
    }
}
