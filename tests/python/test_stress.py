"""Concurrency stress: 32 readers, live resizes/drops and source rewrites, every byte verified.

Setup (budget B = 64 MiB, data >= 8 x B):
  * 3 static model files (DiT bf16, DiT fp8/bf16, Flux scaled-fp8), generated once into
    $TIERFS_TEST_DATA/stress and linked into a fresh source directory, plus
  * 1 mutable model file, ``live.safetensors``, replaced atomically (``mv`` over it) every few
    seconds with a new version (new content; the size alternates between two Flux/DiT layouts).
    Each version is written to a store directory first and hard-linked into the source, so the
    store file *is* that version's bytes; a registry (JSON lines) records when each version
    became visible.
Load, for TIERFS_STRESS_SECONDS (default 45):
  * 32 reader processes: 8 each of pread-random, pread-sequential, mmap-random, mmap-sequential.
    Each repeatedly opens a file (sessions of 1-4 s), reads, and compares every returned byte
    with the expected content. For the mutable file the handle's candidate versions are those
    visible at some time in [open start - 1.1 s (attribute timeout), open end]; every read
    narrows the set to the versions it matches, and an empty set is an error - so all reads of
    one handle must come from ONE version (the one it opened) and never mix versions.
    Readers are processes so that a SIGBUS from an mmap cannot take the test (and its mount
    cleanup) down; a reader killed by a signal is an error.
  * a control thread: ``ram-cache`` to a random size in [B/2, B] or ``drop``, every 150-500 ms.
  * a rewriter thread (the mutable file, every 2-4 s).
  * a sampler: daemon VmRSS every 100 ms, cache.used_bytes every 500 ms.
Watchdog: no reader progress for 30 s, or one read/open/control write taking > 20 s, fails the
test with the daemon's thread stacks (/proc/PID/task/*/stack, wchan) and kills the daemon.
Asserts: no wrong bytes, no errors, daemon alive, VmHWM and max VmRSS <= B + 64 MiB,
cache.used_bytes <= B. A row goes to tests/bench/results/stress/stress.md.
"""

from __future__ import annotations

import datetime
import json
import mmap
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

import gen
from conftest import REPO, MiB, GiB, is_mounted, proc_status_kib

DURATION = float(os.environ.get("TIERFS_STRESS_SECONDS", "45"))

BUDGET = 64 * MiB
# The daemon's memory: the budget and 64 MiB for everything else, plus the io_uring transport's
# ring buffers where it serves (`transport.buffer_bytes`: docs/CONFIGURATION.md).
RSS_BASE_BOUND = BUDGET + 64 * MiB
SETTLE = 1.1            # attribute/entry timeout of the mount (1 s) + margin
NO_PROGRESS_S = 30.0
MAX_OP_S = 20.0
STORE_KEEP_S = 90.0     # superseded versions' store files are deleted after this
KINDS = ("pread-random", "pread-seq", "mmap-random", "mmap-seq")
N_READERS = 32
LIVE = "live.safetensors"

# Static files: (name, specs). About 600 MiB together.
STATIC = [
    ("dit_bf16.safetensors", lambda: gen.dit_specs(1024, 4096, 6, ("BF16",))),
    ("dit_fp8.safetensors", lambda: gen.dit_specs(1536, 6144, 4, ("F8_E4M3", "BF16"))),
    ("flux_fp8.safetensors", lambda: gen.flux_specs(768, 4, 8)),
]
# The mutable file alternates between these two layouts (different sizes).
LIVE_SPECS = [gen.flux_specs(512, 3, 6), gen.dit_specs(768, 3072, 5, ("F8_E4M3", "BF16"))]

# Per-reader shared slots (doubles).
(F_READS, F_BYTES, F_ERRS, F_PROGRESS, F_OPSTART, F_OPENS, F_FILE, F_OFF, F_LEN, F_LIVE_HANDLES,
 F_MAXOP) = range(11)
