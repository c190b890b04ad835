use proptest::prelude::*;

use super::*;
use crate::testutil::{file_bytes, index_of, Spec};

const MIB: u64 = 1 << 20;

/// Executes a plan the way the pipeline does, in plain memory: every chunk's aligned bytes (as far
/// as the file has them) land at its arena offset, then the relocations run. Also checks that
/// every write stays inside the arena and that no two chunks write the same arena byte.
fn simulate(plan: &LoadPlan, file: &[u8]) -> Vec<u8> {
    let mut arena = vec![0u8; plan.arena_bytes as usize];
    let mut written = vec![false; arena.len()];
    for c in &plan.chunks {
        let end = (c.file_offset + c.len).min(file.len() as u64);
        assert!(
            end >= c.file_offset + c.needed(),
            "chunk needs bytes past EOF"
        );
        let src = &file[c.file_offset as usize..end as usize];
        let dst = c.arena_offset as usize;
        assert!(
            dst + c.len as usize <= arena.len(),
            "chunk {c:?} past the arena"
        );
        arena[dst..dst + src.len()].copy_from_slice(src);
        for w in &mut written[dst..dst + c.len as usize] {
            assert!(!*w, "two chunks write arena byte {dst}");
            *w = true;
        }
    }
    for r in &plan.relocations {
        arena.copy_within(r.from as usize..(r.from + r.len) as usize, r.to as usize);
    }
    arena
}

fn assert_exact(plan: &LoadPlan, file: &[u8]) {
    let arena = simulate(plan, file);
    for t in &plan.tensors {
        let want = &file[t.file_start as usize..(t.file_start + t.len) as usize];
        let got = &arena[t.offset as usize..(t.offset + t.len) as usize];
        assert_eq!(got, want, "bytes of {}", t.name);
        let size = dtype_size(&t.dtype).unwrap();
        assert_eq!(t.offset % size, 0, "{} misaligned at {}", t.name, t.offset);
    }
}

fn assert_chunks_aligned(plan: &LoadPlan) {
    for c in &plan.chunks {
        assert_eq!(c.file_offset % IO_ALIGN, 0, "{c:?}");
        assert_eq!(c.len % IO_ALIGN, 0, "{c:?}");
        assert_eq!(c.arena_offset % IO_ALIGN, 0, "{c:?}");
        assert!(c.len <= plan.chunk_bytes && c.len > 0, "{c:?}");
        assert!(c.keep_start < c.keep_end && c.keep_end <= c.len, "{c:?}");
    }
}

const DIT: &[Spec] = &[
    ("blocks.0.attn.weight", "BF16", &[1024, 1024]),
    ("blocks.0.norm.weight", "F32", &[1024]),
    ("blocks.1.attn.weight", "BF16", &[1024, 1024]),
    ("blocks.1.norm.weight", "F32", &[1024]),
    ("head.weight", "F16", &[3000, 7]),
];

#[test]
fn whole_file_is_one_extent_laid_out_as_in_the_file() {
    let file = file_bytes(DIT, None, 1);
    let index = index_of(&file);
    let plan = LoadPlan::new(&index, &Selection::All, MIB).unwrap();
    assert_eq!(plan.extents.len(), 1);
    let e = &plan.extents[0];
    assert_eq!(e.file_start, 0, "data starts in the first page");
    assert_eq!(e.data_start, index.header_bytes);
    assert_eq!(e.data_end, index.data_end);
    assert_eq!(e.file_end, align_up(index.data_end, IO_ALIGN));
    assert!(plan.relocations.is_empty());
    assert_eq!(plan.arena_bytes, e.file_end);
    for (t, info) in plan.tensors.iter().zip(&index.tensors) {
        assert_eq!(t.offset, info.start, "in place: arena mirrors the file");
    }
    assert_eq!(plan.tensor_bytes, index.data_end - index.header_bytes);
    // 4.1 MiB of data in 1 MiB reads: 5 chunks, contiguous in file and arena.
    assert_eq!(plan.chunks.len(), 5);
    for pair in plan.chunks.windows(2) {
        assert_eq!(pair[0].file_offset + pair[0].len, pair[1].file_offset);
        assert_eq!(pair[0].arena_offset + pair[0].len, pair[1].arena_offset);
    }
    assert_eq!(
        plan.chunks[0].keep_start, index.header_bytes,
        "header trimmed"
    );
    assert_chunks_aligned(&plan);
    assert_exact(&plan, &file);
}

#[test]
fn a_subset_costs_arena_and_reads_only_for_its_tensors() {
    let file = file_bytes(DIT, None, 2);
    let index = index_of(&file);
    let names = vec![
        "blocks.0.norm.weight".to_string(),
        "head.weight".to_string(),
    ];
    let plan = LoadPlan::new(&index, &Selection::Tensors(names), MIB).unwrap();
    assert_eq!(plan.tensors.len(), 2);
    assert_eq!(
        plan.extents.len(),
        2,
        "a 2 MiB unselected tensor lies between them"
    );
    // Each small tensor costs one or two pages, not the 2 MiB between them.
    assert!(plan.arena_bytes <= 2 * 2 * IO_ALIGN + align_up(3000 * 7 * 2, IO_ALIGN));
    assert_eq!(plan.read_bytes, plan.arena_bytes);
    assert_eq!(
        plan.extents[1].arena_offset,
        plan.extents[0].file_end - plan.extents[0].file_start
    );
    assert_chunks_aligned(&plan);
    assert_exact(&plan, &file);
}

