//! Reading a load's next touches ahead, for a model larger than the budget in an object store.
//!
//! **Contract.** A loader built on `mmap` touches the first page of every tensor, one after the
//! other, before it copies any ([`super::runs`]). Those touches are probes, served exactly
//! ([`super::classify`]); on an object store each one the cache does not hold waits a round trip
//! of its own. When such a touch reaches the source, the ranges the next [`TOUCHES_AHEAD`]
//! tensors' touches will ask for are read at once, in parallel, on the object store's pool: as
//! far either side of each tensor's first page as this request reaches around its tensor's (a
//! fault reads around the page it hits), in the order the touches go (name order, as
//! `safe_open` lists keys, or file order: whichever the last two touches stepped forward in
//! least), ranges that overlap or nearly touch read as one, and none for a tensor whose first
//! page an earlier touch's request brought into the page cache (its touch never comes). A later
//! touch wholly inside ranges read ahead is served from them (waiting for them while they are
//! read, at most the source's deadline), and reads the next range ahead; a touch outside them
//! reads ahead again from where it is, if it stepped forward from the last one. The first
//! touch since the file was opened reads only [`FIRST_TOUCH_AHEAD`] ahead, and a stream's
//! request stops it all: a reader that streams starts each tensor with a request that looks
//! like a touch. A range that failed is never served: that touch reads the source itself, as
//! it would have.
//!
//! Bytes are exactly the source's: a range is one read of the version the file is, served only
//! for requests it wholly covers. Ranges the chunk cache or the disk tier already hold are not
//! read. What is held is bounded: at most [`TOUCH_AHEAD_BYTES`] per file, outside the chunk
//! budget like the index, dropped as the touches pass them, at the file's next open and at its
//! first stream.
//!
//! Only a model larger than the budget on an object store: one that fits is warmed whole
//! ([`super::WARM_AFTER_TOUCHES`]), and a local disk or a network file system read in order
//! would pay a seek, or a request out of its order, for each range read ahead.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{Layout, ModelFile, ModelStore, ReadBytes};
use crate::index::{TensorIndex, TensorInfo};
use crate::source::AlignedBytes;
use crate::stats::Counters;
use crate::sync::{lock, wait_timeout, Condvar, Mutex};

/// How many tensors' touches are read ahead of the one that reached the source: enough that the
/// store's pool has a range per worker (16) while the loader takes one
/// ([measured](../../../docs/PERFORMANCE.md#models-in-an-object-store)).
pub const TOUCHES_AHEAD: usize = 16;

/// Bytes of ranges read ahead one file holds at most: sixteen touches of a 256 KiB read-around,
/// twice the default readahead window's.
pub const TOUCH_AHEAD_BYTES: u64 = 4 << 20;

/// How many tensors' touches the first touch since the file was opened reads ahead: a reader
/// that streams starts with a request that looks like a touch, and the next one tells.
pub const FIRST_TOUCH_AHEAD: usize = 2;

/// A request larger than this is no touch (a multi-threaded reader's first piece after a jump,
/// a `read()` starting a tensor): nothing is read ahead for it. Twice the 256 KiB one `mmap`
/// fault read around through the mount in the measured loads.
pub const TOUCH_MAX_BYTES: u64 = 512 << 10;

/// Predicted ranges closer than this are read as one: a round trip costs more than reading
/// this many bytes more at the store's bandwidth.
pub const MERGE_GAP: u64 = 64 << 10;

/// How far forward, in an order, a touch may be from the last one and still say that the
/// touches go in that order: the touches of small tensors whose first pages a neighbour's
/// read-around brought in never come.
const ORDER_WINDOW: usize = 4 * TOUCHES_AHEAD;

/// The page size tensors' touches are placed by: a fault reads around the page it hits.
const PAGE: u64 = 4096;

/// Stretches of the file the touches asked for that are remembered: more than the tensors of
/// the largest checkpoints (about 1 000), a few words each.
const ASKED_MAX: usize = 4096;

/// Which order the touches of a load go in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TouchOrder {
    /// Tensor names in byte order, as `safe_open`'s `keys()` lists them.
    #[default]
    Name,
    /// Where the tensors are in the file.
    File,
}

