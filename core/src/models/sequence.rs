//! Which model follows which: the next model's first blocks are read while the reader is done
//! with the one before.
//!
//! Contract: when the last handle of a model file a reader streamed closes and, the last time,
//! the next other file streamed after it was `N`, the first 1/[`HEAD_SHARE`] of the budget of
//! `N` in its learned block order is queued for prefetch, so that a workflow switching between
//! models (a high-noise and a low-noise expert, a text encoder and a diffusion model) finds
//! the next model's first blocks in RAM when it opens it. Only files the chunk cache will
//! serve are warmed: a passthrough file keeps its own page cache, or competes and is then
//! served from the chunk cache (`crate::passthrough`). Files only probed (a header scan opens
//! many and streams none) are no step of a workflow: they neither learn nor warm anything.
//!
//! The warm runs at the close, not earlier
//! ([measured](../../../docs/PERFORMANCE.md#warming-the-next-model-at-the-close)).
//!
//! **A successor not seen yet is guessed**: the first model of the chain of successors that
//! ends at the closed one (for `A → B`, closing `B` guesses `A`; for `A → B → C`, closing `C`
//! guesses `A`). Workflows go round their models, so the model that waited longest comes
//! next; without the guess a cycle's second round opened its first model cold and that
//! model's first misses, with nothing of its own passed yet, evicted what it needed later
//! in the same pass ([measured](../../../docs/PERFORMANCE.md#guessing-the-next-model)). A
//! file's successor is guessed once per mount: a wrong guess reads 1/[`HEAD_SHARE`] of the
//! budget for nothing, once.
//!
//! The sequence is kept with the learned orders ([`crate::prefetch::saved::NextModel`]), so a
//! workflow's first switch after a remount is warmed too: the successor is then opened by the
//! path it had, and warmed only if it is still the version that was streamed (same key). In
//! memory, successors are held weakly: a version pruned or evicted from the table is not
//! warmed through it. [`MAX_SUCCESSORS`] bounds what a folder of many files can make it hold.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use super::ModelFile;
use crate::prefetch::saved::NextModel;

/// Share of the budget warmed of the next model (1/8): enough for its first blocks (a block of
/// a 14B DiT is 1–3 % of a 16 GiB budget) without pushing out much of what the budget keeps
/// of the others.
pub const HEAD_SHARE: u64 = 8;

/// Successors remembered in memory at most (one per model file opened).
const MAX_SUCCESSORS: usize = 1024;

/// Models a guess walks back at most: a workflow's round is a few models, and each step scans
/// the successors.
const MAX_CHAIN: usize = 16;

/// The learned sequence of model opens of one mount.
#[derive(Default)]
pub struct Sequence {
    /// The streamed file whose last handle closed most recently (and its sequence key), unless
    /// another file was streamed since.
    last_closed: Option<(Weak<ModelFile>, String)>,
    /// Successor of each file (by generation): the next different file streamed after it.
    next: HashMap<u64, Link>,
    /// Files (by generation) whose successor was guessed once: not again, so that a model read
    /// again and again after a one-off other model does not keep that model's head warm.
    /// Cleared when it holds [`MAX_SUCCESSORS`] (a file forgotten is guessed for once more).
    guessed: HashSet<u64>,
    /// Links made so far: each link's number, so that of several files that led to one the
    /// latest is taken.
    links_made: u64,
}

/// A file and the next different file streamed after it, both held weakly; `made`: its number.
struct Link {
    file: Weak<ModelFile>,
    next: Weak<ModelFile>,
    made: u64,
}

impl Link {
    fn leads_to(&self, generation: u64) -> bool {
        self.next
            .upgrade()
            .is_some_and(|n| n.generation == generation)
    }
}

/// The key a file's successor is saved under: the file's own (a shard's, not its model's).
pub fn key_of(file: &ModelFile) -> &str {
    &file.file_key
}

impl Sequence {
    /// `file` is streamed for the first time since it was opened: it follows the streamed file
    /// closed last, if another. Returns the entry to save, if any.
    pub fn streamed(&mut self, file: &Arc<ModelFile>) -> Option<(String, NextModel)> {
        let (prev, prev_key) = self.last_closed.take()?;
        let prev = prev.upgrade()?;
        if prev.generation == file.generation || same_model(&prev, file) {
            return None;
        }
        if self.next.len() >= MAX_SUCCESSORS && !self.next.contains_key(&prev.generation) {
            self.next.retain(|_, link| link.next.strong_count() > 0);
        }
        if self.next.len() < MAX_SUCCESSORS || self.next.contains_key(&prev.generation) {
            self.links_made += 1;
            let link = Link {
                file: Arc::downgrade(&prev),
                next: Arc::downgrade(file),
                made: self.links_made,
            };
            self.next.insert(prev.generation, link);
        }
        let next = NextModel {
            next_path: file.path.clone(),
            next_source: file.source.path().to_owned(),
            next_key: key_of(file).to_owned(),
        };
        Some((prev_key, next))
    }

    /// The last handle of `file`, which a reader streamed, closed: what followed it last time
    /// in this mount, if anything did, else the guess (see the module docs).
    pub fn closed(&mut self, file: &Arc<ModelFile>) -> Successor {
        self.last_closed = Some((Arc::downgrade(file), key_of(file).to_owned()));
        let warmable = |next: &Arc<ModelFile>| {
            next.handles.load(std::sync::atomic::Ordering::Acquire) == 0
                && next.generation != file.generation
                && !same_model(file, next)
        };
        let Some(next) = self.next.get(&file.generation) else {
            if self.guessed.contains(&file.generation) {
                return Successor::Unknown { guess: None };
            }
            let guess = self.chain_start(file).filter(|g| warmable(g));
            if guess.is_some() {
                if self.guessed.len() >= MAX_SUCCESSORS {
                    self.guessed.clear();
                }
                self.guessed.insert(file.generation);
            }
            return Successor::Unknown { guess };
        };
        Successor::Known(next.next.upgrade().filter(|next| warmable(next)))
    }

    /// The first model of the chain of successors that ends at `file`, if one leads to it.
    fn chain_start(&self, file: &ModelFile) -> Option<Arc<ModelFile>> {
        // The file that led to `generation` last.
        let before = |generation: u64| {
            self.next
                .iter()
                .filter(|(_, link)| link.leads_to(generation))
                .max_by_key(|(_, link)| link.made)
                .map(|(&prev, _)| prev)
        };
        let mut start = before(file.generation)?;
        // One model back per step. `file` has no successor, so no cycle runs through it; the
        // bound stops a walk round a cycle of other models.
        for _ in 0..MAX_CHAIN {
            match before(start) {
                Some(prev) if prev != file.generation && prev != start => start = prev,
                _ => break,
            }
        }
        self.next.get(&start)?.file.upgrade()
    }
}

/// Whether `a` and `b` are shards of one model (one block order, one reader): the model's own
/// prefetch crosses from shard to shard, and a warm would rewind its reader mid-pass.
fn same_model(a: &ModelFile, b: &ModelFile) -> bool {
    match (&a.tracker, &b.tracker) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

/// What followed a file the last time it closed, as this mount saw it.
pub enum Successor {
    /// Nothing seen in this mount (the saved sequence may know); `guess`: the first model of
    /// the chain that led to the file, if it can be warmed.
    Unknown { guess: Option<Arc<ModelFile>> },
    /// The file that followed, if it is still known and not open now.
    Known(Option<Arc<ModelFile>>),
}
