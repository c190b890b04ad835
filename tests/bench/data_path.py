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
requests an `mmap` reader's faults send). Writes tests/bench/results/data_path/all-loaders.md. Needs root.

Beside the loaders, the size of the pages each path puts in the page cache: the first
--folio-mib of the file is read through a mapping (one byte per 4 KiB page), from the plain file
and through a fresh mount, with the kernel's `filemap:mm_filemap_add_to_page_cache` tracepoint
on (tracefs, mounted if it is not); the table counts the folios inserted for that file by order
(order n: 2^n pages of 4 KiB). Each folio costs the same allocation, page-cache insertion, LRU
and mapping work whatever its size, so a path that fills its page cache with 4 KiB folios pays
that work per 4 KiB where ext4's readahead pays it per folio of up to 2 MiB.

CPU: each timed pass also counts the CPU time the whole machine spent (`/proc/stat`, every CPU,
all but idle and iowait) and, for the mount, the daemon's threads by name (`/proc/PID/task`):
request threads (`fuser-N`), prefetch workers, the invalidation thread. On a machine with
few cores a path that costs more CPU per byte is capped by it, whatever the disk.
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
import machine  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
MAX_PAGES = Path("/proc/sys/fs/fuse/max_pages_limit")
TRACING = Path("/sys/kernel/tracing")
FOLIO_EVENT = TRACING / "events" / "filemap" / "mm_filemap_add_to_page_cache"


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


CLK_TCK = os.sysconf("SC_CLK_TCK")


def busy_cpu_s() -> float:
    """CPU seconds the machine has spent on anything but idle and iowait, all CPUs."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + ticks[4]
    return (sum(ticks[:8]) - idle) / CLK_TCK


def thread_group(name: str) -> str:
    """The daemon's threads by role (their names: fuser-N, tierfs-prefetch, ...)."""
    if name.startswith(("fuser", "tierfs-q", "tierfs-dev")):
        return "requests"
    if name.startswith("tierfs-prefetch") or name.startswith("tierfs-ahead"):
        return "prefetch"
    if name.startswith("tierfs-invalida"):
        return "invalidation"
    return "other"


def daemon_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of the daemon's threads so far, by role."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        cpu = (int(rest[11]) + int(rest[12])) / CLK_TCK  # utime, stime
        out[thread_group(name)] = out.get(thread_group(name), 0.0) + cpu
    return out


def cold(fn, path: Path, cpu: dict | None = None, daemon: int | None = None) -> float:
    """One timed pass after dropping the caches; `cpu` gets the machine's busy CPU seconds
    and, with `daemon`, the daemon's by role."""
    bench.drop_caches()
    time.sleep(0.3)
    d0 = daemon_cpu_s(daemon) if daemon else {}
    c0 = busy_cpu_s()
    t0 = time.perf_counter()
    fn(path)
    elapsed = time.perf_counter() - t0
    if cpu is not None:
        cpu["machine"] = busy_cpu_s() - c0
        for role, s in (daemon_cpu_s(daemon) if daemon else {}).items():
            cpu[role] = s - d0.get(role, 0.0)
    return elapsed


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
            plain_cpu, mount_cpu = [], []
            for _ in range(args.reps):
                plain_cpu.append({})
                plain.append(cold(fn, f, plain_cpu[-1]))
                m = variant.mount(disk.mnt, root, budget)
                try:
                    mount_cpu.append({})
                    mount.append(cold(fn, m.mnt / f.name, mount_cpu[-1], m.pid))
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
                   "plain_s": plain, "mount_s": mount,
                   "plain_cpu_s_gb": statistics.median(c["machine"] for c in plain_cpu) / (size / 1e9),
                   "mount_cpu_s_gb": statistics.median(c["machine"] for c in mount_cpu) / (size / 1e9),
                   "daemon_cpu_s_gb": {role: statistics.median(c.get(role, 0.0) for c in mount_cpu) / (size / 1e9)
                                       for role in ("requests", "prefetch", "invalidation", "other")}}
            print(f"{name:9} {vname:16} plain {row['plain_gbs']:.2f} GB/s  mount {row['mount_gbs']:.2f} GB/s  "
                  f"ratio {row['ratio']:.2f}  disk/model {row['disk']:.2f}  wasted {row['wasted']:.3f}  "
                  f"requests {n:.0f}  daemon {row['daemon_us']:.0f} us  wall {row['wall_us']:.0f} us/request  "
                  f"CPU s/GB plain {row['plain_cpu_s_gb']:.2f} mount {row['mount_cpu_s_gb']:.2f} "
                  f"daemon {row['daemon_cpu_s_gb']}", flush=True)
            rows.append(row)
    return rows


