"""Bounded memory while streaming a file 3x (and more) the cache budget.

Bounds (from the daemon's contract), budget B:
  * daemon peak RSS (VmHWM)                          <= B + 64 MiB
  * page cache of the SOURCE file                    <= 64 MiB   (O_DIRECT / fadvise)
  * page cache of the MOUNTED file + daemon cache    <= 1.1*B + 64 MiB
Figures are printed and written to tests/bench/results/memory/bounded-memory.md (rewritten each session) (override with
$TIERFS_RESULTS) for the closing note.
"""

from __future__ import annotations

import datetime
import mmap
import os
import sys
import time
from pathlib import Path

import pytest

from conftest import MiB, Sampler, drop_caches, parse_size, proc_status_kib, results_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import machine  # noqa: E402  (tests/bench/machine.py: the date and machine line of a results file)

BUDGET = "256MiB"
_fresh = True  # the results file is rewritten by the first test of each session


def _record(mode: str, size: int, budget: int, fig: dict) -> None:
    line = (f"| {datetime.datetime.now():%Y-%m-%d %H:%M} | {mode} | {size / MiB:.0f} | {budget / MiB:.0f} | "
            f"{fig['hwm'] / MiB:.1f} | {fig['rss_max'] / MiB:.1f} | {fig['src_pc'] / MiB:.1f} | "
            f"{fig['mnt_pc'] / MiB:.1f} | {fig['mnt_plus_cache'] / MiB:.1f} | {fig['cache_max'] / MiB:.1f} | "
            f"{fig['mb_s']:.0f} |\n")
    global _fresh
    p = results_file()
    if _fresh or not p.exists():
        _fresh = False
        p.write_text("# tierfs bounded-memory figures (tests/python/test_memory.py)\n\n"
                     f"- date: {machine.date()} (every row's first column)\n"
                     f"- machine: {machine.describe()}\n\n"
                     "| date | mode | file MiB | budget MiB | daemon VmHWM MiB | max VmRSS MiB | "
                     "max src page cache MiB | max mnt page cache MiB | max (mnt pc + cache) MiB | "
                     "max cache used MiB | MB/s |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    with open(p, "a") as f:
        f.write(line)
    print(f"\n[memory] {mode}: " + ", ".join(f"{k}={v / MiB:.1f}MiB" if k != "mb_s" else f"{k}={v:.0f}"
                                          for k, v in fig.items()))


@pytest.mark.parametrize("mode", ["read", "mmap"])
def test_stream_3x_budget_bounded(mount, tree, big_file, mode):
    root, _ = tree
    budget = parse_size(BUDGET)
    rel = "dit_big.safetensors"
    src_p = root / rel
    size = src_p.stat().st_size
    assert size >= 3 * budget, f"test file {size} B must be >= 3x budget {budget} B"
    drop_caches()
    m = mount(root, BUDGET)
    mnt_p = m.mnt / rel
    sampler = Sampler(m, {"src_pc": src_p, "mnt_pc": mnt_p}, period=0.1)
    sampler.start()
    t0 = time.monotonic()
    total = 0
    try:
        with open(mnt_p, "rb", buffering=0) as f:
            if mode == "read":
                while True:
                    b = f.read(MiB)
                    if not b:
                        break
                    total += len(b)
            else:
                mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                try:
                    for off in range(0, size, MiB):
                        total += len(mm[off:off + MiB])
                finally:
                    mm.close()
        elapsed = time.monotonic() - t0
        time.sleep(0.25)  # one more sample after the pass
    finally:
        sampler.stop()
    assert total == size, f"read {total} B, file has {size} B"
    assert len(sampler.samples) >= 3, f"too few samples ({len(sampler.samples)}); errors: {sampler.errors[:3]}"
    assert not sampler.errors, f"sampling errors: {sampler.errors[:3]}"
    hwm = proc_status_kib(m.pid, "VmHWM") * 1024
    fig = {
        "hwm": hwm,
        "rss_max": sampler.max("rss"),
        "src_pc": sampler.max("src_pc"),
        "mnt_pc": sampler.max("mnt_pc"),
        "mnt_plus_cache": max(s["mnt_pc"] + s["cache_used"] for s in sampler.samples),
        "cache_max": sampler.max("cache_used"),
        "mb_s": size / elapsed / 1e6,
    }
    _record(mode, size, budget, fig)
    assert m.alive()
    problems = []
    if hwm > budget + 64 * MiB:
        problems.append(f"daemon VmHWM {hwm / MiB:.1f} MiB > budget {budget / MiB:.0f} + 64 MiB")
    if fig["src_pc"] > 64 * MiB:
        problems.append(f"source file page cache reached {fig['src_pc'] / MiB:.1f} MiB > 64 MiB")
    if fig["mnt_plus_cache"] > 1.1 * budget + 64 * MiB:
        problems.append(f"mounted file page cache + daemon cache reached {fig['mnt_plus_cache'] / MiB:.1f} MiB "
                        f"> 1.1*{budget / MiB:.0f} + 64 MiB (max mnt page cache {fig['mnt_pc'] / MiB:.1f} MiB)")
    if fig["cache_max"] > budget:
        problems.append(f"stats cache.used_bytes reached {fig['cache_max'] / MiB:.1f} MiB > budget")
    assert not problems, "; ".join(problems)
