"""Block-order prefetch and order-aware eviction, end to end.

The reader mimics ComfyUI loading / block-swapping a DiT: block by block in *model* order, each
block's tensors read by 8 threads with 2 MiB ``os.pread``s (every slice compared with the source),
then a short sleep for "compute". The checkpoint is laid out in name order (``blocks.0, blocks.1,
blocks.10, ...``), so file order is not block order and file-order read-ahead alone cannot
follow the reader. The budget is smaller than the file, so every pass after the first must read
about (file data - budget) from disk, ahead of the reader.

Per-pass numbers come from deltas of ``MNT/.tierfs/stats`` taken when the daemon is quiet
(:func:`conftest.quiesce`), so read-ahead still in flight from one pass is counted in that pass.
"""

from __future__ import annotations

import os
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import gen
from conftest import fresh_dir, quiesce

MiB = 1 << 20
THREADS = 8
SLICE = 2 * MiB
COMPUTE_S = 0.04  # "compute" per block; reading a ~18 MiB block from disk takes ~10-20 ms


# ----------------------------------------------------------------------------- model + reader

class DitModel:
    """Tensor layout of a ``blocks.N`` DiT: `pre` (embeddings), `blocks[N]`, `post` (head)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        hn, _ = gen.read_header(self.path)
        self.size = self.path.stat().st_size
        self.data_start = 8 + hn
        self.data_bytes = self.size - self.data_start
        self.blocks: dict[int, list[tuple[str, int, int]]] = {}
        self.pre: list[tuple[str, int, int]] = []
        self.post: list[tuple[str, int, int]] = []
        for t in gen.tensor_ranges(self.path):
            if (mm := re.match(r"blocks\.(\d+)\.", t[0])):
                self.blocks.setdefault(int(mm.group(1)), []).append(t)
            elif t[0].startswith("head."):
                self.post.append(t)
            else:
                self.pre.append(t)
        for ts in self.blocks.values():
            ts.sort()  # state-dict (name) order within a block
        self.n_blocks = len(self.blocks)
        self.block_bytes = {k: sum(e - s for _, s, e in ts) for k, ts in self.blocks.items()}
        self.max_block = max(self.block_bytes.values())


def _pread_full(fd: int, n: int, off: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.pread(fd, n - got, off + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


class Reader:
    """ComfyUI's pattern: a group's tensors cut into 2 MiB slices, read by 8 threads with
    ``os.pread``; every slice is compared with the same bytes of the source."""

    def __init__(self, model: DitModel, mnt_path: Path, threads: int = THREADS):
        self.model = model
        self.src_fd = os.open(model.path, os.O_RDONLY)
        self.fd = os.open(mnt_path, os.O_RDONLY)
        self.pool = ThreadPoolExecutor(threads)
        self.bad: list[str] = []

    def _slice(self, a: tuple[int, int]) -> str | None:
        off, ln = a
        got = _pread_full(self.fd, ln, off)
        if got == _pread_full(self.src_fd, ln, off):
            return None
        return f"{self.model.path.name} off={off} len={ln}: got {len(got)} B, differ from source"

    def read(self, tensors) -> None:
        slices = [(o, min(SLICE, e - o)) for _, s, e in tensors for o in range(s, e, SLICE)]
        self.bad += [r for r in self.pool.map(self._slice, slices) if r]

    def block(self, k: int) -> None:
        self.read(self.model.blocks[k])

    def run_pass(self, order, compute_s: float = COMPUTE_S) -> float:
        """(other) embeddings, then `order`'s blocks with compute after each, then the head.
        Returns the wall time of the pass."""
        t0 = time.monotonic()
        self.read(self.model.pre)
        for k in order:
            self.block(k)
            if compute_s:
                time.sleep(compute_s)
        self.read(self.model.post)
        return time.monotonic() - t0

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        os.close(self.fd)
        os.close(self.src_fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ----------------------------------------------------------------------------- stats helpers

def file_entry(st: dict, rel: str) -> dict:
    for f in st["files"]:
        if f["path"] == rel:
            return f
    raise AssertionError(f"{rel} not in stats files[]: {[f['path'] for f in st['files']]}")


def snap(m, rel: str) -> dict:
    """Quiet stats, flattened to the numbers a pass is measured by."""
    st = quiesce(m)
    f = file_entry(st, rel)
    return {
        "t": time.monotonic(),
        "disk": st["disk"]["read_bytes"],
        "issued": f["prefetch"]["issued_bytes"],
        "used": f["prefetch"]["used_bytes"],
        "wasted": f["prefetch"]["wasted_bytes"],
        "g_issued": st["prefetch"]["issued_bytes"],
        "g_used": st["prefetch"]["used_bytes"],
        "g_wasted": st["prefetch"]["wasted_bytes"],
        "stall": f["stall_seconds"],
        "g_stall": st["cache"]["stall_seconds"],
        "hits": st["cache"]["hits"],
        "misses": st["cache"]["misses"],
        "cache_used": st["cache"]["used_bytes"],
        "budget": st["cache"]["budget_bytes"],
        "window": st["kernel_page_cache"]["window_bytes"],
        "file": f,
    }


def delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in a if isinstance(a[k], (int, float)) and not isinstance(a[k], bool)}


def fmt(d: dict) -> str:
    out = []
    for k in ("disk", "issued", "used", "wasted", "stall", "hits", "misses"):
        if k in d:
            v = d[k]
            out.append(f"{k}={v / MiB:.1f}MiB" if k in ("disk", "issued", "used", "wasted") else f"{k}={v:.3g}")
    return " ".join(out)


def own_state() -> tuple[str, ...]:
    """Mount options giving the mount its own, empty state directory: learned orders are kept
    across remounts (by default in /var/lib/tierfs for root), which must not leak between tests."""
    return ("--state-dir", str(fresh_dir("state")))


def mount_model(mount, model_path: Path, budget_bytes: int, workdir: Path):
    """Mount a source dir holding (a link to) `model_path` as `dit.safetensors`."""
    src = workdir / "src"
    src.mkdir()
    try:
        os.link(model_path, src / "dit.safetensors")
    except OSError:
        os.symlink(model_path, src / "dit.safetensors")
    m = mount(src, f"{budget_bytes // MiB}MiB", own_state())
    return m, "dit.safetensors"


# ----------------------------------------------------------------------------- tests

def test_file_stats_schema(mount, tree):
    """files[] entries carry the prefetch keys of the contract, with the right types."""
    root, _ = tree
    m = mount(root, "64MiB", own_state())
    _ = (m.mnt / "flux.safetensors").read_bytes()
    f = file_entry(quiesce(m), "flux.safetensors")
    assert isinstance(f.get("order_learned"), bool), f
    assert isinstance(f.get("learned_blocks"), int) and not isinstance(f["learned_blocks"], bool), f
    assert isinstance(f.get("prefetch"), dict), f
    for k in ("issued_bytes", "used_bytes", "wasted_bytes"):
        assert isinstance(f["prefetch"].get(k), int), f"files[].prefetch.{k}: {f['prefetch']}"
    assert isinstance(f.get("stall_seconds"), (int, float)) and f["stall_seconds"] >= 0, f
    assert 0 <= f["learned_blocks"] <= f["blocks"], f


def test_numeric_order_two_passes(mount, sorted_dit, workdir):
    """Budget half the file, numeric block order, two passes: pass 2 is prefetched in time."""
    model = DitModel(sorted_dit)
    assert model.n_blocks >= 40 and model.data_bytes >= 600 * MiB, (model.n_blocks, model.data_bytes)
    budget = model.data_bytes // 2
    m, rel = mount_model(mount, sorted_dit, budget, workdir)
    order = sorted(model.blocks)
    with Reader(model, m.mnt / rel) as r:
        r.run_pass(order)
        assert not r.bad, f"pass 1: {len(r.bad)} slices differ, first: {r.bad[:3]}"
        s1 = snap(m, rel)
        t2 = r.run_pass(order)
        assert not r.bad, f"pass 2: {len(r.bad)} slices differ, first: {r.bad[:3]}"
        s2 = snap(m, rel)
    d = delta(s1, s2)
    f = s2["file"]
    msg = (f"pass 2: {fmt(d)} time={t2:.2f}s; file={model.data_bytes / MiB:.0f}MiB "
           f"budget={budget / MiB:.0f}MiB; file stats: {f}")
    assert f["order_learned"] is True, msg
    assert model.n_blocks <= f["learned_blocks"] <= model.n_blocks + 1, (
        f"learned_blocks {f['learned_blocks']}, want {model.n_blocks} blocks (+1 for (other)); {msg}")
    assert d["used"] > 0, f"no prefetched bytes used in pass 2; {msg}"
    assert d["used"] >= 0.5 * d["disk"], f"prefetch.used_bytes delta is not most of pass 2's disk reads; {msg}"
    # Bound: file stall_seconds (summed over the 8 reader threads) < 20 % of pass 2's wall time.
    assert d["stall"] < 0.2 * t2, f"readers stalled {d['stall']:.2f}s (summed over threads) >= 20% of {t2:.2f}s; {msg}"
    assert s2["cache_used"] <= s2["budget"], msg
    assert m.alive()
    print(msg)


def test_learned_non_numeric_order(mount, sorted_dit, workdir):
    """A fixed shuffled block order (not numeric, not file order), 3 passes: in pass 3 prefetch
    follows the learned order — most disk reads are prefetches that get used, little is wasted."""
    model = DitModel(sorted_dit)
    budget = model.data_bytes // 2
    m, rel = mount_model(mount, sorted_dit, budget, workdir)
    order = sorted(model.blocks)
    random.Random(5).shuffle(order)
    with Reader(model, m.mnt / rel) as r:
        r.run_pass(order)
        r.run_pass(order)
        s2 = snap(m, rel)
        t3 = r.run_pass(order)
        s3 = snap(m, rel)
        assert not r.bad, f"{len(r.bad)} slices differ, first: {r.bad[:3]}"
    d = delta(s2, s3)
    f = s3["file"]
    msg = (f"pass 3: {fmt(d)} time={t3:.2f}s; file data={model.data_bytes / MiB:.0f}MiB "
           f"budget={budget / MiB:.0f}MiB block<={model.max_block / MiB:.1f}MiB; file stats: {f}")
    assert f["order_learned"] is True, msg
    assert model.n_blocks <= f["learned_blocks"] <= model.n_blocks + 1, msg
    assert d["used"] >= 0.5 * d["disk"] and d["used"] > 0, f"prefetch did not follow the learned order; {msg}"
    waste_bound = max(2 * model.max_block, 0.1 * d["issued"])
    assert d["wasted"] <= waste_bound, (
        f"wasted {d['wasted'] / MiB:.1f}MiB > max(2 blocks, 10% of issued) = {waste_bound / MiB:.1f}MiB; {msg}")
    assert m.alive()
    print(msg)


@pytest.mark.parametrize("kind", ["numeric", "shuffled"])
def test_repeated_passes_read_only_the_excess(mount, sorted_dit, workdir, kind):
    """Order-aware eviction: budget ~half the file, the same block order every pass (numeric, or
    a fixed shuffled order): passes 2 and 3 each read about (file data - budget) from disk, not
    the whole file."""
    model = DitModel(sorted_dit)
    budget = model.data_bytes // 2
    m, rel = mount_model(mount, sorted_dit, budget, workdir)
    order = sorted(model.blocks)
    if kind == "shuffled":
        random.Random(5).shuffle(order)
    per_pass = []
    with Reader(model, m.mnt / rel) as r:
        s = snap(m, rel)
        for _ in range(3):
            r.run_pass(order, compute_s=0.01)
            s_next = snap(m, rel)
            per_pass.append(delta(s, s_next))
            s = s_next
        assert not r.bad, f"{len(r.bad)} slices differ, first: {r.bad[:3]}"
    target = model.data_bytes - budget
    window = s["window"]
    nums = (f"file data={model.data_bytes / MiB:.1f}MiB budget={budget / MiB:.1f}MiB "
            f"file-budget={target / MiB:.1f}MiB; disk per pass: "
            + ", ".join(f"{d['disk'] / MiB:.1f}MiB" for d in per_pass)
            + "; per pass: " + " | ".join(fmt(d) for d in per_pass))
    assert per_pass[0]["disk"] >= model.data_bytes - window, f"pass 1 did not read the file from disk? {nums}"
    for i in (1, 2):
        assert per_pass[i]["disk"] <= 1.15 * target, (
            f"pass {i + 1} read {per_pass[i]['disk'] / MiB:.1f}MiB > 1.15 x (file data - budget) = "
            f"{1.15 * target / MiB:.1f}MiB; {nums}")
        # accounting sanity: at most `budget` bytes can be resident, plus the kernel page cache window
        assert per_pass[i]["disk"] >= target - window - MiB, f"disk.read_bytes undercounts? {nums}"
    assert s["cache_used"] <= s["budget"], nums
    assert m.alive()
    print(nums)


def test_jump_keeps_waste_bounded(mount, sorted_dit, workdir):
    """Blocks 0..5 then a jump to block 30 (..35), on a fresh mount with a quarter-file budget:
    no crash, exact bytes, prefetch waste bounded by a few blocks; then a full pass is exact."""
    model = DitModel(sorted_dit)
    budget = model.data_bytes // 4
    m, rel = mount_model(mount, sorted_dit, budget, workdir)
    with Reader(model, m.mnt / rel) as r:
        s0 = snap(m, rel)
        r.read(model.pre)
        for k in list(range(0, 6)) + list(range(30, 36)):
            r.block(k)
            time.sleep(COMPUTE_S)
        s1 = snap(m, rel)
        assert not r.bad, f"{len(r.bad)} slices differ, first: {r.bad[:3]}"
        assert m.alive(), m.log_tail()
        d = delta(s0, s1)
        msg = f"after 0..5 -> 30..35: {fmt(d)}; block<={model.max_block / MiB:.1f}MiB; file stats: {s1['file']}"
        bound = 4 * model.max_block
        assert d["wasted"] <= bound, f"wasted {d['wasted'] / MiB:.1f}MiB > 4 blocks ({bound / MiB:.1f}MiB); {msg}"
        r.run_pass(sorted(model.blocks), compute_s=0.005)
        assert not r.bad, f"full pass after the jump: {len(r.bad)} slices differ, first: {r.bad[:3]}"
        s2 = snap(m, rel)
    assert s2["cache_used"] <= s2["budget"]
    assert m.alive(), m.log_tail()
    print(msg, "| after a full pass:", fmt(delta(s1, s2)))