/// One range read ahead, for the touches of one tensor or of several neighbours.
#[derive(Debug)]
pub struct AheadRange {
    pub start: u64,
    pub end: u64,
    /// When it was last predicted to serve a touch (the state's count of tensors read ahead
    /// for): the ranges a touch passed are those predicted before the one serving it.
    predicted: AtomicU64,
    state: Mutex<RangeState>,
    done: Condvar,
}

#[derive(Debug)]
enum RangeState {
    Reading,
    Read(Arc<AlignedBytes>),
    Failed,
}

impl AheadRange {
    fn new(start: u64, end: u64, predicted: u64) -> AheadRange {
        AheadRange {
            start,
            end,
            predicted: AtomicU64::new(predicted),
            state: Mutex::new(RangeState::Reading),
            done: Condvar::new(),
        }
    }

    /// The read of this range is over: its bytes (exactly `[start, end)`), or `None` if it failed.
    pub fn finish(&self, bytes: Option<AlignedBytes>) {
        let read = bytes.filter(|b| b.as_slice().len() as u64 == self.end - self.start);
        *lock(&self.state) = match read {
            Some(bytes) => RangeState::Read(Arc::new(bytes)),
            None => RangeState::Failed,
        };
        self.done.notify_all();
    }

    /// The bytes once read, waiting at most until `deadline`; `None` if the read failed or is
    /// still going then.
    fn wait(&self, deadline: Instant) -> Option<Arc<AlignedBytes>> {
        let mut state = lock(&self.state);
        loop {
            match &*state {
                RangeState::Read(bytes) => return Some(Arc::clone(bytes)),
                RangeState::Failed => return None,
                RangeState::Reading => {
                    let left = deadline.checked_duration_since(Instant::now())?;
                    state = wait_timeout(&self.done, state, left).0;
                }
            }
        }
    }

    fn len(&self) -> u64 {
        self.end - self.start
    }
}

/// The touches read ahead for one file version ([module docs](self)).
#[derive(Debug, Default)]
pub struct TouchAhead {
    /// Tensors (indexes in file order) in name order, made at the first touch read ahead from.
    by_name: OnceLock<Vec<u32>>,
    /// Each tensor's position in name order.
    name_rank: OnceLock<Vec<u32>>,
    state: Mutex<AheadState>,
    /// A stream's request came since the last touch: a reader streams this file, and what
    /// looks like a touch is where it starts reading a tensor.
    continued: AtomicBool,
}

#[derive(Debug, Default)]
struct AheadState {
    /// The tensor (file order) the last touch was of.
    last: Option<usize>,
    order: TouchOrder,
    /// Position in `order` of the furthest tensor read ahead for.
    ahead_to: Option<usize>,
    ranges: Vec<Arc<AheadRange>>,
    /// Tensors read ahead for so far ([`AheadRange::predicted`]).
    predictions: u64,
    /// The touches' requests since the first (sorted, merged): their pages are in the kernel's
    /// page cache, so a tensor whose first page they hold is touched without a request.
    asked: Vec<(u64, u64)>,
}

impl AheadState {
    /// Records the request `[offset, end)` in `asked`, at most [`ASKED_MAX`] stretches kept.
    fn note_asked(&mut self, offset: u64, end: u64) {
        let at = self.asked.partition_point(|&(_, e)| e < offset);
        let mut merged = (offset, end);
        let mut last = at;
        while let Some(&(s, e)) = self.asked.get(last).filter(|&&(s, _)| s <= end) {
            merged = (merged.0.min(s), merged.1.max(e));
            last += 1;
        }
        self.asked.splice(at..last, [merged]);
        if self.asked.len() > ASKED_MAX {
            self.asked.remove(0);
        }
    }

    /// Whether byte `at` is in a request the touches asked for.
    fn was_asked(&self, at: u64) -> bool {
        let i = self.asked.partition_point(|&(_, e)| e <= at);
        self.asked.get(i).is_some_and(|&(s, _)| s <= at)
    }
}

/// What a touch leads to: the ranges that cover it (to serve it from), and the new ranges to
/// read.
#[derive(Debug, Default)]
pub struct TouchPlan {
    pub covering: Option<Vec<Arc<AheadRange>>>,
    pub to_read: Vec<Arc<AheadRange>>,
}

