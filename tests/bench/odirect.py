#!/usr/bin/env python3
"""Where an O_DIRECT loader's "warm" pass comes from: the plain file, a passthrough mount, the
chunk cache, and a RAM-backed (tmpfs) source.

    sudo .venv/bin/python tests/bench/odirect.py [--tierfs PATH] [--pairs N] [--out FILE]

runai-model-streamer opens its files `O_RDONLY | O_DIRECT` and reads them with io_uring, so the
page cache that the acceptance benchmark's warm rows pin the plain file in is never read: this measures, on
the acceptance benchmark's fast source (ext4 on a RAM block device, tests/bench/sources.py) with its 1.5 GiB DiT,
one runai process for every pass:

1. plain file pinned in the page cache vs a passthrough mount (budget > file), passes
   alternating (plain, mount, plain, ...) after a cold pass and one priming pass: time, the
   device bytes each pass read (blkio cgroup count), and the CPU seconds of the loader and of the
   daemon; then `dd bs=1M iflag=direct` (synchronous O_DIRECT) the same way;
2. the same mount with `--no-model-passthrough` (chunk cache, budget > file): a cold pass, then
   passes after it;
3. the model on tmpfs: plain vs through a passthrough mount of that tmpfs folder (what a
   RAM-backed backing file would give).

Prints every pass and writes a Markdown summary (--out).  A benchmark reports; it asserts
nothing.  Needs root.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))
sys.path.insert(0, str(HERE))
import read_patterns as bench  # noqa: E402
import acceptance as I  # noqa: E402
import sources  # noqa: E402
import machine  # noqa: E402

MiB = 1 << 20


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` (all its threads; 0 when gone or None)."""
    if pid is None:
        return 0.0
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class Meter:
    """Times a pass and counts what it cost: device bytes (the blkio cgroup), the loader's CPU
    seconds and the daemon's."""

    def __init__(self, thr: sources.Throttle):
        self.thr, self.lines, self.times = thr, [], {}

    def rec(self, label: str, fn, loader: int | None = None, daemon: int | None = None) -> float:
        b0, l0, d0 = self.thr.read_bytes(), cpu_s(loader), cpu_s(daemon)
        s = fn()
        disk = (self.thr.read_bytes() - b0) / MiB
        self.times.setdefault(label, []).append(s)
        line = (f"{label:<40} {s:6.3f} s  device {disk:5.0f} MiB  loader CPU {cpu_s(loader) - l0:5.2f} s"
                + (f"  daemon CPU {cpu_s(daemon) - d0:4.2f} s" if daemon else ""))
        print(line, flush=True)
        self.lines.append(line)
        return s


def dd_direct(path: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M", "iflag=direct", "status=none"], check=True,
                   timeout=120)
    return time.perf_counter() - t0


def mount(src: Path, root: Path, size: int, extra: list[str]) -> bench.Mount:
    bench._EXTRA = ["--no-state"] + extra
    return bench.Mount(src, root, size + 256 * MiB)


def run(args, root: Path, model: Path, mt: Meter) -> None:
    size = model.stat().st_size
    f = args.disk.mnt / model.name
    shutil.copyfile(model, f)
    os.sync()
    with I.LoaderProc("runai") as lp:
        # 1. the default mount: a model that fits is passed through
        m = mount(args.disk.mnt, root, size, [])
        try:
            p = m.mnt / f.name
            sources.drop_caches()
            mt.rec("runai passthrough cold", lambda: lp.load(p), lp.p.pid, m.pid)
            with bench.Pinned(f):
                lp.load(f)
                for _ in range(args.pairs):
                    mt.rec("runai plain, pinned in the page cache", lambda: lp.load(f), lp.p.pid)
                    mt.rec("runai passthrough, loaded before", lambda: lp.load(p), lp.p.pid, m.pid)
                for _ in range(3):
                    mt.rec("dd iflag=direct plain, pinned", lambda: dd_direct(f))
                    mt.rec("dd iflag=direct passthrough", lambda: dd_direct(p), None, m.pid)
            mt.lines.append(f"modes: {I.file_modes(m.stats(), f.name)}")
        finally:
            m.close()
        # 2. the chunk cache serving the same file
        m = mount(args.disk.mnt, root, size, ["--no-model-passthrough"])
        try:
            p = m.mnt / f.name
            sources.drop_caches()
            mt.rec("runai chunk cache cold", lambda: lp.load(p), lp.p.pid, m.pid)
            for _ in range(3):
                mt.rec("runai chunk cache, loaded before", lambda: lp.load(p), lp.p.pid, m.pid)
            mt.lines.append(f"modes: {I.file_modes(m.stats(), f.name)}")
        finally:
            m.close()
        # 3. what a RAM-backed passthrough backing file would give: the model on tmpfs
        shm = Path(tempfile.mkdtemp(prefix="tierfs-odirect.", dir="/dev/shm"))
        try:
            g = shm / model.name
            shutil.copyfile(model, g)
            m = mount(shm, root, size, [])
            try:
                p = m.mnt / g.name
                lp.load(g)
                lp.load(p)
                for _ in range(3):
                    mt.rec("runai tmpfs plain", lambda: lp.load(g), lp.p.pid)
                    mt.rec("runai tmpfs through passthrough", lambda: lp.load(p), lp.p.pid, m.pid)
                mt.lines.append(f"modes: {I.file_modes(m.stats(), g.name)}")
            finally:
                m.close()
        finally:
            shutil.rmtree(shm, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tierfs", type=Path, default=HERE.parents[1] / "target" / "release" / "tierfs")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--data", default="/var/tmp/tierfs-bench-data")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("odirect.py needs root (devices, mounts, cgroups, drop_caches)")
    model = I.stored_model(Path(args.data), "p1", 0)
    sources.clean_stale()
    bench.clean_stale()
    root = Path(tempfile.mkdtemp(prefix="tierfs-bench.odirect.", dir="/tmp"))
    bench.BIN = I.copy_binary(args.tierfs.resolve(), root)
    try:
        with sources.RamDisk(model.stat().st_size + 512 * MiB, root) as disk:
            args.disk = disk
            thr = sources.Throttle(disk.majmin)
            try:
                thr.set(0)
                mt = Meter(thr)
                run(args, root, model, mt)
            finally:
                thr.close()
    finally:
        for mnt in list(reversed(bench._MOUNTS)):
            mnt.close()
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in mt.times.items()}
    summary = [f"- median {k}: {v:.3f} s ({len(mt.times[k])} passes)" for k, v in med.items()]
    for a, b in (("runai plain, pinned in the page cache", "runai passthrough, loaded before"),
                 ("runai plain, pinned in the page cache", "runai chunk cache, loaded before"),
                 ("dd iflag=direct plain, pinned", "dd iflag=direct passthrough")):
        summary.append(f"- {a} / {b}: {med[a] / med[b]:.2f}")
    print("\n".join(summary))
    if args.out:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        args.out.write_text("\n".join([
            "# O_DIRECT loader (runai-model-streamer) warm passes: where they come from",
            "", f"- date: {machine.date()}", f"- machine: {machine.describe()}",
            "", f"`sudo .venv/bin/python tests/bench/odirect.py --pairs {args.pairs}` ({when}, {model.name}, "
            f"{model.stat().st_size / MiB:.0f} MiB, fast source {disk.kind}; binary {args.tierfs})",
            "", "Medians:", "", *summary, "",
            "Every pass (device: bytes the blkio cgroup read from the source device; CPU: user + system):",
            "", "```", *mt.lines, "```", ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
