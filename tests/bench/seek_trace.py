#!/usr/bin/env python3
"""Where a load's seeks come from on the seeking disk: tierfs over `faultfs --disk --disk-trace`.

    sudo .venv/bin/python tests/bench/seek_trace.py [--loaders dd,pread] [--model-mib 600]
        [--budget-mib 256] [--reps 2] [--tierfs PATH ...] [--out FILE]

The seek class of tests/bench/slow_sources.py (ext4 on a loop device over tmpfs, seen through
`faultfs --disk`: one head, 8 ms per request that does not continue the previous one, 200 MB/s),
with faultfs writing one line per request its head served (`--disk-trace`). Per binary given
with `--tierfs` (several: compared in the same run, taking turns) and loader (`dd`: one
`dd bs=16M` of the model; else a loader of tests/bench/acceptance.py), each load cold through a
fresh mount (`--budget-mib`): the seconds of the load, the requests and seeks the disk served,
the seeks that went back, and the time the head stood idle between requests. Then the same for
a reader of faultfs itself (`dd bs=16M`, no tierfs): the floor of this disk model.
Writes tests/bench/results/seek_trace/seek-trace.md (or --out). Needs root, the release
`tierfs` and `faultfs`. Reports; asserts nothing.
"""

from __future__ import annotations

import argparse
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
import acceptance  # noqa: E402
import gen  # noqa: E402
import machine  # noqa: E402
import netstore  # noqa: E402
import read_patterns as bench  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
SEEK_MS, MBPS = 8, 200


def trace_lines(trace: Path) -> list[str]:
    return [line for line in trace.read_text().splitlines() if line.strip()]


def summary(lines: list[str]) -> dict:
    """Requests, seeks, seeks going back, and the head's idle seconds between requests."""
    rows = [tuple(map(int, line.split())) for line in lines]
    idle, back, end = 0.0, 0, None
    for (t, _, off, n, seek), nxt in zip(rows, rows[1:] + [None]):
        if seek and end is not None and off < end:
            back += 1
        end = off + n
        if nxt is not None:
            busy_us = n / (MBPS * 1e6) * 1e6 + (SEEK_MS * 1000 if seek else 0)
            idle += max(0.0, nxt[0] - (t + busy_us)) / 1e6
    return {"requests": len(rows), "seeks": sum(r[4] for r in rows), "back": back, "idle_s": idle}


def load(loader: str, path: Path, lp: acceptance.LoaderProc | None) -> float:
    if lp is None:
        t0 = time.perf_counter()
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M"], check=True, capture_output=True,
                       timeout=600)
        return time.perf_counter() - t0
    return lp.load(path, timeout=600)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loaders", default="dd,pread")
    ap.add_argument("--model-mib", type=int, default=600)
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tierfs", type=Path, action="append")
    ap.add_argument("--faultfs", type=Path, default=REPO / "target" / "release" / "faultfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data/slow_sources"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "seek_trace" / "seek-trace.md")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("seek_trace.py needs root (devices, mounts, drop_caches)")
    bins = args.tierfs or [REPO / "target" / "release" / "tierfs"]
    loaders = [x for x in args.loaders.split(",") if x]
    if set(loaders) - {"dd"} - set(acceptance.loaders_table()):
        raise SystemExit(f"--loaders: dd or one of {sorted(acceptance.loaders_table())}")
    args.data.mkdir(parents=True, exist_ok=True)
    model = gen.make_big_dit(args.data / f"dit_{args.model_mib}m.safetensors", args.model_mib * MiB, seed=31,
                             sort_names=True)
    size = model.stat().st_size
    root = Path(tempfile.mkdtemp(prefix="tierfs-seektrace.", dir="/var/tmp"))
    copies = []
    for i, b in enumerate(bins):
        (root / f"bin{i}").mkdir()
        copies.append(acceptance.copy_binary(b.resolve(), root / f"bin{i}"))
    load0, t0 = os.getloadavg(), time.monotonic()
    rows: dict[tuple[str, str], list[dict]] = {}
    try:
        with sources.RamDisk(size + 256 * MiB, root, prefer_loop=True) as disk:
            disk.put(model, "models/m.safetensors")
            mnt = Path(tempfile.mkdtemp(prefix="faultfs.", dir=root))
            (root / "no-faults.json").write_text("{}")
            trace = root / "trace"
            log = open(root / "faultfs.log", "wb")
            ff = subprocess.Popen([str(args.faultfs), str(disk.mnt / "models"), str(mnt), "--faults",
                                   str(root / "no-faults.json"), "--disk", "--seek-ms", str(SEEK_MS),
                                   "--disk-mbps", str(MBPS), "--disk-trace", str(trace)],
                                  stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 15
                while not netstore.is_mounted(mnt):
                    if ff.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("faultfs did not mount")
                    time.sleep(0.05)
                for loader in loaders:
                    lp = None if loader == "dd" else acceptance.LoaderProc(loader).__enter__()
                    try:
                        for _ in range(args.reps):
                            for i, binary in enumerate([None, *copies]):
                                sources.drop_caches()
                                seen = len(trace_lines(trace))
                                if binary is None:
                                    if loader != "dd":
                                        continue
                                    s = load(loader, mnt / "m.safetensors", None)
                                    key = "faultfs alone"
                                else:
                                    bench.BIN = binary
                                    m = bench.Mount(mnt, root, args.budget_mib * MiB)
                                    try:
                                        s = load(loader, m.mnt / "m.safetensors", lp)
                                    finally:
                                        m.close()
                                    key = str(bins[i - 1])
                                r = {"s": s, **summary(trace_lines(trace)[seen:])}
                                rows.setdefault((loader, key), []).append(r)
                                print(f"{loader} {key}: {s:.2f} s, {r['requests']} requests, {r['seeks']} seeks "
                                      f"({r['back']} back), head idle {r['idle_s']:.2f} s", flush=True)
                    finally:
                        if lp is not None:
                            lp.__exit__(None, None, None)
            finally:
                netstore.unmount(mnt, ff)
                log.close()
    finally:
        bench.cleanup(root)
    lines = [
        "# Where a load's seeks come from: tierfs over faultfs's seeking disk, traced",
        "",
        *machine.run_lines("seek_trace.py", sys.argv[1:], load0, t0),
        f"- disk: `faultfs --disk` ({SEEK_MS} ms per seek, {MBPS} MB/s) over ext4 on a loop device over tmpfs; "
        f"model {size / 1e9:.2f} GB; tierfs `--ram-cache {args.budget_mib}MiB`, a fresh mount per load, caches "
        "dropped before each",
        "",
        "Medians of the repetitions; head idle: the time between one request's modelled end and the next's start.",
        "",
        "| loader | reader | s | requests | seeks | seeks going back | head idle s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (loader, key), rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        lines.append(f"| {loader} | {key} | {med['s']:.2f} | {med['requests']:.0f} | {med['seeks']:.0f} | "
                     f"{med['back']:.0f} | {med['idle_s']:.2f} |")
    machine.write_results(args.out, "\n".join(lines) + "\n", echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
