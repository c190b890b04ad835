//! The touches read ahead, planned without a source: which ranges a touch asks to read, which
//! touches they serve, and what is held.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::source::AlignedBytes;

/// A safetensors header for tensors of `lens` bytes, in that file order, named `names`; the
/// index parsed from it.
fn index_of(names: &[String], lens: &[u64]) -> TensorIndex {
    let mut offset = 0u64;
    let mut fields = Vec::new();
    for (name, len) in names.iter().zip(lens) {
        fields.push(format!(
            "\"{name}\":{{\"dtype\":\"U8\",\"shape\":[{len}],\"data_offsets\":[{offset},{}]}}",
            offset + len
        ));
        offset += len;
    }
    let json = format!("{{{}}}", fields.join(","));
    let mut header = (json.len() as u64).to_le_bytes().to_vec();
    header.extend_from_slice(json.as_bytes());
    let size = header.len() as u64 + offset;
    TensorIndex::parse(&header, size).expect("index")
}

/// `n` tensors of `len` bytes each, named in file order.
fn uniform(n: usize, len: u64) -> TensorIndex {
    let names: Vec<String> = (0..n).map(|i| format!("blocks.{i:03}.weight")).collect();
    index_of(&names, &vec![len; n])
}

/// The request an `mmap` fault at tensor `t`'s first page sends: 64 KiB either side of it,
/// moved forward whole where that would start before the file.
fn touch(index: &TensorIndex, t: usize) -> (u64, u64) {
    let page = index.tensors[t].start / PAGE * PAGE;
    let start = page.saturating_sub(64 << 10);
    (start, (start + (128 << 10)).min(index.file_size))
}

