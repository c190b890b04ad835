#!/usr/bin/env python3
"""Block-order streaming reader used by read_patterns.py (rows 3 and 4); one pass per process.

    reader.py PLAN.json FILE [FILE ...] [--cgroup /sys/fs/cgroup/memory/NAME] [--threads 8] [--piece 2MiB]

PLAN.json is ``{"groups": [{"name": ..., "ranges": [[start, end], ...], "compute_s": x}, ...]}``
in the order to read them (model order).  A group may name ``"file": i``, the i-th FILE (default
0): a sharded model is read shard by shard, each shard opened when its first group comes and
closed when a group of another file follows, as a loader opens one shard after another.  For each group the reader splits every tensor's
byte range into `piece`-sized pieces and has a pool of `threads` threads ``pread`` them from
one shared descriptor (ComfyUI's dynamic-VRAM re-read pattern), then "computes" (sleeps)
``compute_s``.  With ``--cgroup`` the process first moves itself into that cgroup, so its
page cache is charged there.

Prints one JSON object: total wall time, time spent in compute, per-group read times,
bytes read, and this process's ``/proc/self/io`` ``read_bytes`` delta (bytes it caused
to be read from a block device: its reads' misses plus the readahead they triggered).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def proc_io_read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def pread_exact(fd: int, buf: memoryview, off: int, n: int) -> int:
    """Reads exactly `n` bytes at `off` into `buf` (short reads retried); an early end is an error."""
    got = 0
    while got < n:
        k = os.preadv(fd, [buf[: n - got]], off + got)
        if k <= 0:
            raise OSError(f"short read at {off + got} (wanted {n - got})")
        got += k
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--cgroup")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--piece", type=int, default=2 << 20)
    args = ap.parse_args()
    if args.cgroup:
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
            f.write(f"{os.getpid()}\n")
    with open(args.plan) as f:
        groups = json.load(f)["groups"]

    local = threading.local()
    piece = args.piece

    def read_piece(fd: int, off: int, n: int) -> int:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = memoryview(bytearray(piece))
        return pread_exact(fd, buf, off, n)

    io0 = proc_io_read_bytes()
    fd, fd_file = -1, None
    out_groups = []
    total_bytes = 0
    compute_total = 0.0
    try:
        with ThreadPoolExecutor(max_workers=args.threads) as pool:
            t_start = time.perf_counter()
            for g in groups:
                t0 = time.perf_counter()
                if g.get("file", 0) != fd_file:  # the next shard: opening it is part of the read
                    if fd >= 0:
                        os.close(fd)
                        fd = -1
                    fd_file = g.get("file", 0)
                    fd = os.open(args.files[fd_file], os.O_RDONLY)
                futs = [pool.submit(read_piece, fd, off, min(piece, end - off))
                        for start, end in g["ranges"] for off in range(start, end, piece)]
                n = sum(f.result() for f in futs)
                t1 = time.perf_counter()
                if g["compute_s"] > 0:
                    time.sleep(g["compute_s"])
                t2 = time.perf_counter()
                total_bytes += n
                compute_total += t2 - t1
                out_groups.append({"name": g["name"], "bytes": n, "read_s": t1 - t0, "compute_s": t2 - t1})
            total = time.perf_counter() - t_start
    finally:
        if fd >= 0:
            os.close(fd)
    json.dump({"total_s": total, "compute_s": compute_total, "bytes": total_bytes,
               "io_read_bytes": proc_io_read_bytes() - io0, "groups": out_groups}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
