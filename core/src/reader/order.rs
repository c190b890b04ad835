//! The learned block access order of one file.
//!
//! Diffusion models are read block by block in *module* order, once at load and again on every
//! sampling step. That order is neither file order (writers sort names, so `blocks.10` comes
//! before `blocks.2`) nor always the numeric one (a UNet runs input, middle, then output blocks;
//! Flux runs its double blocks before its single blocks). [`BlockOrder`] watches which blocks
//! readers touch and learns the order of one pass, so prefetch can fetch the block that comes
//! next and eviction can drop the block needed furthest in the future.
//!
//! # Rules
//!
//! **Passes.** Touches are grouped into passes. Within a pass, a block is appended to the pass's
//! order on its *first* touch; later touches of a block already in the pass change nothing. A
//! multi-threaded reader (ComfyUI: 8 threads × 2 MiB `pread`s) interleaves touches of blocks `k`
//! and `k + 1` near their boundary (`k, k+1, k, k+1, k+2, k+1, …`), but it hands out a block's
//! slices in order, so the first touch of `k` still comes before the first touch of `k + 1`,
//! and first touches give `k < k+1 < k+2`. (Were two first touches ever swapped, the two
//! blocks would be learned swapped: both still sit in the read-ahead window, and the next pass
//! corrects it.)
//!
//! **A new pass** starts when the reader touches a block of the current pass that lies more
//! than [`TOLERANCE`] first touches behind the newest one: the reader jumped back, which is how
//! a new sampling step (or a restarted load) looks. The touched block opens the new pass.
//!
//! **Learning.** The finished pass replaces the learned order only if it touched at least half
//! of the blocks; a shorter one is discarded, and the learned order stays. Half is enough to be
//! a real forward pass of a model whose other blocks stay in VRAM, and it keeps a short pass (a
//! probe, a loader reading a few tensors, an aborted step) from reordering the whole file on
//! little evidence; discarding it (rather than continuing it) means a reader that read a few
//! blocks in another order and restarted is learned from its restart. Files with at most
//! `TOLERANCE + 1` blocks never jump back by more than the tolerance, so they keep the default
//! order; there is nothing worth learning in them. A lone stray touch far behind (another
//! process reading the file) ends a pass early; the next full pass repairs the order.
//!
//! **Merging.** Blocks the finished pass never touched (skipped because they sat in VRAM) keep
//! their place *relative to the block they followed* in the previous order: each unseen block
//! is placed, in its old relative order, right after the nearest touched block before it in the
//! previous order (cyclically). Skipping blocks 10–12 therefore keeps them between 9 and 13,
//! and skipping the first blocks keeps the order a rotation of the old one; order is cyclic
//! (the pass after the last block starts at the first), so a rotation means the same.
//!
//! **Stragglers.** A thread may still be finishing the last block of a pass while the others
//! start the next pass. While the new pass has at most [`TOLERANCE`] blocks, a first touch of a
//! block among the last [`TOLERANCE`] first touches of the previous pass is taken as such a
//! straggler and ignored: otherwise the last block would be learned second. If the block really
//! belongs early in the new pass, it is learned one pass later (the previous pass then no longer
//! ends with it).
//!
//! **`(other)`**, the non-block group, is touched at the start and the end of a pass. It needs
//! no special case, which is just as well since nothing here knows which index it is: its first
//! touch puts it first in the pass, and its touch at the end is a jump back that ends the pass
//! and opens the next one with `(other)`, where the next pass's own start touch would have put
//! it anyway.
//!
//! **Robustness.** A reader repeating one order learns the same order on every pass; a reader
//! that changes order is learned after one full pass in the new order. Indexes out of range are
//! ignored. [`BlockOrder`] serializes as `{"order": [...], "learned_len": n}`, the pass in
//! progress is not saved, and deserializing checks that `order` is a permutation.

use serde::{Deserialize, Serialize};