/// Finishes `ranges` with bytes that are their own offsets (byte `i` of the file is `i % 251`).
fn read_all(ranges: &[Arc<AheadRange>]) {
    for r in ranges {
        let bytes: Vec<u8> = (r.start..r.end).map(|i| (i % 251) as u8).collect();
        r.finish(Some(AlignedBytes::copy_of(&bytes).expect("buffer")));
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

#[test]
fn a_touch_reads_the_next_sixteen_touches_ahead_placed_as_it_is() {
    let index = uniform(40, 1 << 20);
    let ahead = TouchAhead::default();
    let plan = ahead.on_touch(&index, touch(&index, 0), true);
    assert!(plan.covering.is_none(), "nothing was read ahead yet");
    let got: Vec<(u64, u64)> = plan.to_read.iter().map(|r| (r.start, r.end)).collect();
    assert_eq!(
        got,
        [touch(&index, 1), touch(&index, 2)],
        "the first touch: two ahead"
    );
    read_all(&plan.to_read);
    let plan = ahead.on_touch(&index, touch(&index, 1), true);
    assert!(plan.covering.is_some());
    let want: Vec<(u64, u64)> = (3..=1 + TOUCHES_AHEAD).map(|t| touch(&index, t)).collect();
    let got: Vec<(u64, u64)> = plan.to_read.iter().map(|r| (r.start, r.end)).collect();
    assert_eq!(got, want, "the second: sixteen past it");
    assert_eq!(ahead.held_bytes(), (TOUCHES_AHEAD as u64 + 1) * (128 << 10));
}

#[test]
fn the_next_touch_is_served_from_its_range_and_reads_one_more_ahead() {
    let index = uniform(40, 1 << 20);
    let ahead = TouchAhead::default();
    read_all(&ahead.on_touch(&index, touch(&index, 0), true).to_read);
    read_all(&ahead.on_touch(&index, touch(&index, 1), true).to_read);
    let request = touch(&index, 2);
    let plan = ahead.on_touch(&index, request, true);
    let covering = plan.covering.expect("the touch is covered");
    let bytes = gather(&covering, request, soon()).expect("read");
    let want: Vec<u8> = (request.0..request.1).map(|i| (i % 251) as u8).collect();
    assert_eq!(bytes, want);
    let more: Vec<(u64, u64)> = plan.to_read.iter().map(|r| (r.start, r.end)).collect();
    assert_eq!(more, [touch(&index, 2 + TOUCHES_AHEAD)]);
    // The range of the touch served stays until the touches pass it; the one before it goes.
    assert_eq!(ahead.held_bytes(), (TOUCHES_AHEAD as u64 + 1) * (128 << 10));
    read_all(&plan.to_read);
    let plan = ahead.on_touch(&index, touch(&index, 3), true);
    assert!(plan.covering.is_some());
    assert_eq!(ahead.held_bytes(), (TOUCHES_AHEAD as u64 + 1) * (128 << 10));
}

#[test]
fn touches_in_name_order_are_read_ahead_in_name_order_even_when_the_file_is_not() {
    // File order interleaves two families; names sort them one after the other.
    let n = 40;
    let names: Vec<String> = (0..n)
        .map(|i| format!("{}.{:03}", if i % 2 == 0 { "a" } else { "b" }, i / 2))
        .collect();
    let index = index_of(&names, &vec![1 << 20; n]);
    let ahead = TouchAhead::default();
    // a.000 (file 0), then a.001 (file 2): the name order.
    read_all(&ahead.on_touch(&index, touch(&index, 0), true).to_read);
    let plan = ahead.on_touch(&index, touch(&index, 2), true);
    assert!(plan.covering.is_some(), "a.001 was read ahead");
    let got: Vec<(u64, u64)> = plan.to_read.iter().map(|r| (r.start, r.end)).collect();
    // a.003 … a.017 (files 6 … 34): past a.001 in name order, a.002 read ahead already.
    let want: Vec<(u64, u64)> = (3..=17).map(|a| touch(&index, 2 * a)).collect();
    assert_eq!(got, want);
}

#[test]
fn touches_in_file_order_are_read_ahead_in_file_order() {
    let n = 48;
    // Names a permutation far from the file order.
    let names: Vec<String> = (0..n).map(|i| format!("t{:03}", (i * 29) % n)).collect();
    let index = index_of(&names, &vec![1 << 20; n]);
    let ahead = TouchAhead::default();
    let mut served = 0;
    for t in 0..30 {
        let request = touch(&index, t);
        let plan = ahead.on_touch(&index, request, true);
        read_all(&plan.to_read);
        if let Some(covering) = plan.covering {
            let bytes = gather(&covering, request, soon()).expect("read");
            assert_eq!(bytes.len() as u64, request.1 - request.0);
            served += 1;
        }
    }
    assert!(
        served >= 27,
        "after two touches the order is known: {served} of 30 served"
    );
}

#[test]
fn small_neighbours_are_read_as_one_range() {
    // Norms of 8 KiB between large weights: their pages are within one read-around.
    let mut lens = Vec::new();
    let mut names = Vec::new();
    for i in 0..20 {
        names.push(format!("b.{i:03}.a_norm"));
        lens.push(8 << 10);
        names.push(format!("b.{i:03}.b_weight"));
        lens.push(1 << 20);
    }
    let index = index_of(&names, &lens);
    let ahead = TouchAhead::default();
    let plan = ahead.on_touch(&index, touch(&index, 1), true);
    for pair in plan.to_read.windows(2) {
        assert!(
            pair[1].start >= pair[0].end,
            "ranges overlap: {:?} {:?}",
            (pair[0].start, pair[0].end),
            (pair[1].start, pair[1].end)
        );
    }
    // Each norm and the weight after it share one range (the norm's page starts it).
    assert!(
        plan.to_read.len() <= TOUCHES_AHEAD / 2 + 1,
        "{} ranges",
        plan.to_read.len()
    );
    assert!(ahead.held_bytes() <= TOUCH_AHEAD_BYTES);
}

#[test]
fn what_is_held_stays_within_its_bound_whatever_the_read_around() {
    let index = uniform(64, 2 << 20);
    let ahead = TouchAhead::default();
    // A 512 KiB read-around: sixteen of them would be 8 MiB.
    let page = index.tensors[0].start / PAGE * PAGE;
    let request = (page.saturating_sub(256 << 10), page + (256 << 10));
    let plan = ahead.on_touch(&index, request, true);
    assert!(!plan.to_read.is_empty());
    assert!(ahead.held_bytes() <= TOUCH_AHEAD_BYTES);
    for t in 1..40 {
        let page = index.tensors[t].start / PAGE * PAGE;
        let request = (page - (256 << 10), page + (256 << 10));
        let plan = ahead.on_touch(&index, request, true);
        read_all(&plan.to_read);
        assert!(
            ahead.held_bytes() <= TOUCH_AHEAD_BYTES,
            "{} bytes held",
            ahead.held_bytes()
        );
    }
}

#[test]
fn a_request_too_large_for_a_touch_or_continuing_a_run_reads_nothing_ahead() {
    let index = uniform(40, 4 << 20);
    let ahead = TouchAhead::default();
    let start = index.tensors[3].start;
    let plan = ahead.on_touch(&index, (start, start + (2 << 20)), true);
    assert!(plan.to_read.is_empty() && plan.covering.is_none());
    let plan = ahead.on_touch(&index, touch(&index, 3), false);
    assert!(plan.to_read.is_empty());
    // Inside a tensor, no tensor starts: no touch either.
    let mid = index.tensors[5].start + (1 << 20);
    let plan = ahead.on_touch(&index, (mid, mid + (128 << 10)), true);
    assert!(plan.to_read.is_empty());
    assert_eq!(ahead.held_bytes(), 0);
}

#[test]
fn a_touch_off_track_reads_ahead_again_from_where_it_is() {
    let index = uniform(100, 1 << 20);
    let ahead = TouchAhead::default();
    read_all(&ahead.on_touch(&index, touch(&index, 0), true).to_read);
    // A jump far past what was read ahead.
    let plan = ahead.on_touch(&index, touch(&index, 40), true);
    assert!(plan.covering.is_none());
    let first = plan.to_read.first().map(|r| (r.start, r.end));
    assert_eq!(first, Some(touch(&index, 41)));
    assert_eq!(plan.to_read.len(), TOUCHES_AHEAD);
    assert!(ahead.held_bytes() <= TOUCH_AHEAD_BYTES);
    // The ranges held before make room for the new ones, oldest first.
    read_all(&plan.to_read);
    let plan = ahead.on_touch(&index, touch(&index, 60), true);
    assert!(plan.covering.is_none());
    assert_eq!(plan.to_read.len(), TOUCHES_AHEAD, "room made for them");
    assert!(ahead.held_bytes() <= TOUCH_AHEAD_BYTES);
}

#[test]
fn a_range_that_failed_or_is_still_read_serves_nothing() {
    let index = uniform(40, 1 << 20);
    let ahead = TouchAhead::default();
    let plan = ahead.on_touch(&index, touch(&index, 0), true);
    plan.to_read[0].finish(None);
    let request = touch(&index, 1);
    let covering = ahead
        .on_touch(&index, request, true)
        .covering
        .expect("covered");
    assert!(gather(&covering, request, soon()).is_none(), "failed");
    // Still being read: the wait ends at its deadline with nothing.
    let request = touch(&index, 2);
    let covering = ahead
        .on_touch(&index, request, true)
        .covering
        .expect("covered");
    let started = Instant::now();
    let deadline = started + Duration::from_millis(50);
    assert!(gather(&covering, request, deadline).is_none());
    assert!(started.elapsed() >= Duration::from_millis(50));
    // A read of the wrong length is a failure, never served.
    let request = touch(&index, 3);
    let covering = ahead
        .on_touch(&index, request, true)
        .covering
        .expect("covered");
    covering[0].finish(Some(AlignedBytes::copy_of(&[0u8; 10]).expect("buffer")));
    assert!(gather(&covering, request, soon()).is_none());
}

#[test]
fn clear_forgets_every_range() {
    let index = uniform(40, 1 << 20);
    let ahead = TouchAhead::default();
    read_all(&ahead.on_touch(&index, touch(&index, 0), true).to_read);
    ahead.clear();
    assert_eq!(ahead.held_bytes(), 0);
    assert!(ahead
        .on_touch(&index, touch(&index, 1), true)
        .covering
        .is_none());
}

#[test]
fn a_reader_that_streams_reads_nothing_ahead_at_the_start_of_each_tensor() {
    let index = uniform(40, 1 << 20);
    let ahead = TouchAhead::default();
    for t in 1..10 {
        // A `read()` reader: the tensor's first request starts a run, the next go on with it.
        let start = index.tensors[t].start;
        let plan = ahead.on_touch(&index, (start, start + (128 << 10)), true);
        read_all(&plan.to_read);
        if t > 1 {
            assert!(plan.to_read.is_empty(), "tensor {t}: a stream, not touches");
        }
        ahead.note_continued();
    }
    assert_eq!(ahead.held_bytes(), 0);
}

#[test]
fn a_touch_that_jumps_back_waits_for_the_next_to_say_where_the_touches_go() {
    let index = uniform(60, 1 << 20);
    let ahead = TouchAhead::default();
    read_all(&ahead.on_touch(&index, touch(&index, 30), true).to_read);
    // A new pass from the start (a copy loop's first fault): nothing read ahead for it...
    let plan = ahead.on_touch(&index, touch(&index, 1), true);
    assert!(plan.covering.is_none() && plan.to_read.is_empty());
    // ...until the next touch follows it.
    let plan = ahead.on_touch(&index, touch(&index, 2), true);
    let first = plan.to_read.first().map(|r| (r.start, r.end));
    assert_eq!(first, Some(touch(&index, 3)));
}

#[test]
fn a_tensor_whose_first_page_a_touch_asked_for_is_not_read_ahead() {
    // Small tensors first in the file (as a writer puts the F32 ones), then large ones; the
    // touches go to a large one after the first request brought in the small ones' pages.
    let mut names = vec![];
    let mut lens = vec![];
    for i in 0..8 {
        names.push(format!("a.{i}.norm"));
        lens.push(4 << 10);
    }
    for i in 0..30 {
        names.push(format!("b.{i:03}.weight"));
        lens.push(1 << 20);
    }
    let index = index_of(&names, &lens);
    let ahead = TouchAhead::default();
    // Touches in file order from the first large one, after one at the file's start.
    read_all(&ahead.on_touch(&index, touch(&index, 0), true).to_read);
    ahead.clear();
    let first = touch(&index, 0);
    ahead.on_touch(&index, first, true);
    let plan = ahead.on_touch(&index, touch(&index, 8), true);
    for r in &plan.to_read {
        assert!(
            r.end > first.1,
            "a range inside what the first touch asked: {:?}",
            (r.start, r.end)
        );
    }
}
