#!/usr/bin/env python3
"""The acceptance benchmark, parts 1-5, in one run: every ratio side by side with its goal.

    sudo .venv/bin/python tests/bench/acceptance.py [--quick] [--only 1,2,3,4,5] [--tierfs PATH]
                                                 [--reps N] [--loaders a,b] [--data DIR] [--out FILE]

Sources (tests/bench/sources.py): the models are copied onto an ext4 file system on a RAM-backed
block device (zram, else loop over tmpfs): the **fast** source.  The **slow** source is the same
device read-throttled to --slow-bps (1 GB/s) by a blkio cgroup that this process, and so every
loader and tierfs daemon it starts, belongs to.  Both raw cold rates are measured and reported;
the throttle is verified by measurement before anything is timed.

Parts (every figure is compared with a baseline measured in the same run; ratios of times are
baseline s / tierfs s, so above 1 means faster through the mount):

1. Loaders: safe_open numpy and pt, safetensors.torch.load_file, ComfyUI's load_torch_file
   sequence (pt safe_open, get_tensor of every key in name order, then every weight copied in
   module order), comfy-aimdo ModelMMAP + frombuffer, 8 x 2 MiB pread, whole-file read, runai
   streamer, numpy.memmap whole-file copy.  Per loader and repetition one child process imports
   the loader's modules once and runs every case (baseline and tierfs alike).  Cases: cold slow and
   cold fast with budget >= file (goal >= 0.95), cold slow with budget = file/4 (goal >= 0.9), cold
   fast with budget = file/4 and file/8 (goal >= 0.8; each of the three below-the-file cases also
   reports the device bytes read and the prefetch wasted as shares of the model, goals <= 1.05 and
   <= 0.05), warm: loaded before through the mount, then again (goal >= 0.8 of the plain
   file held in the page cache), and again after drop_caches: tierfs's own RAM only (report; a
   passthrough file's page cache is dropped too).  Cold = caches dropped and a fresh mount.
   Loaders `gguf` (gguf-py GGUFReader reading every tensor's data, on part 4's
   GGUF) and `sharded` (safe_open shard by shard in index order, on the part-1 model cut into 4
   shards + index.json), and `comfy_checkpoint` (ComfyUI's load sequence on an SD1.5-shaped
   all-in-one checkpoint, gen.checkpoint_specs: text encoder, VAE and UNet in one file, in name
   order): the cold cases only, budgets from the whole model's size.
2. ComfyUI's load sequence, budget = file/4, slow source: disk bytes read (the largest of the blkio
   cgroup's count, which includes a reader's own reads of a passthrough file, the daemon's
   /proc/PID/io read_bytes and tierfs's disk.read_bytes), cold
   and on reload (a second process on the same mount, caches not dropped): <= 1.15 x file; `cat`
   and `dd bs=4k`: <= 1.05 x file; prefetch.wasted_bytes <= 5 % of the file in every case.
3. Streaming with compute (tests/bench/reader.py: blocks in model order, 8 threads x 2 MiB pread,
   then a sleep of --compute-factor x block bytes / raw slow rate): blocks of ~200 MB with a 1 GiB
   budget and of ~50 MB with a 2 GiB budget, slow source.  Stall % (read time outside the
   warm-up groups / pass time) vs the same pass served from tierfs's RAM (budget > file, primed,
   caches not dropped): <= 5 points above.  `--part3-sources slow,fast` measures it on the fast
   source too (the compute then follows the fast source's raw rate).
4. Memory, counted fully (sampled every 50 ms): daemon anonymous RSS + every shmem/memfd/tmpfs
   file the daemon holds open or mapped (allocated blocks, counted once) + the mounted file's page
   cache (cachestat) + the growth of the source file's page cache.  Peak <= 1.1 x budget + 64 MiB
   while a file 3 x the budget is streamed by read() and by mmap, and while two processes map a
   model that fits (fast source).  The same for a sharded model 3 x the budget (the
   part-1 model cut into 4 shards + index.json, read shard by shard in index order; every
   shard's page cache counted) and for a GGUF file 3 x the budget.
5. Repeated passes (reader.py, no compute) over a model larger than the budget, slow source:
   pass time of passes 2.. vs the plain file read by a reader whose memory cgroup is limited to
   the budget (>= 1.5 x), and disk bytes per later pass <= 1.15 x (model - budget).  The
   daemon runs in a memory cgroup of budget + 64 MiB.  Twice: the model as one .safetensors,
   and the same tensors as 4 shards + index.json, read by the same reader shard by
   shard in index order, each shard's tensors in index (= file, name) order as diffusers and
   transformers load a shard, grouped by block as the single file's are, against the plain shards.

--quick uses small files (whole run < 6 min); the default sizes are realistic (~1.5-3 GiB DiTs
from tests/python/gen.py, tensors in name order like real writers) and take ~17 min with the
default 5 repetitions, plus up to a minute to fault in free memory (tests/bench/guest_memory.py:
the VM's free page reporting is turned off for the run, so that a pass's speed does not depend on
which memory the host took back; restored at the end).  Generated
models are kept in --data and copied onto the RAM device for each part.  When tierfs's stats list
files with a `mode`, each row shows the mode the file was served in.  Writes
tests/bench/results/acceptance/full-run.md and .json (or --out) with the command, date, machine, binary hash
and load averages.  A benchmark reports; it asserts nothing.  Needs root.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(HERE))
import read_patterns as bench  # noqa: E402
import gen  # noqa: E402
import gen_gguf  # noqa: E402
import guest_memory  # noqa: E402
import machine  # noqa: E402
import sources  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
SLOW_BPS = 1_000_000_000
DAEMON_OVERHEAD = 64 * MiB
WARMUP_GROUPS = 2  # part 3: (other) + the first block: nothing can be read ahead of them cold

# The goals of the benchmark's parts.
GOAL_COLD_FITS, GOAL_COLD_FAST, GOAL_WARM, GOAL_COLD_QUARTER = 0.95, 0.8, 0.8, 0.9
GOAL_DISK_COMFY, GOAL_DISK_SEQ, GOAL_WASTED = 1.15, 1.05, 0.05
GOAL_STALL_PP = 5.0
GOAL_MEM_FACTOR, GOAL_MEM_SLACK = 1.1, 64 * MiB
GOAL_REPEAT_SPEEDUP, GOAL_REPEAT_DISK = 1.5, 1.15

# Sizes: (default, --quick).
SIZES = {
    "p1_file": (int(1.5 * GiB), 320 * MiB),
    # part 3: (dim, ffn, blocks, budget) per case; bf16 block bytes = 2 * (8 dim^2 + 2 dim ffn)
    "p3_big": ((2560, 10240, 10, 1 * GiB), (1280, 5120, 12, 256 * MiB)),      # ~210 MB / ~52 MB blocks
    "p3_small": ((1280, 5120, 60, 2 * GiB), (640, 2560, 48, 512 * MiB)),     # ~52 MB / ~13 MB blocks
    # part 4's GGUF: Flux-shaped (dim, double blocks, single blocks), 1.38 GiB / 194 MiB,
    # no larger than p1_file so the RAM device's size does not change
    "p4_gguf": ((3072, 3, 6), (1536, 2, 2)),
}
# Sharded models: the tensors of "p1" and "p3_big" cut into N_SHARDS diffusers-style
# shards + index.json (tests/python/gen_gguf.make_sharded), kept in --data/<model>-shards/.
SHARD_STEM, N_SHARDS = "diffusion_pytorch_model", 4


# ----------------------------------------------------------------------------- pure helpers (unit-tested)

# Idle time before every timed cold load of part 1 (see Run.cold_start): past the 0.3 s after
# which the throttle's head start no longer grew in the measurement quoted there.
COLD_IDLE_S = 0.5


def parse_only(s: str) -> list[int]:
    pts = sorted({int(x) for x in s.split(",") if x.strip()})
    if not pts or not set(pts) <= {1, 2, 3, 4, 5}:
        raise argparse.ArgumentTypeError(f"--only: parts are 1-5, got {s!r}")
    return pts


def judge(value: float, op: str, goal: float) -> str:
    """PASS/FAIL of `value op goal` (op: ">=" or "<="); FAIL for NaN."""
    if value != value:  # NaN
        return "FAIL"
    ok = value >= goal if op == ">=" else value <= goal
    return "PASS" if ok else "FAIL"


def loader_reps(name: str, reps: int) -> int:
    """Repetitions of a loader's part-1 cases: `reps`, but at least 5 for runai even when fewer
    are asked for. Before guest memory was held steady (guest_memory.py) its single passes
    ranged over 0.54-1.27 s on both sides in one run, and with 3 repetitions the median of its
    warm row flipped between 0.71 and 1.76 from one run to the next; with steady memory its
    passes of one case still spread by up to 7 % (warm: 0.495-0.531 s in the 2026-12-02 run),
    more than other loaders', so a short --reps run should not judge it on fewer."""
    return max(reps, 5) if name == "runai" else reps