/// How far, in first touches, a reader may touch behind the newest block of its pass without
/// that being a new pass, and how many blocks at the end of a pass may still be touched by
/// stragglers as the next pass starts. Readers touch at most two blocks at once (a thread
/// finishing block `k` while others start `k + 1`); 4 doubles that for the reader's small
/// tensors and unusual thread schedules, and is still far below the dozens of blocks a real
/// new pass jumps back over.
pub const TOLERANCE: usize = 4;

/// How many of the last blocks of a pass count as stragglers when the next pass starts:
/// [`TOLERANCE`], but at most a quarter of the blocks. Straggler touches are ignored until the
/// new pass has more than `TOLERANCE` blocks, so the blocks outside the tail must be able to
/// take it there: with six blocks and a tail of four, a pass could never grow past its first
/// two blocks, every later block was "a straggler", and no block after the second was ever
/// entered or prefetched again (the acceptance benchmark's `--quick` model, 6 blocks).
fn straggler_tail(blocks: usize) -> usize {
    TOLERANCE.min(blocks / 4)
}

/// `in_pass` value of a block not yet touched in the current pass.
const ABSENT: usize = usize::MAX;

/// Learned order of blocks for one file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "Saved", into = "Saved")]
pub struct BlockOrder {
    /// The order prefetch follows: a permutation of `0..blocks`.
    order: Vec<usize>,
    /// `rank[block]`: the position of `block` in `order`.
    rank: Vec<usize>,
    /// Blocks touched by the pass `order` was learned from; 0 until one was.
    learned_len: usize,
    /// The pass in progress: blocks in first-touch order.
    pass: Vec<usize>,
    /// `in_pass[block]`: the position of `block` in `pass`, or [`ABSENT`].
    in_pass: Vec<usize>,
    /// The last [`TOLERANCE`] blocks of the previous pass (see "Stragglers" above).
    prev_tail: Vec<usize>,
}

/// What a touch meant, as returned by [`BlockOrder::touch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// The first touch of the block in this pass, at `position` in the pass's order.
    FirstInPass { position: usize },
    /// Nothing new: the block was touched before in this pass, is a straggler from the previous
    /// pass, or is out of range.
    Again,
    /// The reader jumped back: the block opens a new pass. The finished pass was learned if it
    /// was long enough.
    NewPass,
}

impl BlockOrder {
    /// An order over `blocks` blocks: the default order `0..blocks` until a pass is learned.
    pub fn new(blocks: usize) -> BlockOrder {
        BlockOrder::with_order((0..blocks).collect(), 0)
    }

    /// `order` must be a permutation of `0..order.len()`.
    fn with_order(order: Vec<usize>, learned_len: usize) -> BlockOrder {
        let blocks = order.len();
        let mut this = BlockOrder {
            order: Vec::new(),
            rank: vec![0; blocks],
            learned_len,
            pass: Vec::new(),
            in_pass: vec![ABSENT; blocks],
            prev_tail: Vec::new(),
        };
        this.set_order(order);
        this
    }

    fn set_order(&mut self, order: Vec<usize>) {
        for (position, &block) in order.iter().enumerate() {
            self.rank[block] = position;
        }
        self.order = order;
    }

    /// The number of blocks.
    pub fn blocks(&self) -> usize {
        self.order.len()
    }

    /// Records that a reader touched `block` now, and says what that meant: its first touch in
    /// this pass, a new pass (which learned the finished pass if that touched at least half of
    /// the blocks), or nothing new. Never panics; out-of-range blocks are ignored.
    pub fn touch(&mut self, block: usize) -> Touch {
        let Some(&at) = self.in_pass.get(block) else {
            return Touch::Again;
        };
        if at == ABSENT {
            return self.first_touch(block);
        }
        if self.pass.len() - 1 - at > TOLERANCE {
            self.start_pass(block);
            return Touch::NewPass;
        }
        Touch::Again
    }

    /// How many blocks the current pass has touched.
    pub fn pass_len(&self) -> usize {
        self.pass.len()
    }

    /// How many first touches of the current pass came after `block`'s; `None` if `block` is
    /// not in the current pass (or out of range). A touch with a lag over [`TOLERANCE`] starts
    /// a new pass.
    pub fn lag(&self, block: usize) -> Option<usize> {
        let &at = self.in_pass.get(block)?;
        (at != ABSENT).then(|| self.pass.len() - 1 - at)
    }