class FolioTrace:
    """The page-cache insertions of one file while the block runs (the filemap tracepoint)."""

    def __init__(self, path: Path):
        st = path.stat()
        self.dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        self.ino = f"{st.st_ino:x}"
        self.orders: dict[int, int] = {}
        self.lost = 0
        self.mounted = False
        self.buffer_kb = ""

    def __enter__(self) -> "FolioTrace":
        if not FOLIO_EVENT.exists():
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACING)], check=True, capture_output=True,
                           timeout=30)
            self.mounted = True
        # 16 MiB per CPU holds the ~65 000 records of 256 MiB read in 4 KiB folios.
        # "N" or, before the buffers were first used, "N (expanded: M)": M is what they will be.
        self.buffer_kb = (TRACING / "buffer_size_kb").read_text().replace(")", "").split()[-1]
        (TRACING / "buffer_size_kb").write_text("16384\n")
        (TRACING / "trace").write_text("")
        (FOLIO_EVENT / "enable").write_text("1\n")
        return self

    def __exit__(self, *exc) -> None:
        (FOLIO_EVENT / "enable").write_text("0\n")
        text = (TRACING / "trace").read_text(errors="replace")
        (TRACING / "trace").write_text("")
        (TRACING / "buffer_size_kb").write_text(f"{self.buffer_kb}\n")
        if self.mounted:
            subprocess.run(["umount", str(TRACING)], capture_output=True, timeout=30)
        for line in text.splitlines():
            if line.startswith("# entries-in-buffer/entries-written:"):
                shown, written = line.split(":", 1)[1].split()[0].split("/")
                self.lost = int(written) - int(shown)
            fields = line.split()
            if "dev" not in fields or "ino" not in fields:
                continue
            i = fields.index("dev")
            if fields[i + 1] != self.dev or fields[fields.index("ino") + 1] != self.ino:
                continue
            order = int(next(x for x in fields if x.startswith("order=")).removeprefix("order="))
            self.orders[order] = self.orders.get(order, 0) + 1

    def summary(self) -> dict:
        pages = sum(n << o for o, n in self.orders.items())
        folios = sum(self.orders.values())
        return {"folios": folios, "mean_kib": pages * 4 / folios if folios else float("nan"),
                "orders": dict(sorted(self.orders.items())), "lost": self.lost}


def touch_pages(path: Path, nbytes: int) -> None:
    """Reads one byte of every 4 KiB page of the first `nbytes` of `path` through a mapping."""
    import mmap
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
        try:
            view = memoryview(mm)
            total = 0
            for off in range(0, min(nbytes, len(mm)), 4096):
                total += view[off]
            view.release()
        finally:
            mm.close()


def measure_folios(args, disk: sources.RamDisk, root: Path, f: Path) -> list[dict]:
    """Folios inserted in the page cache for the first --folio-mib of `f`, plain and mounted."""
    nbytes = args.folio_mib * MiB
    rows = []
    for side in ("plain", "mount"):
        bench.drop_caches()
        m = Variant("default").mount(disk.mnt, root, f.stat().st_size // args.div) if side == "mount" else None
        try:
            path = m.mnt / f.name if m else f
            with FolioTrace(path) as trace:
                touch_pages(path, nbytes)
        finally:
            if m:
                m.close()
        row = {"side": side, **trace.summary()}
        print(f"folios {side:5} {row}", flush=True)
        rows.append(row)
    return rows


def render(args, f: Path, raw_gbs: float, rows: list[dict], cmd: str, folios: list[dict]) -> str:
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
    out += ["", "CPU seconds per GB of model, the machine's busy time during the pass (all CPUs; median), "
            "and the daemon's threads by role during the mount's pass:", "",
            "| loader | variant | plain CPU s/GB | mount CPU s/GB | mount / plain | daemon: requests | prefetch "
            "| invalidation | other | rest of the machine (reader, kernel threads) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        d = r["daemon_cpu_s_gb"]
        rest = r["mount_cpu_s_gb"] - sum(d.values())
        out.append(f"| {r['loader']} | {r['variant']} | {r['plain_cpu_s_gb']:.2f} | {r['mount_cpu_s_gb']:.2f} | "
                   f"{r['mount_cpu_s_gb'] / r['plain_cpu_s_gb']:.1f} | {d['requests']:.2f} | {d['prefetch']:.2f} | "
                   f"{d['invalidation']:.2f} | {d['other']:.2f} | {rest:.2f} |")
    if folios:
        out += ["", f"Page-cache folios inserted for the first {args.folio_mib} MiB of the file, read through a "
                "mapping (one byte per 4 KiB page; `filemap:mm_filemap_add_to_page_cache`):", "",
                "| file | folios | mean KiB per folio | folios by order (order: count) | trace records lost |",
                "|---|---:|---:|---|---:|"]
        for r in folios:
            orders = ", ".join(f"{o}: {n}" for o, n in r["orders"].items())
            out.append(f"| {r['side']} | {r['folios']} | {r['mean_kib']:.0f} | {orders} | {r['lost']} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--div", type=int, default=4, help="budget = model / DIV")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--size-mib", type=int, default=2400)
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--variants", default="default,max-pages-4096,readahead-1MiB")
    ap.add_argument("--folio-mib", type=int, default=256,
                    help="MiB of the file whose page-cache folios are counted (0: skip)")
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "data_path" / "all-loaders.md")
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
            f = disk.put(model)
            raw = max(sources.cold_read_gbs(f) for _ in range(2))
            print(f"source: {raw:.2f} GB/s cold read on {disk.kind}; memory: {steady.note}", flush=True)
            folios = measure_folios(args, disk, root, f) if args.folio_mib else []
            rows = measure(args, disk, root, f)
        cmd = "sudo .venv/bin/python tests/bench/data_path.py " + " ".join(sys.argv[1:])
        machine.write_results(args.out, render(args, model, raw, rows, cmd.strip(), folios))
    finally:
        bench.cleanup(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
