#!/usr/bin/env python3
"""The mount's two transports side by side: `/dev/fuse` (fuser) and io_uring (`--io-uring on`).

    sudo .venv/bin/python tests/bench/transport.py [--size-mib 1200] [--reps 4]
        [--loaders read8m,pread8,mmap,load_file] [--cases over,hit]
        [--transports dev_fuse,io_uring,io_uring+max-pages-1024] [--build NAME=PATH ...]

One model (a DiT-shaped .safetensors, tests/python/gen.py) on the fast source of
tests/bench/sources.py (ext4 on a RAM-backed block device). Two cases:

- `over`: a budget of a quarter of the model, every cache dropped before each pass (the cold
  load of a model larger than the budget: chunk loads, prefetch and requests together);
- `hit`: a budget twice the model, model passthrough off, one untimed pass to fill the chunk
  cache, then the timed pass with only the kernel's caches dropped: every request is a hit,
  so the pass measures the request path alone.

Loaders: `read8m` (the file front to back in 8 MiB `read()`s), `pread8` (ComfyUI's dynamic-VRAM
re-read: 8 threads of 2 MiB `pread`s in model order, tests/bench/loaders.py), `mmap` (the file
mapped and copied out in 1 MiB slices), `load_file` (safetensors.torch.load_file). Transports:
`dev_fuse`, `io_uring`, with options after `+`: `max-pages-N` (the kernel's
`fs.fuse.max_pages_limit` raised to N pages for that mount, so requests and ring buffers of up
to N × 4 KiB), `threads-N` (`--threads N`), `NAME` (the build given as `--build NAME=PATH`, to
compare builds in one run: each row of this build gives its speed over the same transport's with
that one, `vs the other build`). Per loader and case the transports alternate within each
repetition, in the order given and reversed every other repetition (use an even `--reps`); each
row gives the median speed and its ratio to the first transport's in the same run, the plain file's cold
speed for reference, the number of read requests, the daemon's mean time per request, and the
CPU seconds per GB of the machine and of the daemon's request threads.

Needs root and the fuse module's `enable_uring` (set here for the run and restored). Writes
tests/bench/results/transport/transport.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(HERE))

import data_path  # noqa: E402
import gen  # noqa: E402
import guest_memory  # noqa: E402
import loaders  # noqa: E402
import machine  # noqa: E402
import read_patterns as bench  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
ENABLE_URING = Path("/sys/module/fuse/parameters/enable_uring")

LOADERS = {
    "read8m": data_path.read8m,
    "pread8": loaders.load_reread_kept,
    "mmap": data_path.mmap_copy,
    "load_file": loaders.load_torch_file,
}


class Transport:
    """A way of mounting: `--io-uring` and, for `+max-pages-N`, the sysctl read at mount."""

    def __init__(self, name: str, builds: dict[str, Path]):
        self.name = name
        parts = name.split("+")
        if parts[0] not in ("dev_fuse", "io_uring"):
            raise SystemExit(f"unknown transport {name!r}")
        self.extra = ("--io-uring", "on" if parts[0] == "io_uring" else "off")
        self.max_pages = 0
        self.bin: Path | None = None
        for part in parts[1:]:
            if part.startswith("max-pages-"):
                self.max_pages = int(part.removeprefix("max-pages-"))
            elif part.startswith("threads-"):
                self.extra = (*self.extra, "--threads", part.removeprefix("threads-"))
            elif part in builds:
                self.bin = builds[part]
            else:
                raise SystemExit(f"unknown transport option {part!r}")

    def mount(self, source: Path, root: Path, budget: int, extra: tuple[str, ...]) -> bench.Mount:
        old = data_path.MAX_PAGES.read_text().strip()
        default_bin = bench.BIN
        if self.max_pages:
            data_path.MAX_PAGES.write_text(str(self.max_pages))
        if self.bin is not None:
            bench.BIN = self.bin
        try:
            return bench.Mount(source, root, budget, extra=(*self.extra, *extra))
        finally:
            data_path.MAX_PAGES.write_text(old)
            bench.BIN = default_bin


def timed(fn, path: Path, daemon: int | None, drop: bool) -> tuple[float, dict]:
    """One pass: its time, and the CPU seconds of the machine and the daemon's threads."""
    cpu: dict = {}
    if drop:
        return data_path.cold(fn, path, cpu, daemon), cpu
    bench.drop_caches()  # the kernel's caches only: the daemon's chunk cache stays
    return data_path.cold(fn, path, cpu, daemon), cpu