impl TouchAhead {
    /// Forgets every range and what the touches were (the load streams now).
    pub fn clear(&self) {
        *lock(&self.state) = AheadState::default();
    }

    /// [`Self::clear`], and no stream came either (the file was opened again).
    pub fn reset(&self) {
        self.clear();
        self.continued.store(false, Ordering::Relaxed);
    }

    /// A reader's request was part of a stream ([`super::runs`]): the next request that starts
    /// a run is where a reader starts a tensor, not a touch.
    pub fn note_continued(&self) {
        if !self.continued.load(Ordering::Relaxed) {
            self.continued.store(true, Ordering::Relaxed);
        }
    }

    /// Bytes of the ranges held now.
    #[cfg(test)]
    pub fn held_bytes(&self) -> u64 {
        lock(&self.state).ranges.iter().map(|r| r.len()).sum()
    }

    /// A touch `[offset, end)` of `index`'s file: the ranges read ahead that cover it, if they
    /// do, and the ranges to read ahead now (none for a request that is not a tensor's touch).
    /// `starts_run`: the request started a new run (a continuing one is a reader going on
    /// through a tensor, not touching the next).
    pub fn on_touch(
        &self,
        index: &TensorIndex,
        (offset, end): (u64, u64),
        starts_run: bool,
    ) -> TouchPlan {
        let mut state = lock(&self.state);
        let covering = covering(&state.ranges, offset, end);
        let Some(anchor) = touched_tensor(index, offset, end) else {
            return TouchPlan {
                covering,
                to_read: Vec::new(),
            };
        };
        state.note_asked(offset, end);
        // A reader streaming the file: what it asks is served if it was read ahead, and
        // nothing more is read ahead.
        if self.continued.swap(false, Ordering::Relaxed) {
            state.ranges.clear();
            state.ahead_to = None;
            state.last = Some(anchor);
            return TouchPlan {
                covering,
                to_read: Vec::new(),
            };
        }
        // A probe going on from another (a touch whose page is near the last one's): served
        // if it was read ahead, and nothing changes.
        if !starts_run {
            return TouchPlan {
                covering,
                to_read: Vec::new(),
            };
        }
        let reach = reach(&index.tensors[anchor], offset, end);
        let first_touch = state.last.is_none();
        let follows = match state.last {
            Some(last) => {
                let current = state.order;
                let order = self.order_of(index, (last, anchor), current);
                state.order = order.unwrap_or(current);
                order.is_some()
            }
            None => true,
        };
        state.last = Some(anchor);
        let pos = self.position(index, state.order, anchor);
        match &covering {
            // On track: the ranges predicted before those serving it, the touches passed.
            Some(used) => {
                let now = used
                    .iter()
                    .map(|r| r.predicted.load(Ordering::Relaxed))
                    .min()
                    .unwrap_or(0);
                state
                    .ranges
                    .retain(|r| r.predicted.load(Ordering::Relaxed) >= now);
            }
            // Off track: read ahead again from here if this touch follows the last one in an
            // order (or is the first), else wait for the next to say where the touches go. The
            // ranges held stay (a touch may yet ask for them) but make room for the new ones.
            None => {
                state.ahead_to = None;
                if !follows {
                    return TouchPlan::default();
                }
            }
        }
        let ahead = if first_touch {
            FIRST_TOUCH_AHEAD
        } else {
            TOUCHES_AHEAD
        };
        let to_read = self.predict(index, &mut state, (pos, ahead), reach, covering.is_none());
        tracing::trace!(
            offset,
            end,
            tensor = anchor,
            reach,
            covered = covering.is_some(),
            read = to_read.len(),
            "a touch: next touches read ahead"
        );
        TouchPlan { covering, to_read }
    }