def tie_tolerance(base_passes: list[float]) -> float:
    """How far below 1.0 a time ratio still counts as a tie with the baseline: the baseline's own
    run-to-run spread (1.4826 x its median absolute deviation, relative to its median: the
    standard deviation for normal noise, robust to one slow outlier), at least 0.5 % and at
    most 1.5 %.

    Only "at least as fast" goals (>= 1.0) use it. On the slow source a loader reading the plain
    file already reads at the throttle's rate (1.63 s for 1.63 GB at 1.0 GB/s), and through
    passthrough the mount reads the same bytes through the same kernel path and throttle: the
    two tie, and a strict >= 1.0 judged the noise (1.627-1.658 s for the same load on the plain
    file in one run)."""
    if len(base_passes) < 2:
        return 0.005
    mid = statistics.median(base_passes)
    mad = statistics.median(abs(x - mid) for x in base_passes)
    return min(0.015, max(0.005, 1.4826 * mad / mid))


def time_ratio(base_s: float, tierfs_s: float) -> float:
    """Baseline seconds / tierfs seconds: above 1, the mount was faster."""
    return base_s / tierfs_s if tierfs_s > 0 else float("nan")


def parse_status(text: str) -> dict[str, int]:
    """Bytes of the `Vm*`/`Rss*` lines of /proc/PID/status."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"(Vm\w+|Rss\w+):\s+(\d+) kB", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * 1024
    return out


def parse_io_read_bytes(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def file_modes(stats: dict, name: str) -> list[str]:
    """Modes tierfs reports for files whose path ends with `name` (stats `files[].mode`)."""
    out = []
    for f in stats.get("files") or []:
        if not isinstance(f, dict) or "mode" not in f:
            continue
        if any(isinstance(v, str) and (v == name or v.endswith("/" + name)) for v in f.values()):
            out.append(str(f["mode"]))
    return out


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_CACHESTAT = 451  # x86_64 and aarch64 (Linux >= 6.5)


class _CRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CStat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def cachestat_fd(fd: int) -> int:
    """Bytes of the file behind `fd` in the page cache (cachestat(2)); 0 where unavailable."""
    rng, st = _CRange(0, 0), _CStat()
    if _libc.syscall(_SYS_CACHESTAT, ctypes.c_uint(fd), ctypes.byref(rng), ctypes.byref(st), ctypes.c_uint(0)) != 0:
        return 0
    return st.nr_cache * os.sysconf("SC_PAGE_SIZE")


def find_key(d, key: str):
    """The first value of `key` anywhere in a nested stats document (None when absent)."""
    if isinstance(d, dict):
        if key in d:
            return d[key]
        d = list(d.values())
    if isinstance(d, list):
        for v in d:
            r = find_key(v, key)
            if r is not None:
                return r
    return None


def memory_goal(budget: int) -> int:
    return int(GOAL_MEM_FACTOR * budget + GOAL_MEM_SLACK)


def is_index(path: Path) -> bool:
    return path.name.endswith(".index.json")


def model_files(path: Path) -> list[Path]:
    """The files of a model: `path` itself, or for an index.json its shards in index order (the
    shard names sorted, as loaders.py's sharded loaders and transformers walk them)."""
    if not is_index(path):
        return [path]
    return [path.parent / s for s in sorted(set(json.loads(path.read_text())["weight_map"].values()))]


def model_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in model_files(path))


def plan_groups(path: Path) -> list[dict]:
    """reader.py groups of a model: its tensors grouped by block, in model order.  A sharded
    model is read as loaders.py's sharded loaders and diffusers / transformers read it: shard by
    shard in index order, each shard's tensors in index order (the weight_map's order, which is
    the shard's file order: writers sort by name), grouped by block like the single file's, each
    group naming its shard (`file`: the index in model_files)."""
    if not is_index(path):
        return [{"name": name, "ranges": ranges, "file": 0} for name, ranges in bench.model_order_groups(path)]
    return [{"name": f"{f.name}:{name}", "ranges": ranges, "file": i}
            for i, f in enumerate(model_files(path))
            for name, ranges in sorted(bench.model_order_groups(f), key=lambda g: min(s for s, _ in g[1]))]


def models_note(stats: dict) -> str:
    """The models tierfs's stats list (`models[]`: sharded models), one phrase each."""
    return "; ".join(f"stats model {x.get('name')}: {len(x.get('shards') or [])} shards, {x.get('blocks')} blocks, "
                     f"order learned {x.get('order_learned')}" for x in stats.get("models") or []
                     if isinstance(x, dict)) or "no model in the stats' models[]"


# ----------------------------------------------------------------------------- loaders (child processes)

def load_safe_open_pt(path: Path) -> int:
    """safe_open(framework="pt"), get_tensor of every key in header order, each copied out (a
    tensor may be a view of safetensors' mapping: copying is what makes it read)."""
    import torch
    from safetensors import safe_open
    order = gen.tensor_ranges(path)
    stage = torch.empty(max(e - s for _, s, e in order), dtype=torch.uint8)
    n = 0
    with safe_open(str(path), framework="pt") as f:
        for name, _, _ in order:
            flat = f.get_tensor(name).reshape(-1).view(torch.uint8)
            stage[: flat.numel()].copy_(flat)
            n += flat.numel()
    return n


def load_comfy(path: Path, order=gen.model_order) -> int:
    """ComfyUI: comfy.utils.load_torch_file (pt safe_open, get_tensor for every key, keys in name
    order) then load_state_dict (every weight copied, in module order)."""
    import torch
    from safetensors import safe_open
    sd = {}
    with safe_open(str(path), framework="pt") as f:
        for k in sorted(f.keys()):
            sd[k] = f.get_tensor(k)
    stage = torch.empty(max(t.nbytes for t in sd.values()), dtype=torch.uint8)
    n = 0
    for name, _, _ in order(path):
        flat = sd[name].reshape(-1).view(torch.uint8)
        stage[: flat.numel()].copy_(flat)
        n += flat.numel()
    return n


def load_comfy_checkpoint(path: Path) -> int:
    """ComfyUI's load of an all-in-one checkpoint: load_torch_file, then the UNet's, the VAE's and
    the text encoder's weights copied in that order (gen.checkpoint_order)."""
    return load_comfy(path, order=gen.checkpoint_order)


def load_whole_read(path: Path) -> int:
    """The whole file read into one buffer (`open(p, "rb").read()`, as safetensors.torch.load
    callers do), without Python's extra copy."""
    size = os.path.getsize(path)
    buf = bytearray(size)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < size:
            k = f.readinto(mv[got:])
            if not k:
                raise OSError(f"short read at {got} of {size}")
            got += k
    return got


def load_np_memmap(path: Path) -> int:
    import numpy as np
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = np.array(mm)
    del mm
    return out.nbytes


def mmap_copy(path: Path) -> int:
    return bench.mmap_pass(path)[1]


def map_hold(path: Path) -> int:
    """Maps the file, faults every page in (copy out in 1 MiB pieces), holds the map 2 s."""
    import mmap
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    out = bytearray(MiB)
    for off in range(0, size, MiB):
        k = min(MiB, size - off)
        out[:k] = mm[off:off + k]
    time.sleep(2)
    mm.close()
    return size


def loaders_table() -> dict:
    import loaders as L
    return {
        "safe_open_np": ("safe_open (numpy)", L.load_safe_open, ("safetensors",)),
        "safe_open_pt": ('safe_open(framework="pt")', load_safe_open_pt, ("torch", "safetensors")),
        "load_file": ("safetensors.torch.load_file", L.load_torch_file, ("torch", "safetensors.torch")),
        "comfy": ("ComfyUI load_torch_file + load_state_dict", load_comfy, ("torch", "safetensors")),
        "aimdo": ("comfy-aimdo ModelMMAP + frombuffer", L.load_aimdo, ("torch", "comfy_aimdo.model_mmap")),
        "pread": ("8 x 2 MiB pread (aimdo re-read)", L.load_reread, ()),
        # a helper of the workflow benchmark's ideal tier, not a loader of part 1's table
        "pread_kept": ("8 x 2 MiB pread, pages kept", L.load_reread_kept, ()),
        "whole_read": ("whole-file read", load_whole_read, ()),
        "runai": ("runai SafetensorsStreamer", L.load_runai, ("torch", "runai_model_streamer")),
        "np_memmap": ("numpy.memmap whole-file copy", load_np_memmap, ("numpy",)),
        # the same cold cases on the GGUF and the sharded model (LOADER_MODEL)
        "gguf": ("GGUF: gguf-py GGUFReader, every tensor's data", L.load_gguf_reader, ("numpy", "gguf")),
        "sharded": ("sharded: safe_open (numpy) shard by shard, index order", L.load_sharded, ("safetensors",)),
        "comfy_checkpoint": ("all-in-one checkpoint: ComfyUI load_torch_file + load_state_dict", load_comfy_checkpoint,
                             ("torch", "safetensors")),
    }


