//! A file's blocks as one line of characters, in the order its reader walks them
//! (`files[].residency` in the stats): what a script or a terminal draws as a strip.
//!
//! One character per block of the file, in the file's learned order (the default order until
//! one is learned), blocks without bytes in the file left out (a shard holds only some of its
//! model's blocks):
//!
//! - `#` every chunk of the block is in the chunk cache;
//! - `>` some chunk of it is being read from the disk (a reader's miss or a prefetch);
//! - `+` part of it is in the cache, nothing of it is being read;
//! - `.` none of it is in the cache.
//!
//! The reader's current block is given as its index in the strip ([`Residency::current`]).
//! The states are the chunk cache's only: a passthrough file's bytes live in the kernel's page
//! cache, which this does not see.

use crate::cache::plan::ChunkPlan;
use crate::cache::ChunkState;

/// A block all of whose chunks are resident.
pub const RESIDENT: char = '#';
/// A block some of whose chunks are being read.
pub const LOADING: char = '>';
/// A block partly resident, nothing of it being read.
pub const PARTLY: char = '+';
/// A block none of whose chunks is resident.
pub const ABSENT: char = '.';

/// The strip of one file and where its reader is in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Residency {
    pub strip: String,
    /// Index in `strip` of the block the reader is in, or was in last (`None`: no block read
    /// yet, or since a warm rewound the reader).
    pub current: Option<usize>,
}

/// The strip of a file cut by `plan`, whose blocks are walked in `order`; `states[c]` is where
/// chunk `c` is ([`crate::cache::ChunkCache::chunk_states`]) and `current` the reader's block.
pub fn strip(
    order: &[usize],
    plan: &ChunkPlan,
    states: &[ChunkState],
    current: Option<usize>,
) -> Residency {
    let mut strip = String::with_capacity(order.len());
    let mut at = None;
    for &block in order {
        let chunks = plan.block_chunks(block);
        if chunks.is_empty() {
            continue;
        }
        if current == Some(block) {
            at = Some(strip.chars().count());
        }
        strip.push(block_char(chunks, states));
    }
    Residency { strip, current: at }
}

fn block_char(chunks: &[usize], states: &[ChunkState]) -> char {
    let state = |c: &usize| states.get(*c).copied().unwrap_or(ChunkState::Absent);
    let resident = chunks
        .iter()
        .filter(|c| state(c) == ChunkState::Resident)
        .count();
    if resident == chunks.len() {
        RESIDENT
    } else if chunks.iter().any(|c| state(c) == ChunkState::Loading) {
        LOADING
    } else if resident > 0 {
        PARTLY
    } else {
        ABSENT
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
        let plan = plan(4);
        assert_eq!(plan.len(), 8);
        let block_of = |b: usize| plan.block_chunks(b).to_vec();
        let mut states = vec![ChunkState::Absent; plan.len()];
        for c in block_of(0) {
            states[c] = ChunkState::Resident;
        }
        states[block_of(1)[0]] = ChunkState::Resident;
        states[block_of(2)[1]] = ChunkState::Loading;
        let order: Vec<usize> = (0..4).rev().collect();
        let got = strip(&order, &plan, &states, Some(2));
        assert_eq!(got.strip, ".>+#");
        assert_eq!(got.current, Some(1));
        assert_eq!(strip(&order, &plan, &states, None).current, None);
    }
}
