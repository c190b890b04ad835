#!/usr/bin/env python3
"""Workflows that switch between models: disk read and time per cycle, through the mount and
from the plain folder under the same memory.

    sudo .venv/bin/python tests/bench/workflow.py [--sources fast,slow] [--scenarios two,three,big_small]
        [--loaders pread,safe_open_pt,comfy,aimdo] [--cycles 4] [--configs plain,tierfs] [--out FILE]

A cycle loads every model of the scenario once, in the same order (Wan 2.2 A14B's high-noise
then low-noise expert on every prompt; a text encoder then the diffusion model):

* ``two``: two models of --model-mib each, the budget 1.28 x one of them: each fits, both do not;
* ``three``: three such models, the budget 2.1 x one;
* ``big_small``: a model 1.6 x the budget after one of 0.4 x (text encoder + diffusion model).

Each load runs in a loader process that imported its modules once (acceptance.py's ``--serve``
children) and frees everything between loads.  Configurations, run back to back per loader so
that drift on the shared machine hits all of them:

* ``plain``: the plain files, the loader in a cgroup v1 memory cgroup of budget + what the loader
  itself holds after its imports (its page cache is charged there: the page cache under the same
  memory);
* ``tierfs``: a fresh mount with ``--ram-cache budget`` (defaults otherwise), the daemon in a
  memory cgroup of budget + 64 MiB, the loader uncapped: what the mount lets stay in memory is
  the mount's doing, and its peak (daemon + its shmem + the source files' page cache) is sampled
  and reported against 1.1 x budget + 64 MiB. The mounted files' own page cache (mmap readers of
  files the chunk cache serves) is not sampled: measuring it means opening them, which makes
  the sampler a reader of the mount; tierfs holds it to `kernel_page_cache.window_bytes`;
* ``tierfs-cache``: the same with ``--no-model-passthrough`` (every model through the chunk cache).

Caches are dropped before cycle 1 only.  Disk bytes per cycle: the source device's read
counter (/sys/dev/block/.../stat: everything that read it, daemon and loader alike; nothing else
uses the RAM device).  Reported per row: cycles 2.. median time and max disk, the ratio plain
time / config time (goal >= 1.5 for tierfs) and disk per cycle / (sum of the models - budget)
(goal <= 1.1), peak memory, and the stall at a switch: the most a load of the steady cycles
waited for the disk in the first block of its model (its file's `start_stall_seconds`, summed
over the loader's threads), over that load's cold time in cycle 1 (goal <= 0.05).

Best possible: after its plain cycles, the loader loads every model cold (caches dropped) and
from the page cache (uncapped, the best of two cycles; `pread`, which drops what it read, is
timed from RAM by the same reads keeping the pages). An ideal tier reads the excess from the
disk at the cold speed and the rest from RAM at the page-cache speed; the plain cycle time over
that is the best ratio any tier could reach on the row, beside the one the mount reached.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(HERE))
import acceptance  # noqa: E402
import read_patterns as bench  # noqa: E402
import gen  # noqa: E402
import guest_memory  # noqa: E402
import machine  # noqa: E402
import sources  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
SLOW_BPS = 1_000_000_000
DAEMON_OVERHEAD = 64 * MiB
GOAL_DISK = 1.1
GOAL_SPEEDUP = 1.5
GOAL_STALL = 0.05
LOADERS = ("pread", "safe_open_pt", "comfy", "aimdo")
# The same reads without dropping the pages, for a loader that drops them (`Case.ideal_cycle`).
KEEPING = {"pread": "pread_kept"}


def scenario(name: str, unit: int) -> tuple[list[tuple[str, int]], int]:
    """([(file name, target size)], budget) of a scenario, `unit` the size of one model."""
    if name == "two":
        return [("high.safetensors", unit), ("low.safetensors", unit)], int(unit * 1.28)
    if name == "three":
        return [(f"m{i}.safetensors", unit) for i in range(3)], int(unit * 2.1)
    if name == "big_small":
        budget = int(unit * 1.28)
        return [("text_encoder.safetensors", int(budget * 0.4)), ("dit.safetensors", int(budget * 1.6))], budget
    raise SystemExit(f"unknown scenario {name}")


def make_models(disk: sources.RamDisk, data: Path, files: list[tuple[str, int]]) -> list[Path]:
    """The scenario's models on the RAM device (generated once into `data`, copied)."""
    out = []
    for i, (name, size) in enumerate(files):
        stored = data / f"workflow_{size // MiB}mib_{i}.safetensors"
        if not stored.exists():
            print(f"generating {stored} ...", flush=True)
            gen.make_big_dit(stored, size, seed=2700 + i, sort_names=True)
        out.append(disk.mnt / name if (disk.mnt / name).exists() else disk.put(stored, name))
    return out


def rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class Case:
    """One scenario on one source: its models, its budget, and the rows it produced."""

    def __init__(self, run: "Run", name: str, source: str):
        self.run, self.name, self.source = run, name, source
        files, self.budget = scenario(name, run.unit)
        self.models = make_models(run.disk, run.data, files)
        self.total = sum(m.stat().st_size for m in self.models)
        self.excess = max(1, self.total - self.budget)
        self.file_figures = FileFigures()

    def cycles(self, loader: acceptance.LoaderProc, paths: list[Path], label: str,
               mount: bench.Mount | None = None) -> dict:
        """--cycles cycles of `paths`; caches dropped before the first. With `mount`, the time
        each load waited for the disk at its start (its file's `start_stall_seconds`) is
        recorded too."""
        sources.drop_caches()
        times, disks, loads, stalls = [], [], [], []
        for _ in range(self.run.args.cycles):
            # the loads' own times: the first load's wall time would include the child's imports
            d0 = self.run.dev.read_bytes()
            per, stall = [], []
            for p in paths:
                s0 = file_stall(mount, p.name) if mount else 0.0
                per.append(loader.load(p))
                stall.append(file_stall(mount, p.name) - s0 if mount else 0.0)
                if mount and self.run.args.file_stats:
                    self.file_figures.show(mount, p.name)
            stalls.append(stall)
            times.append(sum(per))
            disks.append(self.run.dev.read_bytes() - d0)
            loads.append(per)
            print(f"    {label:<14} cycle {len(times)}: {times[-1]:6.2f} s, disk {disks[-1] / 1e9:5.2f} GB, loads "
                  + " ".join(f"{x:.2f}" for x in per), flush=True)
        return {"times": times, "disks": disks, "loads": loads, "stalls": stalls}

    def plain(self, name: str) -> dict:
        with acceptance.LoaderProc(name) as loader:
            # the loader's own memory (imports) on top of the budget: its page cache gets the budget
            limit = self.budget + rss_anon(loader.p.pid) + 64 * MiB
            cg = bench.Cgroup("wf-reader", limit)
            try:
                (cg.path / "cgroup.procs").write_text(f"{loader.p.pid}\n")
                r = self.cycles(loader, self.models, "plain")
            finally:
                cg.remove()
            r["ideal_s"] = self.ideal_cycle(loader)
        r["peak"] = None
        return r

    def ideal_cycle(self, loader: acceptance.LoaderProc) -> float:
        """The cycle time of an ideal tier, for the best ratio any tier can reach on this row: the
        loader's own cold and warm (page cache) times of the plain files, uncapped, weighted by
        the bytes such a tier reads per cycle from the disk (the excess) and from RAM (the
        rest). The disk part costs what a cold load costs per byte, the RAM part what a load
        from the page cache costs: no tier serves a byte faster than the kernel's page cache
        serves it to the same loader."""
        sources.drop_caches()
        cold = sum(loader.load(p) for p in self.models)
        # A loader that drops what it read (pread's DONTNEED) is timed from RAM with the same
        # reads that keep the pages.
        with acceptance.LoaderProc(KEEPING.get(loader.name, loader.name)) as keeping:
            for p in self.models:
                keeping.load(p)
            warm = min(sum(keeping.load(p) for p in self.models) for _ in range(2))
        share = min(1.0, self.excess / self.total)
        print(f"    ideal tier: cold {cold:.2f} s, warm {warm:.2f} s per cycle of loads", flush=True)
        return share * cold + (1 - share) * warm

    def tierfs(self, name: str, extra: tuple[str, ...]) -> dict:
        cgd = bench.Cgroup("wf-daemon", self.budget + DAEMON_OVERHEAD)
        try:
            m = bench.Mount(self.run.disk.mnt, self.run.root, self.budget, cgroup=cgd, extra=extra)
            try:
                paths = [m.mnt / p.name for p in self.models]
                # The sampler must not open the mounted files: an open handle is a reader to the
                # mount (a passthrough file open for the whole run reserves its size).
                with acceptance.LoaderProc(name) as loader, \
                        acceptance.MemorySampler(m.pid, [], self.models) as sampler:
                    r = self.cycles(loader, paths, "tierfs" + ("-cache" if extra else ""), m)
                r["peak"] = sampler.peak["total"]
                r["stats"] = m.stats()
                r["oom_kills"] = cgd.oom_kills()
            finally:
                m.close()
        finally:
            cgd.remove()
        return r