# The model a part-1 loader reads (stored_model keys), "p1" where not named here.  These loaders
# run the cold cases only (COLD_CASES): cold ratios are what these models are judged on, and the warm
# baseline pins one file's pages (bench.Pinned), not a sharded model's.
LOADER_MODEL = {"gguf": "p4_gguf", "sharded": "p1_shards", "comfy_checkpoint": "p1_checkpoint"}


def loader_model(name: str) -> str:
    return LOADER_MODEL.get(name, "p1")


def loaders_by_model(names: list[str]) -> dict[str, list[str]]:
    """`names` grouped by the model they read, models and loaders in first-named order (one model
    on the RAM device at a time)."""
    out: dict[str, list[str]] = {}
    for name in names:
        out.setdefault(loader_model(name), []).append(name)
    return out


# Part 1's rows: (case, tierfs key, baseline key, goal, goal text); the cold-only loaders get
# COLD_CASES, worded for a model that may be several files.
ALL_CASES = (
    ("cold slow, budget ≥ file", "mount cold slow", "source cold slow", GOAL_COLD_FITS, "≥ 0.95"),
    ("cold fast, budget ≥ file", "mount cold fast", "source cold fast", GOAL_COLD_FITS, "≥ 0.95"),
    ("warm: loaded before through the mount vs page cache", "mount warm-k", "source warm", GOAL_WARM, "≥ 0.8"),
    ("warm after drop_caches: tierfs's own RAM only vs page cache", "mount warm", "source warm", None, "report"),
    ("cold slow, budget = file/4", "mount cold slow quarter", "source cold slow", GOAL_COLD_QUARTER, "≥ 0.9"),
    ("cold fast, budget = file/4", "mount cold fast quarter", "source cold fast", GOAL_COLD_FAST, "≥ 0.8"),
    ("cold fast, budget = file/8", "mount cold fast eighth", "source cold fast", GOAL_COLD_FAST, "≥ 0.8"))
COLD_CASES = (
    ("cold slow, budget ≥ model", "mount cold slow", "source cold slow", GOAL_COLD_FITS, "≥ 0.95"),
    ("cold fast, budget ≥ model", "mount cold fast", "source cold fast", GOAL_COLD_FITS, "≥ 0.95"),
    ("cold slow, budget = model/4", "mount cold slow quarter", "source cold slow", GOAL_COLD_QUARTER, "≥ 0.9"),
    ("cold fast, budget = model/4", "mount cold fast quarter", "source cold fast", GOAL_COLD_FAST, "≥ 0.8"),
    ("cold fast, budget = model/8", "mount cold fast eighth", "source cold fast", GOAL_COLD_FAST, "≥ 0.8"))

# The cold cases through a budget below the model, whose disk bytes and wasted prefetch are
# reported as shares of the model (GOAL_DISK_SEQ, GOAL_WASTED): a single-pass loader should read
# the model once.
BELOW_BUDGET_CASES = ("mount cold slow quarter", "mount cold fast quarter", "mount cold fast eighth")


def part1_cases(name: str) -> tuple:
    return ALL_CASES if loader_model(name) == "p1" else COLD_CASES


EXTRA_PASSES = {"mmap_copy": mmap_copy, "map_hold": map_hold}


def _pass_fn(name: str):
    import importlib
    if name in EXTRA_PASSES:
        return EXTRA_PASSES[name]
    _, fn, imports = loaders_table()[name]
    for mod in imports:
        importlib.import_module(mod)
    return fn


def _timed(fn, path: Path) -> dict:
    """`s`: the load's seconds; `header_s`: the header read that plans it, before (outside
    `s`; it is the file's first open, which is what a mount that does work at the open, such
    as checking a disk tier's copy, charges)."""
    t0 = time.perf_counter()
    if path.suffix == ".safetensors":
        gen.tensor_ranges(path)  # the loaders' plans come from the header: outside the timing
    t1 = time.perf_counter()
    n = fn(path)
    return {"s": time.perf_counter() - t1, "header_s": t1 - t0, "bytes": n}


def child_pass(name: str, path: Path) -> None:
    """--pass NAME PATH: one timed load in this process."""
    print(json.dumps(_timed(_pass_fn(name), path)), flush=True)


def child_serve(name: str) -> None:
    """--serve NAME: imports once, then one timed load per path read from stdin, one JSON line
    out per load.  Each load starts with nothing of the previous one alive (tensors, mappings
    and staging buffers are freed when the loader returns), and the baseline and tierfs passes of
    a loader share the process, so both see the same allocator and thread-pool state; what is
    saved is the import (1-3 s of torch per pass)."""
    fn = _pass_fn(name)
    for line in sys.stdin:
        try:
            r = _timed(fn, Path(line.rstrip("\n")))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the pass
            r = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(r), flush=True)


def check_bytes(name: str, path: Path, r: dict) -> None:
    size = os.path.getsize(path)
    if name in ("whole_read", "np_memmap", "mmap_copy", "map_hold") and r["bytes"] != size:
        raise RuntimeError(f"{name} read {r['bytes']} of {size} bytes")