    /// The ranges of the touches after position `pos` not read ahead yet, `reach` bytes
    /// either side of each tensor's first page, up to `ahead` past it and
    /// [`TOUCH_AHEAD_BYTES`] held, the oldest ranges held making room if `replace`; added to the
    /// state.
    fn predict(
        &self,
        index: &TensorIndex,
        state: &mut AheadState,
        (pos, ahead): (usize, usize),
        reach: u64,
        replace: bool,
    ) -> Vec<Arc<AheadRange>> {
        if reach == 0 || 2 * reach > TOUCH_MAX_BYTES {
            return Vec::new();
        }
        let mut held: u64 = state.ranges.iter().map(|r| r.len()).sum();
        let before = state.predictions;
        let first = state.ahead_to.map_or(pos + 1, |a| a.max(pos) + 1);
        let last = (pos + ahead).min(index.tensors.len().saturating_sub(1));
        let mut new: Vec<AheadRange> = Vec::new();
        for at in first..=last {
            let Some(tensor) = self.tensor_at(index, state.order, at) else {
                break;
            };
            let page = tensor.start - tensor.start % PAGE;
            if tensor.is_empty() || state.was_asked(page) {
                // No touch will come: no bytes, or its first page is cached already.
                state.ahead_to = Some(at);
                continue;
            }
            state.predictions += 1;
            let predicted = state.predictions;
            let (mut start, mut end) = (
                page.saturating_sub(reach),
                (page + reach).min(index.file_size),
            );
            // The ranges held that serve part of this touch serve it now.
            for r in state
                .ranges
                .iter()
                .filter(|r| r.start < end && start < r.end)
            {
                r.predicted.store(predicted, Ordering::Relaxed);
            }
            for r in new.iter().filter(|r| r.start < end && start < r.end) {
                r.predicted.store(predicted, Ordering::Relaxed);
            }
            trim(&state.ranges, new.iter(), &mut start, &mut end);
            if start >= end {
                state.ahead_to = Some(at);
                continue;
            }
            let merge = new.last().is_some_and(|prev| {
                start <= prev.end + MERGE_GAP
                    && end + MERGE_GAP >= prev.start
                    && end.max(prev.end) - start.min(prev.start) <= 2 * TOUCH_MAX_BYTES
            });
            let (s, e) = match new.last() {
                Some(prev) if merge => (prev.start.min(start), prev.end.max(end)),
                _ => (start, end),
            };
            let grown = (e - s)
                - if merge {
                    new.last().map_or(0, AheadRange::len)
                } else {
                    0
                };
            while replace && held + grown > TOUCH_AHEAD_BYTES {
                // The range predicted longest ago, unless this touch's predictions use it.
                let oldest = (state.ranges.iter().enumerate())
                    .map(|(i, r)| (r.predicted.load(Ordering::Relaxed), i))
                    .filter(|&(p, _)| p <= before)
                    .min();
                let Some((_, i)) = oldest else {
                    break;
                };
                held -= state.ranges.remove(i).len();
            }
            if held + grown > TOUCH_AHEAD_BYTES {
                break;
            }
            held += grown;
            match new.last_mut() {
                Some(prev) if merge => {
                    (prev.start, prev.end) = (s, e);
                    prev.predicted.store(predicted, Ordering::Relaxed);
                }
                _ => new.push(AheadRange::new(s, e, predicted)),
            }
            state.ahead_to = Some(at);
        }
        let new: Vec<Arc<AheadRange>> = new.into_iter().map(Arc::new).collect();
        state.ranges.extend(new.iter().cloned());
        new
    }

    /// Which order a touch of `to` after one of `from` follows, if it says: the one in which
    /// it is the nearer step forward (within [`ORDER_WINDOW`]); `current` on a tie.
    fn order_of(
        &self,
        index: &TensorIndex,
        (from, to): (usize, usize),
        current: TouchOrder,
    ) -> Option<TouchOrder> {
        let ranks = self.name_rank(index);
        let (a, b) = (*ranks.get(from)? as usize, *ranks.get(to)? as usize);
        let step = |x: usize, y: usize| (y > x && y - x <= ORDER_WINDOW).then(|| y - x);
        match (step(a, b), step(from, to)) {
            (Some(name), Some(file)) if name == file => Some(current),
            (Some(name), Some(file)) if name < file => Some(TouchOrder::Name),
            (_, Some(_)) => Some(TouchOrder::File),
            (Some(_), None) => Some(TouchOrder::Name),
            (None, None) => None,
        }
    }