def measure(args, disk: sources.RamDisk, root: Path, f: Path) -> list[dict]:
    size = f.stat().st_size
    rows = []
    builds = {}
    for spec in args.build:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"--build wants NAME=PATH of a tierfs binary, not {spec!r}")
        builds[name] = Path(path)
    transports = [Transport(t, builds) for t in args.transports.split(",")]
    for name in args.loaders.split(","):
        fn = LOADERS[name]
        fn(f)  # imports and first-use costs, untimed
        for case in args.cases.split(","):
            if case == "over":
                budget, extra = size // 4, ()
            elif case == "hit":
                budget, extra = 2 * size, ("--no-model-passthrough",)
            else:
                raise SystemExit(f"unknown case {case!r}")
            runs: dict[str, dict[str, list]] = {t.name: {"s": [], "req": [], "us": [], "cpu": [], "daemon": [],
                                                         "disk": []} for t in transports}
            plain = []
            for rep in range(args.reps):
                plain.append(data_path.cold(fn, f))
                # The first mount after the plain pass runs up to 10 % faster on the hit path
                # (the same build first or second: vectored-pread-hit*.md): the order flips
                # every repetition, so an even --reps gives each transport each place as often.
                for t in transports if rep % 2 == 0 else transports[::-1]:
                    m = t.mount(disk.mnt, root, budget, extra)
                    try:
                        if case == "hit":
                            fn(m.mnt / f.name)  # fills the chunk cache
                            before = m.stats()["ops"]["read"]
                        else:
                            before = {"count": 0, "mean_us": 0.0}
                        s, cpu = timed(fn, m.mnt / f.name, m.pid, drop=case == "over")
                        st = m.stats()
                        transport = st.get("transport", {})
                        if t.name.startswith("io_uring") and transport.get("kind") != "io_uring":
                            raise SystemExit(f"{t.name}: the mount is served by {transport}")
                    finally:
                        m.close()
                    ops = st["ops"]["read"]
                    count = ops["count"] - before["count"]
                    total_us = ops["mean_us"] * ops["count"] - before["mean_us"] * before["count"]
                    r = runs[t.name]
                    r["s"].append(s)
                    r["req"].append(count)
                    r["us"].append(total_us / count if count else float("nan"))
                    r["cpu"].append(cpu.get("machine", 0.0))
                    r["daemon"].append(cpu.get("requests", 0.0))
                    r["disk"].append(st["disk"]["read_bytes"] / size)
            base = statistics.median(runs[transports[0].name]["s"])
            for t in transports:
                # The same transport with another build, for `vs build`: `dev_fuse` against
                # `dev_fuse+NAME` (the speed of this build over that one).
                other = next((o for o in transports if o.bin is not None and t.bin is None
                              and o.name.split("+")[:-1] == t.name.split("+")
                              and o.name.split("+")[-1] in builds), None)
                vs_build = (statistics.median(runs[other.name]["s"]) / statistics.median(runs[t.name]["s"])
                            if other else None)
                r = runs[t.name]
                s = statistics.median(r["s"])
                row = {"loader": name, "case": case, "transport": t.name, "gbs": size / s / 1e9,
                       "vs_base": base / s, "plain_gbs": size / statistics.median(plain) / 1e9,
                       "requests": statistics.median(r["req"]), "daemon_us": statistics.median(r["us"]),
                       "cpu_s_gb": statistics.median(r["cpu"]) / (size / 1e9),
                       "req_cpu_s_gb": statistics.median(r["daemon"]) / (size / 1e9),
                       "disk": max(r["disk"]), "times": r["s"], "vs_build": vs_build,
                       "build": other.name.split("+")[-1] if other else None}
                print(f"{name:9} {case:5} {t.name:24} {row['gbs']:.2f} GB/s  vs dev_fuse {row['vs_base']:.2f}  "
                      f"plain {row['plain_gbs']:.2f}  requests {row['requests']:.0f}  daemon "
                      f"{row['daemon_us']:.0f} us  CPU s/GB {row['cpu_s_gb']:.2f} (request threads "
                      f"{row['req_cpu_s_gb']:.2f})  disk/model {row['disk']:.2f}"
                      + (f"  vs {row['build']} {vs_build:.2f}" if other else ""), flush=True)
                rows.append(row)
    return rows