def run_child(name: str, path: Path, timeout: float = 600) -> float:
    """One timed load in a fresh process."""
    p = subprocess.run([sys.executable, __file__, "--pass", name, str(path)], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{name} on {path} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    check_bytes(name, path, r)
    return r["s"]


class LoaderProc:
    """A `--serve NAME` child: timed loads without paying the imports each time."""

    def __init__(self, name: str):
        self.name = name
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen([sys.executable, __file__, "--serve", name], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err, text=True, bufsize=1)
        bench._PROCS.append(self.p)

    def load(self, path: Path, timeout: float = 600, with_header: bool = False) -> float:
        """Seconds of one load of `path`; `with_header`: its header read (the first open)
        included."""
        import select
        self.p.stdin.write(f"{path}\n")
        self.p.stdin.flush()
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        line = self.p.stdout.readline() if ready else ""
        if not line:
            self.close()
            self.err.seek(0)
            raise RuntimeError(f"{self.name} on {path}: no answer (exit status {self.p.returncode}):\n"
                               + self.err.read()[-2000:].decode(errors="replace"))
        r = json.loads(line)
        if "error" in r:
            raise RuntimeError(f"{self.name} on {path}: {r['error']}")
        check_bytes(self.name, path, r)
        return r["s"] + (r.get("header_s", 0.0) if with_header else 0.0)

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
                self.p.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.p.kill()
                self.p.wait()
        if self.p in bench._PROCS:
            bench._PROCS.remove(self.p)
        self.err.close()

    def __enter__(self) -> "LoaderProc":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ----------------------------------------------------------------------------- memory accounting

_SHMEM_PREFIXES: list[str] | None = None


def shmem_roots() -> list[str]:
    global _SHMEM_PREFIXES
    if _SHMEM_PREFIXES is None:
        with open("/proc/mounts") as f:
            _SHMEM_PREFIXES = [ln.split()[1] for ln in f if ln.split()[2] in ("tmpfs", "shm", "hugetlbfs")]
    return _SHMEM_PREFIXES


def daemon_memory(pid: int) -> dict[str, int]:
    """Anonymous RSS and the shmem the daemon owns: every memfd / tmpfs file it holds open or
    mapped, by allocated blocks, each inode counted once (mapped shmem is in RssShmem too, so
    RssShmem is left out).  RssFile (the binary, mapped source pages) is left out: source pages
    are counted as the source's page cache growth."""
    try:
        st = parse_status(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return {"anon": 0, "shmem": 0}
    seen, shmem = set(), 0
    for d in (f"/proc/{pid}/fd", f"/proc/{pid}/map_files"):
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for e in entries:
            p = f"{d}/{e}"
            try:
                target = os.readlink(p)
                if not (target.startswith("/memfd:") or any(target.startswith(r.rstrip("/") + "/")
                                                            for r in shmem_roots() if r != "/")):
                    continue
                s = os.stat(p)
            except OSError:
                continue
            if (s.st_dev, s.st_ino) not in seen:
                seen.add((s.st_dev, s.st_ino))
                shmem += s.st_blocks * 512
    return {"anon": st.get("RssAnon", 0), "shmem": shmem}


class MemorySampler:
    """Samples the full memory count of a mount every `period` s in a thread; keeps the peak.

    The mounted files (a model's shards: all of them) are opened once, before the readers, and
    their page cache read with cachestat on those descriptors: an open per sample could make the
    kernel drop the file's page cache (an open without FOPEN_KEEP_CACHE does) and so hide what is
    being measured."""

    def __init__(self, pid: int, mounted_files: list[Path], source_files: list[Path], period: float = 0.05):
        self.pid, self.period = pid, period
        self.fds = [os.open(f, os.O_RDONLY) for f in mounted_files]
        self.src_fds = [os.open(f, os.O_RDONLY) for f in source_files]
        self.src0 = [cachestat_fd(fd) for fd in self.src_fds]
        self.peak: dict[str, int] = {"total": 0}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> dict[str, int]:
        m = daemon_memory(self.pid)
        s = {"anon": m["anon"], "shmem": m["shmem"], "mount_pc": sum(map(cachestat_fd, self.fds)),
             "source_pc": sum(max(0, cachestat_fd(fd) - s0) for fd, s0 in zip(self.src_fds, self.src0))}
        s["total"] = sum(s.values())
        return s

    def _loop(self) -> None:
        while not self._stop.is_set():
            s = self.sample()
            if s["total"] > self.peak["total"]:
                self.peak = s
            self._stop.wait(self.period)

    def __enter__(self) -> "MemorySampler":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(timeout=5)
        for fd in self.fds + self.src_fds:
            os.close(fd)


# ----------------------------------------------------------------------------- the run

def stored_model(data: Path, key: str, q: int) -> Path:
    """The generated model of `key` ("p1", "p3_big", "p3_small"; "p1_shards", "p3_big_shards":
    the same tensors as shards, returned as their index.json; "p4_gguf") in `data`, written once."""
    if key.endswith("_shards"):
        base = key.removesuffix("_shards")
        specs = gen.big_dit_specs(SIZES["p1_file"][q]) if base == "p1" else gen.sorted_dit_specs(*SIZES[base][q][:3])
        root = data / (stored_model_name(base, q).removesuffix(".safetensors") + "-shards")
        if not (root / f"{SHARD_STEM}.safetensors.index.json").exists():
            print(f"generating {root} ...", flush=True)
        return gen_gguf.make_sharded(root, SHARD_STEM, specs, N_SHARDS, seed=2613 if base == "p1" else 2614)
    if key == "p4_gguf":
        dim, n_double, n_single = SIZES[key][q]
        stored = data / f"flux_{dim}x{n_double}x{n_single}.gguf"
        if not stored.exists():
            print(f"generating {stored} ...", flush=True)
        return gen_gguf.make_dit_gguf(stored, seed=2615, dim=dim, n_double=n_double, n_single=n_single)
    if key == "p1_checkpoint":
        stored = data / stored_model_name(key, q)
        if not stored.exists():
            print(f"generating {stored} ...", flush=True)
            gen.write_streaming(stored, gen.checkpoint_specs(scale=1 + 2 * q), seed=2616)
        return stored
    if key == "p1":
        size = SIZES["p1_file"][q]
        stored = data / stored_model_name(key, q)
        if not stored.exists():
            print(f"generating {stored} ...", flush=True)
            gen.make_big_dit(stored, size, seed=2611, sort_names=True)
        return stored
    dim, ffn, blocks, _ = SIZES[key][q]
    stored = data / stored_model_name(key, q)
    if not stored.exists():
        print(f"generating {stored} ...", flush=True)
        stored.parent.mkdir(parents=True, exist_ok=True)
        gen.write_streaming(stored, gen.sorted_dit_specs(dim, ffn, blocks), seed=2612 + blocks)
    return stored


def stored_model_name(key: str, q: int) -> str:
    if key == "p1_checkpoint":
        return f"sd_checkpoint_{1 + 2 * q}.safetensors"
    if key == "p1":
        return f"dit_{SIZES['p1_file'][q] // MiB}mib_sorted.safetensors"
    dim, ffn, blocks, _ = SIZES[key][q]
    return f"dit_{dim}x{ffn}x{blocks}_sorted.safetensors"


class Run:
    def __init__(self, args, root: Path, disk: sources.RamDisk, thr: sources.Throttle):
        self.args, self.root, self.disk, self.thr = args, root, disk, thr
        self.q = 1 if args.quick else 0
        self.data = Path(args.data)
        self.rows: list[dict] = []
        self.details: list[str] = []
        self.passes: dict[str, list[float]] = {}
        self.raw: dict[str, float] = {}
        self.modes: dict[str, set] = {}

    # -- files
    def model(self, key: str) -> Path:
        """Generates (once, in --data) and copies onto the RAM device the model of `key` (for a
        sharded model its index.json and shards, in their own folder; the index is returned)."""
        stored = stored_model(self.data, key, self.q)
        for src in [stored] + (model_files(stored) if is_index(stored) else []):
            dst = self.disk.mnt / src.relative_to(self.data)
            if not dst.exists() or dst.stat().st_size != src.stat().st_size:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        os.sync()
        return self.disk.mnt / stored.relative_to(self.data)

    def drop(self, path: Path) -> None:
        """Frees the RAM device of a model no longer needed (discard mount)."""
        if is_index(path):
            shutil.rmtree(path.parent, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        os.sync()

    def on_mount(self, m: bench.Mount, path: Path) -> Path:
        """`path` (a file on the RAM device) as seen through the mount `m`."""
        return m.mnt / path.relative_to(self.disk.mnt)

    # -- recording
    def slow(self, on: bool) -> None:
        self.thr.set(self.args.slow_bps if on else 0)

    def rec(self, key: str, v: float, unit: str = "s") -> None:
        self.passes.setdefault(key, []).append(v)
        print(f"  {key:<66} {v:9.3f} {unit}", flush=True)

    def med(self, key: str) -> float:
        return statistics.median(self.passes[key]) if self.passes.get(key) else float("nan")

    def note_modes(self, label: str, m: bench.Mount, name: str) -> None:
        try:
            modes = file_modes(m.stats(), name)
        except (OSError, ValueError):
            modes = []
        if modes:
            self.modes.setdefault(label, set()).update(modes)

    def row(self, part: int, name: str, tierfs: str, base: str, value: float, op: str, goal: float | None,
            goal_text: str, mode_key: str | None = None, tie: float = 0.0) -> None:
        """`tie`: for a ">= 1.0" goal, a ratio this far below 1.0 is a tie ([`tie_tolerance`]),
        reported as "PASS (tie)"."""
        result = "—" if goal is None else judge(value, op, goal)
        if result == "FAIL" and op == ">=" and goal == 1.0 and value >= 1.0 - tie:
            result = f"PASS (tie, ±{tie * 100:.1f} %)"
        mode = ", ".join(sorted(self.modes.get(mode_key, ()))) if mode_key else ""
        self.rows.append({"part": part, "name": name, "tierfs": tierfs, "baseline": base,
                          "ratio": f"{value:.2f}" if value == value else "n/a", "goal": goal_text,
                          "result": result, "mode": mode})

    def mount(self, budget: int, cgroup=None, extra: tuple[str, ...] = ()) -> bench.Mount:
        return bench.Mount(self.disk.mnt, self.root, budget, cgroup=cgroup, extra=extra)

    # -- sources
    def raw_rates(self) -> None:
        f = self.model("p1")
        self.slow(False)
        fast = [sources.cold_read_gbs(f) for _ in range(2)]
        self.slow(True)
        slow, warn = sources.verify(self.thr, f, self.args.slow_bps)
        self.raw = {"fast": max(fast), "slow": slow}
        if warn:
            print(f"warning: {warn}", flush=True)
            self.details.append(f"- warning: {warn}")
        print(f"sources: fast {self.raw['fast']:.2f} GB/s, slow {slow:.2f} GB/s (throttle "
              f"{self.args.slow_bps / 1e9:.2f} GB/s) on {self.disk.kind} {self.disk.dev}", flush=True)

    # -- part 1
    def part1(self) -> None:
        print("part 1: loaders, cold slow / cold fast / warm / cold slow with budget = file/4", flush=True)
        table = loaders_table()
        names = self.args.loaders or [n for n in table if n != "pread_kept"]
        size_of: dict[str, int] = {}
        for key, group in loaders_by_model(names).items():
            self.drop_all()  # one model on the RAM device at a time
            f = self.model(key)
            size = model_bytes(f)
            full, quarter = size + 256 * MiB, size // 4
            for name in group:
                size_of[name] = size
            for name in group:
                print(f"loader {name}: {table[name][0]} on {f.name}", flush=True)
                for _ in range(loader_reps(name, self.args.reps)):
                    try:
                        with LoaderProc(name) as lp:
                            self.loader_rep(lp, name, f, full, quarter)
                    except Exception as e:  # noqa: BLE001 - one broken loader must not end the run
                        self.details.append(f"- part 1, {name} failed: {str(e)[:400]!r}")
                        print(f"  FAILED: {e}", flush=True)
                        for m in list(reversed(bench._MOUNTS)):
                            m.close()
                        break
            what = (f"{len(gen.tensor_ranges(f))} tensors" if key == "p1" else
                    f"{len(model_files(f))} file(s): {', '.join(x.name for x in model_files(f))}")
            self.details.append(f"- part 1 ({', '.join(group)}): model {f.relative_to(self.disk.mnt)} "
                                f"({size / GiB:.2f} GiB, {what}), budgets {full / MiB:.0f} MiB (≥ model) and "
                                f"{quarter / MiB:.0f} MiB (model/4); median of {self.args.reps} repetitions ("
                                f"runai {loader_reps('runai', self.args.reps)}); per "
                                "loader and repetition one process (imports paid once) runs all its cases")
        for name in names:
            label = table[name][0]
            k = lambda case: f"p1 {name} {case}"  # noqa: E731
            for case, mcase, scase, goal, text in part1_cases(name):
                tm, ts = self.med(k(mcase)), self.med(k(scase))
                gbs = lambda t: f"{t:.2f} ({size_of[name] / t / 1e9:.2f} GB/s)" if t > 0 else "n/a"  # noqa: E731
                self.row(1, f"{label}: {case} (s)", gbs(tm), gbs(ts), time_ratio(ts, tm), ">=", goal, text,
                         mode_key=k(mcase), tie=tie_tolerance(self.passes.get(k(scase), [])))
                if mcase in BELOW_BUDGET_CASES:
                    for what, title, share_goal in (("disk/model", "disk read / model", GOAL_DISK_SEQ),
                                                     ("wasted/model", "prefetch wasted / model", GOAL_WASTED)):
                        v = self.med(k(f"{mcase} {what}"))
                        self.row(1, f"{label}: {case}, {title}", f"{v:.3f}", "model", v, "<=", share_goal,
                                 f"≤ {share_goal}")
        self.drop_all()

    def note_model_modes(self, label: str, m: bench.Mount, f: Path) -> None:
        for x in model_files(f):
            self.note_modes(label, m, x.name)

    @staticmethod
    def cold_start() -> None:
        """Before every timed cold load of part 1, source and mount alike: caches dropped, then
        the same idle time. The throttle lets a reader that starts after an idle gap through a
        little faster (1.5 GiB `dd` at 1.0 GB/s: 1.576-1.577 s right after another read,
        1.541-1.553 s after 0.3-3 s idle); without the same idle time, the mount's passes start
        after mounting (idle) while the source's start right after the previous load: a bias of
        ~2 % for the mount, as large as the differences the slow-source rows are about."""
        sources.drop_caches()
        time.sleep(COLD_IDLE_S)

    def cold_mount_case(self, lp: LoaderProc, key: str, f: Path, budget: int) -> None:
        """One cold load of `f` through a fresh mount with `budget`: its time, and the device bytes
        read (the cgroup's count: the loader's and the daemon's reads alike) and the prefetch
        wasted, each as a share of the model."""
        m = self.mount(budget)
        try:
            self.cold_start()
            cg0 = self.thr.read_bytes()
            self.rec(key, lp.load(self.on_mount(m, f)))
            size = model_bytes(f)
            self.rec(key + " disk/model", (self.thr.read_bytes() - cg0) / size, "x")
            try:
                wasted = m.stats()["prefetch"]["wasted_bytes"]
            except (OSError, ValueError, KeyError):
                wasted = float("nan")
            self.rec(key + " wasted/model", wasted / size, "x")
            self.note_model_modes(key, m, f)
        finally:
            m.close()

    def loader_rep(self, lp: LoaderProc, name: str, f: Path, full: int, quarter: int) -> None:
        """One repetition of a loader's part-1 cases on the model `f` (a file or an index.json)."""
        k = lambda case: f"p1 {name} {case}"  # noqa: E731
        # An untimed load first: the first load in a fresh process pays one-time costs (lazy
        # imports, first faults of the loader's code) that the timed passes must not, least of
        # all only the first of them, which is the source's (load_file, cold slow: 2.36, 2.10,
        # 1.81 s as a process's first load against 1.63 s for every later one).
        self.slow(False)
        lp.load(f)
        self.slow(True)
        self.cold_start()
        self.rec(k("source cold slow"), lp.load(f))
        for budget, case in ((full, "mount cold slow"), (quarter, "mount cold slow quarter")):
            self.cold_mount_case(lp, k(case), f, budget)
        self.slow(False)
        self.cold_start()
        self.rec(k("source cold fast"), lp.load(f))
        for budget, case in ((quarter, "mount cold fast quarter"), (quarter // 2, "mount cold fast eighth")):
            self.cold_mount_case(lp, k(case), f, budget)
        m = self.mount(full)
        try:
            self.cold_start()
            self.rec(k("mount cold fast"), lp.load(self.on_mount(m, f)))
            self.note_model_modes(k("mount cold fast"), m, f)
            if part1_cases(name) is COLD_CASES:
                return
            # One warm pass before the measured one, as the source gets below ("priming"): the
            # first pass over pages just read costs CPU that later passes do not pay, through the
            # mount as from the plain file (aimdo, one process, caches dropped, then four loads,
            # 3 reps: first warm pass 0.26-0.29 s from the source, 0.26-0.30 s through the mount;
            # second 0.23-0.26 s, 0.23-0.26 s). Without it this row compared a first warm pass
            # through the mount with the source's second.
            lp.load(m.mnt / f.name)
            # Disk bytes of the measured pass alone (they once included the priming pass: runai's
            # "3116 MiB" for a 1558 MiB file was two passes of 1558).
            cg0 = self.thr.read_bytes()
            self.rec(k("mount warm-k"), lp.load(m.mnt / f.name))
            self.note_modes(k("mount warm-k"), m, f.name)
            warm_disk = self.thr.read_bytes() - cg0
            if warm_disk > 0:
                self.details.append(f"- part 1, {name}: the warm pass (no drop) read {warm_disk / MiB:.0f} MiB "
                                    "from disk (tierfs did not hold the whole file, or the loader reads "
                                    "with O_DIRECT: see the source's warm pass)")
            sources.drop_caches()
            cg0 = self.thr.read_bytes()
            self.rec(k("mount warm"), lp.load(m.mnt / f.name))
            self.note_modes(k("mount warm"), m, f.name)
            drop_disk = self.thr.read_bytes() - cg0
            if drop_disk > 0:
                self.details.append(f"- part 1, {name}: after drop_caches the warm pass read {drop_disk / MiB:.0f} "
                                    "MiB from disk (what tierfs held was page cache, e.g. a passthrough file, or the "
                                    "loader reads with O_DIRECT)")
        finally:
            m.close()
        with bench.Pinned(f):
            lp.load(f)  # priming: the first pass over freshly pinned pages costs CPU (loaders.py)
            cg0 = self.thr.read_bytes()
            self.rec(k("source warm"), lp.load(f))
            src_disk = self.thr.read_bytes() - cg0
        # A loader that opens with O_DIRECT (runai-model-streamer 0.17.1: O_RDONLY|O_DIRECT,
        # io_uring) bypasses the page cache the file is pinned in: its "warm" baseline is the
        # device, read in full on every pass, and so is its pass through a passthrough mount.
        if src_disk > 0:
            self.details.append(f"- part 1, {name}: the source's warm pass read {src_disk / MiB:.0f} MiB from disk "
                                "although the file was pinned in the page cache (the loader bypasses it: "
                                "O_DIRECT), so this row's baseline is the device's speed")

    def drop_all(self) -> None:
        """Frees the RAM device after a part: models are copied back when needed (seconds)."""
        for p in [*self.disk.mnt.glob("*.safetensors"), *self.disk.mnt.glob("*.gguf"),
                  *self.disk.mnt.glob(f"*-shards/{SHARD_STEM}.safetensors.index.json")]:
            self.drop(p)

    # -- part 2
    def part2(self) -> None:
        print("part 2: disk bytes, budget = file/4, slow source", flush=True)
        f = self.model("p1")
        size = f.stat().st_size
        budget = size // 4
        self.slow(True)
        cases: list[tuple[str, float, dict]] = []

        def measure(m: bench.Mount, run) -> tuple[float, dict]:
            s0, io0, cg0 = m.stats(), bench.proc_io_read_bytes(m.pid), self.thr.read_bytes()
            run()
            s1, io1, cg1 = m.stats(), bench.proc_io_read_bytes(m.pid), self.thr.read_bytes()
            d = {"proc": io1 - io0, "cgroup": cg1 - cg0, "stats": s1["disk"]["read_bytes"] - s0["disk"]["read_bytes"],
                 "wasted": s1["prefetch"]["wasted_bytes"] - s0["prefetch"]["wasted_bytes"],
                 "issued": s1["prefetch"]["issued_bytes"] - s0["prefetch"]["issued_bytes"]}
            return max(d["proc"], d["stats"], d["cgroup"]), d

        m = self.mount(budget)
        try:
            path = m.mnt / f.name
            sources.drop_caches()
            _, d = measure(m, lambda: run_child("comfy", path))
            cases.append(("ComfyUI sequence, cold", GOAL_DISK_COMFY, d))
            self.note_modes("p2 comfy", m, f.name)
            _, d = measure(m, lambda: run_child("comfy", path))
            cases.append(("ComfyUI sequence, reload (same mount, no drop)", GOAL_DISK_COMFY, d))
        finally:
            m.close()
        for label, cmd in (("cat", ["cat"]), ("dd bs=4k", ["dd", "bs=4k", "of=/dev/null"])):
            m = self.mount(budget)
            try:
                path = m.mnt / f.name
                argv = cmd + [str(path)] if label == "cat" else cmd + [f"if={path}"]
                sources.drop_caches()
                _, d = measure(m, lambda: subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                         check=True, timeout=600))
                cases.append((f"{label}, cold", GOAL_DISK_SEQ, d))
                self.note_modes(f"p2 {label}", m, f.name)
            finally:
                m.close()
        for label, goal, d in cases:
            disk = max(d["proc"], d["stats"], d["cgroup"])
            key = "p2 comfy" if label.startswith("ComfyUI") else f"p2 {label.split(',')[0]}"
            self.row(2, f"{label}: disk bytes / file (budget {budget / MiB:.0f} MiB)", f"{disk / 1e9:.2f} GB",
                     f"{size / 1e9:.2f} GB", disk / size, "<=", goal, f"≤ {goal}", mode_key=key)
            self.row(2, f"{label}: prefetch.wasted_bytes / file", f"{d['wasted'] / 1e6:.0f} MB", f"{size / 1e9:.2f} GB",
                     d["wasted"] / size, "<=", GOAL_WASTED, f"≤ {GOAL_WASTED}", mode_key=key)
            self.details.append(f"- part 2, {label}: daemon /proc io read_bytes {d['proc'] / 1e6:.0f} MB, blkio "
                                f"cgroup {d['cgroup'] / 1e6:.0f} MB, tierfs disk.read_bytes {d['stats'] / 1e6:.0f} MB, "
                                f"prefetch issued {d['issued'] / 1e6:.0f} MB, wasted {d['wasted'] / 1e6:.0f} MB")
        self.drop_all()

    # -- part 3
    def plan(self, f: Path, tag: str, compute_per_byte: float) -> tuple[Path, list]:
        doc = {"groups": [dict(g, compute_s=compute_per_byte * sum(e - s for s, e in g["ranges"]))
                          for g in plan_groups(f)]}
        p = self.root / f"plan-{tag}.json"
        p.write_text(json.dumps(doc))
        return p, doc["groups"]

    @staticmethod
    def stall(r: dict) -> float:
        """Stall share of a reader.py pass, %: read time outside the warm-up groups / pass time."""
        return 100 * sum(g["read_s"] for g in r["groups"][WARMUP_GROUPS:]) / r["total_s"]

    def part3(self) -> None:
        for source in self.args.part3_sources.split(","):
            if source not in ("slow", "fast"):
                raise SystemExit(f"--part3-sources: unknown source {source!r}")
            print(f"part 3: streaming with compute, {source} source", flush=True)
            for key in ("p3_big", "p3_small"):
                self.part3_case(key, source)

    def part3_case(self, key: str, source: str) -> None:
        """Part 3 for the model `key` on the `source` ("slow" or "fast")."""
        self.drop_all()
        budget = SIZES[key][self.q][3]
        f = self.model(key)
        size = f.stat().st_size
        self.slow(source == "slow")
        tput = sources.cold_read_gbs(f) * 1e9
        plan, groups = self.plan(f, key, self.args.compute_factor / tput)
        block = sum(e - s for s, e in groups[WARMUP_GROUPS]["ranges"])
        # the slow source's keys are the ones the results have always had
        tag = key if source == "slow" else f"{key} fast"
        on = "" if source == "slow" else "fast source, "
        k = lambda case: f"p3 {tag} {case}"  # noqa: E731
        for _ in range(self.args.reps):
            sources.drop_caches()
            self.rec(k("source cold stall %"), self.stall(bench.run_reader(plan, f)), "%")
            m = self.mount(budget)
            try:
                sources.drop_caches()
                r = bench.run_reader(plan, m.mnt / f.name)
                self.rec(k("mount cold stall %"), self.stall(r), "%")
                self.note_modes(k("mount cold stall %"), m, f.name)
            finally:
                m.close()
            m = self.mount(size + 256 * MiB)
            try:
                # primed, and caches NOT dropped: a file that fits may be served by passthrough,
                # whose RAM is the page cache (drop_caches would make this pass cold)
                bench.read_pass(m.mnt / f.name, MiB)
                cg0 = self.thr.read_bytes()
                r = bench.run_reader(plan, m.mnt / f.name)
                if self.thr.read_bytes() > cg0:
                    self.details.append(f"- part 3, {f.name}: the pass from RAM read "
                                        f"{(self.thr.read_bytes() - cg0) / MiB:.0f} MiB from disk")
                self.note_modes(k("mount RAM stall %"), m, f.name)
                self.rec(k("mount RAM stall %"), self.stall(r), "%")
            finally:
                m.close()
            # the pass from RAM served the way the cold pass is (the chunk cache), so that the
            # stall the disk adds is told apart from what the serving mode costs
            m = self.mount(size + 256 * MiB, extra=("--no-model-passthrough",))
            try:
                bench.read_pass(m.mnt / f.name, MiB)
                r = bench.run_reader(plan, m.mnt / f.name)
                self.note_modes(k("mount RAM cache-mode stall %"), m, f.name)
                self.rec(k("mount RAM cache-mode stall %"), self.stall(r), "%")
            finally:
                m.close()
        cold, ram, src = self.med(k("mount cold stall %")), self.med(k("mount RAM stall %")), \
            self.med(k("source cold stall %"))
        self.row(3, f"{on}blocks ~{block / 1e6:.0f} MB, budget {budget / GiB:g} GiB: stall % cold − stall % from "
                    f"RAM (points; tierfs = cold %, baseline = RAM %)", f"{cold:.1f} %", f"{ram:.1f} %",
                 cold - ram, "<=", GOAL_STALL_PP, f"≤ {GOAL_STALL_PP:g} pp", mode_key=k("mount cold stall %"))
        ram_cache = self.med(k("mount RAM cache-mode stall %"))
        self.row(3, f"{on}blocks ~{block / 1e6:.0f} MB: stall % cold − stall % from RAM in the chunk cache, "
                    f"the cold pass's mode (report: the stall the disk adds)", f"{cold:.1f} %",
                 f"{ram_cache:.1f} %", cold - ram_cache, "<=", None, "report",
                 mode_key=k("mount RAM cache-mode stall %"))
        self.row(3, f"{on}blocks ~{block / 1e6:.0f} MB: stall % of the plain file read cold (report)",
                 f"{cold:.1f} %", f"{src:.1f} %", cold - src, "<=", None, "report")
        self.details.append(f"- part 3, {f.name}: {size / GiB:.2f} GiB, {len(groups)} groups, block "
                            f"{block / 1e6:.0f} MB, budget {budget / MiB:.0f} MiB; {source} raw {tput / 1e9:.2f} GB/s, "
                            f"compute {self.args.compute_factor} x block disk time; warm-up groups not counted: "
                            f"{', '.join(g['name'] for g in groups[:WARMUP_GROUPS])}")
        self.drop_all()

    # -- part 4
    def part4(self) -> None:
        print("part 4: memory counted fully", flush=True)
        self.slow(False)
        third = lambda size: size // 3  # noqa: E731 - a model 3 x the budget
        fits = lambda size: (size // (64 * MiB) + 2) * 64 * MiB  # noqa: E731
        cases = (("p1", "read() of a file 3x the budget", third, ["whole_read_seq"]),
                 ("p1", "mmap copy of a file 3x the budget", third, ["mmap_copy"]),
                 ("p1", "two readers map a model that fits", fits, ["map_hold", "map_hold"]),
                 ("p1_shards", f"sharded ({N_SHARDS} shards + index.json), read() shard by shard, model 3x the "
                  "budget", third, ["whole_read_seq"]),
                 ("p1_shards", f"sharded ({N_SHARDS} shards + index.json), mmap copy shard by shard, model 3x the "
                  "budget", third, ["mmap_copy"]),
                 ("p4_gguf", "GGUF, read() of a file 3x the budget", third, ["whole_read_seq"]),
                 ("p4_gguf", "GGUF, mmap copy of a file 3x the budget", third, ["mmap_copy"]))
        for key, label, budget_of, readers in cases:
            if not self.disk.mnt.joinpath(stored_model(self.data, key, self.q).relative_to(self.data)).exists():
                self.drop_all()  # one model on the RAM device at a time
            f = self.model(key)
            budget = budget_of(model_bytes(f))
            self.memory_case(label, f, budget, readers)
        self.drop_all()

    def memory_case(self, label: str, f: Path, budget: int, readers: list[str]) -> None:
        """Part 4, one case: the peak full memory count while `readers` stream the model `f`
        (each of its files in turn: a sharded model shard by shard in index order)."""
        sources.drop_caches()
        m = self.mount(budget)
        try:
            files = model_files(f)
            paths = [self.on_mount(m, x) for x in files]
            with MemorySampler(m.pid, paths, files) as s:
                for path, src in zip(paths, files):
                    if readers == ["whole_read_seq"]:
                        _, n = bench.read_pass(path, MiB)
                        if n != src.stat().st_size:
                            raise RuntimeError(f"read {n} of {src.stat().st_size} bytes of {path}")
                        continue
                    procs = [subprocess.Popen([sys.executable, __file__, "--pass", r, str(path)],
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                             for r in readers]
                    for p in procs:
                        out, err = p.communicate(timeout=600)
                        if p.returncode != 0:
                            raise RuntimeError(f"reader failed: {err[-1000:]}")
                time.sleep(0.2)
            peak = s.peak
            st = m.stats()
            for x in files:
                self.note_modes(f"p4 {label}", m, x.name)
        finally:
            m.close()
        goal = memory_goal(budget)
        pinned = find_key(st, "pinned_bytes")
        self.row(4, f"{label}: peak memory (budget {budget / MiB:.0f} MiB) / goal", f"{peak['total'] / MiB:.0f} MiB",
                 f"{goal / MiB:.0f} MiB", peak["total"] / goal, "<=", 1.0,
                 "≤ 1.0 (1.1 × budget + 64 MiB)", mode_key=f"p4 {label}")
        self.details.append(
            f"- part 4, {label}: {f.relative_to(self.disk.mnt)} ({model_bytes(f) / MiB:.0f} MiB in {len(files)} "
            f"file(s)); at the peak, daemon anon RSS {peak.get('anon', 0) / MiB:.0f} MiB, daemon shmem "
            f"{peak.get('shmem', 0) / MiB:.0f} MiB, mounted files' page cache {peak.get('mount_pc', 0) / MiB:.0f} MiB, "
            f"source page cache growth {peak.get('source_pc', 0) / MiB:.0f} MiB"
            + (f"; stats pinned_bytes {pinned / MiB:.0f} MiB" if pinned is not None else "")
            + (f"; {models_note(st)}" if is_index(f) else ""))

    # -- part 5
    def part5(self) -> None:
        print("part 5: repeated passes, slow source", flush=True)
        if not (bench.CGROUP_MEM / "cgroup.procs").exists():
            self.details.append("- part 5: no cgroup v1 memory controller: not measured")
            self.row(5, "repeated passes", "n/a", "n/a", float("nan"), ">=", GOAL_REPEAT_SPEEDUP, "≥ 1.5")
            return
        budget = SIZES["p3_big"][self.q][3]
        for key, label in (("p3_big", ""), ("p3_big_shards", f"sharded ({N_SHARDS} shards + index.json, shard by "
                                                              "shard in index order): ")):
            self.drop_all()  # one model on the RAM device at a time
            self.repeat_case(key, label, self.model(key), budget)
        self.drop_all()

    def pass_stats(self, m: bench.Mount, s0: dict) -> tuple[str, dict]:
        """What one pass cost the mount, from its stats before (`s0`) and after."""
        s1 = m.stats()
        d = lambda a, b: s1.get(a, {}).get(b, 0) - s0.get(a, {}).get(b, 0)  # noqa: E731
        text = (f"tierfs disk {d('disk', 'read_bytes') / MiB:.0f} MiB, evicted {d('cache', 'evicted_bytes') / MiB:.0f} "
                f"MiB, prefetch issued/used/wasted {d('prefetch', 'issued_bytes') / MiB:.0f}/"
                f"{d('prefetch', 'used_bytes') / MiB:.0f}/{d('prefetch', 'wasted_bytes') / MiB:.0f} MiB")
        return text, s1

    def repeat_case(self, key: str, label: str, f: Path, budget: int) -> None:
        """Part 5 for the model `f` (a file or a sharded model's index.json)."""
        size = model_bytes(f)
        files = model_files(f)
        plan, _ = self.plan(f, f"repeat-{key}", 0.0)
        self.slow(True)
        passes = self.args.passes
        base_t, mnt_t, mnt_disk = [], [], []
        k = lambda case: f"p5 {key} {case}"  # noqa: E731
        cg = bench.Cgroup("i11-reader", budget)
        try:
            sources.drop_caches()
            for i in range(passes):
                r = bench.run_reader(plan, files, cg)
                base_t.append(r["total_s"])
                self.rec(k("source (reader cgroup = budget) pass s"), r["total_s"])
        finally:
            cg.remove()
        cgd = bench.Cgroup("i11-daemon", budget + DAEMON_OVERHEAD)
        cgr = bench.Cgroup("i11-reader", budget)
        try:
            m = self.mount(budget, cgroup=cgd)
            try:
                sources.drop_caches()
                for i in range(passes):
                    io0, cg0, s0 = bench.proc_io_read_bytes(m.pid), self.thr.read_bytes(), m.stats()
                    r = bench.run_reader(plan, [self.on_mount(m, x) for x in files], cgr)
                    mnt_t.append(r["total_s"])
                    # the daemon's reads, or the reader's own where the kernel reads the source for it
                    # (passthrough): the blkio cgroup holds both
                    mnt_disk.append(max(bench.proc_io_read_bytes(m.pid) - io0, self.thr.read_bytes() - cg0))
                    self.rec(k("tierfs pass s"), r["total_s"])
                    self.rec(k("tierfs pass disk GB"), mnt_disk[-1] / 1e9, "GB")
                    text, _ = self.pass_stats(m, s0)
                    self.details.append(f"- part 5, {key} pass {i + 1}: {r['total_s']:.2f} s, {text}")
                for x in files:
                    self.note_modes(k("mode"), m, x.name)
                facts = cgd.facts()
                models = models_note(m.stats()) if is_index(f) else ""
            finally:
                m.close()
        finally:
            cgr.remove()
            cgd.remove()
        tb, tm = statistics.median(base_t[1:]), statistics.median(mnt_t[1:])
        self.row(5, f"{label}pass time, passes 2..{passes} (model {size / 1e9:.2f} GB, budget {budget / GiB:g} GiB; "
                    "baseline: reader cgroup = budget)", f"{tm:.2f} s", f"{tb:.2f} s", time_ratio(tb, tm), ">=",
                 GOAL_REPEAT_SPEEDUP, f"≥ {GOAL_REPEAT_SPEEDUP}", mode_key=k("mode"))
        target = GOAL_REPEAT_DISK * (size - budget)
        later = max(mnt_disk[1:])
        self.row(5, f"{label}disk bytes per later pass (max) / (model − budget)", f"{later / 1e9:.2f} GB",
                 f"{(size - budget) / 1e9:.2f} GB", later / (size - budget), "<=", GOAL_REPEAT_DISK,
                 f"≤ {GOAL_REPEAT_DISK}", mode_key=k("mode"))
        self.details.append(f"- part 5, {key}: {f.relative_to(self.disk.mnt)} ({len(files)} file(s)), {passes} passes, "
                            f"no compute, caches dropped before pass 1 only; daemon cgroup limit "
                            f"{facts['limit'] / MiB:.0f} MiB, max usage {facts['max_usage'] / MiB:.0f} MiB, OOM kills "
                            f"{facts['oom_kills']}; disk goal {target / 1e9:.2f} GB" + (f"; {models}" if models else ""))


# ----------------------------------------------------------------------------- main

def copy_binary(src: Path, root: Path) -> Path:
    dst = root / "tierfs"
    for _ in range(30):  # not while cargo is still writing it
        m0 = src.stat().st_mtime_ns
        shutil.copy2(src, dst)
        if subprocess.run([str(dst), "mount", "--help"], capture_output=True).returncode == 0 \
                and src.stat().st_mtime_ns == m0:
            return dst
        time.sleep(2)
    raise SystemExit(f"{src} keeps changing or does not run")


def machine(args, load0, binary: Path, disk: sources.RamDisk) -> dict:
    mem = next(int(ln.split()[1]) for ln in open("/proc/meminfo") if ln.startswith("MemTotal:")) * 1024
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    git = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True).stdout.strip()
    # the checkout the binary was built in (it may be another worktree than the harness's)
    bin_git = subprocess.run(["git", "-C", str(args.tierfs.parent), "log", "-1", "--format=%ct %h (%D) %s"],
                             capture_output=True, text=True).stdout.strip()
    if bin_git:
        ct, bin_git = bin_git.split(" ", 1)
        bin_git = bin_git[:100]
        if args.tierfs.stat().st_mtime < int(ct):
            bin_git += " — the binary is older than that commit"
    return {"cpus": os.cpu_count(), "cpu": cpu, "ram_gib": round(mem / GiB, 1), "kernel": platform.release(),
            "load_start": [round(x, 2) for x in load0], "load_end": [round(x, 2) for x in os.getloadavg()],
            "binary": str(args.tierfs), "binary_sha256": hashlib.sha256(binary.read_bytes()).hexdigest()[:12],
            "binary_built": datetime.datetime.fromtimestamp(args.tierfs.stat().st_mtime).isoformat(timespec="seconds"),
            "harness_tree": git, "binary_tree": bin_git, "device": f"{disk.kind} ({disk.dev}), ext4, discard",
            "mount_args": f"--ram-cache BUDGET {' '.join(bench.mount_extra())}".strip()}


def render(cmd: str, elapsed: float, info: dict, raw: dict, run: Run) -> str:
    has_mode = any(r["mode"] for r in run.rows)
    head = "| part | row | tierfs | baseline | ratio | goal | result |" + (" mode |" if has_mode else "")
    sep = "|---|---|---:|---:|---:|---|---|" + ("---|" if has_mode else "")
    n_pass = sum(r["result"].startswith("PASS") for r in run.rows)
    n_tie = sum(r["result"].startswith("PASS (tie") for r in run.rows)
    n_fail = sum(r["result"] == "FAIL" for r in run.rows)
    return "\n".join([
        "# Acceptance benchmark: loaders through the mount vs the plain file (one run)",
        "",
        f"- command: `{cmd}` ({elapsed / 60:.1f} min)",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- machine: {info['cpus']} CPUs ({info['cpu']}), {info['ram_gib']} GiB RAM, kernel {info['kernel']}",
        f"- load average (1/5/15 min) at the start {' '.join(map(str, info['load_start']))}, at the end "
        f"{' '.join(map(str, info['load_end']))} (shared machine: compare figures of the same run only)",
        f"- binary: {info['binary']}, sha256 {info['binary_sha256']}, built {info['binary_built']} (copied at the "
        f"start; every mount ran that copy); its checkout's HEAD: {info['binary_tree'] or '?'}; harness at "
        f"{info['harness_tree']}",
        f"- mounts: `tierfs mount SRC MNT {info['mount_args']}`, fresh for every cold pass",
        f"- memory: {info.get('guest_memory', '?')} (tests/bench/guest_memory.py)",
        f"- sources: {info['device']}; raw cold sequential read (1 MiB read()): fast {raw.get('fast', 0):.2f} GB/s, "
        f"slow {raw.get('slow', 0):.2f} GB/s (blkio read_bps_device {run.args.slow_bps / 1e9:.2f} GB/s on every "
        "process of the run, tierfs daemon included)",
        f"- result: {n_pass} PASS, {n_fail} FAIL" + (
            f" ({n_tie} of the PASS are ties: a time ratio below 1.0 by less than the baseline's own run-to-run "
            "spread, see `tie_tolerance` in the harness)" if n_tie else ""),
        "",
        head, sep,
        *(f"| {r['part']} | {r['name']} | {r['tierfs']} | {r['baseline']} | {r['ratio']} | {r['goal']} | "
          f"{r['result']} |" + (f" {r['mode'] or '—'} |" if has_mode else "") for r in run.rows),
        "",
        "Ratios: part 1 and 5 times are baseline s / tierfs s (above 1: faster through the mount); part 2 disk",
        "bytes / file size; part 3 percentage points above the RAM floor; part 4 peak / (1.1 × budget + 64 MiB).",
        "",
        "Details:",
        "",
        *dict.fromkeys(run.details),  # each note once (repetitions repeat them)
        "",
        "All passes:",
        "",
        *(f"- {k}: {', '.join(f'{x:.3f}' for x in v)}" for k, v in run.passes.items()),
        "",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pass", dest="one", nargs=2, metavar=("NAME", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="small files (< 6 min)")
    ap.add_argument("--only", type=parse_only, default=[1, 2, 3, 4, 5], help="parts to run, e.g. 1,3")
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--reps", type=int, help="passes per case, median reported (default 1 quick, 5 otherwise)")
    ap.add_argument("--passes", type=int, default=3, help="part 5 passes")
    ap.add_argument("--loaders", help="part 1 loaders (default all): " + ",".join(
        ["safe_open_np", "safe_open_pt", "load_file", "comfy", "aimdo", "pread", "whole_read", "runai", "np_memmap",
         "gguf", "sharded", "comfy_checkpoint"]))
    ap.add_argument("--slow-bps", type=int, default=SLOW_BPS)
    ap.add_argument("--compute-factor", type=float, default=1.35, help="part 3 compute / block disk time")
    ap.add_argument("--part3-sources", default="slow", help="part 3 on these sources: slow, fast or slow,fast")
    ap.add_argument("--data", default="/var/tmp/tierfs-bench-data", help="generated models, kept and reused")
    ap.add_argument("--out", help="results (default tests/bench/results/acceptance/full-run.md + .json for a full run)")
    ap.add_argument("--prepare", action="store_true", help="only generate the models in --data (no root needed)")
    args = ap.parse_args()
    if args.one:
        child_pass(args.one[0], Path(args.one[1]))
        return 0
    if args.serve:
        child_serve(args.serve)
        return 0
    if args.prepare:
        for key in ("p1", "p3_big", "p3_small", "p1_shards", "p3_big_shards", "p4_gguf"):
            print(stored_model(Path(args.data), key, 1 if args.quick else 0))
        return 0
    # 5: with guest memory held steady the passes of one case agree to ~0.1-0.3 %, and a median
    # of 3 still moved a cold-slow tie row 0.55 % once (ComfyUI 1.645 vs 1.636 s; 0.1 % with 5)
    args.reps = args.reps or (1 if args.quick else 5)
    if args.loaders:
        args.loaders = [x for x in args.loaders.split(",") if x]
        unknown = set(args.loaders) - set(loaders_table())
        if unknown:
            raise SystemExit(f"--loaders: unknown {sorted(unknown)}")
    if os.geteuid() != 0:
        raise SystemExit("acceptance.py needs root (devices, mounts, cgroups, drop_caches)")
    if not os.access(args.tierfs, os.X_OK):
        raise SystemExit(f"{args.tierfs} missing: cargo build --release -p tierfs")
    args.tierfs = args.tierfs.resolve()
    full = args.only == [1, 2, 3, 4, 5] and not args.loaders
    out = Path(args.out) if args.out else (HERE / "results" / "acceptance" / "full-run.md" if full else None)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    sources.clean_stale()
    bench.clean_stale()
    root = Path(tempfile.mkdtemp(prefix="tierfs-bench.i11.", dir="/tmp"))
    bench.BIN = copy_binary(args.tierfs, root)
    load0 = os.getloadavg()
    t0 = time.monotonic()
    q = 1 if args.quick else 0
    # the sharded models and the GGUF are no larger than the models they are cut from (p1, p3_big)
    # but for their headers, which the 512 MiB of slack covers
    need = max([SIZES["p1_file"][q]] + [
        (sum(map(gen.nbytes, gen.sorted_dit_specs(*SIZES[k][q][:3]))) if p in args.only else 0)
        for k, p in (("p3_big", 3), ("p3_small", 3), ("p3_big", 5))])
    disk_size = (need + 512 * MiB + MiB - 1) // MiB * MiB  # one model at a time (Run.drop_all)
    run = None
    try:
        with guest_memory.SteadyMemory() as steady, sources.RamDisk(disk_size, root) as disk:
            thr = sources.Throttle(disk.majmin)
            try:
                run = Run(args, root, disk, thr)
                run.raw_rates()
                for p in args.only:
                    try:
                        getattr(run, f"part{p}")()
                    except Exception as e:  # noqa: BLE001 - a broken part is reported, the others run
                        import traceback
                        traceback.print_exc()
                        run.rows.append({"part": p, "name": "(part failed)", "tierfs": type(e).__name__,
                                         "baseline": "", "ratio": "n/a", "goal": "", "result": "FAIL", "mode": ""})
                        run.details.append(f"- part {p} failed: {str(e)[:500]!r}")
                        for m in list(reversed(bench._MOUNTS)):
                            m.close()
                        for cg in list(reversed(bench._CGROUPS)):
                            cg.remove()
                info = machine(args, load0, bench.BIN, disk)
                info["guest_memory"] = steady.note
            finally:
                bench.cleanup(None)
                thr.close()
    finally:
        bench.cleanup(root)
    elapsed = time.monotonic() - t0
    cmd = "sudo .venv/bin/python tests/bench/acceptance.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    text = render(cmd.strip(), elapsed, info, run.raw, run)
    print("\n" + text)
    if out:
        machine.write_results(out, text, {
            "command": cmd.strip(), "elapsed_s": round(elapsed), "machine": info, "sources_gbs": run.raw,
            "rows": run.rows, "details": run.details, "passes": run.passes})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; mounts, devices and cgroups removed", file=sys.stderr)
        sys.exit(130)
