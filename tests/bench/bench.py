#!/usr/bin/env python3
"""tierfs read benchmark: one command, one table of ratios measured in the same run.

    sudo .venv/bin/python tests/bench/bench.py [--size-gib 2] [--reps 3] [--budget 3GiB]

Measures sequential reads of a generated ~2 GiB DiT checkpoint:

* cold   - page cache dropped (echo 3 > drop_caches) before each pass; the mount is
           a fresh `tierfs mount` (empty tierfs cache).  Mount vs the source file read
           directly.  With 1 MiB read() calls and with 128 KiB (cat-like) calls.
* warm   - tierfs cache holds the file (budget >= file size; one priming pass), then
           drop_caches (so neither the source's nor the mount's kernel page cache
           helps) and read through the mount: served from the tierfs RAM cache.
           Compared with the source read from the page cache.
* warm-k - re-read through the mount without dropping caches (whatever the kernel
           keeps for the FUSE file, plus the tierfs cache).

Each figure is the median of --reps passes.  Prints a table and writes
tests/bench/RESULTS.md (command, date, machine facts, peak daemon RSS).
Needs root (drop_caches, mount).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import gen  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
TIERFS = Path(os.environ.get("TIERFS_BIN", REPO / "target" / "release" / "tierfs"))


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_pass(path: Path, bs: int) -> tuple[float, int]:
    """Sequential read with `bs`-sized read() calls into a reused buffer; (seconds, bytes)."""
    buf = bytearray(bs)
    mv = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            n = os.readv(fd, [mv])
            if n == 0:
                break
            total += n
    finally:
        os.close(fd)
    return time.perf_counter() - t0, total


def is_mounted(mp: Path) -> bool:
    s = str(mp.resolve())
    with open("/proc/mounts") as f:
        return any(line.split()[1] == s for line in f)


class Mount:
    def __init__(self, source: Path, root: Path, budget: str):
        self.mnt = Path(tempfile.mkdtemp(prefix="mnt.", dir=root))
        self.log = open(root / (self.mnt.name + ".log"), "wb")
        self.proc = subprocess.Popen([str(TIERFS), "mount", str(source), str(self.mnt), "--ram-cache", budget],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                self.close()
                raise SystemExit(f"tierfs exited early ({self.proc.returncode}); see {self.log.name}")
            try:
                json.loads((self.mnt / ".tierfs" / "stats").read_bytes())
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    self.close()
                    raise SystemExit("mount not ready after 10 s")
                time.sleep(0.05)

    def stats(self) -> dict:
        return json.loads((self.mnt / ".tierfs" / "stats").read_bytes())

    def hwm(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            if is_mounted(self.mnt):
                subprocess.run(["umount", "-l", str(self.mnt)])
            self.log.close()


def machine_facts() -> dict:
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal:")) * 1024
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {"nproc": os.cpu_count(), "ram_gib": round(mem / GiB, 1), "kernel": platform.release(), "cpu": cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", default="3GiB", help="tierfs --ram-cache (>= file size for the warm case)")
    ap.add_argument("--data", default=os.environ.get("TIERFS_BENCH_DATA", "/tmp/tierfs-bench-data"),
                    help="where the generated checkpoint is kept (reused across runs)")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench.py needs root (drop_caches, mount)")
    if not os.access(TIERFS, os.X_OK):
        raise SystemExit(f"{TIERFS} missing: cargo build --release --workspace")

    data = Path(args.data)
    src_dir = data / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    target = int(args.size_gib * GiB)
    ckpt = src_dir / f"dit_{args.size_gib:g}gib.safetensors"
    if not ckpt.exists():
        print(f"generating {ckpt} ...", flush=True)
        gen.write_streaming(ckpt, gen.big_dit_specs(target), seed=2024)
    size = ckpt.stat().st_size
    rel = ckpt.name
    root = Path(tempfile.mkdtemp(prefix="tierfs-bench.", dir="/tmp"))
    res: dict[str, list[float]] = {}
    hwms: list[int] = []
    notes: list[str] = []

    def rec(key: str, secs: float, n: int) -> None:
        assert n == size, f"{key}: read {n} B of {size}"
        res.setdefault(key, []).append(size / secs / 1e6)
        print(f"  {key:<32} {size / secs / 1e6:9.0f} MB/s", flush=True)

    mounts: list[Mount] = []
    try:
        for bs, bsname in ((MiB, "1MiB"), (128 << 10, "128KiB")):
            for _ in range(args.reps):
                drop_caches()
                rec(f"cold source {bsname}", *read_pass(ckpt, bs))
                m = Mount(src_dir, root, args.budget)
                mounts.append(m)
                drop_caches()
                rec(f"cold mount {bsname}", *read_pass(m.mnt / rel, bs))
                hwms.append(m.hwm())
                m.close()
        # warm
        read_pass(ckpt, MiB)
        for _ in range(args.reps):
            rec("warm source (page cache) 1MiB", *read_pass(ckpt, MiB))
        m = Mount(src_dir, root, args.budget)
        mounts.append(m)
        read_pass(m.mnt / rel, MiB)  # prime the tierfs cache
        s0 = m.stats()
        for _ in range(args.reps):
            drop_caches()
            rec("warm mount (tierfs cache) 1MiB", *read_pass(m.mnt / rel, MiB))
        s1 = m.stats()
        disk_delta = s1["disk"]["read_bytes"] - s0["disk"]["read_bytes"]
        notes.append(f"warm mount passes read {disk_delta / MiB:.1f} MiB from disk "
                     f"(cache hits +{s1['cache']['hits'] - s0['cache']['hits']}, "
                     f"misses +{s1['cache']['misses'] - s0['cache']['misses']}, "
                     f"used {s1['cache']['used_bytes'] / MiB:.0f} MiB of {s1['cache']['budget_bytes'] / MiB:.0f})")
        for _ in range(args.reps):
            rec("warm-k mount (no drop) 1MiB", *read_pass(m.mnt / rel, MiB))
        hwms.append(m.hwm())
        m.close()
    finally:
        for m in mounts:
            m.close()
        if not any(is_mounted(p) for p in root.iterdir() if p.is_dir()):
            shutil.rmtree(root, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in res.items()}
    rows = [
        ("cold, 1 MiB reads", med["cold mount 1MiB"], med["cold source 1MiB"]),
        ("cold, 128 KiB reads", med["cold mount 128KiB"], med["cold source 128KiB"]),
        ("warm, tierfs cache vs page cache", med["warm mount (tierfs cache) 1MiB"], med["warm source (page cache) 1MiB"]),
        ("warm, no drop (kernel + tierfs) vs page cache", med["warm-k mount (no drop) 1MiB"],
         med["warm source (page cache) 1MiB"]),
    ]
    facts = machine_facts()
    cmd = "sudo .venv/bin/python tests/bench/bench.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = [
        "# tierfs benchmark results",
        "",
        f"- command: `{cmd.strip()}`",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {facts['nproc']} CPUs ({facts['cpu']}), {facts['ram_gib']} GiB RAM, kernel {facts['kernel']}",
        f"- file: {ckpt.name}, {size / GiB:.2f} GiB, {len(gen.tensor_ranges(ckpt))} tensors; "
        f"tierfs --ram-cache {args.budget}; median of {args.reps} passes",
        f"- peak daemon RSS (VmHWM, max over mounts): {max(hwms) / MiB:.0f} MiB",
        *(f"- {n}" for n in notes),
        "",
        "| case | mount MB/s | source MB/s | mount / source |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {a:.0f} | {b:.0f} | {a / b:.2f} |" for name, a, b in rows),
        "",
        "All passes (MB/s):",
        "",
        *(f"- {k}: {', '.join(f'{x:.0f}' for x in v)}" for k, v in res.items()),
        "",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