    fn position(&self, index: &TensorIndex, order: TouchOrder, tensor: usize) -> usize {
        match order {
            TouchOrder::File => tensor,
            TouchOrder::Name => self
                .name_rank(index)
                .get(tensor)
                .map_or(tensor, |&r| r as usize),
        }
    }

    fn tensor_at<'a>(
        &self,
        index: &'a TensorIndex,
        order: TouchOrder,
        at: usize,
    ) -> Option<&'a TensorInfo> {
        let tensor = match order {
            TouchOrder::File => at,
            TouchOrder::Name => *self.by_name(index).get(at)? as usize,
        };
        index.tensors.get(tensor)
    }

    fn by_name(&self, index: &TensorIndex) -> &[u32] {
        self.by_name.get_or_init(|| {
            let mut order: Vec<u32> = (0..index.tensors.len() as u32).collect();
            order.sort_by(|&a, &b| {
                index.tensors[a as usize]
                    .name
                    .cmp(&index.tensors[b as usize].name)
            });
            order
        })
    }

    fn name_rank(&self, index: &TensorIndex) -> &[u32] {
        self.name_rank.get_or_init(|| {
            let by_name = self.by_name(index);
            let mut rank = vec![0u32; by_name.len()];
            for (pos, &tensor) in by_name.iter().enumerate() {
                rank[tensor as usize] = pos as u32;
            }
            rank
        })
    }
}

/// The tensor a touch `[offset, end)` is of: the one whose first page is in the request,
/// nearest its middle (a fault reads around the page it hits); `None` if no tensor starts in
/// it or the request is too large for a touch.
fn touched_tensor(index: &TensorIndex, offset: u64, end: u64) -> Option<usize> {
    if end <= offset || end - offset > TOUCH_MAX_BYTES {
        return None;
    }
    let middle = offset + (end - offset) / 2;
    let from = offset - offset % PAGE;
    let first = index.tensors.partition_point(|t| t.start < from);
    index.tensors[first..]
        .iter()
        .enumerate()
        .take_while(|(_, t)| t.start < end)
        .filter(|(_, t)| !t.is_empty())
        .min_by_key(|(_, t)| t.start.abs_diff(middle))
        .map(|(i, _)| first + i)
}

/// How far either side of a tensor's first page its touch reads, from the touch `[offset,
/// end)` of `tensor`: a fault reads around the page it hits, as far back as forward. Pages
/// already cached are left out of the request, so it may start later than the read-around
/// did (its end then tells how far it reaches); one that starts at the file's start was
/// moved forward whole, and reaches half its length.
fn reach(tensor: &TensorInfo, offset: u64, end: u64) -> u64 {
    if offset == 0 {
        return end / 2;
    }
    let page = tensor.start - tensor.start % PAGE;
    page.saturating_sub(offset).max(end.saturating_sub(page))
}

/// The ranges that together cover `[offset, end)` without a gap, in order; `None` if they do
/// not.
fn covering(ranges: &[Arc<AheadRange>], offset: u64, end: u64) -> Option<Vec<Arc<AheadRange>>> {
    let mut out = Vec::new();
    let mut pos = offset;
    while pos < end {
        let next = ranges.iter().find(|r| r.start <= pos && pos < r.end)?;
        pos = next.end;
        out.push(Arc::clone(next));
    }
    (!out.is_empty()).then_some(out)
}

/// Shrinks `[start, end)` by the ranges held or about to be read that cover its head or its
/// tail (a range in its middle leaves it whole: read twice, never served wrong).
fn trim<'a>(
    held: &[Arc<AheadRange>],
    new: impl Iterator<Item = &'a AheadRange> + Clone,
    start: &mut u64,
    end: &mut u64,
) {
    loop {
        let before = (*start, *end);
        for (s, e) in held
            .iter()
            .map(|r| (r.start, r.end))
            .chain(new.clone().map(|r| (r.start, r.end)))
        {
            if s <= *start && *start < e {
                *start = e;
            }
            if *start < *end && s < *end && *end <= e {
                *end = s;
            }
        }
        if (*start, *end) == before || *start >= *end {
            return;
        }
    }
}

