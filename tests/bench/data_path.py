#!/usr/bin/env python3
"""Where the time goes when a model larger than the budget is read from a fast disk.

    sudo .venv/bin/python tests/bench/data_path.py [--div 4] [--reps 2] [--size-mib 2400]
                                                   [--variants default,max-pages-4096,readahead-1MiB]

One model (a DiT-shaped .safetensors, tests/python/gen.py) on the fast source of
tests/bench/sources.py (ext4 on a RAM-backed block device), a budget of model/--div. For each
loader and each variant of the mount, alternating in one process: the plain file's cold time,
then a fresh mount's cold time (every cache dropped before each). Loaders: `read8m` (the whole
file with 8 MiB `read()`s), `mmap` (the file mapped and copied out in 1 MiB slices),
`load_file` (safetensors.torch.load_file, every tensor copied out).

Per row: both speeds and their ratio, device bytes read by the daemon / model, prefetch wasted /
model, and from the daemon's stats the number of FUSE read requests, the daemon's own mean time
per request, and the load's wall time per request: the difference is what the request costs
outside the daemon's handler (queueing, waking the serving thread and the reader, the copy of
the reply into the reader's pages).

Variants: `default`; `max-pages-N` raises the kernel's `fs.fuse.max_pages_limit` to N pages
for that mount (the daemon asks for 4096: 16 MiB requests; the kernel's default limit is 256:
1 MiB) and restores it; `readahead-SIZE` mounts with `--readahead SIZE` (the size of the
requests an `mmap` reader's faults send). Writes tests/bench/data-path-results.md. Needs root.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(HERE))

import read_patterns as bench  # noqa: E402
import gen  # noqa: E402
import guest_memory  # noqa: E402
import loaders  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
MAX_PAGES = Path("/proc/sys/fs/fuse/max_pages_limit")


def read8m(path: Path) -> int:
    return bench.read_pass(path, 8 * MiB)[1]


def mmap_copy(path: Path) -> int:
    return bench.mmap_pass(path)[1]


LOADERS = {"read8m": read8m, "mmap": mmap_copy, "load_file": loaders.load_torch_file}


class Variant:
    """A way of mounting: extra `tierfs mount` arguments and, for `max-pages-N`, the sysctl."""

    def __init__(self, name: str):
        self.name = name
        self.extra: tuple[str, ...] = ()
        self.max_pages = 0
        if name.startswith("max-pages-"):
            self.max_pages = int(name.removeprefix("max-pages-"))
        elif name.startswith("readahead-"):
            self.extra = ("--readahead", name.removeprefix("readahead-"))
        elif name != "default":
            raise SystemExit(f"unknown variant {name!r}")

    def mount(self, source: Path, root: Path, budget: int) -> bench.Mount:
        """A mount with this variant's settings (the sysctl is read at mount time only)."""
        old = MAX_PAGES.read_text().strip()
        if self.max_pages:
            MAX_PAGES.write_text(str(self.max_pages))
        try:
            return bench.Mount(source, root, budget, extra=self.extra)
        finally:
            MAX_PAGES.write_text(old)


def cold(fn, path: Path) -> float:
    bench.drop_caches()
    time.sleep(0.3)
    t0 = time.perf_counter()
    fn(path)
    return time.perf_counter() - t0


