"""The pure helpers of tests/bench/acceptance.py and sources.py: parsing, goals, ratios.

No devices, mounts or cgroups are created: the benchmark itself is not run here (it needs a
quiet machine and ~25 minutes; see tests/bench/results/read_patterns/read-patterns.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import acceptance  # noqa: E402
import sources  # noqa: E402

pytestmark = pytest.mark.timeout(10)


def test_parse_only():
    assert acceptance.parse_only("3,1, 3") == [1, 3]
    for bad in ("", "6", "0,1"):
        with pytest.raises(argparse.ArgumentTypeError):
            acceptance.parse_only(bad)


def test_judge_and_ratio():
    assert acceptance.judge(1.0, ">=", 1.0) == "PASS"
    assert acceptance.judge(0.99, ">=", 1.0) == "FAIL"
    assert acceptance.judge(1.15, "<=", 1.15) == "PASS"
    assert acceptance.judge(1.16, "<=", 1.15) == "FAIL"
    assert acceptance.judge(float("nan"), "<=", 1.15) == "FAIL"
    assert acceptance.judge(float("nan"), ">=", 0.8) == "FAIL"
    # baseline seconds / tierfs seconds: a mount twice as fast is 2.0
    assert acceptance.time_ratio(2.0, 1.0) == 2.0
    assert acceptance.time_ratio(1.0, 0.0) != acceptance.time_ratio(1.0, 0.0)  # NaN, never a pass


def test_tie_tolerance_is_the_baselines_spread_within_bounds():
    # 1.627-1.658 s: MAD 0.007 s of 1.634 -> 0.64 %
    assert abs(acceptance.tie_tolerance([1.627, 1.658, 1.634]) - 0.00635) < 1e-4
    # one slow outlier does not widen it; a single pass gets the floor; wild noise the cap
    assert acceptance.tie_tolerance([2.182, 1.624, 1.628]) == 0.005
    assert acceptance.tie_tolerance([1.63]) == 0.005
    assert acceptance.tie_tolerance([1.5, 1.7, 1.9]) == 0.015


def test_a_tie_passes_only_an_at_least_as_fast_goal():
    run = acceptance.Run.__new__(acceptance.Run)
    run.rows, run.modes = [], {}
    run.row(1, "a", "1.64", "1.63", 0.994, ">=", 1.0, "≥ 1.0", tie=0.0064)
    run.row(1, "b", "1.65", "1.63", 0.988, ">=", 1.0, "≥ 1.0", tie=0.0064)
    run.row(1, "c", "1.81", "1.63", 0.899, ">=", 0.9, "≥ 0.9", tie=0.0064)
    assert [r["result"] for r in run.rows] == ["PASS (tie, ±0.6 %)", "FAIL", "FAIL"]


def test_memory_goal():
    mib = 1 << 20
    assert acceptance.memory_goal(1000 * mib) == 1100 * mib + 64 * mib


def test_find_key():
    assert acceptance.find_key({"cache": {"pinned_bytes": 5}}, "pinned_bytes") == 5
    assert acceptance.find_key({"files": [{"a": 1}, {"pinned_bytes": 0}]}, "pinned_bytes") == 0
    assert acceptance.find_key({"cache": {}}, "pinned_bytes") is None


def test_parse_status_and_io():
    status = "Name:\ttierfs\nVmRSS:\t  2048 kB\nRssAnon:\t  1024 kB\nRssFile:\t 512 kB\nRssShmem:\t 0 kB\nThreads: 9\n"
    st = acceptance.parse_status(status)
    assert st == {"VmRSS": 2 << 20, "RssAnon": 1 << 20, "RssFile": 512 << 10, "RssShmem": 0}
    io = "rchar: 10\nwchar: 0\nsyscr: 1\nsyscw: 0\nread_bytes: 4096\nwrite_bytes: 0\n"
    assert acceptance.parse_io_read_bytes(io) == 4096
    assert acceptance.parse_io_read_bytes("") == 0


def test_file_modes():
    stats = {"files": [{"path": "a/model.safetensors", "mode": "passthrough"},
                       {"path": "other.safetensors", "mode": "fuse"},
                       {"path": "model.safetensors.bak", "mode": "x"},
                       {"path": "model.safetensors"}]}
    assert acceptance.file_modes(stats, "model.safetensors") == ["passthrough"]
    assert acceptance.file_modes({"files": []}, "m") == []
    assert acceptance.file_modes({}, "m") == []


def test_blkio_service_bytes_and_throttle_verdict():
    text = "253:1 Read 1258291200\n253:1 Write 0\n253:1 Sync 1258291200\n7:0 Read 5\nTotal 1258291205\n"
    assert sources.parse_service_bytes(text, "253:1") == 1258291200
    assert sources.parse_service_bytes(text, "7:0") == 5
    assert sources.parse_service_bytes(text, "8:0") == 0
    assert sources.throttle_verdict(1.04, 1.0) == "ok"
    assert sources.throttle_verdict(2.9, 1.0) == "fast"
    assert sources.throttle_verdict(0.5, 1.0) == "starved"


def test_sharded_model_files_and_plan(tmp_path):
    """A sharded model's files come in index order, and its reader plan covers every tensor byte
    of every shard exactly once, shard by shard, each group naming its shard."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gen
    import gen_gguf
    specs = gen.sorted_dit_specs(64, 128, 6)
    index = gen_gguf.make_sharded(tmp_path / "m", acceptance.SHARD_STEM, specs, 3, seed=1)
    files = acceptance.model_files(index)
    assert [f.name for f in files] == [f"{acceptance.SHARD_STEM}-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert acceptance.model_bytes(index) == sum(f.stat().st_size for f in files)
    single = files[0]
    assert acceptance.model_files(single) == [single]
    groups = acceptance.plan_groups(index)
    assert [g["file"] for g in groups] == sorted(g["file"] for g in groups)  # shard by shard
    # each shard's tensors in index (file) order: the groups' first bytes ascend within a shard
    for i in range(len(files)):
        firsts = [min(s for s, _ in g["ranges"]) for g in groups if g["file"] == i]
        assert firsts == sorted(firsts), i
    for i, f in enumerate(files):
        want = sorted((s, e) for _, s, e in gen.tensor_ranges(f))
        got = sorted(tuple(r) for g in groups if g["file"] == i for r in g["ranges"])
        assert got == want, f.name
    assert {g["file"] for g in acceptance.plan_groups(single)} == {0}


def test_models_note():
    st = {"models": [{"name": "m/x.safetensors.index.json", "shards": [{}, {}], "blocks": 7, "order_learned": True}]}
    assert acceptance.models_note(st) == "stats model m/x.safetensors.index.json: 2 shards, 7 blocks, order learned True"
    assert acceptance.models_note({}) == "no model in the stats' models[]"


def test_reader_reads_a_sharded_plan(tmp_path):
    """reader.py over a sharded model's plan reads every tensor byte of every shard."""
    import json
    import subprocess
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gen
    import gen_gguf
    index = gen_gguf.make_sharded(tmp_path / "m", acceptance.SHARD_STEM, gen.sorted_dit_specs(64, 128, 6), 3, seed=2)
    files = acceptance.model_files(index)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"groups": [dict(g, compute_s=0.0) for g in acceptance.plan_groups(index)]}))
    p = subprocess.run([sys.executable, str(acceptance.HERE / "reader.py"), str(plan), *map(str, files)],
                       capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(p.stdout)
    assert out["bytes"] == sum(e - s for f in files for _, s, e in gen.tensor_ranges(f))
    assert len(out["groups"]) == len(acceptance.plan_groups(index))


def test_part1_loaders_by_model_and_cases():
    """The GGUF and sharded loaders read their own models and run the cold cases only; the others the
    part-1 file and every case."""
    table = acceptance.loaders_table()
    assert {"gguf", "sharded", "comfy_checkpoint"} <= set(table)
    assert acceptance.loaders_by_model(["comfy", "comfy_checkpoint"]) == {"p1": ["comfy"], "p1_checkpoint": ["comfy_checkpoint"]}
    assert acceptance.part1_cases("comfy_checkpoint") == acceptance.COLD_CASES
    assert acceptance.loaders_by_model(["comfy", "gguf", "sharded", "pread"]) == {
        "p1": ["comfy", "pread"], "p4_gguf": ["gguf"], "p1_shards": ["sharded"]}
    assert acceptance.part1_cases("gguf") == acceptance.part1_cases("sharded") == acceptance.COLD_CASES
    assert acceptance.part1_cases("comfy") == acceptance.ALL_CASES
    assert [c[1] for c in acceptance.COLD_CASES] == ["mount cold slow", "mount cold fast", "mount cold slow quarter",
                                                  "mount cold fast quarter", "mount cold fast eighth"]
    assert {c[1] for c in acceptance.COLD_CASES} <= {c[1] for c in acceptance.ALL_CASES}
    # Every below-the-model case reports its disk bytes and wasted prefetch, for every loader.
    assert set(acceptance.BELOW_BUDGET_CASES) <= {c[1] for c in acceptance.COLD_CASES}


@pytest.mark.timeout(60)
def test_gguf_and_sharded_passes_read_every_tensor(tmp_path):
    """`--pass gguf` and `--pass sharded` (the child processes part 1 times) read every tensor
    byte of a small GGUF and of a small sharded model."""
    import json
    import subprocess
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gen
    import gen_gguf
    g = gen_gguf.make_dit_gguf(tmp_path / "m.gguf", seed=3, dim=256, n_double=1, n_single=1)
    index = gen_gguf.make_sharded(tmp_path / "s", acceptance.SHARD_STEM, gen.sorted_dit_specs(64, 128, 6), 3, seed=2)
    want = {"gguf": (g, sum(t[4] - t[3] for t in gen_gguf.gguf_tensors(g))),
            "sharded": (index, sum(e - s for f in acceptance.model_files(index) for _, s, e in gen.tensor_ranges(f)))}
    for name, (path, nbytes) in want.items():
        p = subprocess.run([sys.executable, str(acceptance.HERE / "acceptance.py"), "--pass", name, str(path)],
                           capture_output=True, text=True, timeout=50, check=True)
        assert json.loads(p.stdout.strip().splitlines()[-1])["bytes"] == nbytes, name


def test_guest_memory_turns_reporting_off_one_above_the_largest_buddy_order():
    import guest_memory
    x86 = ("Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      2\n"
           "Node 0, zone    DMA32      3      2      3      3      2      3      2      3      3      3    700\n"
           "Node 0, zone   Normal    144    312    226     93     50     13      4      2      3      2   4932\n")
    assert guest_memory.orders_in(x86) == 11  # orders 0-10: 11 is the first order no block has
    arm64_64k = "Node 0, zone   Normal " + " ".join(["1"] * 14) + "\n"
    assert guest_memory.orders_in(arm64_64k) == 14
    with pytest.raises(ValueError):
        guest_memory.orders_in("")


def test_guest_memory_faults_in_free_memory_but_the_reserve():
    import guest_memory
    GiB = 1 << 30
    assert guest_memory.mem_free("MemTotal: 24683584 kB\nMemFree:  24374272 kB\n") == 24374272 * 1024
    with pytest.raises(ValueError):
        guest_memory.mem_free("MemTotal: 1 kB\n")
    assert guest_memory.pieces_to_fault(23 * GiB, reserve=2 * GiB, piece=GiB) == 21
    assert guest_memory.pieces_to_fault(int(2.9 * GiB), reserve=2 * GiB, piece=GiB) == 0
    assert guest_memory.pieces_to_fault(GiB, reserve=2 * GiB, piece=GiB) == 0  # never negative


def test_steady_memory_turns_reporting_off_and_always_restores(tmp_path, monkeypatch):
    """SteadyMemory against stand-ins for its sysfs and /proc files (no real memory is touched:
    MemFree leaves nothing above the reserve)."""
    import errno
    import guest_memory
    order = tmp_path / "page_reporting_order"
    (tmp_path / "buddyinfo").write_text("Node 0, zone   Normal " + " ".join(["1"] * 11) + "\n")
    (tmp_path / "meminfo").write_text("MemFree: 1024 kB\n")
    monkeypatch.setattr(guest_memory, "REPORTING_ORDER", order)
    monkeypatch.setattr(guest_memory, "BUDDYINFO", tmp_path / "buddyinfo")
    monkeypatch.setattr(guest_memory, "MEMINFO", tmp_path / "meminfo")
    # no device registered: the order reads negative, nothing is written
    order.write_text("-1\n")
    with guest_memory.SteadyMemory() as steady:
        assert order.read_text() == "-1\n"
    assert "nothing to hold steady" in steady.note
    # reporting on: off for the run, then back
    order.write_text("9\n")
    with guest_memory.SteadyMemory() as steady:
        assert order.read_text().strip() == "11"
        assert "9 → 11" in steady.note
    assert order.read_text().strip() == "9"
    # a kernel refusing 11 gets its largest order, still restored afterwards
    real_write = type(order).write_text

    def refusing(path, text, *a, **k):
        if path == order and text.strip() == "11":
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(path, text, *a, **k)

    monkeypatch.setattr(type(order), "write_text", refusing)
    with guest_memory.SteadyMemory() as steady:
        assert order.read_text().strip() == "10"
        assert "refused 11" in steady.note
    assert order.read_text().strip() == "9"
    # a failure while setting up restores the order before it propagates
    monkeypatch.setattr(guest_memory, "orders_in", lambda text: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        guest_memory.SteadyMemory().__enter__()
    assert order.read_text().strip() == "9"