/// `[offset, end)` copied out of `ranges` (which cover it, in order), waiting for each at most
/// until `deadline`; `None` if one failed or is still being read then.
pub fn gather(
    ranges: &[Arc<AheadRange>],
    (offset, end): (u64, u64),
    deadline: Instant,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity((end - offset) as usize);
    let mut pos = offset;
    for range in ranges {
        let bytes = range.wait(deadline)?;
        let stop = end.min(range.end);
        let from = usize::try_from(pos.checked_sub(range.start)?).ok()?;
        let to = usize::try_from(stop - range.start).ok()?;
        out.extend_from_slice(bytes.as_slice().get(from..to)?);
        pos = stop;
    }
    (pos == end).then_some(out)
}

/// How long a touch waits for a range being read when the mount has no source deadline.
pub const WAIT_UNBOUNDED: Duration = Duration::from_secs(30);

impl ModelStore {
    /// A probe `[offset, end)` of `file` that the chunk cache does not hold, served from ranges
    /// read ahead for its load's touches, after reading the next touches ahead ([module
    /// docs](self)); `None` where the file's touches are not read ahead or no range read
    /// covers it: the caller then reads it exactly, as before. `starts_run`: the request
    /// started a new run ([`super::runs`]).
    pub(super) fn read_touch_ahead(
        &self,
        file: &Arc<ModelFile>,
        (offset, end): (u64, u64),
        starts_run: bool,
    ) -> Option<ReadBytes> {
        if !file.remote || file.model_size() <= self.cache.budget() {
            return None;
        }
        let Layout::Indexed { index, .. } = file.layout() else {
            return None;
        };
        let plan = file.touch_ahead.on_touch(index, (offset, end), starts_run);
        for range in plan.to_read {
            self.read_ahead_for_touches(file, range);
        }
        let covering = plan.covering?;
        let limit = self.source_io.config().timeout.unwrap_or(WAIT_UNBOUNDED);
        let bytes = gather(&covering, (offset, end), Instant::now() + limit)?;
        Counters::add(&self.counters().touch_ahead_served_bytes, end - offset);
        Some(ReadBytes::Owned(bytes))
    }

    /// Reads `range` on the object store's pool, unless the chunk cache or the disk tier
    /// holds it (the touch is then served from there, as any probe is).
    fn read_ahead_for_touches(&self, file: &Arc<ModelFile>, range: Arc<AheadRange>) {
        if self.held_locally(file, range.start, range.end) {
            range.finish(None);
            return;
        }
        let task = {
            let (file, range) = (Arc::clone(file), Arc::clone(&range));
            let counters = Arc::clone(self.cache.counters());
            Box::new(
                move || match file.source.read_aligned(range.start, range.end) {
                    Ok(bytes) => {
                        let len = range.end - range.start;
                        Counters::add(&counters.disk_reads, 1);
                        Counters::add(&counters.disk_read_bytes, len);
                        Counters::add(&counters.touch_ahead_bytes, len);
                        range.finish(Some(bytes));
                    }
                    Err(e) => {
                        tracing::debug!(file = %file.path.display(), start = range.start, end = range.end, error = %e, "a touch read ahead failed; the touch reads the source itself");
                        range.finish(None);
                    }
                },
            )
        };
        if !self.prefetcher.submit_remote(task) {
            range.finish(None);
        }
    }

    /// Whether every chunk `[start, end)` overlaps is in the chunk cache or the disk tier (the
    /// header is in memory).
    fn held_locally(&self, file: &ModelFile, start: u64, end: u64) -> bool {
        let (Some(plan), Some(header_end)) = (file.plan(), file.header_end()) else {
            return false;
        };
        let from = start.max(header_end);
        if from >= end {
            return true;
        }
        let (Some(first), Some(last)) = (plan.chunk_at(from), plan.chunk_at(end - 1)) else {
            return false;
        };
        (first..=last).all(|chunk| {
            file.chunk_present(&self.cache, chunk)
                || plan.get(chunk).is_some_and(|span| {
                    file.disk_tier
                        .as_ref()
                        .is_some_and(|tier| tier.holds(span.start, span.end))
                })
        })
    }
}

#[cfg(test)]
#[path = "touch_ahead_tests.rs"]
mod tests;
