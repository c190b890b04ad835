#!/usr/bin/env python3
"""Cost of reading the stats, the metrics and the dashboard while a model streams.

    sudo .venv/bin/python tests/bench/stats_polling.py [--tierfs target/release/tierfs] \\
        [--size-mib 512] [--rounds 9] [--interval 0.1]

One mount, one model (`--no-model-passthrough`, so every read goes through the daemon), read
whole with 1 MiB `pread`s in two settings: *warm* (budget twice the model: every read a cache
hit, the path that takes the cache's lock most often) and *streaming* (budget a quarter of the
model: misses, prefetch and eviction all the time). Each round reads the model once without and
once with a poller thread, alternating, so that drift of the machine hits both alike; a control
row polls in neither pass. Pollers:

- *viewers*: what the three views do at their default rates, all at once, every second:
  `tierfs top` (`.tierfs/stats`), the dashboard page (`/stats` over HTTP from `--metrics-addr`)
  and a Prometheus scrape (`/metrics`; Prometheus itself scrapes every 15 s or more);
- `.tierfs/stats` and `.tierfs/metrics` every second, every `--interval` seconds, and back to
  back (the worst case).

Prints, per setting and poller, the median throughput of each, the ratio polled/unpolled, and
the readers' p99 `pread` latency (a lock the read path waits on would show there first). It also
measures, with no reader, the daemon's CPU time per second of the viewers' polling (from
/proc/PID/stat): the most a reader could lose to them on a machine whose CPUs are all busy.
Writes tests/bench/results/stats_polling/stats-polling.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import gen  # noqa: E402
from ops_overhead import spawn_mount, stop_mount  # noqa: E402

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


VIEWERS = "viewers"


class Poller(threading.Thread):
    """Reads stats and metrics every `interval` seconds (0: back to back) until stopped; with
    `interval` = VIEWERS, what `tierfs top`, the page and a scrape read, every second."""

    def __init__(self, mnt: Path, interval: float | str, addr: str):
        super().__init__(daemon=True)
        self.mnt, self.addr = mnt, addr
        self.interval = 1.0 if interval == VIEWERS else interval
        self.viewers = interval == VIEWERS
        self.stop = threading.Event()
        self.polls = 0
        self.seconds = 0.0

    def poll(self) -> None:
        if self.viewers:
            (self.mnt / ".tierfs" / "stats").read_bytes()
            for path in ("/stats", "/metrics"):
                with urllib.request.urlopen(f"http://{self.addr}{path}", timeout=10) as r:
                    r.read()
        else:
            for name in ("stats", "metrics"):
                (self.mnt / ".tierfs" / name).read_bytes()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            self.poll()
            self.seconds += time.perf_counter() - started
            self.polls += 1
            if self.interval:
                self.stop.wait(self.interval)


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


def daemon_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def viewers_cpu(mnt: Path, addr: str, pid: int, seconds: float) -> float:
    """Daemon CPU seconds per second while only the viewers poll (no reader)."""
    poller = Poller(mnt, VIEWERS, addr)
    before, started = daemon_cpu_seconds(pid), time.perf_counter()
    poller.start()
    time.sleep(seconds)
    poller.stop.set()
    poller.join(timeout=30)
    return (daemon_cpu_seconds(pid) - before) / (time.perf_counter() - started)


def served_addr(log: Path) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = re.search(r"metrics: http://([0-9.:]+)/metrics", log.read_text(errors="replace"))
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise SystemExit(f"no metrics address in {log}")


def measure(mnt: Path, addr: str, model: Path, rounds: int, interval: float | str | None) -> dict:
    """`rounds` pairs of passes, unpolled then polled every `interval` s (`None`: the control,
    both passes unpolled, which shows the noise of the machine)."""
    runs = {"plain": [], "polled": []}
    lat = {"plain": [], "polled": []}
    polls, poll_seconds = 0, 0.0
    for _ in range(rounds):
        for name in ("plain", "polled"):
            poller = Poller(mnt, interval, addr) if name == "polled" and interval is not None else None
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
    ap.add_argument("--cpu-seconds", type=float, default=30.0,
                    help="how long the viewers poll an idle mount for the daemon CPU figure")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "bench" / "results" / "stats_polling" / "stats-polling.md")
    args = ap.parse_args()

    rows, cpu = [], {}
    with tempfile.TemporaryDirectory(prefix="tierfs-poll-bench.", dir="/var/tmp") as tmp:
        root = Path(tmp)
        src = root / "src"
        src.mkdir()
        model = src / "dit.safetensors"
        gen.make_big_dit(model, args.size_mib << 20)
        for setting, budget in (("warm", 2 * args.size_mib), ("streaming", args.size_mib // 4)):
            mnt = root / f"mnt-{setting}"
            mnt.mkdir()
            log = root / f"{setting}.log"
            proc = spawn_mount(args.tierfs, src, mnt, log, "--ram-cache", f"{budget}MiB",
                               "--no-state", "--no-model-passthrough", "--metrics-addr", "0")
            try:
                addr = served_addr(log)
                read_pass(mnt / model.name)  # learn the order (and, warm, fill the cache)
                cpu[setting] = viewers_cpu(mnt, addr, proc.pid, args.cpu_seconds)
                for interval in (None, VIEWERS, 1.0, args.interval, 0.0):
                    r = measure(mnt, addr, model, args.rounds, interval)
                    rows.append((setting, budget, interval, r))
            finally:
                stop_mount(proc, mnt)

    lines = [
        "# Reading stats and metrics while a model streams: cost on read throughput",
        "",
        f"Command: `{' '.join(sys.argv)}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.node()}, "
        f"{os.cpu_count()} CPUs, kernel {platform.release()}; load average {os.getloadavg()[0]:.2f} (the benchmark's own threads included)  ",
        f"File: {args.size_mib} MiB DiT through the chunk cache; 1 MiB `pread`s, one reader; median of "
        f"{args.rounds} passes each, unpolled and polled alternating. *viewers*: every second, "
        "`.tierfs/stats` (`tierfs top`), `/stats` over HTTP (the dashboard page) and `/metrics` "
        "(a Prometheus scrape) at once; the other rows read `.tierfs/stats` and `.tierfs/metrics` "
        "once each per poll.",
        "",
        "Ratio: median over the rounds of polled / unpolled pass of the same round (quartiles in "
        "brackets); the control row polls in neither pass and shows the machine's noise.",
        "",
        "| setting | budget | poll every | unpolled GB/s | polled GB/s | ratio [q1, q3] | "
        "p99 read unpolled | p99 read polled | polls | ms per poll |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting, budget, interval, r in rows:
        every = ("control: never" if interval is None else "viewers, 1 s" if interval == VIEWERS
                 else f"{interval:g} s" if interval else "back to back")
        lines.append(f"| {setting} | {budget} MiB | {every} | {r['plain']:.2f} | {r['polled']:.2f} | "
                     f"{r['ratio']:.3f} [{r['q1']:.3f}, {r['q3']:.3f}] | {r['p99_plain_ms']:.2f} ms | "
                     f"{r['p99_polled_ms']:.2f} ms | {r['polls']} | {r['poll_ms']:.2f} |")
    lines += ["", "Daemon CPU while only the viewers poll (no reader), per second of polling: "
              + "; ".join(f"{setting} mount {c * 1e3:.2f} ms ({c * 100:.2f} % of one CPU)"
                          for setting, c in cpu.items()) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