class Run:
    def __init__(self, args, root: Path, disk: sources.RamDisk, thr: sources.Throttle):
        self.args, self.root, self.disk, self.thr = args, root, disk, thr
        self.unit = args.model_mib * MiB
        self.data = Path(args.data)
        self.dev = bench.DevStat(disk.mnt)
        self.rows: list[dict] = []

    def case(self, name: str, source: str) -> None:
        self.thr.set(SLOW_BPS if source == "slow" else 0)
        case = Case(self, name, source)
        print(f"{name} on the {source} source: {len(case.models)} models, {case.total / 1e9:.2f} GB, budget "
              f"{case.budget / MiB:.0f} MiB", flush=True)
        for loader in self.args.loaders:
            results = {}
            for config in self.args.configs:
                if config == "plain":
                    results[config] = case.plain(loader)
                else:
                    extra = ("--no-model-passthrough",) if config == "tierfs-cache" else ()
                    results[config] = case.tierfs(loader, extra)
            self.record(case, loader, results)
        for p in case.models:
            p.unlink()

    def record(self, case: Case, loader: str, results: dict) -> None:
        rows = []
        for config, r in results.items():
            rows.append({"scenario": case.name, "source": case.source, "loader": loader, "config": config,
                         "excess_gb": case.excess / 1e9, "peak_mib": (r["peak"] or 0) / MiB,
                         "peak_goal_mib": (1.1 * case.budget + DAEMON_OVERHEAD) / MiB, "oom_kills": r.get("oom_kills", 0),
                         "times": r["times"], "disks_gb": [d / 1e9 for d in r["disks"]], "loads": r["loads"],
                         "stalls": r["stalls"], "modes": file_modes(r.get("stats", {})),
                         "ideal_s": r.get("ideal_s")})
        self.rows += summarize(rows)

    def render(self, cmd: str, elapsed: float, note: str, date: str = "", host: str = "") -> str:
        return render(self.rows, cmd, elapsed, note, self.args.model_mib, self.args.cycles, date, host)


def steady(n: int) -> slice:
    """The cycles figures are taken from: the last two of four or more (cycle 1 is cold; in the
    next ones models that turn out to compete move from passthrough to the chunk cache, a cycle
    later for a loader that keeps a handle past the next model's open), else all but the first."""
    return slice(n - 2, None) if n >= 4 else slice(1, None) if n >= 2 else slice(None)


