#!/usr/bin/env python3
"""The compressed RAM tier in the cache: what the budget holds, and what it saves, per `--compress` mode.

    sudo .venv/bin/python tests/bench/compress_tier.py [--parts held,classes,loaders]
        [--classes fast,1g,disk] [--model-mib 256] [--turns-budget-mib 448] [--passes-budget-mib 384]
        [--cycles 4] [--passes 3] [--think-s 1] [--loaders NAMES] [--reps 5] [--loaders-model-mib 1536]
        [--tierfs PATH] [--weights PATH] [--data DIR] [--out FILE]

Models: synthetic bf16 checkpoints whose weights follow a trained model's distribution
(`core/examples/weights_file.rs`, `tierfs_core::weights`: each tensor normal with its own
deviation, log-uniform in [0.005, 0.08], rounded to nearest even; a DiT of dim 1024); the
exponent plane's entropy it reports is in the results.  They sit on ext4 on a loop device over
tmpfs (tests/bench/sources.py), read by the 8 x 2 MiB `pread` loader of tests/bench/acceptance.py
(the workflow loader of tests/bench/slow_sources.py), every mount with `--no-model-passthrough`
(so a model that fits the budget goes through the chunk cache) and `--compress MODE`.

Source classes (blkio cgroup on every process of the run, tests/bench/sources.py):
* **fast**: the device unthrottled (the stand-in for local flash; `auto` must not be slower);
* **1g**: read-throttled to 1 GB/s;
* **disk**: 200 MB/s and 200 requests/s, a hard disk's two limits (slow_sources.py's disk class).

Parts (`--parts`: `held` is 1, `classes` 2 and 3, `loaders` 4):
1. **held** (fast class, `--compress on`, budget twice the model): one load of model A, then
   the compressor left to finish; `cache.used_bytes` (frames, raw chunks and decoded windows:
   what the budget is charged) / the model's size, and the frames' ratio; then a second load,
   served from the frames: its time against the first load's, and the decode speed (bytes
   decoded / decode time, on the readers' threads).
2. **turns**, per class: two models (A, B) taking turns through one mount whose budget holds
   both only compressed (`--turns-budget-mib`), `--cycles` cycles A then B, per mode off, auto,
   on; the same cycles on the plain source (page cache unbounded, dropped at the start).  Per
   cycle: seconds of loading and source bytes (the cgroup's block-layer read bytes).  After each
   load the loader pauses `--think-s` (a workflow computes with the model it loaded; the
   compressor works meanwhile); the pause is not in the seconds.  The daemon's peak RSS
   (`VmHWM`) against 1.1 x budget + 64 MiB, the source throughput the mount measured
   (`source.devices[].throughput_bytes_per_second`) and the bytes it compressed.
3. **passes**, per class: `--passes` passes over a model 1.3 x `--passes-budget-mib`, per mode,
   `--think-s` between passes; source bytes and seconds per pass.
4. **loaders** (fast class): `auto`, the default, against `off` (tierfs without the tier) for
   every loader of the acceptance benchmark's part 1 (`--loaders`), on a bf16 model of
   `--loaders-model-mib`, mounts as a user makes them (model passthrough allowed, only
   `--compress` differs), budget
   ≥ the model and budget = model / 4; per case a cold load (caches dropped, fresh mount) and a
   warm one (the same mount again); `--reps` repetitions, the two modes' order reversed every
   other one, medians; auto / off as speed (above 1: auto faster) and whether `auto` compressed
   anything.

Ratios are against runs of the same class in the same process; a benchmark reports, it asserts
nothing.  Writes tests/bench/results/compress_tier/compress-tier.md and .json (or --out).
Needs root, the release `tierfs` and the `weights_file` example
(`cargo build --release -p tierfs -p tierfs-core --example weights_file`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
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
import machine  # noqa: E402
import read_patterns as bench  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
CLASSES = {"fast": (0, 0), "1g": (1_000_000_000, 0), "disk": (200_000_000, 200)}
MODES = ("off", "auto", "on")
LOADER = "pread"
EXTRA = ("--no-model-passthrough",)
# Part 4: the default first, then what tierfs did without the tier.
LOADER_MODES = ("auto", "off")
PART1_LOADERS = "safe_open_np,safe_open_pt,load_file,comfy,aimdo,pread,whole_read,np_memmap"
PARTS = ("held", "classes", "loaders")


def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def mount_facts(m: bench.Mount) -> dict:
    s = m.stats()
    devs = s.get("source", {}).get("devices", [])
    tp = [d.get("throughput_bytes_per_second") or 0 for d in devs]
    z = s["cache"]["compress"]
    return {"source_gbs": max(tp, default=0) / 1e9, "encoded_bytes": z["encoded_bytes"],
            "decode_errors": z["decode_errors"]}


def hwm(pid: int) -> int:
    try:
        return acceptance.parse_status(Path(f"/proc/{pid}/status").read_text()).get("VmHWM", 0)
    except OSError:
        return 0


class Run:
    def __init__(self, args, root: Path, disk: sources.RamDisk, thr: sources.Throttle, models: dict):
        self.args, self.root, self.disk, self.thr, self.models = args, root, disk, thr, models
        self.src = disk.mnt / "models"

    def set_class(self, name: str) -> None:
        bps, iops = CLASSES[name]
        self.thr.set(bps)
        self.thr.set_iops(iops)

    def mount(self, budget: int, mode: str) -> bench.Mount:
        return bench.Mount(self.src, self.root, budget, extra=(*EXTRA, "--compress", mode))

    def wait_compressed(self, m: bench.Mount, timeout: float = 120) -> dict:
        """The stats once the compressor has nothing left to do (what it holds stops changing)."""
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            z = m.stats()["cache"]
            now = (z["used_bytes"], z["compress"]["raw_bytes"], z["compress"]["window_bytes"])
            if now == last and z["compress"]["window_bytes"] == 0:
                return m.stats()
            last = now
            time.sleep(1.5)
        return m.stats()

    def held(self) -> dict:
        self.set_class("fast")
        a = self.models["a"]
        size = a.stat().st_size
        sources.drop_caches()
        m = self.mount(2 * size + 64 * MiB, "on")
        try:
            with acceptance.LoaderProc(LOADER) as lp:
                first = lp.load(m.mnt / a.name, timeout=1800)
                s = self.wait_compressed(m)
                c = s["cache"]
                second = lp.load(m.mnt / a.name, timeout=1800)
                c2 = m.stats()["cache"]["compress"]
            out = {"model_bytes": size, "used_bytes": c["used_bytes"], "compress": c["compress"],
                   "first_s": first, "second_s": second,
                   "decode_gbs": ratio(c2["decoded_bytes"], c2["decode_seconds"]) / 1e9}
        finally:
            m.close()
        print(f"   held: used {out['used_bytes'] / size:.3f} x model, frames ratio {c['compress']['ratio']:.3f}, "
              f"second load {second:.2f} s vs first {first:.2f} s, decode {out['decode_gbs']:.2f} GB/s", flush=True)
        return out

    def turns(self, cname: str) -> dict:
        rels = [self.models["a"].name, self.models["b"].name]
        budget = self.args.turns_budget_mib * MiB
        out: dict = {"budget": budget, "models_bytes": sum(self.models[k].stat().st_size for k in "ab"),
                     "plain": [], "modes": {}}
        with acceptance.LoaderProc(LOADER) as lp:
            sources.drop_caches()
            for _ in range(self.args.cycles):
                b0, t = self.thr.read_bytes(), 0.0
                for rel in rels:
                    t += lp.load(self.src / rel, timeout=1800)
                    time.sleep(self.args.think_s)
                out["plain"].append({"s": t, "bytes": self.thr.read_bytes() - b0})
            for mode in MODES:
                sources.drop_caches()
                m = self.mount(budget, mode)
                cycles = []
                try:
                    for _ in range(self.args.cycles):
                        b0, t = self.thr.read_bytes(), 0.0
                        for rel in rels:
                            t += lp.load(m.mnt / rel, timeout=1800)
                            time.sleep(self.args.think_s)
                        c = m.stats()["cache"]
                        cycles.append({"s": t, "bytes": self.thr.read_bytes() - b0, "used": c["used_bytes"],
                                       "compressed_raw": c["compress"]["raw_bytes"],
                                       "frames": c["compress"]["frame_bytes"]})
                    peak = hwm(m.pid)
                    facts = mount_facts(m)
                finally:
                    m.close()
                out["modes"][mode] = {"cycles": cycles, "peak_rss": peak, **facts}
                print(f"   turns {cname} {mode}: s " + ", ".join(fmt(c["s"]) for c in cycles) + "; source MiB "
                      + ", ".join(f"{c['bytes'] / MiB:.0f}" for c in cycles)
                      + f"; peak RSS {peak / MiB:.0f} MiB (limit {(1.1 * budget + 64 * MiB) / MiB:.0f})", flush=True)
        print(f"   turns {cname} plain: s " + ", ".join(fmt(c["s"]) for c in out["plain"]), flush=True)
        return out

    def passes(self, cname: str) -> dict:
        big = self.models["big"]
        budget = self.args.passes_budget_mib * MiB
        out: dict = {"budget": budget, "model_bytes": big.stat().st_size, "modes": {}}
        with acceptance.LoaderProc(LOADER) as lp:
            for mode in MODES:
                sources.drop_caches()
                m = self.mount(budget, mode)
                runs = []
                try:
                    for _ in range(self.args.passes):
                        b0 = self.thr.read_bytes()
                        s = lp.load(m.mnt / big.name, timeout=1800)
                        runs.append({"s": s, "bytes": self.thr.read_bytes() - b0})
                        time.sleep(self.args.think_s)
                    peak = hwm(m.pid)
                    facts = mount_facts(m)
                finally:
                    m.close()
                out["modes"][mode] = {"passes": runs, "peak_rss": peak, **facts}
                print(f"   passes {cname} {mode}: s " + ", ".join(fmt(r["s"]) for r in runs) + "; source MiB "
                      + ", ".join(f"{r['bytes'] / MiB:.0f}" for r in runs), flush=True)
        return out


def loaders_part(run: "Run") -> dict:
    """Part 4: the acceptance loaders through `--compress auto` and `--compress off`, fast class."""
    args = run.args
    run.set_class("fast")
    big = run.models["loaders"]
    size = big.stat().st_size
    cases = {"fits": size + 64 * MiB, "quarter": size // 4}
    table = acceptance.loaders_table()
    out: dict = {"model_bytes": size, "budgets": cases, "loaders": {}}
    for name in args.loaders:
        label = table[name][0]
        rows: dict = {case: {mode: {"cold": [], "warm": [], "encoded": 0, "mode": ""} for mode in LOADER_MODES}
                      for case in cases}
        try:
            with acceptance.LoaderProc(name) as lp:
                for rep in range(args.reps):
                    for case, budget in cases.items():
                        order = LOADER_MODES if rep % 2 == 0 else tuple(reversed(LOADER_MODES))
                        for mode in order:
                            sources.drop_caches()
                            m = bench.Mount(run.src, run.root, budget, extra=("--compress", mode))
                            try:
                                cold = lp.load(m.mnt / big.name, timeout=1800)
                                warm = lp.load(m.mnt / big.name, timeout=1800)
                                s = m.stats()
                                r = rows[case][mode]
                                r["cold"].append(cold)
                                r["warm"].append(warm)
                                r["encoded"] += s["cache"]["compress"]["encoded_bytes"]
                                r["mode"] = "/".join(sorted(set(acceptance.file_modes(s, big.name)))) or r["mode"]
                            finally:
                                m.close()
        except Exception as e:  # noqa: BLE001 - a loader that fails is reported, the others run
            out["loaders"][name] = {"label": label, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"   loaders {name}: failed: {e}", flush=True)
            for m in list(reversed(bench._MOUNTS)):
                m.close()
            continue
        out["loaders"][name] = {"label": label, "cases": rows}
        print(f"   loaders {name}: " + "; ".join(
            f"{case} cold auto/off {fmt(auto_off(rows[case], 'cold'))} warm {fmt(auto_off(rows[case], 'warm'))}"
            for case in cases), flush=True)
    return out


def median(xs: list) -> float:
    return statistics.median(xs) if xs else float("nan")


def auto_off(case: dict, load: str, pick=median) -> float:
    """off s / auto s of one case's `load` ("cold" or "warm") times, each mode's `pick` of them."""
    return ratio(pick(case["off"][load]) if case["off"][load] else 0,
                 pick(case["auto"][load]) if case["auto"][load] else 0)


def render_loaders(res: dict, args) -> list:
    lp = res["loaders"]
    size = lp["model_bytes"]
    lines = ["## Loaders: `--compress auto` (the default) against `off`, fast source", "",
             f"The acceptance benchmark's part-1 loaders on the {size / MiB:.0f} MiB bf16 model, ext4 on the "
             "loop device unthrottled; mounts as a user makes them, only `--compress` differs; budget ≥ model "
             f"({lp['budgets']['fits'] / MiB:.0f} MiB) and model / 4 ({lp['budgets']['quarter'] / MiB:.0f} MiB); "
             f"cold: caches dropped, fresh mount; warm: the same mount's second load; median of {args.reps}, the "
             "modes' order reversed every other repetition. auto/off: off s / auto s (above 1: auto faster), of "
             "the medians and, in brackets, of each mode's fastest load (single loads of the `mmap` loaders through "
             "a mount vary widely from one to the next). MiB compressed: what `auto` encoded over all "
             "repetitions.", "",
             "| loader | budget | mode | off cold s | auto cold s | auto/off cold | off warm s | auto warm s "
             "| auto/off warm | MiB compressed (auto) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    worst = []
    for name, r in lp["loaders"].items():
        if "error" in r:
            lines.append(f"| {r['label']} | — | — | failed: `{r['error']}` | | | | | | |")
            continue
        for case, rows in r["cases"].items():
            off, auto = rows["off"], rows["auto"]
            c, w = auto_off(rows, "cold"), auto_off(rows, "warm")
            cb, wb = auto_off(rows, "cold", min), auto_off(rows, "warm", min)
            worst += [c, w]
            lines.append(f"| {r['label']} | {'≥ model' if case == 'fits' else 'model / 4'} | {auto['mode']} | "
                         f"{fmt(median(off['cold']))} | {fmt(median(auto['cold']))} | {fmt(c)} ({fmt(cb)}) | "
                         f"{fmt(median(off['warm']))} | {fmt(median(auto['warm']))} | {fmt(w)} ({fmt(wb)}) | "
                         f"{auto['encoded'] / MiB:.0f} |")
    worst = [x for x in worst if x == x]
    if worst:
        lines += ["", f"auto/off over every row: lowest {min(worst):.2f}, highest {max(worst):.2f}, "
                  f"median {statistics.median(worst):.2f}."]
    return lines + [""]


def render(cmd: str, info: dict, res: dict, args) -> str:
    lines = [
        "# The compressed RAM tier in the cache (`tests/bench/compress_tier.py`)",
        "",
        f"- command: `{cmd}` ({info['elapsed_s'] / 60:.1f} min)",
        f"- date: {info['date']}",
        f"- machine: {info['machine']}",
        f"- load average (1/5/15 min) at the start {info['load_start']}, at the end {info['load_end']} "
        "(shared machine: compare figures of the same run only)",
        f"- binary: {info['binary']}; harness at {info['harness']}",
        f"- mounts (held, turns, passes): `tierfs mount SRC MNT --ram-cache BUDGET {' '.join(bench.mount_extra())} "
        f"{' '.join(EXTRA)} --compress MODE`, fresh per mode; loader: 8 x 2 MiB `pread`; "
        f"{args.think_s:g} s pause after each load (not in the times)",
        f"- models: {', '.join(info['models'])}",
        "",
    ]
    h = res.get("held")
    if h:
        size = h["model_bytes"]
        lines += [
            "## Held: one bf16 model, `--compress on`, fast source",
            "",
            f"- model {size / MiB:.0f} MiB; after one load and the compressor's round: `cache.used_bytes` "
            f"{h['used_bytes'] / MiB:.1f} MiB = **{h['used_bytes'] / size:.3f} x the model**; frames "
            f"{h['compress']['frame_bytes'] / MiB:.1f} MiB for {h['compress']['raw_bytes'] / MiB:.1f} MiB of "
            f"chunks (ratio {h['compress']['ratio']:.3f}); windows {h['compress']['window_bytes'] / MiB:.1f} MiB",
            f"- first load {fmt(h['first_s'])} s (from the source), second {fmt(h['second_s'])} s (every chunk "
            f"decoded from its frame); decode {fmt(h['decode_gbs'])} GB/s of output per reader thread "
            "(`decoded_bytes / decode_seconds`)",
            "",
        ]
    if res.get("loaders"):
        lines += render_loaders(res, args)
    for cname, c in res.get("classes", {}).items():
        if "error" in c:
            lines += [f"## {cname}", "", f"failed: `{c['error']}`", ""]
            continue
        t = c["turns"]
        one = t["models_bytes"] / 2
        lim = 1.1 * t["budget"] + 64 * MiB
        lines += [f"## {cname}: {c['describe']}", "",
                  f"Two models taking turns ({one / MiB:.0f} MiB each, budget {t['budget'] / MiB:.0f} MiB: both fit "
                  f"only compressed); per cycle A then B: seconds, source bytes / one model. Plain: the loader on "
                  "the source's files, page cache unbounded.", "",
                  "| cycle | plain s | " + " | ".join(f"{m} s" for m in MODES) + " | "
                  + " | ".join(f"{m} bytes/model" for m in MODES) + " | auto/off time | on/off time |",
                  "|---:|---:|" + "---:|" * (2 * len(MODES) + 2)]
        for i, p in enumerate(t["plain"]):
            row = [t["modes"][m]["cycles"][i] for m in MODES]
            lines.append(f"| {i + 1} | {fmt(p['s'])} | " + " | ".join(fmt(r["s"]) for r in row) + " | "
                         + " | ".join(fmt(r["bytes"] / one, 3) for r in row) + " | "
                         + f"{fmt(ratio(row[1]['s'], row[0]['s']))} | {fmt(ratio(row[2]['s'], row[0]['s']))} |")
        lines += ["", "Peak daemon RSS (`VmHWM`) / (1.1 x budget + 64 MiB): "
                  + ", ".join(f"{m} {fmt(t['modes'][m]['peak_rss'] / lim, 3)} ({t['modes'][m]['peak_rss'] / MiB:.0f} MiB)"
                              for m in MODES)
                  + "; decode errors: " + ", ".join(f"{m} {t['modes'][m]['decode_errors']}" for m in MODES)
                  + "; MiB compressed: " + ", ".join(f"{m} {t['modes'][m]['encoded_bytes'] / MiB:.0f}" for m in MODES)
                  + "; source GB/s as the mount measured it: "
                  + ", ".join(f"{m} {fmt(t['modes'][m]['source_gbs'])}" for m in MODES), ""]
        ps = c["passes"]
        over = ps["model_bytes"] - ps["budget"]
        lines += [f"Repeated passes over a {ps['model_bytes'] / MiB:.0f} MiB model (budget {ps['budget'] / MiB:.0f} "
                  f"MiB): per pass, seconds and source bytes / (model − budget)", "",
                  "| pass | " + " | ".join(f"{m} s" for m in MODES) + " | "
                  + " | ".join(f"{m} bytes/(model−budget)" for m in MODES) + " |",
                  "|---:|" + "---:|" * (2 * len(MODES))]
        for i in range(len(ps["modes"]["off"]["passes"])):
            row = [ps["modes"][m]["passes"][i] for m in MODES]
            lines.append(f"| {i + 1} | " + " | ".join(fmt(r["s"]) for r in row) + " | "
                         + " | ".join(fmt(r["bytes"] / over, 3) for r in row) + " |")
        lines += ["", "Peak daemon RSS / (1.1 x budget + 64 MiB): "
                  + ", ".join(f"{m} {fmt(ps['modes'][m]['peak_rss'] / (1.1 * ps['budget'] + 64 * MiB), 3)}"
                              for m in MODES)
                  + "; MiB compressed: " + ", ".join(f"{m} {ps['modes'][m]['encoded_bytes'] / MiB:.0f}" for m in MODES)
                  + "; source GB/s as the mount measured it: "
                  + ", ".join(f"{m} {fmt(ps['modes'][m]['source_gbs'])}" for m in MODES), ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help="from " + ",".join(PARTS))
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--loaders", default=PART1_LOADERS, help="part 4's loaders (acceptance.py's names)")
    ap.add_argument("--reps", type=int, default=5, help="part 4's repetitions")
    ap.add_argument("--loaders-model-mib", type=int, default=1536, help="part 4's model")
    ap.add_argument("--model-mib", type=int, default=256)
    ap.add_argument("--turns-budget-mib", type=int, default=448)
    ap.add_argument("--passes-budget-mib", type=int, default=384)
    ap.add_argument("--cycles", type=int, default=4)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--think-s", type=float, default=1.0)
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--weights", type=Path, default=REPO / "target" / "release" / "examples" / "weights_file")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data/compress_tier"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "compress_tier" / "compress-tier.md")
    args = ap.parse_args()
    args.parts = [p for p in args.parts.split(",") if p]
    args.classes = [c for c in args.classes.split(",") if c] if "classes" in args.parts else []
    args.loaders = [n for n in args.loaders.split(",") if n]
    if set(args.parts) - set(PARTS):
        raise SystemExit(f"--parts from {list(PARTS)}")
    if set(args.classes) - set(CLASSES):
        raise SystemExit(f"--classes from {list(CLASSES)}")
    if set(args.loaders) - set(acceptance.loaders_table()):
        raise SystemExit(f"--loaders from {list(acceptance.loaders_table())}")
    if os.geteuid() != 0:
        raise SystemExit("compress_tier.py needs root (devices, mounts, cgroups, drop_caches)")
    for b in (args.tierfs, args.weights):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"{b} missing: cargo build --release -p tierfs -p tierfs-core --example weights_file")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    sources.clean_stale()
    args.data.mkdir(parents=True, exist_ok=True)
    big_mib = args.passes_budget_mib * 13 // 10
    specs = {"a": (args.model_mib, 41), "b": (args.model_mib, 42), "big": (big_mib, 43)}
    if "loaders" in args.parts:
        specs["loaders"] = (args.loaders_model_mib, 44)
    models, notes = {}, []
    for key, (mib, seed) in specs.items():
        path = args.data / f"bf16_{key}_{mib}m_s{seed}.safetensors"
        note = path.with_suffix(".txt")
        if not path.exists() or not note.exists():
            r = subprocess.run([str(args.weights), str(path), str(mib), str(seed)], capture_output=True, text=True,
                               check=True)
            note.write_text(r.stdout.strip())
        models[key] = path
        notes.append(note.read_text().strip().replace(str(args.data) + "/", ""))
    root = Path(tempfile.mkdtemp(prefix="tierfs-compress.", dir="/var/tmp"))
    bench.BIN = acceptance.copy_binary(args.tierfs.resolve(), root)
    load0 = os.getloadavg()
    t0 = time.monotonic()
    results: dict = {"classes": {}}
    need = sum(p.stat().st_size for p in models.values()) + 256 * MiB
    try:
        with sources.RamDisk((need + MiB - 1) // MiB * MiB, root, prefer_loop=True) as disk:
            thr = sources.Throttle(disk.majmin)
            try:
                for p in models.values():
                    disk.put(p, "models/" + p.name)
                run = Run(args, root, disk, thr, {k: disk.mnt / "models" / p.name for k, p in models.items()})
                if "held" in args.parts:
                    print("== held", flush=True)
                    results["held"] = run.held()
                if "loaders" in args.parts:
                    print("== loaders, fast source: auto against off", flush=True)
                    results["loaders"] = loaders_part(run)
                for cname in args.classes:
                    bps, iops = CLASSES[cname]
                    describe = (f"ext4 on {disk.kind} ({disk.dev}), " + (
                        "unthrottled" if not bps else f"blkio read_bps_device {bps / 1e6:.0f} MB/s"
                        + (f" + read_iops_device {iops}/s" if iops else "")))
                    print(f"== {cname}: {describe}", flush=True)
                    try:
                        run.set_class(cname)
                        results["classes"][cname] = {"describe": describe, "turns": run.turns(cname),
                                                     "passes": run.passes(cname)}
                    except Exception as e:  # noqa: BLE001 - a failed class is reported, the others run
                        import traceback
                        traceback.print_exc()
                        results["classes"][cname] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
                        for m in list(reversed(bench._MOUNTS)):
                            m.close()
            finally:
                bench.cleanup(None)
                thr.set(0)
                thr.set_iops(0)
                thr.close()
    finally:
        bench.cleanup(root)
    git = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True).stdout.strip()
    info = {"date": machine.date(), "machine": machine.describe(), "elapsed_s": time.monotonic() - t0,
            "load_start": " ".join(f"{x:.2f}" for x in load0),
            "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()), "binary": str(args.tierfs),
            "harness": git[:100], "models": notes}
    cmd = "sudo .venv/bin/python tests/bench/compress_tier.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    text = render(cmd.strip(), info, results, args)
    machine.write_results(args.out, text, {"command": cmd.strip(), "info": info, **results}, echo=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; mounts, devices and cgroups removed", file=sys.stderr)
        sys.exit(130)