    fn first_touch(&mut self, block: usize) -> Touch {
        if self.pass.len() <= TOLERANCE && self.prev_tail.contains(&block) {
            return Touch::Again;
        }
        let position = self.pass.len();
        self.in_pass[block] = position;
        self.pass.push(block);
        Touch::FirstInPass { position }
    }

    /// Ends the current pass, learning it if it is long enough, and opens a new one at `block`.
    fn start_pass(&mut self, block: usize) {
        self.end_pass();
        self.in_pass[block] = 0;
        self.pass.push(block);
    }

    /// Ends the current pass (learning it if it is long enough), its last blocks taken as
    /// possible stragglers.
    fn end_pass(&mut self) {
        if self.pass.len() * 2 >= self.blocks() {
            self.learn();
        }
        for &done in &self.pass {
            self.in_pass[done] = ABSENT;
        }
        let tail = self
            .pass
            .len()
            .saturating_sub(straggler_tail(self.blocks()));
        self.prev_tail = self.pass.split_off(tail);
        self.pass.clear();
    }

    /// The next touch starts a new pass wherever it lands: ends the current pass like a jump
    /// back would (learning it if it is long enough), with no stragglers to expect from it.
    pub fn rewind(&mut self) {
        self.end_pass();
        self.prev_tail.clear();
    }

    /// Makes the current pass the learned order, merging in the blocks it did not touch (see
    /// "Merging" above). The pass is not empty.
    fn learn(&mut self) {
        let blocks = self.blocks();
        let mut order = Vec::with_capacity(blocks);
        for &seen in &self.pass {
            order.push(seen);
            let mut next = (self.rank[seen] + 1) % blocks;
            while self.in_pass[self.order[next]] == ABSENT {
                order.push(self.order[next]);
                next = (next + 1) % blocks;
            }
        }
        self.learned_len = self.pass.len();
        self.set_order(order);
    }

    /// The order prefetch should follow: the learned one once a pass was seen, else `0..blocks`.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Whether a pass was learned.
    pub fn is_learned(&self) -> bool {
        self.learned_len > 0
    }

    /// How many blocks the pass behind the learned order touched (the rest were merged in from
    /// the previous order); 0 until a pass is learned.
    pub fn learned_len(&self) -> usize {
        self.learned_len
    }

    /// Up to `count` blocks that follow `block` in [`order`](Self::order), wrapping around to
    /// the start (the next pass); never `block` itself, so at most `blocks - 1`. Empty for a
    /// block out of range.
    pub fn next_after(&self, block: usize, count: usize) -> Vec<usize> {
        let Some(&at) = self.rank.get(block) else {
            return Vec::new();
        };
        let blocks = self.blocks();
        (1..blocks)
            .take(count)
            .map(|ahead| self.order[(at + ahead) % blocks])
            .collect()
    }

    /// How many positions ahead `to` is from `from` in cyclic [`order`](Self::order) (0 = the
    /// same block): the "needed furthest in the future" key for order-aware eviction (the block
    /// just behind the reader has the largest distance, `blocks - 1`). `usize::MAX` if either
    /// block is out of range.
    pub fn distance(&self, from: usize, to: usize) -> usize {
        match (self.rank.get(from), self.rank.get(to)) {
            (Some(&from), Some(&to)) => (to + self.blocks() - from) % self.blocks(),
            _ => usize::MAX,
        }
    }
}

/// The serialized form: the order and what it was learned from, not the pass in progress.
#[derive(Serialize, Deserialize)]
struct Saved {
    order: Vec<usize>,
    learned_len: usize,
}

impl From<BlockOrder> for Saved {
    fn from(order: BlockOrder) -> Saved {
        Saved {
            order: order.order,
            learned_len: order.learned_len,
        }
    }
}

