#!/usr/bin/env python3
"""Cost of the per-operation stats (`ops` in .tierfs/stats) on warm read throughput.

    sudo .venv/bin/python tests/bench/ops_overhead.py --baseline OLD_TIERFS \\
        [--tierfs target/release/tierfs] [--size-mib 512] [--rounds 9] [--readers 1,4]

Mounts one source folder twice, once with each binary (`--baseline`: a build without the
recorder, e.g. the parent commit's; `--tierfs`: this one), both with a budget larger than the
file, primes both caches, then reads the whole file through each mount in turn, alternating
A/B per round (so drift of the machine hits both alike), with 1 MiB `read()` calls from 1 and
from 4 reader threads. Prints the median GB/s of each and the ratio new/baseline; writes the
table to tests/bench/results/ops_overhead/ops-overhead.md. The baseline is measured in the same run.
"""

from __future__ import annotations

import argparse
import hashlib
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
sys.path.insert(0, str(REPO / "tests" / "python"))
import gen  # noqa: E402

CHUNK = 1 << 20


def mount(binary: Path, src: Path, mnt: Path, budget: str, log: Path) -> subprocess.Popen:
    # Builds that serve a model fitting the budget by FUSE passthrough would take the daemon
    # (and its recorder) out of the measurement: keep the file in the chunk cache.
    help_text = subprocess.run([str(binary), "mount", "--help"], capture_output=True, text=True).stdout
    extra = ["--no-model-passthrough"] if "--no-model-passthrough" in help_text else []
    return spawn_mount(binary, src, mnt, log, "--ram-cache", budget, "--no-state", *extra)


def spawn_mount(binary: Path, src: Path, mnt: Path, log: Path, *args: str) -> subprocess.Popen:
    """`binary mount src mnt *args` in the foreground, returned once the mount answers (30 s)."""
    proc = subprocess.Popen([str(binary), "mount", str(src), str(mnt), *args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not (mnt / ".tierfs" / "stats").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{binary} did not mount: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc


def stop_mount(proc: subprocess.Popen, mnt: Path) -> None:
    """Ends a mount made by `spawn_mount`, however it is doing (a stuck daemon is killed)."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def read_pass(path: Path, readers: int) -> float:
    """Reads the whole file with `readers` threads (interleaved 1 MiB pieces); returns GB/s."""
    size = path.stat().st_size
    pieces = list(range(0, size, CHUNK))

    def work(k: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            for off in pieces[k::readers]:
                os.pread(fd, CHUNK, off)
        finally:
            os.close(fd)

    started = time.perf_counter()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return size / (time.perf_counter() - started) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True, help="tierfs binary without the recorder")
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--readers", default="1,4")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "bench" / "results" / "ops_overhead" / "ops-overhead.md")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="tierfs-ops-bench.", dir="/var/tmp") as tmp:
        root = Path(tmp)
        src = root / "src"
        src.mkdir()
        model = src / "dit.safetensors"
        gen.make_big_dit(model, args.size_mib << 20)
        budget = f"{2 * args.size_mib}MiB"
        mounts, procs = {}, []
        try:
            for name, binary in (("baseline", args.baseline), ("new", args.tierfs)):
                mnt = root / f"mnt-{name}"
                mnt.mkdir()
                procs.append(mount(binary, src, mnt, budget, root / f"{name}.log"))
                mounts[name] = mnt / model.name
            want = hashlib.sha256(model.read_bytes()).hexdigest()
            for name, path in mounts.items():  # prime both caches, and check the bytes
                assert hashlib.sha256(path.read_bytes()).hexdigest() == want, f"{name}: wrong bytes"
            rows = []
            for readers in [int(r) for r in args.readers.split(",")]:
                runs = {"baseline": [], "new": []}
                for _ in range(args.rounds):
                    for name in ("baseline", "new"):
                        runs[name].append(read_pass(mounts[name], readers))
                base, new = statistics.median(runs["baseline"]), statistics.median(runs["new"])
                rows.append((readers, base, new, new / base))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for mnt in root.glob("mnt-*"):
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)

    lines = [
        "# Per-operation stats: cost on warm read throughput",
        "",
        f"Command: `{' '.join(sys.argv)}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.node()}, "
        f"{os.cpu_count()} CPUs, kernel {platform.release()}; load average {os.getloadavg()[0]:.2f}  ",
        f"File: {args.size_mib} MiB DiT, cached by tierfs (budget {2 * args.size_mib} MiB); 1 MiB `pread`s; "
        f"median of {args.rounds} alternating passes.",
        "",
        "| readers | baseline GB/s | with ops stats GB/s | ratio |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r} | {b:.2f} | {n:.2f} | {ratio:.3f} |" for r, b, n, ratio in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