NF = 11
MAXV = 8192


def _results_path() -> Path:
    p = Path(os.environ.get("TIERFS_STRESS_RESULTS", REPO / "tests" / "bench" / "results" / "stress" / "stress.md"))
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def _spec_size(specs) -> int:
    # write_streaming's layout: 8 + padded header + data.
    header: dict = {"__metadata__": {"format": "pt", "generator": "tierfs-tests-stream"}}
    off = 0
    for s in specs:
        n = gen.nbytes(s)
        header[s[0]] = {"dtype": s[1], "shape": list(s[2]), "data_offsets": [off, off + n]}
        off += n
    hj = json.dumps(header, separators=(",", ":")).encode()
    return 8 + len(hj) + (-len(hj) % 8) + off


# ----------------------------------------------------------------------------- registry

class Registry:
    """Versions of the mutable file, as JSON lines: {"v", "path", "size", "t_b"} written before
    the mv, then {"v", "t_a"} after it. Readers (other processes) re-read it at each open."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.path.write_text("")

    def begin(self, v: int, store: Path, size: int) -> None:
        self._append({"v": v, "path": str(store), "size": size, "t_b": time.monotonic()})

    def end(self, v: int) -> None:
        self._append({"v": v, "t_a": time.monotonic()})

    def _append(self, rec: dict) -> None:
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()


def read_registry(path: str) -> dict[int, dict]:
    out: dict[int, dict] = {}
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # a line being written
            r = json.loads(line)
            out.setdefault(r["v"], {}).update(r)
    return out


def candidates(reg: dict[int, dict], t0: float, t1: float) -> list[int]:
    """Versions visible at some time in [t0 - SETTLE, t1]."""
    res = []
    for v in sorted(reg):
        r = reg[v]
        if r["t_b"] > t1:
            continue
        nxt = reg.get(v + 1)
        if nxt is not None and "t_a" in nxt and nxt["t_a"] < t0 - SETTLE:
            continue
        res.append(v)
    return res


# ----------------------------------------------------------------------------- reader process

def _first_diff(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    if a[:n] == b[:n]:
        return n if len(a) != len(b) else -1
    while hi - lo > 1:  # binary search on prefixes
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def reader_main(idx: int, kind: str, files: list[dict], mnt: str, reg_path: str, live_min: int,
                deadline: float, stop, slots, vseen, err_dir: str) -> None:
    errfile = Path(err_dir) / f"reader-{idx:02d}.txt"
    nerr_written = 0
    base = idx * NF
    rng = random.Random(0x5EED + idx * 7919)
    static_maps: dict[str, mmap.mmap] = {}
    for f in files:
        if not f["mutable"]:
            with open(f["expected"], "rb") as fh:
                static_maps[f["rel"]] = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)

    def error(msg: str) -> None:
        nonlocal nerr_written
        slots[base + F_ERRS] += 1
        if nerr_written < 20:
            nerr_written += 1
            with open(errfile, "a") as fh:
                fh.write(f"[{time.monotonic():.3f}] reader {idx} ({kind}): {msg}\n")

    try:
        while not stop.value and time.monotonic() < deadline:
            fi = rng.randrange(len(files))
            f = files[fi]
            rel, path = f["rel"], os.path.join(mnt, f["rel"])
            slots[base + F_FILE] = fi
            slots[base + F_OFF] = -1
            slots[base + F_LEN] = 0
            t0 = time.monotonic()
            slots[base + F_OPSTART] = t0
            fd = os.open(path, os.O_RDONLY)
            t1 = time.monotonic()
            cands: dict[int, mmap.mmap] = {}
            if f["mutable"]:
                reg = read_registry(reg_path)
                for v in candidates(reg, t0, t1):
                    try:
                        with open(reg[v]["path"], "rb") as fh:
                            cands[v] = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
                    except FileNotFoundError:
                        pass
                slots[base + F_LIVE_HANDLES] += 1
            else:
                cands[0] = static_maps[rel]
            all_cands = dict(cands)
            mm = None
            try:
                size = os.fstat(fd).st_size
                if kind.startswith("mmap"):
                    length = live_min if f["mutable"] else size
                    mm = mmap.mmap(fd, length, prot=mmap.PROT_READ)
                    limit = length
                else:
                    limit = size
                slots[base + F_OPSTART] = 0
                slots[base + F_PROGRESS] = time.monotonic()
                slots[base + F_OPENS] += 1
                sess_end = time.monotonic() + rng.uniform(1.0, 4.0)
                seq = kind.endswith("seq")
                pos = 0 if rng.random() < 0.3 else rng.randrange(limit)
                while not stop.value and time.monotonic() < min(sess_end, deadline):
                    if seq:
                        n = rng.choice((64 << 10, 256 << 10, 1 << 20, 2 << 20))
                        if pos >= limit:
                            pos = 0
                        off = pos
                    else:
                        r = rng.random()
                        n = (rng.randint(1, 4096) if r < 0.3 else
                             rng.randint(4096, 256 << 10) if r < 0.7 else rng.randint(256 << 10, 2 << 20))
                        off = rng.randrange(limit)
                    if mm is not None:
                        n = min(n, limit - off)
                    slots[base + F_OFF] = off
                    slots[base + F_LEN] = n
                    op_start = time.monotonic()
                    slots[base + F_OPSTART] = op_start
                    got = mm[off:off + n] if mm is not None else os.pread(fd, n, off)
                    slots[base + F_OPSTART] = 0
                    slots[base + F_MAXOP] = max(slots[base + F_MAXOP], time.monotonic() - op_start)
                    pos = off + max(len(got), 1)
                    keep = {v: e for v, e in cands.items() if e[off:off + len(got)] == got
                            and (mm is not None or len(got) == min(n, max(0, len(e) - off)))}
                    if not keep:
                        # Diagnose: which known version (if any) this read matches, where it differs.
                        detail = []
                        for v, e in all_cands.items():
                            exp = e[off:off + n] if mm is not None else e[off:off + n]
                            detail.append(f"v{v}: first diff at +{_first_diff(got, exp)} "
                                          f"(expected {len(exp)} B)")
                        other = ""
                        if f["mutable"]:
                            reg = read_registry(reg_path)
                            for v in sorted(reg):
                                try:
                                    with open(reg[v]["path"], "rb") as fh:
                                        e = fh.read()
                                except FileNotFoundError:
                                    continue
                                if e[off:off + len(got)] == got:
                                    other += f" matches v{v};"
                            other += " registry: " + ", ".join(
                                f"v{v} t_b={reg[v]['t_b']:.3f} t_a={reg[v].get('t_a', float('nan')):.3f}"
                                for v in sorted(reg) if v in all_cands or v - 1 in all_cands or v + 1 in all_cands)
                        error(f"WRONG BYTES {rel} off={off} len={n} got={len(got)} B via "
                              f"{'mmap' if mm is not None else 'pread'}; open window "
                              f"[{t0:.3f},{t1:.3f}] fstat size={size}; candidates still "
                              f"consistent before this read: {sorted(cands)}; "
                              f"vs all candidates at open: {'; '.join(detail)};{other}")
                        break
                    cands = keep
                    slots[base + F_READS] += 1
                    slots[base + F_BYTES] += len(got)
                    slots[base + F_PROGRESS] = time.monotonic()
                if f["mutable"] and len(cands) == 1:
                    v = next(iter(cands))
                    if v < MAXV:
                        vseen[v] = 1
            finally:
                slots[base + F_OPSTART] = 0
                if mm is not None:
                    mm.close()
                os.close(fd)
                for v, e in all_cands.items():
                    if f["mutable"]:
                        e.close()
    except BaseException:  # noqa: BLE001 - reported by the parent
        error("exception:\n" + traceback.format_exc())
        os._exit(3)
    os._exit(0)


# ----------------------------------------------------------------------------- test

def _make_static(data_dir: Path) -> list[Path]:
    d = data_dir / "stress"
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for i, (name, specs) in enumerate(STATIC):
        p = d / name
        if not p.exists():
            gen.write_streaming(p, specs(), seed=500 + i)
        out.append(p)
    return out


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        os.symlink(src, dst)


def _dump_daemon(pid: int) -> str:
    lines = [f"daemon pid {pid} threads:"]
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError as e:
        return f"daemon pid {pid}: {e}"
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"

        def rd(n):
            try:
                with open(f"{base}/{n}") as fh:
                    return fh.read().strip()
            except OSError as e:
                return f"<{e.strerror}>"
        stat = rd("stat")
        state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
        lines.append(f"-- tid {tid} comm={rd('comm')} state={state} wchan={rd('wchan')}")
        stack = rd("stack")
        if stack:
            lines.extend("     " + s for s in stack.splitlines())
    return "\n".join(lines)


def _majflt(pid: int) -> int:
    """Major page faults of `pid` so far (-1 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[9])
    except (OSError, IndexError, ValueError):
        return -1