def summarize(rows: list[dict]) -> list[dict]:
    """Adds the steady-state figures and the verdict to the rows of one loader (plain first)."""
    base = next((r for r in rows if r["config"] == "plain"), None)
    for r in rows:
        later = steady(len(r["times"]))
        r["cycle_s"] = statistics.median(r["times"][later])
        r["disk_gb"] = max(r["disks_gb"][later])
        r["disk_ratio"] = r["disk_gb"] / r["excess_gb"]
        r["speedup"] = base["cycle_s"] / r["cycle_s"] if base else float("nan")
        r["bound"] = base["cycle_s"] / base["ideal_s"] if base and base.get("ideal_s") else float("nan")
        # the stall at a switch (steady cycles) against that load's cold time (cycle 1)
        r["switch_stall"] = max((s / max(r["loads"][0][i], 1e-9) for c in r["stalls"][later]
                                 for i, s in enumerate(c)), default=0.0)
        if r["config"] != "plain":
            r["ok"] = (r["disk_ratio"] <= GOAL_DISK and r["speedup"] >= GOAL_SPEEDUP and not r["oom_kills"]
                       and r["peak_mib"] <= r["peak_goal_mib"] and r["switch_stall"] <= GOAL_STALL)
    return rows


def render(rows: list[dict], cmd: str, elapsed: float, note: str, model_mib: int, cycles: int,
           date: str = "", host: str = "") -> str:
    lines = ["# Model-switching workflows: disk and time per cycle", "",
             *([f"- date: {date}", f"- machine: {host}", ""] if date or host else []),
             f"`{cmd}` ({elapsed / 60:.0f} min; {note})", "",
             f"Models of {model_mib} MiB (scenario `big_small`: 0.4 and 1.6 x the budget); "
             f"{cycles} cycles, caches dropped before the first; figures from the steady cycles "
             f"({'the last two' if cycles >= 4 else '2..'}): median time, max device bytes. Ratios: plain time / "
             "config time (goal ≥ 1.5), disk / (sum of the models − budget) (goal ≤ 1.1); peak memory of "
             "the mount against 1.1 × budget + 64 MiB; stall at a switch / that load's cold time (goal ≤ "
             "0.05). Best possible: the speed vs plain of an ideal tier that reads only the excess from "
             "the disk, at the loader's own cold speed, and the rest at its speed from the page cache "
             "(both measured on the plain files in the same run).", "",
             "| scenario | source | loader | config | cycle s | disk GB/cycle | disk / excess | speed vs plain "
             "| best possible | peak MiB (goal) | switch stall / cold load | modes | result |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = "" if "ok" not in r else ("PASS" if r["ok"] else "FAIL")
        peak = "" if r["config"] == "plain" else f"{r['peak_mib']:.0f} ({r['peak_goal_mib']:.0f})"
        stall = "" if r["config"] == "plain" else f"{r['switch_stall']:.3f}"
        lines.append(f"| {r['scenario']} | {r['source']} | {r['loader']} | {r['config']} | {r['cycle_s']:.2f} | "
                     f"{r['disk_gb']:.2f} | {r['disk_ratio']:.2f} | {r['speedup']:.2f} | "
                     f"{'' if r['config'] == 'plain' else format(r.get('bound', float('nan')), '.2f')} | {peak} | {stall} | "
                     f"{r.get('modes', '')} | {ok} |")
    lines += ["", "Per cycle (time s / disk GB):", ""]
    for r in rows:
        lines.append(f"- {r['scenario']} {r['source']} {r['loader']} {r['config']}: "
                     + ", ".join(f"{t:.2f}/{d:.2f}" for t, d in zip(r["times"], r["disks_gb"])))
    return "\n".join(lines) + "\n"


class FileFigures:
    """--file-stats: after each load through the mount, every model's mode, what the chunk cache
    holds of it, and what was read of it from the disk and served from resident chunks since the
    previous load (the daemon's per-file figures): where a cycle's disk bytes went."""

    def __init__(self):
        self.last: dict = {}

    def show(self, mount: bench.Mount, loaded: str) -> None:
        print(f"      after loading {loaded}:", flush=True)
        for f in mount.stats().get("files") or []:
            if not isinstance(f, dict) or not f.get("path"):
                continue
            before = self.last.get(f["path"], {})
            grew = {k: (f.get(k) or 0) - (before.get(k) or 0) for k in ("disk_read_bytes", "hit_bytes")}
            print(f"        {f['path']:<26} {f.get('mode') or '-':<11} cached {(f.get('cached_bytes') or 0) / MiB:5.0f} MiB, "
                  f"disk +{grew['disk_read_bytes'] / MiB:4.0f} MiB, hits +{grew['hit_bytes'] / MiB:4.0f} MiB", flush=True)
            self.last[f["path"]] = f


def file_stall(mount: bench.Mount, name: str) -> float:
    """`start_stall_seconds` of the mounted file `name` (0 before its first open): the time its
    readers waited for the disk in the first block of its order."""
    for f in mount.stats().get("files") or []:
        if isinstance(f, dict) and f.get("path") == name:
            return float(f.get("start_stall_seconds") or 0.0)
    return 0.0


def file_modes(stats: dict) -> str:
    modes = {}
    for f in stats.get("files") or []:
        name = next((v for v in f.values() if isinstance(v, str) and v.endswith(".safetensors")), None) \
            if isinstance(f, dict) else None
        if name:
            modes[Path(name).stem] = f.get("mode", "?")
    return " ".join(f"{k}:{v}" for k, v in sorted(modes.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", default="fast,slow")
    ap.add_argument("--scenarios", default="two,three,big_small")
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--configs", default="plain,tierfs")
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--model-mib", type=int, default=768)
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--data", default="/var/tmp/tierfs-bench-data")
    ap.add_argument("--out", help="results file (markdown; .json beside it)")
    ap.add_argument("--file-stats", action="store_true",
                    help="after each load through the mount, print each model's figures from the mount's stats")
    ap.add_argument("--render", type=Path, help="only render the rows of a results .json again")
    args = ap.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        groups: dict = {}
        for r in saved["rows"]:
            # rows written before `excess_gb` and `oom_kills` were recorded
            r.setdefault("excess_gb", r["disk_gb"] / r["disk_ratio"])
            r.setdefault("oom_kills", 0)
            groups.setdefault((r["scenario"], r["source"], r["loader"]), []).append(r)
        rows = [x for g in groups.values() for x in summarize(g)]
        print(render(rows, saved["command"], saved.get("elapsed_s", 0), saved.get("note", ""),
                     saved.get("model_mib", 0), len(rows[0]["times"]), saved.get("date", ""),
                     saved.get("machine", "")))
        return 0
    args.loaders = [x for x in args.loaders.split(",") if x]
    args.configs = [x for x in args.configs.split(",") if x]
    if os.geteuid() != 0:
        raise SystemExit("workflow.py needs root (devices, mounts, cgroups, drop_caches)")
    sources.clean_stale()
    bench.clean_stale()
    root = Path(tempfile.mkdtemp(prefix="tierfs-bench.wf.", dir="/tmp"))
    bench.BIN = acceptance.copy_binary(args.tierfs.resolve(), root)
    t0 = time.monotonic()
    started, host = machine.date(), machine.describe()
    need = max(sum(s for _, s in scenario(n, args.model_mib * MiB)[0]) for n in args.scenarios.split(","))
    run = None
    try:
        with guest_memory.SteadyMemory() as steady, sources.RamDisk(need + 512 * MiB, root) as disk:
            thr = sources.Throttle(disk.majmin)
            try:
                run = Run(args, root, disk, thr)
                for source in args.sources.split(","):
                    for name in args.scenarios.split(","):
                        run.case(name, source)
                note = steady.note
            finally:
                bench.cleanup(None)
                thr.close()
    finally:
        bench.cleanup(root)
    cmd = "sudo .venv/bin/python tests/bench/workflow.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    text = run.render(cmd.strip(), time.monotonic() - t0, note, started, host)
    print("\n" + text)
    if args.out:
        machine.write_results(args.out, text, {
            "date": started, "machine": host, "command": cmd.strip(), "elapsed_s": time.monotonic() - t0,
            "note": note, "model_mib": args.model_mib, "rows": run.rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
