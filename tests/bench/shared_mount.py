"""Cost of the shared-mount access rule: opens/s and warm read throughput (issue 13).

On a shared mount (`--allow-other`, root daemon) every lookup, getattr and open made for a user
other than root runs with that user's credentials: the serving thread switches fsuid, fsgid and
supplementary groups around the source call (tierfs_core::access). Reads of an open file do not
switch. This bench measures, in one run, the same workloads on:

  baseline  mount without --allow-other, read by root (no switch at all)
  shared    mount with --allow-other, read by tierfs-user (switch on every lookup/open)
  shared/root  the same shared mount read by root (no switch: the rule's fixed cost)

Workloads: `opens` = open + 4 KiB header read + close of one model file, repeated for 3 s;
`warm read` = a 256 MiB model read twice with 1 MiB reads, the second pass timed (all cached).
Prints ratios against the baseline, and writes tests/bench/shared-mount-results.md.

    sudo .venv/bin/python tests/bench/shared_mount.py
"""

from __future__ import annotations

import json
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


def mounted(src: Path, mnt: Path, allow_other: bool):
    cmd = [str(TIERFS), "mount", str(src), str(mnt), "--ram-cache", "1GiB", "--no-state"]
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


def main() -> None:
    users.ensure_user()
    base = Path(tempfile.mkdtemp(prefix="tierfs-shared-bench.", dir="/var/tmp"))
    os.chmod(base, 0o755)
    src, mnt = base / "src", base / "mnt"
    src.mkdir(mode=0o755)
    mnt.mkdir(mode=0o755)
    model = src / "m.safetensors"
    gen.make_big_dit(model, 256 * MiB)
    os.chmod(model, 0o644)
    rows = {}
    try:
        for name, allow_other, as_user in (("baseline", False, False), ("shared", True, True),
                                           ("shared/root", True, False)):
            proc = mounted(src, mnt, allow_other)
            try:
                path = mnt / model.name
                rows[name] = (measure(path, "opens", as_user), measure(path, "read", as_user))
            finally:
                unmount(proc, mnt)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    b_opens, b_read = rows["baseline"]
    lines = ["| run | opens/s | ratio | warm read MB/s | ratio |", "|---|---|---|---|---|"]
    for name, (opens, read) in rows.items():
        lines.append(f"| {name} | {opens:.0f} | {opens / b_opens:.2f} | {read / 1e6:.0f} | {read / b_read:.2f} |")
    table = "\n".join(lines)
    print(table)
    (HERE / "shared-mount-results.md").write_text(
        "# Shared-mount access rule: cost (tests/bench/shared_mount.py)\n\n"
        f"Machine: {platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}.\n"
        "Command: `sudo .venv/bin/python tests/bench/shared_mount.py`\n\n" + table + "\n")


if __name__ == "__main__":
    main()