def render(args, model: Path, raw: float, rows: list[dict], run: list[str]) -> str:
    lines = [
        "# The mount's transports: /dev/fuse and io_uring",
        "",
        *run,
        f"- model: {model.name} ({model.stat().st_size / 1e9:.2f} GB) on a RAM-backed ext4 "
        f"({raw:.2f} GB/s cold read); {args.reps} repetitions, medians; transports alternate "
        "within each repetition, their order reversed every other one",
        "- `over`: budget a quarter of the model, cold; `hit`: budget twice the model "
        "(`--no-model-passthrough`), chunk cache filled by an untimed pass, kernel caches dropped",
        f"- `vs dev_fuse`: speed over the first transport's (`{rows[0]['transport'] if rows else ''}`) "
        "in the same run; `vs the other build`: speed over the same transport's with the build "
        "given by `--build` (this build on the row without it); `daemon µs`: the "
        "daemon's mean time per read request; CPU: seconds per GB of the whole machine, and of the "
        "daemon's request threads",
        "",
        "| loader | case | transport | GB/s | vs dev_fuse | plain file GB/s | read requests | daemon µs/request "
        "| machine CPU s/GB | request threads CPU s/GB | source read / model | vs the other build |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        vs_build = f"{r['vs_build']:.2f} (against `{r['build']}`)" if r["vs_build"] is not None else ""
        lines.append(f"| {r['loader']} | {r['case']} | {r['transport']} | {r['gbs']:.2f} | {r['vs_base']:.2f} "
                     f"| {r['plain_gbs']:.2f} | {r['requests']:.0f} | {r['daemon_us']:.0f} | {r['cpu_s_gb']:.2f} "
                     f"| {r['req_cpu_s_gb']:.2f} | {r['disk']:.2f} | {vs_build} |")
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1200)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--loaders", default="pread8,mmap,load_file")
    ap.add_argument("--cases", default="over,hit")
    ap.add_argument("--transports", default="dev_fuse,io_uring,io_uring+max-pages-1024")
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PATH",
                    help="another tierfs binary, used by the transports with the option +NAME")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "transport" / "transport.md")
    args = ap.parse_args()
    load0, t0 = os.getloadavg(), time.monotonic()
    bench.BIN = args.tierfs
    args.data.mkdir(parents=True, exist_ok=True)
    model = args.data / f"dit_{args.size_mib}mib.safetensors"
    if not model.exists():
        gen.make_big_dit(model, args.size_mib * MiB)
    if not ENABLE_URING.exists():
        raise SystemExit("this kernel has no FUSE io_uring transport (Linux 6.14 or later)")
    was = ENABLE_URING.read_text().strip()
    ENABLE_URING.write_text("Y")
    root = Path(tempfile.mkdtemp(prefix="tierfs-transport.", dir="/var/tmp"))
    try:
        with guest_memory.SteadyMemory(), sources.RamDisk(model.stat().st_size + 512 * MiB, root) as disk:
            f = disk.put(model)
            raw = max(sources.cold_read_gbs(f) for _ in range(2))
            print(f"source: {raw:.2f} GB/s cold read on {disk.kind}", flush=True)
            rows = measure(args, disk, root, f)
        run = machine.run_lines("transport.py", sys.argv[1:], load0, t0)
        machine.write_results(args.out, render(args, model, raw, rows, run))
    finally:
        bench.cleanup(root)
        ENABLE_URING.write_text(was)
    return 0


if __name__ == "__main__":
    sys.exit(main())
