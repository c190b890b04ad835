#!/usr/bin/env python3
"""tierfs benchmark: one command, one table of ratios measured in the same run.

    sudo .venv/bin/python tests/bench/read_patterns.py [--rows 1,2,3,4] [--reps 3] [--budget 3GiB]
                                               [--stream-budget 2GiB] [--passes 3] [--reps4 2]

Every figure is compared with a baseline measured in the same run (the disk is noisy); each
is the median of --reps passes unless said otherwise.  Rows:

1. cold    - page cache dropped before each pass, fresh `tierfs mount` (empty cache): the
             ~2 GiB DiT read sequentially through the mount vs the source file directly,
             with 1 MiB read() calls and with 128 KiB (cat-like) calls.  Goal >= 0.95.
2. warm    - tierfs cache holds the file (--budget >= file; one priming pass), then
             drop_caches, and the file is read through the mount (served from the tierfs
             RAM cache) vs the source from the page cache (pinned there with a MAP_LOCKED
             mapping, so another process's drop_caches cannot spoil it).  Via read()
             (1 MiB calls; goal >= 0.6) and via mmap (whole file mapped, copied out in
             1 MiB pieces, so every page is faulted in order; reported).  warm-k: re-read through the mount
             without dropping caches (kernel page cache window + tierfs cache).  ceiling: the
             same read() pass on tests/faultfs's fuse-ceiling, a FUSE file system that serves
             a file from RAM with no work per read and tierfs's FUSE settings: the most any
             FUSE file system can reach on this kernel and machine (reported).
3. stream  - a ~4 GiB DiT (40 bf16 blocks, names sorted like real writers so blocks.10
             precedes blocks.2 in the file) read block by block in *model order* ((other)
             first, then blocks.0, 1, 2, ...) by tests/bench/reader.py: each tensor's range
             is cut into 2 MiB pieces that a pool of 8 threads preads, then the reader
             "computes" (sleeps) 1.2 x block_bytes / cold-disk-throughput (the throughput
             is the median cold sequential 1 MiB read() rate of the first 2 GiB of that file).
             Cold: drop_caches, fresh mount with --stream-budget (2 GiB < file).  Stall =
             pass time - compute - the read time of the warm-up ((other) and blocks.0,
             which nothing can read ahead of on a cold first pass).  Goal: stall <= 5 % of
             the pass time through tierfs; the source file read directly is the baseline.
             tierfs's own prefetch/stall counters after the pass are reported.  The goal
             also counts the cost of getting bytes from RAM at all, so the row adds a floor:
             the same pass served wholly from RAM (tierfs cache larger than the file, after
             a priming read and drop_caches / the source pinned in the page cache), the same
             pass on fuse-ceiling (see row 2: what the pass costs on a FUSE file system that
             does no work at all), and the stall above the tierfs floor ("derived"), which
             is what prefetch can hide.
4. repeat  - the same reader, no compute (pure I/O: the row isolates what eviction keeps),
             --passes passes over the 4 GiB model with a 2 GiB budget, caches dropped
             before pass 1 only.  Baseline: the source file read directly by a reader in a
             cgroup v1 memory cgroup with memory.limit_in_bytes = budget (its page cache
             is charged there, so the kernel LRU thrashes as it would in real life).
             tierfs: the daemon runs in its own cgroup limited to budget + 64 MiB (the
             cache budget plus the daemon's own overhead: threads, index, FUSE buffers),
             the reader in a cgroup like the baseline's (budget) - the mounted file's
             page cache is kept small by tierfs itself.  Disk bytes per pass: for tierfs
             the delta of .tierfs/stats disk.read_bytes; for the baseline the reader
             process's /proc/self/io read_bytes (both are per-process block-layer
             accounting, immune to other activity on the disk; the device's
             /sys/dev/block/*/stat sectors are recorded as a cross-check).  Goals: disk
             bytes of every pass after the first <= 1.15 x (model - budget); pass time
             (median of passes 2.. over --reps4 repetitions) baseline / tierfs >= 1.5.

Mounts use `--no-state` (when the binary has it): every mount starts with no learned block
order, and nothing is written to the system's state dir.  The binary is copied at the start
(the lead rebuilds target/release while working), so all rows measure the same one; its hash
is recorded.  The machine may be shared: load averages at start and end are recorded.

Prints the table (with PASS/FAIL vs each goal - a benchmark reports, it does not assert)
and, for a full run (or with --out), writes tests/bench/results/read_patterns/read-patterns.md: command, date, machine,
binary, table, per-row details, all passes.  Generated checkpoints are kept in --data and
reused.  Needs root (drop_caches, mount, cgroups).  Mounts and cgroups are removed on every
exit path, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import mmap
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
import gen  # noqa: E402
import machine  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
TIERFS = Path(os.environ.get("TIERFS_BIN", REPO / "target" / "release" / "tierfs"))
BIN = TIERFS  # what mounts run: a private copy of TIERFS taken at the start (see main)
CEILING = REPO / "target" / "release" / "fuse-ceiling"  # row 2's yardstick (tests/faultfs)
READER = HERE / "reader.py"
CGROUP_MEM = Path("/sys/fs/cgroup/memory")
CG_PREFIX = "tierfs-bench-"
DAEMON_OVERHEAD = 64 * MiB      # row 4: daemon cgroup limit = budget + this
COMPUTE_FACTOR = 1.2            # row 3: compute per block = factor x block bytes / disk throughput
STALL_GOAL = 0.05
DISK_GOAL = 1.15
SPEEDUP_GOAL = 1.5
WARMUP_GROUPS = 2               # row 3: (other) + blocks.0 are not counted as stall

# Everything that must be undone on exit.
_MOUNTS: list["Mount"] = []
_CGROUPS: list["Cgroup"] = []
_PROCS: list[subprocess.Popen] = []


def parse_size(s: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", s, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r}")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": MiB, "G": GiB, "T": 1 << 40}[m.group(2).upper()])


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_pass(path: Path, bs: int, limit: int | None = None) -> tuple[float, int]:
    """Sequential read with `bs`-sized read() calls into a reused buffer; (seconds, bytes)."""
    buf = bytearray(bs)
    mv = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while limit is None or total < limit:
            n = os.readv(fd, [mv])
            if n == 0:
                break
            total += n
    finally:
        os.close(fd)
    return time.perf_counter() - t0, total


def mmap_pass(path: Path, piece: int = MiB) -> tuple[float, int]:
    """mmap the whole file and copy it out in `piece`-sized slices (every page faulted, in order)."""
    out = bytearray(piece)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        mv = memoryview(mm)
        try:
            for off in range(0, size, piece):
                n = min(piece, size - off)
                out[:n] = mv[off:off + n]
        finally:
            mv.release()
    finally:
        mm.close()
    return time.perf_counter() - t0, size


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_CACHESTAT = 451  # x86_64 and aarch64 (Linux >= 6.5)


def page_cache_bytes(path: Path) -> int:
    """Bytes of `path` in the page cache (cachestat(2); -1 where unavailable)."""
    class Range(ctypes.Structure):
        _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

    class Stat(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in
                    ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]

    fd = os.open(path, os.O_RDONLY)
    try:
        rng, st = Range(0, 0), Stat()
        if _libc.syscall(_SYS_CACHESTAT, ctypes.c_uint(fd), ctypes.byref(rng), ctypes.byref(st), ctypes.c_uint(0)) == 0:
            return st.nr_cache * os.sysconf("SC_PAGE_SIZE")
    finally:
        os.close(fd)
    return -1


class Pinned:
    """Keeps a file in the page cache: a MAP_LOCKED mapping reads it in and holds it locked, so a
    `drop_caches` by anything else on the machine cannot turn a "warm" baseline cold."""

    def __init__(self, path: Path):
        fd = os.open(path, os.O_RDONLY)
        try:
            self.mm = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_LOCKED", 0x2000),
                                prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.resident = page_cache_bytes(path)

    def __enter__(self) -> "Pinned":
        return self

    def __exit__(self, *exc) -> None:
        self.mm.close()


def mounted(mp: Path) -> bool:
    s = str(mp)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == s for line in f)


def proc_io_read_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class DevStat:
    """Bytes read by the block device holding `path` (/sys/dev/block/MAJ:MIN/stat, whole disk)."""

    def __init__(self, path: Path):
        st = os.stat(path)
        p = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve()
        if not (p / "stat").exists():
            p = p.parent
        self.stat_path = p / "stat"
        self.name = p.name
        ra = p / "queue" / "read_ahead_kb"
        self.read_ahead_kb = ra.read_text().strip() if ra.exists() else "?"

    def read_bytes(self) -> int:
        try:
            return int(self.stat_path.read_text().split()[2]) * 512
        except (OSError, IndexError, ValueError):
            return 0


class Cgroup:
    """A cgroup v1 memory cgroup with a hard limit."""

    def __init__(self, name: str, limit: int):
        self.path = CGROUP_MEM / (CG_PREFIX + name)
        if self.path.exists():
            Cgroup.remove_path(self.path)
        self.path.mkdir()
        _CGROUPS.append(self)
        (self.path / "memory.limit_in_bytes").write_text(f"{limit}\n")
        self.limit = int((self.path / "memory.limit_in_bytes").read_text())

    def read(self, key: str) -> str:
        return (self.path / key).read_text()

    def oom_kills(self) -> int:
        for line in self.read("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def facts(self) -> dict:
        return {"limit": self.limit, "max_usage": int(self.read("memory.max_usage_in_bytes")),
                "failcnt": int(self.read("memory.failcnt")), "oom_kills": self.oom_kills()}

    @staticmethod
    def remove_path(path: Path) -> None:
        for _ in range(50):
            if not path.exists():
                return
            try:
                pids = (path / "cgroup.procs").read_text().split()
            except OSError:
                pids = []
            for pid in pids:  # only processes of ours can be there; park them in the root cgroup
                try:
                    (CGROUP_MEM / "cgroup.procs").write_text(pid + "\n")
                except OSError:
                    pass
            try:
                path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        print(f"warning: could not remove cgroup {path}", file=sys.stderr)

    def remove(self) -> None:
        Cgroup.remove_path(self.path)
        if self in _CGROUPS:
            _CGROUPS.remove(self)


def wait_or_kill(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Waits for a daemon told to stop; kills it if it does not within `timeout` seconds."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Mount:
    """A running `tierfs mount` of `source` (foreground daemon), optionally inside a memory cgroup."""

    def __init__(self, source: Path | str, root: Path, budget: int, cgroup: Cgroup | None = None,
                 extra: tuple[str, ...] = (), wrap: tuple[str, ...] = (), env: dict | None = None):
        """`source`: a folder, or an `s3://` URL (as text); `wrap`: the command the daemon runs
        under (`nsenter` into a store's network namespace); `env`: its environment."""
        self.mnt = Path(tempfile.mkdtemp(prefix="mnt.", dir=root))
        self.log_path = root / (self.mnt.name + ".log")
        self.log = open(self.log_path, "wb")
        cmd = [*wrap, str(BIN), "mount", str(source), str(self.mnt), "--ram-cache", str(budget), *mount_extra(),
               *extra]
        if cgroup is not None:  # join the cgroup, then exec: the daemon never runs outside it
            cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup.path), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        _MOUNTS.append(self)
        ready = threading.Event()
        deadline = time.monotonic() + 15

        def probe() -> None:  # in a thread: a hung daemon must not hang the benchmark
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    json.loads((self.mnt / ".tierfs" / "stats").read_bytes())
                    ready.set()
                    return
                except (OSError, ValueError):
                    time.sleep(0.05)

        t = threading.Thread(target=probe, daemon=True)
        t.start()
        t.join(timeout=16)
        if not ready.is_set():
            rc = self.proc.poll()
            self.close()
            raise RuntimeError(f"tierfs mount not ready (exit status {rc}); log {self.log_path}:\n"
                               + self.log_path.read_bytes()[-2000:].decode(errors="replace"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stats(self) -> dict:
        return json.loads((self.mnt / ".tierfs" / "stats").read_bytes())

    def hwm(self) -> int:
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                wait_or_kill(self.proc)
        finally:
            if mounted(self.mnt):
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            if not self.log.closed:
                self.log.close()
            keep = os.environ.get("TIERFS_BENCH_KEEP_LOGS")
            if keep and self.log_path.exists():
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(self.log_path, Path(keep) / self.log_path.name)
            if self in _MOUNTS:
                _MOUNTS.remove(self)


class CeilingMount:
    """tests/faultfs's `fuse-ceiling`: one file, `data`, of `size` bytes served from RAM with no
    work per read and tierfs's FUSE settings: the fastest any FUSE file system reads here."""

    def __init__(self, root: Path, size: int):
        self.mnt = Path(tempfile.mkdtemp(prefix="ceiling.", dir=root))
        self.file = self.mnt / "data"
        self.proc = subprocess.Popen([str(CEILING), str(self.mnt), str(size)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _MOUNTS.append(self)
        deadline = time.monotonic() + 60  # it fills `size` bytes first
        while not self.file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"fuse-ceiling not ready (exit status {self.proc.poll()})")
            time.sleep(0.1)

    def close(self) -> None:
        try:
            if mounted(self.mnt):
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            wait_or_kill(self.proc)
        finally:
            if self in _MOUNTS:
                _MOUNTS.remove(self)


_EXTRA: list[str] | None = None


def mount_extra() -> list[str]:
    """`--no-state` where the binary has it: every mount starts without learned block orders
    (cold means cold), and the benchmark leaves nothing in the system's state dir. Plus the
    words of `$TIERFS_BENCH_MOUNT_ARGS`, e.g. `--no-model-passthrough` to measure the chunk
    cache where a model fits the budget (it is otherwise passed through to the kernel)."""
    global _EXTRA
    if _EXTRA is None:
        h = subprocess.run([str(BIN), "mount", "--help"], capture_output=True, text=True).stdout
        _EXTRA = ["--no-state"] if "--no-state" in h else []
        _EXTRA += os.environ.get("TIERFS_BENCH_MOUNT_ARGS", "").split()
    return _EXTRA


def cleanup(root: Path | None) -> None:
    """Undo everything: reader processes, mounts, cgroups, the scratch dir.  Ctrl-C-proof."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for p in list(_PROCS):
            if p.poll() is None:
                p.kill()
                p.wait()
        for m in list(reversed(_MOUNTS)):
            m.close()
        for cg in list(reversed(_CGROUPS)):
            cg.remove()
        if root is not None and root.exists():
            left = [p for p in root.iterdir() if p.is_dir() and mounted(p)]
            if left:
                print(f"warning: still mounted: {left}", file=sys.stderr)
            else:
                shutil.rmtree(root, ignore_errors=True)
    finally:
        signal.signal(signal.SIGINT, old)


def clean_stale() -> None:
    """Leftovers of a killed earlier run (SIGKILL skips `finally`)."""
    with open("/proc/mounts") as f:
        stale = [line.split()[1] for line in f if "/tierfs-bench." in line.split()[1]]
    for mp in stale:
        subprocess.run(["umount", "-l", mp], capture_output=True)
    if CGROUP_MEM.is_dir():
        for p in CGROUP_MEM.glob(CG_PREFIX + "*"):
            Cgroup.remove_path(p)


def run_reader(plan: Path, file: Path | list[Path], cgroup: Cgroup | None = None) -> dict:
    """One reader.py pass; `file` is the model's file, or its shards (the plan's groups name them)."""
    files = file if isinstance(file, list) else [file]
    cmd = [sys.executable, str(READER), str(plan), *map(str, files)]
    if cgroup is not None:
        cmd += ["--cgroup", str(cgroup.path)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _PROCS.append(p)
    try:
        out, err = p.communicate()
    finally:
        _PROCS.remove(p)
    if p.returncode != 0:
        raise RuntimeError(f"reader failed ({p.returncode}) on {file}:\n{err[-3000:]}")
    return json.loads(out)


# ----------------------------------------------------------------------------- block order

_BLOCK_RE = re.compile(r"(?:^|\.)(double_blocks|single_transformer_blocks|single_blocks|transformer_blocks"
                       r"|blocks|layers|h)\.(\d+)(?:\.|$)")
_FAMILY_RANK = {"double_blocks": 0, "transformer_blocks": 0, "single_blocks": 1, "single_transformer_blocks": 1}


def model_order_groups(path: Path) -> list[tuple[str, list[tuple[int, int]]]]:
    """Tensor groups in model order: `(other)` first, then blocks numerically (double before single)."""
    groups: dict[tuple, tuple[str, list[tuple[int, int]]]] = {}
    for name, start, end in gen.tensor_ranges(path):
        m = _BLOCK_RE.search(name)
        if m:
            key = (1, _FAMILY_RANK.get(m.group(1), 0), int(m.group(2)))
            label = f"{name[:m.end(2)].lstrip('.')}"
        else:
            key, label = (0,), "(other)"
        groups.setdefault(key, (label, []))[1].append((start, end))
    return [groups[k] for k in sorted(groups)]


def stream_dit_specs() -> list:
    """Row 3/4 model: 40 bf16 DiT blocks (dim 1536, ffn 11264), 4.29 GB (< 4 GiB), tensors in
    *name* order as real writers sort them (blocks.0, blocks.1, blocks.10, ..., blocks.2, ...,
    head.*, patch_embedding.*, ...), so file order is not model order."""
    if hasattr(gen, "sorted_dit_specs"):
        return gen.sorted_dit_specs(1536, 11264, 40)
    return sorted(gen.dit_specs(1536, 11264, 40, ("BF16",)), key=lambda s: s[0])


# ----------------------------------------------------------------------------- the run

class Bench:
    def __init__(self, args, root: Path):
        self.args = args
        self.root = root
        self.data = Path(args.data)
        self.src = self.data / "src"
        self.src.mkdir(parents=True, exist_ok=True)
        self.passes: dict[str, list[float]] = {}      # key -> per-pass figures (for the results file)
        self.table: list[dict] = []
        self.details: list[str] = []
        self.hwms: list[int] = []
        self.disk_tput: float | None = None           # bytes/s, cold source sequential read

    # -- files
    def ckpt2(self) -> Path:
        p = self.src / f"dit_{self.args.size_gib:g}gib.safetensors"
        if not p.exists():
            print(f"generating {p} ...", flush=True)
            gen.write_streaming(p, gen.big_dit_specs(int(self.args.size_gib * GiB)), seed=2024)
        return p

    def ckpt4(self) -> Path:
        p = self.src / "dit40_bf16_sorted_4gib.safetensors"
        if not p.exists():
            print(f"generating {p} ...", flush=True)
            gen.write_streaming(p, stream_dit_specs(), seed=2025)
        return p

    # -- recording
    def rec(self, key: str, value: float, unit: str = "MB/s") -> None:
        self.passes.setdefault(key, []).append(value)
        print(f"  {key:<44} {value:10.2f} {unit}", flush=True)

    def row(self, name: str, mount: float, base: float, ratio: float, goal: str, ok: bool | None,
            fmt: str = "{:.0f}") -> None:
        self.table.append({"name": name, "mount": fmt.format(mount), "base": fmt.format(base),
                           "ratio": f"{ratio:.2f}", "goal": goal,
                           "result": "—" if ok is None else ("PASS" if ok else "FAIL")})

    def med(self, key: str) -> float:
        return statistics.median(self.passes[key])

    # -- row 1
    def row1(self) -> None:
        print("row 1: cold sequential read", flush=True)
        ckpt, a = self.ckpt2(), self.args
        size = ckpt.stat().st_size
        for bs, bsname in ((MiB, "1MiB"), (128 << 10, "128KiB")):
            for _ in range(a.reps):
                drop_caches()
                t, n = read_pass(ckpt, bs)
                assert n == size
                self.rec(f"cold source {bsname}", size / t / 1e6)
                m = Mount(self.src, self.root, a.budget)
                try:
                    drop_caches()
                    t, n = read_pass(m.mnt / ckpt.name, bs)
                    assert n == size, f"read {n} of {size}"
                    self.rec(f"cold mount {bsname}", size / t / 1e6)
                    self.hwms.append(m.hwm())
                finally:
                    m.close()
        for bsname, label in (("1MiB", "1 MiB"), ("128KiB", "128 KiB")):
            a_, b_ = self.med(f"cold mount {bsname}"), self.med(f"cold source {bsname}")
            self.row(f"1. cold, {label} reads (MB/s)", a_, b_, a_ / b_, "≥ 0.95", a_ / b_ >= 0.95)

    # -- row 2
    def row2(self) -> None:
        print("row 2: warm (tierfs cache vs page cache)", flush=True)
        ckpt, a = self.ckpt2(), self.args
        size = ckpt.stat().st_size
        if size > a.budget:
            print(f"  note: file {size} B > --budget {a.budget} B; the warm mount will not hold it")
        with Pinned(ckpt) as pin:
            self.details.append(f"- row 2: source pinned in the page cache for its warm passes (MAP_LOCKED): "
                                f"{pin.resident / MiB:.0f} of {size / MiB:.0f} MiB resident")
            read_pass(ckpt, MiB)
            for _ in range(a.reps):
                t, _ = read_pass(ckpt, MiB)
                self.rec("warm source (page cache) read 1MiB", size / t / 1e6)
                t, _ = mmap_pass(ckpt)
                self.rec("warm source (page cache) mmap", size / t / 1e6)
        m = Mount(self.src, self.root, a.budget)
        try:
            read_pass(m.mnt / ckpt.name, MiB)  # prime the tierfs cache
            s0 = m.stats()
            for _ in range(a.reps):
                drop_caches()
                t, n = read_pass(m.mnt / ckpt.name, MiB)
                assert n == size
                self.rec("warm mount (tierfs cache) read 1MiB", size / t / 1e6)
                drop_caches()
                t, _ = mmap_pass(m.mnt / ckpt.name)
                self.rec("warm mount (tierfs cache) mmap", size / t / 1e6)
            s1 = m.stats()
            for _ in range(a.reps):
                t, n = read_pass(m.mnt / ckpt.name, MiB)
                self.rec("warm-k mount (no drop) read 1MiB", size / t / 1e6)
            self.hwms.append(m.hwm())
        finally:
            m.close()
        if CEILING.exists():
            c = CeilingMount(self.root, size)
            try:
                read_pass(c.file, MiB)
                for _ in range(a.reps):
                    t, n = read_pass(c.file, MiB)
                    assert n == size
                    self.rec("warm FUSE ceiling read 1MiB", size / t / 1e6)
            finally:
                c.close()
        else:
            self.details.append(f"- row 2: no FUSE ceiling row ({CEILING} not built)")
        disk = s1["disk"]["read_bytes"] - s0["disk"]["read_bytes"]
        self.details.append(
            f"- row 2: warm mount passes (read + mmap) read {disk / MiB:.1f} MiB from disk "
            f"(cache hits +{s1['cache']['hits'] - s0['cache']['hits']}, misses +{s1['cache']['misses'] - s0['cache']['misses']}, "
            f"used {s1['cache']['used_bytes'] / MiB:.0f} MiB of {s1['cache']['budget_bytes'] / MiB:.0f})")
        src = self.med("warm source (page cache) read 1MiB")
        for key, label, goal in (("warm mount (tierfs cache) read 1MiB", "2. warm, tierfs cache vs page cache, read() (MB/s)", 0.6),
                                 ("warm mount (tierfs cache) mmap", "2. warm, tierfs cache vs page cache, mmap (MB/s)", None),
                                 ("warm-k mount (no drop) read 1MiB", "2. warm, no drop (kernel + tierfs) vs page cache, read() (MB/s)", None)):
            base = self.med("warm source (page cache) mmap") if "mmap" in key else src
            v = self.med(key)
            self.row(label, v, base, v / base, f"≥ {goal}" if goal else "report",
                     None if goal is None else v / base >= goal)
        if "warm FUSE ceiling read 1MiB" in self.passes:
            ceiling, tierfs = self.med("warm FUSE ceiling read 1MiB"), self.med("warm mount (tierfs cache) read 1MiB")
            self.row("2. … ceiling: FUSE serving RAM with no work per read, read() (MB/s)", ceiling, src,
                     ceiling / src, "report", None)
            self.details.append(
                f"- row 2: tierfs's warm read() is {tierfs / ceiling:.2f} of the FUSE ceiling "
                f"(tests/faultfs fuse-ceiling: one file served from an anonymous mapping with no work per "
                f"read, FOPEN_DIRECT_IO, 8 threads, cloned fds); {ceiling / src:.2f} of the page cache is "
                f"the most any FUSE file system gets here")

    # -- shared by rows 3 and 4
    def plan(self, ckpt: Path, name: str, compute_per_byte: float) -> tuple[Path, list]:
        groups = model_order_groups(ckpt)
        doc = {"groups": [{"name": g, "ranges": r, "compute_s": compute_per_byte * sum(e - s for s, e in r)}
                          for g, r in groups]}
        p = self.root / f"plan-{name}.json"
        p.write_text(json.dumps(doc))
        return p, doc["groups"]

    def measure_disk_tput(self) -> float:
        """Cold sequential throughput of the row 3/4 file itself (1 MiB reads of its first 2 GiB).

        Measured on that file, not taken from row 1: the virtual disk's host caches recently
        written files, so two files on it can read at 0.4 and 1.8 GB/s in the same minute."""
        if self.disk_tput is None:
            ckpt = self.ckpt4()
            vals = []
            for _ in range(self.args.reps):
                drop_caches()
                t, n = read_pass(ckpt, MiB, limit=2 * GiB)
                vals.append(n / t)
                self.rec("cold source 1MiB, first 2 GiB of row 3 file", n / t / 1e6)
            self.disk_tput = statistics.median(vals)
        return self.disk_tput

    # -- row 3
    def row3(self) -> None:
        print("row 3: streaming pass with compute, model order, cold", flush=True)
        a = self.args
        ckpt = self.ckpt4()
        size = ckpt.stat().st_size
        tput = self.measure_disk_tput()
        plan, groups = self.plan(ckpt, "stream", COMPUTE_FACTOR / tput)
        data_bytes = sum(e - s for g in groups for s, e in g["ranges"])
        compute_planned = sum(g["compute_s"] for g in groups)
        warm_budget = max(a.stream_budget, (size // GiB + 2) * GiB)
        res: dict[str, list[dict]] = {"source": [], "mount": [], "source warm": [], "mount warm": []}
        pinned: list[int] = []

        def record(case: str, r: dict, stats: dict | None = None) -> None:
            assert r["bytes"] == data_bytes, f"{case}: read {r['bytes']} of {data_bytes}"
            warm = sum(g["read_s"] for g in r["groups"][:WARMUP_GROUPS])
            stall = sum(g["read_s"] for g in r["groups"][WARMUP_GROUPS:])
            res[case].append({"total": r["total_s"], "compute": r["compute_s"], "warmup": warm, "stall": stall,
                              "pct": 100 * stall / r["total_s"], "stats": stats})
            self.rec(f"stream {case} stall %", 100 * stall / r["total_s"], "%")
            self.passes.setdefault(f"stream {case} pass s", []).append(r["total_s"])

        for _ in range(a.reps):
            drop_caches()
            record("source", run_reader(plan, ckpt))
            with Pinned(ckpt) as pin:  # the whole file, held in the page cache
                record("source warm", run_reader(plan, ckpt))
                pinned.append(pin.resident)
            m = Mount(self.src, self.root, a.stream_budget)
            try:
                drop_caches()
                r = run_reader(plan, m.mnt / ckpt.name)
                record("mount", r, m.stats())
                self.hwms.append(m.hwm())
            finally:
                m.close()
            # floor: the same pass served entirely from the tierfs cache (budget > file)
            m = Mount(self.src, self.root, warm_budget)
            try:
                read_pass(m.mnt / ckpt.name, MiB)
                drop_caches()
                s0 = m.stats()
                r = run_reader(plan, m.mnt / ckpt.name)
                s1 = m.stats()
                record("mount warm", r, {"disk": s1["disk"]["read_bytes"] - s0["disk"]["read_bytes"]})
            finally:
                m.close()
            if CEILING.exists():  # the same pass from a FUSE file system that does no work at all
                c = CeilingMount(self.root, size)
                try:
                    res.setdefault("FUSE ceiling", [])
                    record("FUSE ceiling", run_reader(plan, c.file))
                finally:
                    c.close()
        medpct = {k: statistics.median(x["pct"] for x in v) for k, v in res.items()}
        mi = sorted(range(a.reps), key=lambda i: res["mount"][i]["pct"])[a.reps // 2]  # the median rep
        ms = res["mount"][mi]
        self.row(f"3. stream+compute, stall % of pass (cold, {a.stream_budget / GiB:g} GiB budget)",
                 ms["pct"], medpct["source"], ms["pct"] / medpct["source"] if medpct["source"] else float("nan"),
                 "tierfs ≤ 5 %", ms["pct"] <= 100 * STALL_GOAL, fmt="{:.1f} %")
        self.row(f"3. … floor: same pass from RAM (tierfs cache {warm_budget / GiB:g} GiB ⊇ file / page cache)",
                 medpct["mount warm"], medpct["source warm"],
                 medpct["mount warm"] / medpct["source warm"] if medpct["source warm"] else float("nan"),
                 "report", None, fmt="{:.1f} %")
        if "FUSE ceiling" in medpct:
            self.row("3. … FUSE ceiling: same pass from a FUSE file system with no work per read",
                     medpct["FUSE ceiling"], medpct["source warm"], medpct["FUSE ceiling"] / medpct["source warm"],
                     "report", None, fmt="{:.1f} %")
        above = ms["pct"] - medpct["mount warm"]
        self.row("3. … stall above the RAM floor (cold − floor, percentage points)", above,
                 medpct["source"] - medpct["source warm"],
                 above / (medpct["source"] - medpct["source warm"]) if medpct["source"] != medpct["source warm"] else float("nan"),
                 "tierfs ≤ 5 (derived)", above <= 100 * STALL_GOAL, fmt="{:.1f}")
        mt = statistics.median(x["total"] for x in res["mount"])
        st_ = statistics.median(x["total"] for x in res["source"])
        self.row("3. stream+compute, pass time s (ratio = source / tierfs)", mt, st_, st_ / mt, "report", None,
                 fmt="{:.2f}")
        p = ms["stats"]
        self.details += [
            f"- row 3: file {ckpt.name} ({size / GiB:.2f} GiB, {len(groups)} groups in model order: "
            f"{', '.join(g['name'] for g in groups[:4])}, …), budget {a.stream_budget / GiB:g} GiB; cold disk "
            f"throughput {tput / 1e6:.0f} MB/s -> compute {COMPUTE_FACTOR} x bytes / throughput = {compute_planned:.2f} s "
            f"per pass ({1e3 * groups[WARMUP_GROUPS]['compute_s']:.0f} ms for {groups[WARMUP_GROUPS]['name']}); "
            f"not counted as stall (warm-up): {', '.join(g['name'] for g in groups[:WARMUP_GROUPS])}",
            "  - the floor passes show what the reader spends just getting bytes from RAM (copies, FUSE round "
            "trips, Python threads); the 5 % goal counts that too. Source floor: file pinned in the page cache "
            f"(MAP_LOCKED; resident {', '.join(f'{x / MiB:.0f}' for x in pinned)} of {size / MiB:.0f} MiB)",
            *(f"  - {k} rep {i + 1}: pass {x['total']:.2f} s, compute {x['compute']:.2f} s, warm-up read "
              f"{x['warmup']:.2f} s, stall {x['stall']:.2f} s = {x['pct']:.1f} %"
              + (f" (disk during the pass {x['stats']['disk'] / MiB:.0f} MiB)" if k == "mount warm" else "")
              for k in res for i, x in enumerate(res[k])),
            f"  - tierfs stats after the median cold pass (rep {mi + 1}): prefetch.issued_bytes "
            f"{p['prefetch']['issued_bytes'] / MiB:.0f} MiB, prefetch.used_bytes {p['prefetch']['used_bytes'] / MiB:.0f} MiB, "
            f"prefetch.wasted_bytes {p['prefetch']['wasted_bytes'] / MiB:.0f} MiB, cache.stall_seconds "
            f"{p['cache']['stall_seconds']:.2f} (summed over threads); disk.read_bytes {p['disk']['read_bytes'] / MiB:.0f} MiB, "
            f"hits {p['cache']['hits']}, misses {p['cache']['misses']}, evicted {p['cache']['evicted_bytes'] / MiB:.0f} MiB",
        ]

    # -- row 4
    def row4(self) -> None:
        print("row 4: repeated passes over a model 2x the budget, no compute", flush=True)
        a = self.args
        if not (CGROUP_MEM / "cgroup.procs").exists():
            print("  skipped: no cgroup v1 memory controller at /sys/fs/cgroup/memory")
            self.details.append("- row 4: skipped (no cgroup v1 memory controller)")
            return
        ckpt = self.ckpt4()
        size = ckpt.stat().st_size
        budget = a.stream_budget
        plan, groups = self.plan(ckpt, "repeat", 0.0)
        data_bytes = sum(e - s for g in groups for s, e in g["ranges"])
        dev = DevStat(ckpt)
        base: list[list[dict]] = []
        mnt: list[list[dict]] = []
        facts: list[str] = []
        failed: list[str] = []

        def baseline(rep: int) -> None:
            """The source file, read by a reader whose cgroup (page cache included) is limited to the budget."""
            passes: list[dict] = []
            base.append(passes)
            cg = Cgroup("reader", budget)
            try:
                drop_caches()
                for i in range(a.passes):
                    d0 = dev.read_bytes()
                    r = run_reader(plan, ckpt, cg)
                    assert r["bytes"] == data_bytes
                    passes.append({"t": r["total_s"], "disk": r["io_read_bytes"], "dev": dev.read_bytes() - d0})
                    self.rec(f"repeat source pass {i + 1} s", r["total_s"], "s")
                f = cg.facts()
                facts.append(f"  - rep {rep}, baseline reader cgroup: limit {f['limit'] / MiB:.0f} MiB, max usage "
                             f"{f['max_usage'] / MiB:.0f} MiB, failcnt {f['failcnt']}")
            finally:
                cg.remove()

        def tierfs(rep: int) -> None:
            """Daemon in a cgroup of budget + overhead, reader in one like the baseline's."""
            passes: list[dict] = []
            mnt.append(passes)
            cgd = Cgroup("daemon", budget + DAEMON_OVERHEAD)
            cgr = Cgroup("reader", budget)
            try:
                m = Mount(self.src, self.root, budget, cgroup=cgd)
                try:
                    drop_caches()
                    for i in range(a.passes):
                        s0, d0, io0 = m.stats(), dev.read_bytes(), proc_io_read_bytes(m.pid)
                        try:
                            r = run_reader(plan, m.mnt / ckpt.name, cgr)
                        except RuntimeError as e:
                            failed.append(f"rep {rep} pass {i + 1}: {e}; daemon alive: {m.alive()}, "
                                          f"daemon cgroup {cgd.facts()}")
                            print("  " + failed[-1])
                            break
                        s1 = m.stats()
                        d = lambda sec, key: s1[sec][key] - s0[sec][key]  # noqa: E731
                        passes.append({"t": r["total_s"], "disk": d("disk", "read_bytes"),
                                       "pio": proc_io_read_bytes(m.pid) - io0, "dev": dev.read_bytes() - d0,
                                       "evicted": d("cache", "evicted_bytes"), "issued": d("prefetch", "issued_bytes"),
                                       "used": d("prefetch", "used_bytes"), "wasted": d("prefetch", "wasted_bytes"),
                                       "stall": d("cache", "stall_seconds")})
                        self.rec(f"repeat mount pass {i + 1} s", r["total_s"], "s")
                    hwm, alive = m.hwm(), m.alive()
                    self.hwms.append(hwm)
                finally:
                    m.close()
                fd_, fr = cgd.facts(), cgr.facts()
                facts.append(f"  - rep {rep}, tierfs daemon cgroup: limit {fd_['limit'] / MiB:.0f} MiB (budget + "
                             f"{DAEMON_OVERHEAD // MiB} MiB), max usage {fd_['max_usage'] / MiB:.0f} MiB, failcnt "
                             f"{fd_['failcnt']}, OOM kills {fd_['oom_kills']}; daemon VmHWM {hwm / MiB:.0f} MiB, alive "
                             f"after the passes: {alive}; tierfs reader cgroup max usage {fr['max_usage'] / MiB:.0f} MiB")
            finally:
                cgr.remove()
                cgd.remove()

        for rep in range(1, a.reps4 + 1):
            baseline(rep)
            tierfs(rep)

        target = DISK_GOAL * (size - budget)
        self.details += [
            f"- row 4: file {ckpt.name} ({size / GiB:.2f} GiB = {size / 1e9:.2f} GB), budget {budget / GiB:g} GiB, "
            f"{a.reps4} reps x {a.passes} passes per case, no compute, caches dropped before pass 1 only; readers: "
            f"8 threads x 2 MiB pread, model order; disk goal 1.15 x (model - budget) = {target / 1e9:.2f} GB; "
            f"device {dev.name} counts the whole disk (other activity included) and is only a cross-check",
            *facts,
            *(f"  - rep {rep + 1} source pass {i + 1}: {b['t']:.2f} s, reader /proc/self/io read_bytes "
              f"{b['disk'] / 1e9:.2f} GB (device {b['dev'] / 1e9:.2f} GB)"
              for rep, ps in enumerate(base) for i, b in enumerate(ps)),
            *(f"  - rep {rep + 1} tierfs pass {i + 1}: {x['t']:.2f} s, disk.read_bytes {x['disk'] / 1e9:.2f} GB (daemon "
              f"/proc io {x['pio'] / 1e9:.2f} GB, device {x['dev'] / 1e9:.2f} GB), evicted {x['evicted'] / 1e9:.2f} GB, "
              f"prefetch issued/used/wasted {x['issued'] / 1e9:.2f}/{x['used'] / 1e9:.2f}/{x['wasted'] / 1e9:.2f} GB, "
              f"cache.stall_seconds +{x['stall']:.2f}" for rep, ps in enumerate(mnt) for i, x in enumerate(ps)),
            *(f"  - tierfs FAILED: {f}" for f in failed),
        ]
        if failed or any(len(ps) < a.passes for ps in base + mnt) or a.passes < 2:
            self.table.append({"name": "4. repeated passes", "mount": "failed" if failed else "n/a", "base": "",
                               "ratio": "", "goal": "", "result": "FAIL" if failed else "—"})
            return
        later_m = max(x["disk"] for ps in mnt for x in ps[1:])
        later_b = max(x["disk"] for ps in base for x in ps[1:])
        self.row(f"4. repeat, disk GB per pass after the 1st (max; model {size / 1e9:.2f} GB, budget {budget / GiB:g} GiB)",
                 later_m / 1e9, later_b / 1e9, later_m / later_b if later_b else float("nan"),
                 f"tierfs ≤ {target / 1e9:.2f} GB", later_m <= target, fmt="{:.2f}")
        tm = statistics.median(x["t"] for ps in mnt for x in ps[1:])
        tb = statistics.median(x["t"] for ps in base for x in ps[1:])
        self.row("4. repeat, pass time s (median of passes 2..; ratio = source / tierfs)", tm, tb, tb / tm,
                 f"≥ {SPEEDUP_GOAL}", tb / tm >= SPEEDUP_GOAL, fmt="{:.2f}")
        t1m = statistics.median(ps[0]["t"] for ps in mnt)
        t1b = statistics.median(ps[0]["t"] for ps in base)
        self.row("4. repeat, pass 1 time s (cold)", t1m, t1b, t1b / t1m, "report", None, fmt="{:.2f}")


def machine_facts(data: Path, load0: tuple, bin_mtime: str) -> list[str]:
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal:")) * 1024
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    dev = DevStat(data)
    st = TIERFS.stat() if TIERFS.exists() else None
    h = hashlib.sha256(BIN.read_bytes()).hexdigest()[:12]
    now = hashlib.sha256(TIERFS.read_bytes()).hexdigest()[:12] if st else "gone"
    git = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "core", "fs"],
                           capture_output=True, text=True).stdout.strip()
    cg = "cgroup v1 memory controller" if (CGROUP_MEM / "cgroup.procs").exists() else "no cgroup v1 memory controller"
    others = subprocess.run(["pgrep", "-c", "-x", "tierfs"], capture_output=True, text=True).stdout.strip() or "0"
    return [
        f"- load average (1/5/15 min) at the start: {' '.join(f'{x:.2f}' for x in load0)}, at the end: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; other tierfs daemons running "
        f"at the end: {others} (the machine is shared: compare only figures of the same run)",
        f"- mounts: `tierfs mount SRC MNT --ram-cache BUDGET {' '.join(mount_extra())}`".rstrip() + "",
        f"- machine: {os.cpu_count()} CPUs ({cpu}), {mem / GiB:.1f} GiB RAM, kernel {platform.release()}; "
        f"data on {dev.name} (read_ahead_kb {dev.read_ahead_kb}); {cg}",
        f"- binary: {TIERFS.relative_to(REPO) if TIERFS.is_relative_to(REPO) else TIERFS}, sha256 {h} (copied at the "
        f"start of the run; every mount ran that copy){'' if now == h else f' — it has since been rebuilt (now {now})'}"
        f"; built {bin_mtime}; tree at {git}{' (core/ or fs/ modified)' if dirty else ''}",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,3,4", help="comma-separated rows to run (default: all)")
    ap.add_argument("--size-gib", type=float, default=2.0, help="rows 1-2 file size")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=parse_size, default=3 * GiB, help="rows 1-2 --ram-cache (>= file size for row 2)")
    ap.add_argument("--stream-budget", type=parse_size, default=2 * GiB, help="rows 3-4 --ram-cache (< the 4 GiB file)")
    ap.add_argument("--passes", type=int, default=3, help="row 4 passes per repetition")
    ap.add_argument("--reps4", type=int, default=2, help="row 4 repetitions (each: baseline passes, then tierfs passes)")
    ap.add_argument("--data", default=os.environ.get("TIERFS_BENCH_DATA", "/tmp/tierfs-bench-data"),
                    help="where generated checkpoints are kept (reused across runs)")
    ap.add_argument("--out", help="results file (default: tests/bench/results/read_patterns/read-patterns.md for a full run, none otherwise)")
    args = ap.parse_args()
    rows = sorted({int(x) for x in args.rows.split(",") if x.strip()})
    if not set(rows) <= {1, 2, 3, 4}:
        raise SystemExit(f"--rows: unknown row in {args.rows}")
    if os.geteuid() != 0:
        raise SystemExit("read_patterns.py needs root (drop_caches, mount, cgroups)")
    if not os.access(TIERFS, os.X_OK):
        raise SystemExit(f"{TIERFS} missing: cargo build --release -p tierfs")
    out = args.out or (str(HERE / "results" / "read_patterns" / "read-patterns.md") if rows == [1, 2, 3, 4] else None)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    clean_stale()
    root = Path(tempfile.mkdtemp(prefix="tierfs-bench.", dir="/tmp"))
    global BIN  # the lead may rebuild target/release mid-run: all rows must measure one binary
    BIN = root / "tierfs"
    for attempt in range(30):  # not while cargo is still writing it: same mtime before/after, and it runs
        m0 = TIERFS.stat().st_mtime_ns
        shutil.copy2(TIERFS, BIN)
        ok = subprocess.run([str(BIN), "mount", "--help"], capture_output=True).returncode == 0
        if ok and TIERFS.stat().st_mtime_ns == m0:
            break
        time.sleep(2)
    else:
        cleanup(root)
        raise SystemExit(f"{TIERFS} keeps changing or does not run")
    bin_mtime = datetime.datetime.fromtimestamp(BIN.stat().st_mtime).isoformat(timespec="seconds")
    b = Bench(args, root)
    facts: list[str] = []
    t0 = time.monotonic()
    load0 = os.getloadavg()
    try:
        for r in rows:
            try:
                getattr(b, f"row{r}")()
            except Exception as e:  # noqa: BLE001 - a broken row is reported, the others still run
                import traceback
                traceback.print_exc()
                b.table.append({"name": f"{r}. (row failed)", "mount": type(e).__name__, "base": "", "ratio": "",
                                "goal": "", "result": "FAIL"})
                b.details.append(f"- row {r} failed: {str(e)[:500]!r}")
                for m in list(reversed(_MOUNTS)):  # leave nothing of the failed row behind
                    m.close()
                for cg in list(reversed(_CGROUPS)):
                    cg.remove()
        facts = machine_facts(Path(args.data), load0, bin_mtime)
    finally:
        cleanup(root)
    elapsed = time.monotonic() - t0

    cmd = "sudo .venv/bin/python tests/bench/read_patterns.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    files = []
    if {1, 2} & set(rows):
        c = b.ckpt2()
        files.append(f"rows 1-2: {c.name}, {c.stat().st_size / GiB:.2f} GiB, {len(gen.tensor_ranges(c))} tensors, "
                     f"--ram-cache {args.budget / GiB:g} GiB")
    if {3, 4} & set(rows):
        c = b.ckpt4()
        files.append(f"rows 3-4: {c.name}, {c.stat().st_size / GiB:.2f} GiB, {len(gen.tensor_ranges(c))} tensors, "
                     f"--ram-cache {args.stream_budget / GiB:g} GiB")
    lines = [
        "# Read patterns benchmark results (`tests/bench/read_patterns.py`)",
        "",
        "(The acceptance benchmark: loaders on a fast and a throttled slow source: `sudo .venv/bin/python",
        "tests/bench/acceptance.py [--quick]`, results in tests/bench/results/acceptance/full-run.md.)",
        "",
        f"- command: `{cmd.strip()}` (rows {','.join(map(str, rows))}; {elapsed:.0f} s)",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        *facts,
        *(f"- file, {f}" for f in files),
        f"- median of {args.reps} passes unless said otherwise (row 4: {args.reps4} x {args.passes} passes per case)",
        f"- peak daemon RSS (VmHWM, max over mounts): {max(b.hwms, default=0) / MiB:.0f} MiB",
        "",
        "| row | tierfs | baseline | ratio | goal | result |",
        "|---|---:|---:|---:|---|---|",
        *(f"| {r['name']} | {r['mount']} | {r['base']} | {r['ratio']} | {r['goal']} | {r['result']} |" for r in b.table),
        "",
        "Ratios are tierfs / baseline for throughputs and stall shares, baseline / tierfs for times.",
        "Baselines: the source file read directly (rows 1, 3), from the page cache (row 2), by a",
        "reader whose memory cgroup is limited to the budget (row 4).",
        "",
        "Details:",
        "",
        *b.details,
        "",
        "All passes:",
        "",
        *(f"- {k}: {', '.join(f'{x:.1f}' if x < 100 else f'{x:.0f}' for x in v)}" for k, v in b.passes.items()),
        "",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if out:
        machine.write_results(out, text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; mounts and cgroups removed", file=sys.stderr)
        sys.exit(130)
