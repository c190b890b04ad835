#!/usr/bin/env python3
"""Cost of opening source descriptors on demand: a header scan of many small model files.

    sudo .venv/bin/python tests/bench/header_scan.py --baseline OLD_TIERFS \\
        [--tierfs target/release/tierfs] [--files 5000] [--rounds 5]

Writes `--files` small `.safetensors` (a few hundred bytes each, like a LoRA folder), mounts
the folder once with each binary (`--baseline`: e.g. main before descriptors were opened on
demand, which kept three per file ever opened; `--tierfs`: this build, which opens them per
open handle and closes them at release), and scans it through each mount in turn, alternating
per round (which goes first alternates too): open, read the 8-byte length and the JSON header, close (ComfyUI's LoRA scan). The
first round indexes every file; later rounds open known versions, where this build reopens
the descriptors and the baseline had them open already. Also scans SOURCE directly. Prints the
median files/s of each and the ratios, and the most descriptors each daemon held. `--files`
must stay under a third of the baseline daemon's descriptor limit, or the baseline fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
import gen  # noqa: E402
from ops_overhead import spawn_mount, stop_mount  # noqa: E402


def mount(binary: Path, src: Path, mnt: Path, log: Path) -> subprocess.Popen:
    return spawn_mount(binary, src, mnt, log, "--ram-cache", "256MiB", "--no-state")


def scan(root: Path, names: list[str]) -> float:
    """Reads every header under `root`; returns files per second."""
    started = time.perf_counter()
    for name in names:
        with open(root / name, "rb", buffering=0) as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if len(f.read(n)) != n:
                raise SystemExit(f"{root / name}: short header")
    return len(names) / (time.perf_counter() - started)


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tierfs-header-scan.", dir="/var/tmp"))
    src = work / "src"
    src.mkdir()
    names = [f"lora_{i:05d}.safetensors" for i in range(args.files)]
    for i, name in enumerate(names):
        (src / name).write_bytes(gen.small_safetensors(i))
    binaries = {"baseline": args.baseline, "tierfs": args.tierfs}
    procs, mnts = {}, {}
    try:
        for label, binary in binaries.items():
            mnts[label] = work / f"mnt-{label}"
            mnts[label].mkdir()
            procs[label] = mount(binary, src, mnts[label], work / f"{label}.log")
        rates: dict[str, list[float]] = {"source": [], "baseline": [], "tierfs": []}
        first: dict[str, float] = {}
        most_fds = {label: 0 for label in binaries}
        for rnd in range(args.rounds + 1):
            rates_now = {"source": scan(src, names)}
            # Each binary goes first every other round: a daemon still answering the last
            # scan's (asynchronous) releases must not slow the other's scan alone.
            for label in sorted(binaries, reverse=rnd % 2 == 1):
                if rnd == 0:
                    # Indexing reads the source and drops what it read from the page cache:
                    # bring it back, so that the second daemon does not read from disk alone.
                    scan(src, names)
                rates_now[label] = scan(mnts[label], names)
                most_fds[label] = max(most_fds[label], fds(procs[label].pid))
            if rnd == 0:
                first = rates_now  # indexing every file: reported apart
                continue
            for label, rate in rates_now.items():
                rates[label].append(rate)
        med = {label: statistics.median(r) for label, r in rates.items()}
        print(f"{args.files} files, {args.rounds} rounds after the first (median files/s)")
        print(f"  first round (indexing): baseline {first['baseline']:.0f}/s, tierfs {first['tierfs']:.0f}/s, "
              f"ratio tierfs/baseline {first['tierfs'] / first['baseline']:.2f}")
        print(f"  source directly: {med['source']:.0f}/s")
        print(f"  baseline: {med['baseline']:.0f}/s ({med['baseline'] / med['source']:.2f} x source), "
              f"at most {most_fds['baseline']} descriptors")
        print(f"  tierfs:   {med['tierfs']:.0f}/s ({med['tierfs'] / med['source']:.2f} x source), "
              f"at most {most_fds['tierfs']} descriptors")
        print(f"  ratio tierfs/baseline: {med['tierfs'] / med['baseline']:.2f}")
    finally:
        for label, proc in procs.items():
            stop_mount(proc, mnts[label])
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
