"""Cost of the shared-mount access rule: opens/s and warm read throughput.

On a shared mount (`--allow-other`, root daemon) every lookup, getattr and open made for a user
other than root runs with that user's credentials: the serving thread switches fsuid, fsgid and
supplementary groups around the source call (tierfs_core::access). Reads of an open file do not
switch. This bench measures, in one run, the same workloads on:

  baseline  mount without --allow-other, read by root (no switch at all)
  shared    mount with --allow-other, read by tierfs-user (switch on every lookup/open)
  shared/root  the same shared mount read by root (no switch: the rule's fixed cost)

and, on each of those, the model reached through a link to another file system (`/dev/shm`),
which the path resolver walks a component at a time (tierfs_core::access::resolve).

Workloads: `opens` = open + 4 KiB header read + close of one model file, repeated for 3 s;
`warm read` = a 256 MiB model read twice with 1 MiB reads, the second pass timed (all cached).
Prints ratios against the baseline, the daemon's own mean time per `open` request (from its
stats: free of the reader process's noise, which moves opens/s by ±5 % from run to run), and
writes tests/bench/results/shared_mount/access-rule-cost.md.

`--compare OTHER_TIERFS` also runs every row with another build (say, the one before a change),
alternating the two builds `--reps` times, and prints this build's median over the other's:
what the change costs, measured in one run.

    sudo .venv/bin/python tests/bench/shared_mount.py [--compare /path/to/other/tierfs] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
import gen  # noqa: E402
import users  # noqa: E402

sys.path.insert(0, str(HERE))
import machine  # noqa: E402

TIERFS = Path(os.environ.get("TIERFS_BIN", HERE.parent.parent / "target" / "release" / "tierfs"))
MiB = 1 << 20

CHILD = r"""
import json, os, sys, time
path, mode = sys.argv[1], sys.argv[2]
if mode == "opens":
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 3.0:
        fd = os.open(path, os.O_RDONLY)
        os.pread(fd, 4096, 0)
        os.close(fd)
        n += 1
    print(json.dumps(n / (time.monotonic() - t0)))
else:
    def one_pass():
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(1 << 20)
            total = 0
            while True:
                got = f.readinto(buf)
                if not got:
                    return total
                total += got
    one_pass()
    t0 = time.monotonic()
    total = one_pass()
    print(json.dumps(total / (time.monotonic() - t0)))
"""


def measure(path: Path, mode: str, as_user: bool) -> float:
    args = ["/usr/bin/python3", "-c", CHILD, str(path), mode]
    if as_user:
        r = users.run_as(args, timeout=120, cwd="/")
    else:
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"bench child failed: {r.stderr}")
    return json.loads(r.stdout)


def mounted(tierfs: Path, src: Path, mnt: Path, allow_other: bool):
    cmd = [str(tierfs), "mount", str(src), str(mnt), "--ram-cache", "1GiB", "--no-state"]
    if allow_other:
        cmd.append("--allow-other")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not (mnt / ".tierfs" / "stats").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("mount not ready")
        time.sleep(0.05)
    return proc


def unmount(proc, mnt: Path) -> None:
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


RUNS = (("baseline", False, False), ("shared", True, True), ("shared/root", True, False))
MODELS = (("", "m.safetensors"), (" (link to another fs)", "linked.safetensors"))


def open_us(mnt: Path) -> tuple[int, float]:
    """The daemon's own count and mean time of `open` requests so far (its stats)."""
    ops = json.loads((mnt / ".tierfs" / "stats").read_text())["ops"]["open"]
    return ops["count"], ops["mean_us"]


