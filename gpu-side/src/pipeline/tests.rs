use std::collections::{HashSet, VecDeque};

use super::*;
use crate::plan::{Selection, IO_ALIGN};
use crate::testutil::{file_bytes, index_of, temp_file, Spec};

const KIB: u64 = 1024;

/// A DiT-like file with mixed dtypes and, through the 3-element BF16 tensors, misaligned F32 ones.
fn specs() -> Vec<(String, &'static str, Vec<u64>)> {
    let mut out = vec![("embed".to_string(), "BF16", vec![300, 77])];
    for b in 0..6 {
        out.push((
            format!("blocks.{b}.attn.weight"),
            "BF16",
            vec![256, 200 + b],
        ));
        out.push((format!("blocks.{b}.odd"), "BF16", vec![3]));
        out.push((format!("blocks.{b}.norm"), "F32", vec![513]));
        out.push((format!("blocks.{b}.mlp"), "F8_E4M3", vec![64 * 1024 + b]));
    }
    out.push(("head".to_string(), "F16", vec![7, 7]));
    out
}

struct Fixture {
    file: Vec<u8>,
    temp: tempfile::NamedTempFile,
}

fn fixture(seed: u64) -> Fixture {
    let owned = specs();
    let specs: Vec<Spec> = owned
        .iter()
        .map(|(n, d, s)| (n.as_str(), *d, s.as_slice()))
        .collect();
    let file = file_bytes(&specs, None, seed);
    let temp = temp_file(&file);
    Fixture { file, temp }
}

fn check_tensors(plan: &LoadPlan, arena: &[u8], file: &[u8]) {
    for t in &plan.tensors {
        let want = &file[t.file_start as usize..(t.file_start + t.len) as usize];
        let got = &arena[t.offset as usize..(t.offset + t.len) as usize];
        assert!(got == want, "tensor {} differs", t.name);
    }
}

fn load_host(
    fx: &Fixture,
    selection: &Selection,
    chunk: u64,
    buffers: usize,
    config: PipelineConfig,
) -> (LoadPlan, Vec<u8>, PipelineStats) {
    let plan = LoadPlan::new(&index_of(&fx.file), selection, chunk).unwrap();
    let reader = SourceReader::open(fx.temp.path()).unwrap();
    let mut pool = StagingPool::host(buffers, chunk as usize).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes as usize];
    let stats = run(
        &plan,
        &reader,
        &mut pool,
        &mut HostSink::new(&mut arena),
        config,
    )
    .unwrap();
    (plan, arena, stats)
}

#[test]
fn host_loads_are_bit_exact_for_every_thread_buffer_and_chunk_count() {
    let fx = fixture(1);
    let subset = Selection::Blocks(vec!["blocks.0".into(), "blocks.4".into()]);
    for selection in [Selection::All, subset] {
        for (threads, buffers, chunk) in [(1, 1, 4 * KIB), (3, 2, 64 * KIB), (8, 16, 1024 * KIB)] {
            for mode in [ReadMode::Direct, ReadMode::Buffered] {
                let config = PipelineConfig { threads, mode };
                let (plan, arena, stats) = load_host(&fx, &selection, chunk, buffers, config);
                assert!(
                    !plan.relocations.is_empty(),
                    "fixture must exercise relocation"
                );
                check_tensors(&plan, &arena, &fx.file);
                assert_eq!(stats.chunks, plan.chunks.len());
                assert_eq!(stats.read_bytes, plan.read_bytes);
                let kept: u64 = plan.chunks.iter().map(|c| c.keep_end - c.keep_start).sum();
                assert_eq!(stats.copied_bytes, kept, "only tensor bytes are copied");
                assert_eq!(stats.direct_io, mode == ReadMode::Direct);
            }
        }
    }
}

/// One queued operation of [`DelayedSink`]: a copy or a relocation, completed in FIFO order like
/// the operations of a CUDA stream.
enum Op {
    Copy {
        id: usize,
        src: *const u8,
        len: usize,
        checksum: u64,
        dst: u64,
    },
    Relocate {
        from: u64,
        to: u64,
        len: u64,
    },
}

/// A sink that, like an asynchronous device copy, reads the source only when the copy "runs":
/// later, in submission order, a few operations per `reclaim`. It checks that the source still
/// holds what it held at submission (no buffer reused early) and that no id is in flight twice.
struct DelayedSink<'a> {
    dst: &'a mut [u8],
    queue: VecDeque<Op>,
    in_flight: HashSet<usize>,
    step: usize,
    submitted: Vec<u64>,
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl DelayedSink<'_> {
    fn complete_one(&mut self) -> Option<usize> {
        match self.queue.pop_front()? {
            Op::Copy {
                id,
                src,
                len,
                checksum: sum,
                dst,
            } => {
                // SAFETY: the pipeline promises `src` stays valid until the id is reclaimed.
                let src = unsafe { std::slice::from_raw_parts(src, len) };
                assert_eq!(
                    checksum(src),
                    sum,
                    "buffer {id} changed while its copy was pending"
                );
                self.dst[dst as usize..dst as usize + len].copy_from_slice(src);
                self.in_flight.remove(&id);
                Some(id)
            }
            Op::Relocate { from, to, len } => {
                self.dst
                    .copy_within(from as usize..(from + len) as usize, to as usize);
                None
            }
        }
    }
}