#[test]
fn tensors_closer_than_a_page_share_an_extent() {
    let specs: &[Spec] = &[
        ("a", "F32", &[100]),
        ("gap", "U8", &[1000]),
        ("b", "F32", &[100]),
        ("big", "U8", &[20000]),
        ("c", "F32", &[100]),
    ];
    let file = file_bytes(specs, None, 3);
    let index = index_of(&file);
    let sel = Selection::Tensors(vec!["a".into(), "b".into(), "c".into()]);
    let plan = LoadPlan::new(&index, &sel, MIB).unwrap();
    assert_eq!(
        plan.extents.len(),
        2,
        "a+b merge across 1000 bytes, c is 20000 bytes away"
    );
    assert_exact(&plan, &file);
}

#[test]
fn blocks_select_all_their_tensors_and_unknown_names_are_errors() {
    let file = file_bytes(DIT, None, 4);
    let index = index_of(&file);
    let plan = LoadPlan::new(&index, &Selection::Blocks(vec!["blocks.1".into()]), MIB).unwrap();
    let names: Vec<&str> = plan.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["blocks.1.attn.weight", "blocks.1.norm.weight"]);
    assert_exact(&plan, &file);

    let err = LoadPlan::new(&index, &Selection::Blocks(vec!["blocks.9".into()]), MIB).unwrap_err();
    assert!(matches!(err, PlanError::UnknownBlock { ref name, .. } if name == "blocks.9"));
    assert!(err.to_string().contains("blocks.0"), "{err}");
    let err = LoadPlan::new(&index, &Selection::Tensors(vec!["nope".into()]), MIB).unwrap_err();
    assert!(matches!(err, PlanError::UnknownTensor { ref name } if name == "nope"));
}

#[test]
fn misaligned_tensors_are_relocated_to_aligned_slots() {
    // The data section starts at a multiple of 8 (the header is padded like the writer pads it),
    // so 'odd' (3 BF16 elements) is aligned, 'f' starts 6 bytes in (not a multiple of 4) and 'l'
    // 406 bytes in (not a multiple of 8).
    let specs: &[Spec] = &[
        ("odd", "BF16", &[3]),
        ("f", "F32", &[100]),
        ("l", "I64", &[7]),
        ("z", "F32", &[0]),
    ];
    let file = file_bytes(specs, None, 5);
    let index = index_of(&file);
    assert_ne!(
        index.tensors[1].start % 4,
        0,
        "test layout must misalign 'f'"
    );
    let plan = LoadPlan::new(&index, &Selection::All, MIB).unwrap();
    assert_eq!(plan.relocations.len(), 2, "{:?}", plan.relocations);
    for r in &plan.relocations {
        assert_eq!(r.to % SLOT_ALIGN, 0);
        assert!(r.to >= plan.extents[0].file_end, "slots follow the extents");
    }
    let empty = plan.tensors.iter().find(|t| t.name == "z").unwrap();
    assert_eq!((empty.offset, empty.len), (0, 0));
    assert_exact(&plan, &file);
}

#[test]
fn chunk_sizes_must_be_aligned() {
    let file = file_bytes(DIT, None, 6);
    let index = index_of(&file);
    for bad in [0, 1000, IO_ALIGN + 1] {
        assert!(matches!(
            LoadPlan::new(&index, &Selection::All, bad),
            Err(PlanError::BadChunk(b)) if b == bad
        ));
    }
}

#[test]
fn a_file_without_tensors_plans_nothing() {
    let file = file_bytes(&[], None, 7);
    let plan = LoadPlan::new(&index_of(&file), &Selection::All, MIB).unwrap();
    assert_eq!(
        (plan.arena_bytes, plan.chunks.len(), plan.tensors.len()),
        (0, 0, 0)
    );
}

const DTYPES: [&str; 6] = ["U8", "BF16", "F16", "F32", "I64", "F8_E4M3"];

fn layout() -> impl Strategy<Value = (Vec<(usize, u64)>, usize, Vec<bool>, u64)> {
    (
        prop::collection::vec((0..DTYPES.len(), 0u64..6000), 1..24),
        0usize..16,
        prop::collection::vec(any::<bool>(), 24),
        1u64..5,
    )
}

proptest! {
    /// Any layout, any subset, any chunk size: tensors come out exact and aligned, chunks are
    /// aligned and never overlap in the arena.
    #[test]
    fn plans_are_exact_for_any_layout((tensors, pad, keep, pages) in layout()) {
        let names: Vec<String> = (0..tensors.len()).map(|i| format!("t{i}")).collect();
        let shapes: Vec<[u64; 1]> = tensors.iter().map(|&(_, n)| [n]).collect();
        let specs: Vec<Spec> = tensors
            .iter()
            .enumerate()
            .map(|(i, &(d, _))| (names[i].as_str(), DTYPES[d], &shapes[i][..]))
            .collect();
        let natural = file_bytes(&specs, None, 0).len() - 8
            - specs.iter().map(|(_, d, s)| (s[0] * dtype_size(d).unwrap()) as usize).sum::<usize>();
        let file = file_bytes(&specs, Some(natural + pad), 8);
        let index = index_of(&file);
        let selected: Vec<String> =
            names.iter().zip(&keep).filter(|(_, k)| **k).map(|(n, _)| n.clone()).collect();
        for selection in [Selection::All, Selection::Tensors(selected)] {
            let plan = LoadPlan::new(&index, &selection, pages * IO_ALIGN).unwrap();
            assert_chunks_aligned(&plan);
            assert_exact(&plan, &file);
            let kept: u64 = plan.chunks.iter().map(|c| c.keep_end - c.keep_start).sum();
            let spans: u64 = plan.extents.iter().map(|e| e.data_end - e.data_start).sum();
            prop_assert_eq!(kept, spans);
        }
    }
}