def measure_build(tierfs: Path, src: Path, mnt: Path) -> dict[str, tuple[float, float, float]]:
    """Per row: opens/s, warm read bytes/s, and the daemon's mean time per `open` request in
    the opens workload (µs; its own stats, so the noise of the reader's process is left out)."""
    rows = {}
    for name, allow_other, as_user in RUNS:
        proc = mounted(tierfs, src, mnt, allow_other)
        try:
            for suffix, model in MODELS:
                path = mnt / model
                n0, us0 = open_us(mnt)
                opens = measure(path, "opens", as_user)
                n1, us1 = open_us(mnt)
                per_open = (us1 * n1 - us0 * n0) / max(n1 - n0, 1)
                rows[name + suffix] = (opens, measure(path, "read", as_user), per_open)
        finally:
            unmount(proc, mnt)
    return rows


def ratio_table(rows: dict[str, tuple[float, float, float]]) -> str:
    b_opens, b_read, _ = rows["baseline"]
    lines = ["| run | opens/s | ratio | warm read MB/s | ratio | daemon µs per open |",
             "|---|---|---|---|---|---|"]
    for name, (opens, read, us) in rows.items():
        lines.append(f"| {name} | {opens:.0f} | {opens / b_opens:.2f} | {read / 1e6:.0f} | {read / b_read:.2f} | {us:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", type=Path, help="another tierfs build to measure against")
    ap.add_argument("--reps", type=int, default=3, help="alternations with --compare (median)")
    args = ap.parse_args()
    users.ensure_user()
    base = Path(tempfile.mkdtemp(prefix="tierfs-shared-bench.", dir="/var/tmp"))
    other_fs = Path(tempfile.mkdtemp(prefix="tierfs-shared-bench.", dir="/dev/shm"))
    for d in (base, other_fs):
        os.chmod(d, 0o755)
    src, mnt = base / "src", base / "mnt"
    src.mkdir(mode=0o755)
    mnt.mkdir(mode=0o755)
    model = src / "m.safetensors"
    gen.make_big_dit(model, 256 * MiB)
    os.chmod(model, 0o644)
    shutil.copy(model, other_fs / "linked.safetensors")
    os.chmod(other_fs / "linked.safetensors", 0o644)
    os.symlink(other_fs / "linked.safetensors", src / "linked.safetensors")
    builds = [("this build", TIERFS)] + ([("compare", args.compare)] if args.compare else [])
    runs: dict[str, list[dict]] = {label: [] for label, _ in builds}
    try:
        for _ in range(args.reps if args.compare else 1):
            for label, tierfs in builds:
                runs[label].append(measure_build(tierfs, src, mnt))
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(other_fs, ignore_errors=True)

    def median(label: str) -> dict[str, tuple[float, float, float]]:
        keys = runs[label][0].keys()
        return {k: tuple(statistics.median(r[k][i] for r in runs[label]) for i in range(3)) for k in keys}

    mine = median("this build")
    text = ratio_table(mine)
    if args.compare:
        theirs = median("compare")
        lines = [f"\nThis build against {args.compare} (medians of {args.reps} alternating runs):\n",
                 "| run | opens/s this | other | ratio | warm read MB/s this | other | ratio | daemon µs per open this | other | ratio |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for k, (o, r, us) in mine.items():
            oo, orr, ous = theirs[k]
            lines.append(f"| {k} | {o:.0f} | {oo:.0f} | {o / oo:.3f} | {r / 1e6:.0f} | {orr / 1e6:.0f} | {r / orr:.3f} "
                         f"| {us:.1f} | {ous:.1f} | {us / ous:.3f} |")
        text += "\n" + "\n".join(lines)
    print(text)
    command = "sudo .venv/bin/python tests/bench/shared_mount.py" + (
        f" --compare {args.compare} --reps {args.reps}" if args.compare else "")
    (HERE / "results" / "shared_mount" / "access-rule-cost.md").write_text(
        "# Shared-mount access rule: cost (tests/bench/shared_mount.py)\n\n"
        f"Machine: {platform.node()}, {machine.describe()}.\n"
        f"Date: {machine.date()}.\n"
        f"Command: `{command}`\n\n" + text + "\n")


if __name__ == "__main__":
    main()