/// A saved order that is not a permutation of `0..n`, or claims more learned blocks than `n`.
#[derive(Debug, thiserror::Error)]
#[error("invalid tracker order: {0}")]
pub struct InvalidOrder(&'static str);

impl TryFrom<Saved> for BlockOrder {
    type Error = InvalidOrder;

    fn try_from(saved: Saved) -> Result<BlockOrder, InvalidOrder> {
        let blocks = saved.order.len();
        if saved.learned_len > blocks {
            return Err(InvalidOrder("learned_len exceeds the number of blocks"));
        }
        let mut present = vec![false; blocks];
        for &block in &saved.order {
            match present.get_mut(block) {
                Some(seen @ false) => *seen = true,
                _ => return Err(InvalidOrder("order is not a permutation")),
            }
        }
        Ok(BlockOrder::with_order(saved.order, saved.learned_len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Touches every block of `order` once, in order; returns what the touches returned.
    fn pass(learner: &mut BlockOrder, order: &[usize]) -> Vec<Touch> {
        order.iter().map(|&block| learner.touch(block)).collect()
    }

    /// Three passes of `order`; the third touch of `order[0]` ends the second pass.
    fn learn(learner: &mut BlockOrder, order: &[usize]) {
        pass(learner, order);
        pass(learner, order);
        learner.touch(order[0]);
    }

    /// The 40 blocks of a model whose file holds `(other)` first, then `blocks.0`..`blocks.38`
    /// sorted by name (`blocks.0, blocks.1, blocks.10, …`); read `(other)`, then numerically.
    fn name_sorted_model() -> Vec<usize> {
        let mut names: Vec<String> = (0..39).map(|n| format!("blocks.{n}")).collect();
        names.sort();
        let index = |n: usize| {
            let name = format!("blocks.{n}");
            1 + names.iter().position(|sorted| *sorted == name).unwrap()
        };
        std::iter::once(0).chain((0..39).map(index)).collect()
    }

    fn is_permutation(order: &[usize], blocks: usize) -> bool {
        let mut sorted = order.to_vec();
        sorted.sort_unstable();
        sorted == (0..blocks).collect::<Vec<_>>()
    }

    #[test]
    fn default_order_until_a_pass_is_learned() {
        let mut learner = BlockOrder::new(5);
        assert_eq!(learner.order(), &[0, 1, 2, 3, 4]);
        assert!(!learner.is_learned());
        assert_eq!(learner.learned_len(), 0);
        assert_eq!(learner.blocks(), 5);
        pass(&mut learner, &[4, 3, 2, 1, 0]);
        assert_eq!(
            learner.order(),
            &[0, 1, 2, 3, 4],
            "a pass is learned when it ends"
        );
    }

    #[test]
    fn first_touches_make_the_pass_and_a_jump_back_ends_it() {
        let truth = name_sorted_model();
        let mut learner = BlockOrder::new(truth.len());
        let touches = pass(&mut learner, &truth);
        for (position, touch) in touches.into_iter().enumerate() {
            assert_eq!(touch, Touch::FirstInPass { position });
        }
        assert_eq!(learner.touch(truth[0]), Touch::NewPass);
        assert_eq!(learner.order(), truth);
        assert!(learner.is_learned());
        assert_eq!(learner.learned_len(), 40);
    }

    #[test]
    fn repeating_the_same_order_is_stable() {
        let truth = name_sorted_model();
        let mut learner = BlockOrder::new(truth.len());
        for _ in 0..5 {
            pass(&mut learner, &truth);
            if learner.is_learned() {
                assert_eq!(learner.order(), truth);
            }
        }
        assert!(learner.is_learned());
    }

    #[test]
    fn interleaved_touches_near_a_boundary_keep_block_order() {
        let mut learner = BlockOrder::new(10);
        let touches = [0, 1, 0, 1, 2, 1, 3, 2, 3, 4, 2, 5, 4, 6, 5, 7, 8, 6, 9, 8];
        let firsts = touches
            .iter()
            .filter(|&&block| matches!(learner.touch(block), Touch::FirstInPass { .. }))
            .count();
        assert_eq!(firsts, 10);
        assert_eq!(learner.touch(9), Touch::Again);
        assert_eq!(learner.touch(0), Touch::NewPass);
        assert_eq!(learner.order(), (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn touches_within_the_tolerance_are_not_a_new_pass() {
        let mut learner = BlockOrder::new(20);
        pass(&mut learner, &(0..12).collect::<Vec<_>>());
        assert_eq!(learner.touch(11 - TOLERANCE), Touch::Again);
        assert_eq!(learner.touch(10 - TOLERANCE), Touch::NewPass);
    }

    #[test]
    fn a_short_pass_does_not_replace_a_learned_order() {
        let truth = name_sorted_model();
        let mut learner = BlockOrder::new(truth.len());
        learn(&mut learner, &truth);
        // The reader reads 10 blocks, then jumps back.
        pass(&mut learner, &truth[1..10]);
        assert_eq!(learner.touch(truth[2]), Touch::NewPass);
        assert_eq!(learner.order(), truth);
        assert_eq!(learner.learned_len(), 40);
        // The reader reads 10 blocks in file order, then restarts.
        assert_eq!(learner.touch(0), Touch::FirstInPass { position: 1 });
        pass(&mut learner, &(1..10).collect::<Vec<_>>());
        assert_eq!(learner.touch(0), Touch::NewPass);
        assert_eq!(learner.order(), truth);
        assert_eq!(learner.learned_len(), 40);
    }

    #[test]
    fn half_the_blocks_is_enough_to_learn() {
        let mut learner = BlockOrder::new(12);
        pass(&mut learner, &[5, 4, 3, 2, 1, 0]);
        assert_eq!(learner.touch(5), Touch::NewPass);
        assert_eq!(learner.order(), &[5, 6, 7, 8, 9, 10, 11, 4, 3, 2, 1, 0]);
        assert_eq!(learner.learned_len(), 6);
    }

    #[test]
    fn other_touched_at_start_and_end_does_not_break_learning() {
        let truth = name_sorted_model();
        let mut learner = BlockOrder::new(truth.len());
        let mut new_passes = 0;
        for _ in 0..3 {
            for &block in truth.iter().chain([&0]) {
                if learner.touch(block) == Touch::NewPass {
                    new_passes += 1;
                    assert_eq!(learner.order(), truth);
                }
            }
        }
        assert_eq!(new_passes, 3, "each pass ends at its closing (other) touch");
    }

    #[test]
    fn adapts_when_the_order_changes() {
        // UNet-like: 0 = (other), inputs 1..=12, middle 25, outputs 13..=24.
        let unet: Vec<usize> = std::iter::once(0)
            .chain(1..=12)
            .chain([25])
            .chain(13..=24)
            .collect();
        let mut learner = BlockOrder::new(26);
        learn(&mut learner, &(0..26).collect::<Vec<_>>());
        assert_eq!(learner.order(), (0..26).collect::<Vec<_>>());
        pass(&mut learner, &unet[1..]);
        learner.touch(unet[0]);
        assert_eq!(learner.order(), unet);
    }

    #[test]
    fn skipped_blocks_keep_their_relative_place() {
        let truth = name_sorted_model();
        let mut learner = BlockOrder::new(truth.len());
        learn(&mut learner, &truth);
        // Blocks 10..13 of the order stay in VRAM this pass.
        let skipping: Vec<usize> = truth[..10].iter().chain(&truth[13..]).copied().collect();
        pass(&mut learner, &skipping[1..]);
        learner.touch(truth[0]);
        assert_eq!(learner.order(), truth);
        assert_eq!(learner.learned_len(), 37);
        // The first 5 stay in VRAM: the order is learned as a rotation of the old one.
        pass(&mut learner, &truth[1..]);
        assert_eq!(learner.touch(truth[5]), Touch::NewPass);
        pass(&mut learner, &truth[6..]);
        assert_eq!(learner.touch(truth[5]), Touch::NewPass);
        assert_eq!(learner.learned_len(), 35);
        let rotated: Vec<usize> = truth[5..].iter().chain(&truth[..5]).copied().collect();
        assert_eq!(learner.order(), rotated);
    }

    #[test]
    fn stragglers_of_the_previous_pass_are_not_learned_first() {
        let mut learner = BlockOrder::new(10);
        pass(&mut learner, &(0..10).collect::<Vec<_>>());
        assert_eq!(learner.touch(0), Touch::NewPass);
        assert_eq!(learner.touch(9), Touch::Again, "a thread finishing block 9");
        assert_eq!(learner.touch(1), Touch::FirstInPass { position: 1 });
        assert_eq!(learner.touch(8), Touch::Again);
        pass(&mut learner, &(2..10).collect::<Vec<_>>());
        learner.touch(0);
        assert_eq!(learner.order(), (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn every_block_of_a_small_file_is_entered_again_in_the_next_pass() {
        let mut learner = BlockOrder::new(6);
        pass(&mut learner, &(0..6).collect::<Vec<_>>());
        assert_eq!(learner.touch(0), Touch::NewPass);
        for block in 1..6 {
            assert_eq!(
                learner.touch(block),
                Touch::FirstInPass { position: block },
                "block {block} of the second pass"
            );
        }
    }

    #[test]
    fn out_of_range_blocks_are_ignored() {
        let mut learner = BlockOrder::new(3);
        assert_eq!(learner.touch(3), Touch::Again);
        assert_eq!(learner.touch(usize::MAX), Touch::Again);
        assert_eq!(learner.next_after(3, 2), Vec::<usize>::new());
        assert_eq!(learner.distance(0, 3), usize::MAX);
        assert_eq!(learner.distance(usize::MAX, 0), usize::MAX);
        let mut empty = BlockOrder::new(0);
        assert_eq!(empty.touch(0), Touch::Again);
        assert!(empty.order().is_empty());
        assert!(empty.next_after(0, 4).is_empty());
    }

    #[test]
    fn next_after_wraps_around() {
        let mut learner = BlockOrder::new(6);
        learn(&mut learner, &[3, 1, 4, 0, 5, 2]);
        assert_eq!(learner.next_after(3, 2), &[1, 4]);
        assert_eq!(learner.next_after(5, 3), &[2, 3, 1]);
        assert_eq!(learner.next_after(2, 1), &[3]);
        assert_eq!(learner.next_after(4, 0), Vec::<usize>::new());
        assert_eq!(learner.next_after(0, 100), &[5, 2, 3, 1, 4], "never itself");
    }

    #[test]
    fn distance_is_cyclic_positions_ahead() {
        let mut learner = BlockOrder::new(6);
        learn(&mut learner, &[3, 1, 4, 0, 5, 2]);
        assert_eq!(learner.distance(4, 4), 0);
        assert_eq!(learner.distance(4, 0), 1);
        assert_eq!(learner.distance(4, 2), 3);
        assert_eq!(learner.distance(4, 3), 4);
        assert_eq!(
            learner.distance(4, 1),
            5,
            "just behind the reader: furthest"
        );
        assert_eq!(learner.distance(2, 3), 1);
    }

    #[test]
    fn serializes_the_learned_order_only() {
        let mut learner = BlockOrder::new(6);
        learn(&mut learner, &[2, 0, 5, 3, 1, 4]);
        let json = serde_json::to_string(&learner).unwrap();
        assert_eq!(json, r#"{"order":[2,0,5,3,1,4],"learned_len":6}"#);
        let mut back: BlockOrder = serde_json::from_str(&json).unwrap();
        assert_eq!(back.order(), learner.order());
        assert!(back.is_learned());
        assert_eq!(back.distance(2, 1), 4);
        assert_eq!(back.touch(1), Touch::FirstInPass { position: 0 });
    }

    #[test]
    fn rejects_invalid_saved_orders() {
        for json in [
            r#"{"order":[0,0,1],"learned_len":3}"#,
            r#"{"order":[0,3,1],"learned_len":3}"#,
            r#"{"order":[0,1],"learned_len":3}"#,
            r#"{"order":[0,1]}"#,
        ] {
            assert!(serde_json::from_str::<BlockOrder>(json).is_err(), "{json}");
        }
    }

    /// xorshift64*: a deterministic stream for the simulation.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
        }
    }

    /// Interleaves the touches of `segments` (block, touches) as 8 threads would: a sliding
    /// window of two segments in flight, the next one admitted once the window's oldest segment
    /// is done and its newest was first touched (slices are handed out in order), touches drawn
    /// at random from those in flight.
    fn interleave(segments: &[(usize, usize)], rng: &mut Rng) -> Vec<usize> {
        let mut left: Vec<usize> = segments.iter().map(|&(_, touches)| touches).collect();
        let (mut touches, mut oldest, mut next) = (Vec::new(), 0, 0);
        while oldest < segments.len() {
            let newest_started = next == oldest || left[next - 1] < segments[next - 1].1;
            if next < oldest + 2 && next < segments.len() && newest_started {
                next += 1;
            }
            let mut pick = rng.below((oldest..next).map(|segment| left[segment]).sum());
            let mut segment = oldest;
            while pick >= left[segment] {
                pick -= left[segment];
                segment += 1;
            }
            touches.push(segments[segment].0);
            left[segment] -= 1;
            while oldest < next && left[oldest] == 0 {
                oldest += 1;
            }
        }
        touches
    }

    /// 3 passes over `truth` by 8 threads, each block read as 8 to 24 slices, `(other)` (block
    /// 0) touched at the start and, if `other_at_end`, at the end of each pass. Returns how many
    /// touches went back to the block before the previous touch's, and how many were stragglers
    /// (the last block touched while the next pass is at its start).
    fn simulate(truth: &[usize], other_at_end: bool, seed: u64) -> (usize, usize) {
        let mut segments = Vec::new();
        for _ in 0..3 {
            segments.extend(truth.iter().map(|&block| (block, 8 * (1 + block % 3))));
            if other_at_end {
                segments.push((0, 2));
            }
        }
        let touches = interleave(&segments, &mut Rng(seed));
        let returns = touches.windows(3).filter(|w| w[0] == w[2] && w[0] != w[1]);
        let (mut learner, mut new_passes, mut stragglers) = (BlockOrder::new(truth.len()), 0, 0);
        for &block in &touches {
            if learner.touch(block) == Touch::NewPass {
                new_passes += 1;
                assert_eq!(learner.order(), truth, "seed {seed}, pass {new_passes}");
                assert_eq!(learner.learned_len(), truth.len());
            } else if new_passes > 0 && learner.pass.len() < 3 && truth.ends_with(&[block]) {
                stragglers += 1;
            }
        }
        assert_eq!(new_passes, if other_at_end { 3 } else { 2 }, "seed {seed}");
        (returns.count(), stragglers)
    }

    #[test]
    fn eight_interleaved_threads_learn_the_true_order_after_one_pass() {
        let truth = name_sorted_model();
        let (mut returns, mut stragglers) = (0, 0);
        for seed in 1..=20 {
            for other_at_end in [true, false] {
                let (back, late) = simulate(&truth, other_at_end, seed);
                (returns, stragglers) = (returns + back, stragglers + late);
            }
        }
        assert!(returns > 5000, "touches interleave: {returns}");
        assert!(stragglers > 50, "passes overlap: {stragglers}");
    }

    proptest! {
        #[test]
        fn touch_never_panics_and_order_stays_a_permutation(
            blocks in 0usize..50,
            touches in proptest::collection::vec(0usize..60, 0..1500),
        ) {
            let mut learner = BlockOrder::new(blocks);
            for block in touches {
                learner.touch(block);
                prop_assert!(is_permutation(learner.order(), blocks));
            }
            prop_assert!(learner.learned_len() <= blocks);
            for block in 0..blocks {
                for (ahead, &next) in learner.next_after(block, 3).iter().enumerate() {
                    prop_assert_eq!(learner.distance(block, next), ahead + 1);
                }
            }
            let json = serde_json::to_string(&learner).unwrap();
            let back: BlockOrder = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back.order(), learner.order());
        }
    }
}
