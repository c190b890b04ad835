#!/usr/bin/env python3
"""What a loader's read-ahead hint is worth on a model served by passthrough, and whether the
daemon can stand in for it.

    sudo .venv/bin/python tests/bench/passthrough_hints.py [--reps 4] [--size-mib 1536]
                                                          [--loaders safe_open_pt,comfy,pread]

A model that fits the budget is served by FUSE passthrough: the reader's `read()`s and its
mapping go to the source file, but through a file the kernel opens for the passthrough open, so
a loader's `posix_fadvise(POSIX_FADV_SEQUENTIAL)` on its own descriptor (torch's
`UntypedStorage.from_file`, which `safe_open(framework="pt")` and ComfyUI's load use, gives one)
lands on the mounted file and never reaches the reads. On the fast source of
tests/bench/sources.py (ext4 on a RAM-backed block device), caches dropped before every pass,
the cases alternate in one process:

1. **The hint**: a `MAP_PRIVATE` mapping of the whole model copied out in 64 MiB pieces, with
   and without `POSIX_FADV_SEQUENTIAL` on the mapped descriptor, from the plain file and
   through the mount.
2. **Reading ahead from the daemon's side**: each loader on the plain file and through the
   mount, alone and with a helper thread that starts with the loader and asks for the whole
   source file with `POSIX_FADV_WILLNEED` in 64 MiB steps (what the daemon could do for a
   passthrough file, whose whole size the budget reserves anyway).

Writes tests/bench/results/passthrough_hints/hints.md. Needs root.
"""

from __future__ import annotations

import argparse
import datetime
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(HERE))

import acceptance  # noqa: E402
import gen  # noqa: E402
import guest_memory  # noqa: E402
import loaders  # noqa: E402
import machine  # noqa: E402
import read_patterns as bench  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
STEP = 64 * MiB

LOADERS = {
    "safe_open_pt": acceptance.load_safe_open_pt,
    "comfy": acceptance.load_comfy,
    "pread": loaders.load_reread,
}


def private_copy(path: Path, hint: bool) -> int:
    """Copies a MAP_PRIVATE mapping of `path` out in 64 MiB pieces, after
    POSIX_FADV_SEQUENTIAL on the mapped descriptor if `hint`."""
    import numpy as np
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if hint:
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
        try:
            src = np.frombuffer(mm, dtype=np.uint8)
            out = np.empty(STEP, dtype=np.uint8)
            for off in range(0, size, STEP):
                n = min(STEP, size - off)
                out[:n] = src[off:off + n]
            del src
        finally:
            mm.close()
        return size
    finally:
        os.close(fd)


def willneed(path: Path, stop: threading.Event) -> None:
    """Asks for the whole of `path` with POSIX_FADV_WILLNEED, 64 MiB at a time."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        for off in range(0, size, STEP):
            if stop.is_set():
                return
            os.posix_fadvise(fd, off, min(STEP, size - off), os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def cold(fn, path: Path, ahead_of: Path | None = None) -> float:
    """One pass of `fn(path)` after dropping the caches; with `ahead_of`, a helper thread asks
    for that file with WILLNEED from the pass's start."""
    bench.drop_caches()
    time.sleep(0.3)
    stop = threading.Event()
    helper = threading.Thread(target=willneed, args=(ahead_of, stop)) if ahead_of else None
    t0 = time.perf_counter()
    if helper:
        helper.start()
    fn(path)
    elapsed = time.perf_counter() - t0
    stop.set()
    if helper:
        helper.join()
    return elapsed


def measure(args, source: Path, mounted: Path) -> tuple[dict, dict]:
    hint: dict[str, list[float]] = {}
    for _ in range(args.reps):
        for side, path in (("plain", source), ("mount", mounted)):
            for on in (False, True):
                key = f"{side}, {'with' if on else 'without'} the hint"
                hint.setdefault(key, []).append(cold(lambda p: private_copy(p, on), path))
    print({k: round(statistics.median(v), 3) for k, v in hint.items()}, flush=True)
    ahead: dict[str, dict[str, list[float]]] = {}
    for name in args.loaders.split(","):
        fn = LOADERS[name]
        fn(source)  # imports and first-use costs, untimed
        runs = ahead.setdefault(name, {})
        for _ in range(args.reps):
            for side, path in (("plain", source), ("mount", mounted)):
                runs.setdefault(side, []).append(cold(fn, path))
                runs.setdefault(f"{side} + WILLNEED", []).append(cold(fn, path, ahead_of=source))
        print(name, {k: round(statistics.median(v), 3) for k, v in runs.items()}, flush=True)
    return hint, ahead


def render(args, model: Path, raw_gbs: float, kind: str, modes: list, hint: dict, ahead: dict, cmd: str) -> str:
    med = statistics.median
    out = ["# Passthrough: a loader's read-ahead hint, and reading ahead from the daemon\n",
           f"- command: `{cmd}`",
           f"- date: {datetime.datetime.now():%Y-%m-%d %H:%M}; kernel {os.uname().release}; {os.cpu_count()} CPUs",
           f"- model {model.name}: {model.stat().st_size / 1e9:.2f} GB on {kind} (cold `read()` "
           f"{raw_gbs:.2f} GB/s); budget larger than the model: served by {', '.join(sorted(set(modes)))}; "
           f"median of {args.reps}, caches dropped before every pass", "",
           "A `MAP_PRIVATE` mapping of the model copied out (s):", "",
           "| case | median s | passes |", "|---|---:|---|"]
    for k, v in hint.items():
        out.append(f"| {k} | {med(v):.3f} | {', '.join(f'{x:.3f}' for x in v)} |")
    out += ["", "Loaders, alone and with a helper asking for the whole source file with `WILLNEED` (s):", "",
            "| loader | plain | plain + WILLNEED | mount | mount + WILLNEED | plain / mount | plain / (mount + WILLNEED) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name, runs in ahead.items():
        p, pw, m, mw = (med(runs[k]) for k in ("plain", "plain + WILLNEED", "mount", "mount + WILLNEED"))
        out.append(f"| {name} | {p:.3f} | {pw:.3f} | {m:.3f} | {mw:.3f} | {p / m:.2f} | {p / mw:.2f} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--size-mib", type=int, default=1536)
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "passthrough_hints" / "hints.md")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (RAM-backed source, drop_caches, mounts)")
    bench.BIN = args.tierfs
    args.data.mkdir(parents=True, exist_ok=True)
    model = args.data / f"dit_{args.size_mib}mib_sorted.safetensors"
    if not model.exists():
        gen.make_big_dit(model, args.size_mib * MiB, seed=2611, sort_names=True)
    root = Path(tempfile.mkdtemp(prefix="tierfs-hints.", dir="/var/tmp"))
    try:
        with guest_memory.SteadyMemory(), sources.RamDisk(model.stat().st_size + 512 * MiB, root) as disk:
            f = disk.put(model)
            raw = max(sources.cold_read_gbs(f) for _ in range(2))
            m = bench.Mount(disk.mnt, root, model.stat().st_size * 2)
            try:
                hint, ahead = measure(args, f, m.mnt / f.name)
                modes = [x.get("mode") for x in m.stats().get("files", []) if x.get("path") == f.name]
            finally:
                m.close()
        cmd = "sudo .venv/bin/python tests/bench/passthrough_hints.py " + " ".join(sys.argv[1:])
        machine.write_results(args.out, render(args, model, raw, disk.kind, modes, hint, ahead, cmd.strip()))
    finally:
        bench.cleanup(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
