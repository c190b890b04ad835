#!/usr/bin/env python3
"""Cost of reading `.tierfs/stats` and `.tierfs/metrics` in a loop while a model streams.

    sudo .venv/bin/python tests/bench/stats_polling.py [--tierfs target/release/tierfs] \\
        [--size-mib 512] [--rounds 9] [--interval 0.1]

One mount, one model (`--no-model-passthrough`, so every read goes through the daemon), read
whole with 1 MiB `pread`s in two settings: *warm* (budget twice the model: every read a cache
hit, the path that takes the cache's lock most often) and *streaming* (budget a quarter of the
model: misses, prefetch and eviction all the time). Each round reads the model once without and
once with a poller thread reading both files (every second, like `tierfs top`'s default; every
`--interval` seconds; and back to back, the worst case), alternating, so that drift of the
machine hits both alike; a control row polls in neither pass. Prints, per setting and poll rate, the median throughput of each, the ratio
polled/unpolled, and the readers' p99 `pread` latency (a lock the read path waits on would show
there first); writes the table to tests/bench/stats-polling-results.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import gen  # noqa: E402
from ops_overhead import spawn_mount  # noqa: E402

CHUNK = 1 << 20


def read_pass(path: Path) -> tuple[float, list[float]]:
    """Reads the whole file in 1 MiB pieces; returns (GB/s, per-read latencies in seconds)."""
    size = path.stat().st_size
    latencies = []
    fd = os.open(path, os.O_RDONLY)
    try:
        started = time.perf_counter()
        for off in range(0, size, CHUNK):
            t = time.perf_counter()
            os.pread(fd, CHUNK, off)
            latencies.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
    return size / elapsed / 1e9, latencies


class Poller(threading.Thread):
    """Reads stats and metrics every `interval` seconds (0: back to back) until stopped."""

    def __init__(self, mnt: Path, interval: float):
        super().__init__(daemon=True)
        self.files = [mnt / ".tierfs" / "stats", mnt / ".tierfs" / "metrics"]
        self.interval = interval
        self.stop = threading.Event()
        self.polls = 0
        self.seconds = 0.0

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            for f in self.files:
                f.read_bytes()
            self.seconds += time.perf_counter() - started
            self.polls += 1
            if self.interval:
                self.stop.wait(self.interval)


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


def measure(mnt: Path, model: Path, rounds: int, interval: float | None) -> dict:
    """`rounds` pairs of passes, unpolled then polled every `interval` s (`None`: the control,
    both passes unpolled, which shows the noise of the machine)."""
    runs = {"plain": [], "polled": []}
    lat = {"plain": [], "polled": []}
    polls, poll_seconds = 0, 0.0
    for _ in range(rounds):
        for name in ("plain", "polled"):
            poller = Poller(mnt, interval) if name == "polled" and interval is not None else None
            if poller:
                poller.start()
            gbps, latencies = read_pass(mnt / model.name)
            if poller:
                poller.stop.set()
                poller.join(timeout=30)
                polls += poller.polls
                poll_seconds += poller.seconds
            runs[name].append(gbps)
            lat[name].extend(latencies)
    plain, polled = statistics.median(runs["plain"]), statistics.median(runs["polled"])
    # Each polled pass against the unpolled pass just before it: drift of the machine cancels.
    paired = [b / a for a, b in zip(runs["plain"], runs["polled"])]
    q1, _, q3 = statistics.quantiles(paired, n=4)
    return {"plain": plain, "polled": polled, "ratio": statistics.median(paired), "q1": q1, "q3": q3,
            "p99_plain_ms": p99(lat["plain"]) * 1e3, "p99_polled_ms": p99(lat["polled"]) * 1e3,
            "polls": polls, "poll_ms": poll_seconds / max(polls, 1) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "bench" / "stats-polling-results.md")
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="tierfs-poll-bench.", dir="/var/tmp") as tmp:
        root = Path(tmp)
        src = root / "src"
        src.mkdir()
        model = src / "dit.safetensors"
        gen.make_big_dit(model, args.size_mib << 20)
        for setting, budget in (("warm", 2 * args.size_mib), ("streaming", args.size_mib // 4)):
            mnt = root / f"mnt-{setting}"
            mnt.mkdir()
            proc = spawn_mount(args.tierfs, src, mnt, root / f"{setting}.log", "--ram-cache",
                               f"{budget}MiB", "--no-state", "--no-model-passthrough")
            try:
                read_pass(mnt / model.name)  # learn the order (and, warm, fill the cache)
                for interval in (None, 1.0, args.interval, 0.0):
                    r = measure(mnt, model, args.rounds, interval)
                    rows.append((setting, budget, interval, r))
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)

    lines = [
        "# Reading stats and metrics while a model streams: cost on read throughput",
        "",
        f"Command: `{' '.join(sys.argv)}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.node()}, "
        f"{os.cpu_count()} CPUs, kernel {platform.release()}; load average {os.getloadavg()[0]:.2f}  ",
        f"File: {args.size_mib} MiB DiT through the chunk cache; 1 MiB `pread`s, one reader; median of "
        f"{args.rounds} passes each, unpolled and polled alternating. A poll reads `.tierfs/stats` "
        "and `.tierfs/metrics` once each.",
        "",
        "Ratio: median over the rounds of polled / unpolled pass of the same round (quartiles in "
        "brackets); the control row polls in neither pass and shows the machine's noise.",
        "",
        "| setting | budget | poll every | unpolled GB/s | polled GB/s | ratio [q1, q3] | "
        "p99 read unpolled | p99 read polled | polls | ms per poll |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting, budget, interval, r in rows:
        every = "control: never" if interval is None else f"{interval:g} s" if interval else "back to back"
        lines.append(f"| {setting} | {budget} MiB | {every} | {r['plain']:.2f} | {r['polled']:.2f} | "
                     f"{r['ratio']:.3f} [{r['q1']:.3f}, {r['q3']:.3f}] | {r['p99_plain_ms']:.2f} ms | "
                     f"{r['p99_polled_ms']:.2f} ms | {r['polls']} | {r['poll_ms']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