impl Sink for DelayedSink<'_> {
    unsafe fn submit(&mut self, id: usize, src: &[u8], arena_offset: u64) -> Result<(), SinkError> {
        assert!(
            self.in_flight.insert(id),
            "buffer {id} submitted while in flight"
        );
        self.submitted.push(arena_offset);
        self.queue.push_back(Op::Copy {
            id,
            src: src.as_ptr(),
            len: src.len(),
            checksum: checksum(src),
            dst: arena_offset,
        });
        Ok(())
    }

    fn reclaim(&mut self, wait: bool) -> Result<Vec<usize>, SinkError> {
        // Finish 0, 1 or 2 operations per call, in rotation; at least one copy when waiting.
        self.step += 1;
        let mut budget = self.step % 3;
        let mut done = Vec::new();
        while (budget > 0 || (wait && done.is_empty())) && !self.queue.is_empty() {
            done.extend(self.complete_one());
            budget = budget.saturating_sub(1);
        }
        Ok(done)
    }

    fn relocate(&mut self, from: u64, to: u64, len: u64) -> Result<(), SinkError> {
        self.queue.push_back(Op::Relocate { from, to, len });
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        while !self.queue.is_empty() {
            self.complete_one();
        }
        Ok(())
    }
}

fn delayed_load(threads: usize, buffers: usize) -> (LoadPlan, Vec<u8>, Vec<u64>, Fixture) {
    let fx = fixture(2);
    let plan = LoadPlan::new(&index_of(&fx.file), &Selection::All, 8 * KIB).unwrap();
    let reader = SourceReader::open(fx.temp.path()).unwrap();
    let mut pool = StagingPool::host(buffers, 8 * KIB as usize).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes as usize];
    let mut sink = DelayedSink {
        dst: &mut arena,
        queue: VecDeque::new(),
        in_flight: HashSet::new(),
        step: 0,
        submitted: Vec::new(),
    };
    let config = PipelineConfig {
        threads,
        mode: ReadMode::Direct,
    };
    run(&plan, &reader, &mut pool, &mut sink, config).unwrap();
    let submitted = sink.submitted;
    (plan, arena, submitted, fx)
}

#[test]
fn buffers_are_reused_only_after_their_asynchronous_copy_finished() {
    for (threads, buffers) in [(1, 1), (2, 2), (4, 3), (8, 16)] {
        let (plan, arena, submitted, fx) = delayed_load(threads, buffers);
        check_tensors(&plan, &arena, &fx.file);
        let mut want: Vec<u64> = plan
            .chunks
            .iter()
            .map(|c| c.arena_offset + c.keep_start)
            .collect();
        let mut got = submitted.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "every chunk submitted exactly once");
    }
}

#[test]
fn one_reader_submits_chunks_in_file_order() {
    let (plan, _, submitted, _) = delayed_load(1, 4);
    let order: Vec<u64> = plan
        .chunks
        .iter()
        .map(|c| c.arena_offset + c.keep_start)
        .collect();
    assert_eq!(submitted, order);
}

#[test]
fn a_file_shorter_than_its_plan_fails_without_hanging() {
    let fx = fixture(3);
    let plan = LoadPlan::new(&index_of(&fx.file), &Selection::All, 16 * KIB).unwrap();
    let cut = fx.file.len() - 5000;
    let short = temp_file(&fx.file[..cut]);
    let reader = SourceReader::open(short.path()).unwrap();
    let mut pool = StagingPool::host(4, 16 * KIB as usize).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes as usize];
    let config = PipelineConfig {
        threads: 4,
        mode: ReadMode::Direct,
    };
    let err = run(
        &plan,
        &reader,
        &mut pool,
        &mut HostSink::new(&mut arena),
        config,
    )
    .unwrap_err();
    assert!(
        matches!(err, PipelineError::Read(ReadError::Truncated { got_end, .. }) if got_end == cut as u64),
        "{err}"
    );
}

#[test]
fn destination_errors_and_bad_settings_are_reported() {
    let fx = fixture(4);
    let plan = LoadPlan::new(&index_of(&fx.file), &Selection::All, 16 * KIB).unwrap();
    let reader = SourceReader::open(fx.temp.path()).unwrap();
    let config = PipelineConfig {
        threads: 2,
        mode: ReadMode::Buffered,
    };
    let mut small = vec![0u8; (plan.arena_bytes / 2) as usize];
    let mut pool = StagingPool::host(2, 16 * KIB as usize).unwrap();
    let err = run(
        &plan,
        &reader,
        &mut pool,
        &mut HostSink::new(&mut small),
        config,
    )
    .unwrap_err();
    assert!(
        matches!(err, PipelineError::Sink(SinkError::OutOfBounds { .. })),
        "{err}"
    );

    let mut tiny = StagingPool::host(2, IO_ALIGN as usize).unwrap();
    let err = run(&plan, &reader, &mut tiny, &mut NullSink::default(), config).unwrap_err();
    assert!(matches!(err, PipelineError::BufferTooSmall { .. }), "{err}");

    let none = PipelineConfig {
        threads: 0,
        ..config
    };
    let err = run(&plan, &reader, &mut pool, &mut NullSink::default(), none).unwrap_err();
    assert!(matches!(err, PipelineError::NoWorkers), "{err}");
}

#[test]
fn the_null_sink_reads_the_whole_plan() {
    let fx = fixture(5);
    let plan = LoadPlan::new(&index_of(&fx.file), &Selection::All, 32 * KIB).unwrap();
    let reader = SourceReader::open(fx.temp.path()).unwrap();
    let mut pool = StagingPool::host(4, 32 * KIB as usize).unwrap();
    let config = PipelineConfig {
        threads: 3,
        mode: ReadMode::Direct,
    };
    let stats = run(&plan, &reader, &mut pool, &mut NullSink::default(), config).unwrap();
    assert_eq!(stats.read_bytes, plan.read_bytes);
    assert_eq!(stats.chunks, plan.chunks.len());
}