def measure(args, disk: sources.RamDisk, root: Path, f: Path) -> list[dict]:
    size = f.stat().st_size
    budget = size // args.div
    rows = []
    for name in args.loaders.split(","):
        fn = LOADERS[name]
        fn(f)  # imports and first-use costs, untimed
        for vname in args.variants.split(","):
            variant = Variant(vname)
            plain, mount, disk_read, wasted, reqs, req_us = [], [], [], [], [], []
            for _ in range(args.reps):
                plain.append(cold(fn, f))
                m = variant.mount(disk.mnt, root, budget)
                try:
                    mount.append(cold(fn, m.mnt / f.name))
                    st = m.stats()
                finally:
                    m.close()
                disk_read.append(st["disk"]["read_bytes"] / size)
                wasted.append(st["prefetch"]["wasted_bytes"] / size)
                reqs.append(st["ops"]["read"]["count"])
                req_us.append(st["ops"]["read"]["mean_us"])
            p, t = statistics.median(plain), statistics.median(mount)
            n = statistics.median(reqs)
            row = {"loader": name, "variant": vname, "plain_gbs": size / p / 1e9, "mount_gbs": size / t / 1e9,
                   "ratio": p / t, "disk": max(disk_read), "wasted": max(wasted), "requests": n,
                   "daemon_us": statistics.median(req_us), "wall_us": t / n * 1e6 if n else float("nan"),
                   "plain_s": plain, "mount_s": mount}
            print(f"{name:9} {vname:16} plain {row['plain_gbs']:.2f} GB/s  mount {row['mount_gbs']:.2f} GB/s  "
                  f"ratio {row['ratio']:.2f}  disk/model {row['disk']:.2f}  wasted {row['wasted']:.3f}  "
                  f"requests {n:.0f}  daemon {row['daemon_us']:.0f} us  wall {row['wall_us']:.0f} us/request",
                  flush=True)
            rows.append(row)
    return rows


def render(args, f: Path, raw_gbs: float, rows: list[dict], cmd: str) -> str:
    size = f.stat().st_size
    out = [f"# Data path: a model {args.div}× the budget on a fast source\n",
           f"- command: `{cmd}`",
           f"- date: {datetime.datetime.now():%Y-%m-%d %H:%M}; kernel {os.uname().release}; "
           f"{os.cpu_count()} CPUs; load average before {os.getloadavg()[0]:.2f}",
           f"- model {f.name}: {size / 1e9:.2f} GB; budget {size // args.div / MiB:.0f} MiB; "
           f"source: cold `read()` of the plain file {raw_gbs:.2f} GB/s; median of {args.reps} "
           "alternating repetitions (plain file, then a fresh mount), caches dropped before each",
           "",
           "| loader | variant | plain GB/s | mount GB/s | mount / plain | disk / model | wasted / model "
           "| read requests | daemon µs / request | wall µs / request |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['loader']} | {r['variant']} | {r['plain_gbs']:.2f} | {r['mount_gbs']:.2f} | "
                   f"{r['ratio']:.2f} | {r['disk']:.2f} | {r['wasted']:.3f} | {r['requests']:.0f} | "
                   f"{r['daemon_us']:.0f} | {r['wall_us']:.0f} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--div", type=int, default=4, help="budget = model / DIV")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--size-mib", type=int, default=2400)
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--variants", default="default,max-pages-4096,readahead-1MiB")
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data"))
    ap.add_argument("--out", type=Path, default=HERE / "data-path-results.md")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (RAM-backed source, drop_caches, mounts)")
    bench.BIN = args.tierfs
    args.data.mkdir(parents=True, exist_ok=True)
    model = args.data / f"dit_{args.size_mib}mib.safetensors"
    if not model.exists():
        gen.make_big_dit(model, args.size_mib * MiB)
    root = Path(tempfile.mkdtemp(prefix="tierfs-data-path.", dir="/var/tmp"))
    try:
        # Guest memory held steady (tests/bench/guest_memory.py): on a VM that reports free pages
        # to its host, a pass that gets memory back from the host pays a fault per page, and the
        # plain file's cold read of this model ranged over 2.2-4.5 GB/s in one run without it.
        with guest_memory.SteadyMemory() as steady, sources.RamDisk(model.stat().st_size + 512 * MiB, root) as disk:
            f = disk.mnt / model.name
            subprocess.run(["cp", str(model), str(f)], check=True)
            os.sync()
            raw = max(sources.cold_read_gbs(f) for _ in range(2))
            print(f"source: {raw:.2f} GB/s cold read on {disk.kind}; memory: {steady.note}", flush=True)
            rows = measure(args, disk, root, f)
        cmd = "sudo .venv/bin/python tests/bench/data_path.py " + " ".join(sys.argv[1:])
        args.out.write_text(render(args, model, raw, rows, cmd.strip()))
        print(f"wrote {args.out}")
    finally:
        bench.cleanup(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