def _proc_brief(pid: int) -> str:
    def rd(n):
        try:
            with open(f"/proc/{pid}/{n}") as fh:
                return fh.read().strip()
        except OSError as e:
            return f"<{e.strerror}>"
    return f"wchan={rd('wchan')} stack={' | '.join(rd('stack').splitlines()[:6])}"


def test_stress_readers_resizes_rewrites(mount, data_dir, workdir, tierfs_bin):
    static = _make_static(data_dir)
    src = workdir / "src"
    store = workdir / "store"
    src.mkdir()
    store.mkdir()
    for p in static:
        _link(p, src / p.name)
    reg = Registry(workdir / "registry.jsonl")
    err_dir = workdir / "errors"
    err_dir.mkdir()
    live_sizes = [_spec_size(s) for s in LIVE_SPECS]
    live_min = min(live_sizes)

    def write_version(v: int) -> Path:
        p = store / f"v{v}.safetensors"
        gen.write_streaming(p, LIVE_SPECS[v % 2], seed=10_000 + v)
        assert p.stat().st_size == live_sizes[v % 2]
        return p

    p0 = write_version(0)
    reg.begin(0, p0, p0.stat().st_size)
    _link(p0, src / LIVE)
    reg.end(0)
    data_bytes = sum(p.stat().st_size for p in static) + p0.stat().st_size
    assert data_bytes >= 8 * BUDGET, f"data {data_bytes / MiB:.0f} MiB < 8 x budget"

    m = mount(src, f"{BUDGET // MiB}MiB")
    m.rearm_watchdog(DURATION + 600)
    pid = m.pid
    files = [{"rel": p.name, "mutable": False, "expected": str(p)} for p in static]
    files.append({"rel": LIVE, "mutable": True, "expected": None})

    ctx = multiprocessing.get_context("fork")
    slots = ctx.RawArray("d", N_READERS * NF)
    vseen = ctx.RawArray("b", MAXV)
    stop = ctx.RawValue("b", 0)
    t_start = time.monotonic() + 0.5
    deadline = t_start + DURATION
    for i in range(N_READERS):
        slots[i * NF + F_PROGRESS] = t_start
    procs = []
    for i in range(N_READERS):
        kind = KINDS[i % len(KINDS)]
        pr = ctx.Process(target=reader_main, name=f"reader-{i}-{kind}",
                         args=(i, kind, files, str(m.mnt), str(reg.path), live_min, deadline, stop,
                               slots, vseen, str(err_dir)), daemon=True)
        pr.start()
        procs.append((pr, kind))

    errors: list[str] = []
    counts = {"resizes": 0, "drops": 0, "rewrites": 0}
    ctl_state = {"op_start": 0.0, "what": ""}
    sample = {"rss_max": 0, "cache_max": 0, "n_rss": 0, "n_stats": 0}
    halt = threading.Event()

    def control():
        rng = random.Random(42)
        ctl = m.mnt / ".tierfs" / "control"
        while not halt.is_set() and time.monotonic() < deadline:
            halt.wait(rng.uniform(0.15, 0.5))
            if halt.is_set():
                break
            if rng.random() < 0.7:
                cmd, key = f"ram-cache {rng.randint(BUDGET // MiB // 2, BUDGET // MiB)}MiB", "resizes"
            else:
                cmd, key = "drop", "drops"
            ctl_state["what"], ctl_state["op_start"] = cmd, time.monotonic()
            try:
                fd = os.open(ctl, os.O_WRONLY)
                try:
                    os.write(fd, cmd.encode())
                finally:
                    os.close(fd)
                counts[key] += 1
            except OSError as e:
                errors.append(f"control {cmd!r}: {e!r}")
            finally:
                ctl_state["op_start"] = 0.0

    def rewriter():
        rng = random.Random(43)
        v = 0
        while not halt.is_set() and time.monotonic() < deadline:
            halt.wait(rng.uniform(2.0, 4.0))
            if halt.is_set() or time.monotonic() >= deadline:
                break
            v += 1
            try:
                p = write_version(v)
                tmp = src / f".{LIVE}.tmp"
                os.link(p, tmp)
                reg.begin(v, p, p.stat().st_size)
                os.replace(tmp, src / LIVE)  # mv over it
                reg.end(v)
                counts["rewrites"] += 1
                # Delete store files of versions superseded long ago (no handle can pick them).
                r = read_registry(str(reg.path))
                now = time.monotonic()
                for old in sorted(r):
                    nxt = r.get(old + 1, {})
                    if "t_a" in nxt and nxt["t_a"] < now - STORE_KEEP_S:
                        Path(r[old]["path"]).unlink(missing_ok=True)
            except Exception as e:  # noqa: BLE001
                errors.append(f"rewriter v{v}: {e!r}")

    def sampler():
        k = 0
        while not halt.is_set():
            try:
                rss = proc_status_kib(pid, "VmRSS") * 1024
                sample["rss_max"] = max(sample["rss_max"], rss)
                sample["n_rss"] += 1
                if k % 5 == 0:
                    with open(m.mnt / ".tierfs" / "stats", "rb") as fh:
                        st = json.loads(fh.read())
                    sample["cache_max"] = max(sample["cache_max"], st["cache"]["used_bytes"])
                    sample["n_stats"] += 1
            except Exception as e:  # noqa: BLE001
                if m.alive():
                    errors.append(f"sampler: {e!r}")
            k += 1
            halt.wait(0.1)

    threads = [threading.Thread(target=t, daemon=True, name=t.__name__) for t in (control, rewriter, sampler)]
    for t in threads:
        t.start()

    def totals():
        return {k: int(sum(slots[i * NF + f] for i in range(N_READERS)))
                for k, f in (("reads", F_READS), ("bytes", F_BYTES), ("errors", F_ERRS),
                             ("opens", F_OPENS), ("live_handles", F_LIVE_HANDLES))}

    # An mmap read of a 2 MiB random range that the kernel serves as 512 synchronous 4 KiB faults
    # (it stops reading ahead for a mapping that misses a lot) is slow under this load, but not
    # stuck: it counts as progressing while its reader's major-fault count keeps rising.
    fault_seen: dict[int, tuple[int, float]] = {}

    def faults_moved(i: int, now: float) -> bool:
        n = _majflt(procs[i][0].pid)
        last = fault_seen.get(i)
        if last is None or n != last[0]:
            fault_seen[i] = (n, now)
            return last is not None
        return now - last[1] <= MAX_OP_S

    hang = None
    last_report = time.monotonic()
    while True:
        time.sleep(0.2)
        now = time.monotonic()
        running = [pr for pr, _ in procs if pr.is_alive()]
        if not running:
            break
        last_prog = max(slots[i * NF + F_PROGRESS] for i in range(N_READERS))
        if now - last_prog > NO_PROGRESS_S:
            hang = f"no reader made progress for {now - last_prog:.1f} s"
        for i in range(N_READERS):
            s0 = slots[i * NF + F_OPSTART]
            if s0 and faults_moved(i, now):
                continue
            if s0 and now - s0 > MAX_OP_S:
                fi = int(slots[i * NF + F_FILE])
                hang = (f"reader {i} ({procs[i][1]}) stuck {now - s0:.1f} s in one operation on "
                        f"{files[fi]['rel']} off={int(slots[i * NF + F_OFF])} len={int(slots[i * NF + F_LEN])}")
                break
        if ctl_state["op_start"] and now - ctl_state["op_start"] > MAX_OP_S:
            hang = f"control write {ctl_state['what']!r} stuck {now - ctl_state['op_start']:.1f} s"
        if not m.alive():
            hang = hang or f"daemon exited with {m.proc.returncode}"
        if hang:
            break
        if now > deadline + 60:
            hang = "readers did not stop 60 s after the deadline"
            break
        if now - last_report > 60:
            last_report = now
            t = totals()
            print(f"\n[stress] t={now - t_start:.0f}s reads={t['reads']} {t['bytes'] / GiB:.2f} GiB "
                  f"errors={t['errors']} rss_max={sample['rss_max'] / MiB:.1f} MiB "
                  f"resizes={counts['resizes']} drops={counts['drops']} rewrites={counts['rewrites']}",
                  flush=True)

    if hang:
        dump = _dump_daemon(pid) if m.alive() else f"(daemon gone, rc={m.proc.returncode})"
        readers = "\n".join(f"  reader {i} ({k}) alive={pr.is_alive()} {_proc_brief(pr.pid)}"
                            for i, (pr, k) in enumerate(procs))
        sys.stderr.write(f"\n[stress] HANG: {hang}\n{dump}\n")
        m.kill()
        subprocess.run(["umount", "-l", str(m.mnt)], capture_output=True)
        stop.value = 1
        halt.set()
        for pr, _ in procs:
            if pr.is_alive():
                pr.kill()
            pr.join(timeout=10)
        assert not is_mounted(m.mnt)
        t = totals()
        log = m.log_tail(4000)
        pytest.fail(f"STRESS HANG/CRASH: {hang} (after {time.monotonic() - t_start:.0f} s; reads={t['reads']}, "
                    f"{t['bytes'] / GiB:.2f} GiB verified, resizes={counts['resizes']} drops={counts['drops']} "
                    f"rewrites={counts['rewrites']})\n{dump}\nreaders:\n{readers}\ndaemon log tail:\n{log}")

    halt.set()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.monotonic() - t_start
    time.sleep(0.2)
    hwm = proc_status_kib(pid, "VmHWM") * 1024
    rss_now = proc_status_kib(pid, "VmRSS") * 1024
    st = m.stats()
    tot = totals()
    for i, (pr, kind) in enumerate(procs):
        if pr.exitcode != 0:
            sig = f" (signal {signal.Signals(-pr.exitcode).name})" if pr.exitcode and pr.exitcode < 0 else ""
            fi = int(slots[i * NF + F_FILE])
            errors.append(f"reader {i} ({kind}) exited with {pr.exitcode}{sig}; last op on "
                          f"{files[fi]['rel']} off={int(slots[i * NF + F_OFF])} len={int(slots[i * NF + F_LEN])}")
        if slots[i * NF + F_READS] == 0:
            errors.append(f"reader {i} ({kind}) made no reads")
    reader_errs = "".join(p.read_text(errors="replace") for p in sorted(err_dir.iterdir()))
    n_err = tot["errors"] + len(errors)
    versions_seen = sum(1 for v in range(MAXV) if vseen[v])
    rss_max = max(sample["rss_max"], rss_now)
    rss_bound = RSS_BASE_BOUND + st["transport"]["buffer_bytes"]
    max_op = {k: max(slots[i * NF + F_MAXOP] for i, (_, kind) in enumerate(procs) if kind == k) for k in KINDS}
    max_op_s = " / ".join(f"{max_op[k]:.1f}" for k in KINDS)

    summary = (f"[stress] duration={elapsed:.0f}s readers={N_READERS} budget={BUDGET // MiB}MiB "
               f"data={data_bytes / MiB:.0f}MiB reads={tot['reads']} opens={tot['opens']} "
               f"verified={tot['bytes'] / GiB:.2f}GiB ({tot['bytes']} B) resizes={counts['resizes']} "
               f"drops={counts['drops']} rewrites={counts['rewrites']} live-handles={tot['live_handles']} "
               f"live-versions-verified={versions_seen}/{counts['rewrites'] + 1} errors={n_err} "
               f"VmHWM={hwm / MiB:.1f}MiB maxVmRSS={rss_max / MiB:.1f}MiB (bound {rss_bound / MiB:.0f}MiB, "
               f"{sample['n_rss']} samples) max cache.used={sample['cache_max'] / MiB:.1f}MiB "
               f"cache hits={st['cache']['hits']} misses={st['cache']['misses']} "
               f"evicted={st['cache']['evicted_bytes'] / GiB:.1f}GiB "
               f"slowest read s ({' / '.join(KINDS)})={max_op_s}")
    print("\n" + summary, flush=True)
    p = _results_path()
    if not p.exists():
        p.write_text("# tierfs stress figures (tests/python/test_stress.py)\n\n"
                     "| date | duration s | reader threads | budget MiB | data MiB | reads | GiB verified | "
                     "errors | peak RSS MiB (VmHWM / max VmRSS, bound) | resizes / drops / rewrites | "
                     "slowest read s (pread-random / pread-seq / mmap-random / mmap-seq) |\n"
                     "|---|---|---|---|---|---|---|---|---|---|---|\n")
    with open(p, "a") as fh:
        fh.write(f"| {datetime.datetime.now():%Y-%m-%d %H:%M} | {elapsed:.0f} | {N_READERS} | {BUDGET // MiB} | "
                 f"{data_bytes / MiB:.0f} | {tot['reads']} | {tot['bytes'] / GiB:.2f} | {n_err} | "
                 f"{hwm / MiB:.1f} / {rss_max / MiB:.1f} (≤ {rss_bound / MiB:.0f}) | "
                 f"{counts['resizes']} / {counts['drops']} / {counts['rewrites']} | {max_op_s} |\n")

    problems = []
    if tot["errors"] or errors:
        problems.append(f"{tot['errors']} reader error(s), {len(errors)} other error(s):\n{reader_errs}"
                        + "\n".join(errors[:30]))
    if not m.alive():
        problems.append(f"daemon exited with {m.proc.returncode}")
    if hwm > rss_bound or rss_max > rss_bound:
        problems.append(f"daemon peak RSS VmHWM {hwm / MiB:.1f} MiB / max VmRSS {rss_max / MiB:.1f} MiB "
                        f"> bound {rss_bound / MiB:.0f} MiB")
    if sample["cache_max"] > BUDGET:
        problems.append(f"cache.used_bytes reached {sample['cache_max'] / MiB:.1f} MiB > max budget")
    if counts["resizes"] == 0 or counts["drops"] == 0 or counts["rewrites"] == 0:
        problems.append(f"load incomplete: {counts}")
    if versions_seen < min(2, counts["rewrites"] + 1):
        problems.append(f"only {versions_seen} version(s) of {LIVE} verified through the mount")
    assert not problems, "\n".join(problems) + f"\n{summary}\ndaemon log tail:\n{m.log_tail(3000)}"
