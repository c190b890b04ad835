"""Memory pressure: the cache budget is a ceiling, not a reservation.

A desktop's scenario scaled down: a memory cgroup of S = 1152 MiB holds the daemon with a
768 MiB budget (2/3 S); `cat` of the 1088 MiB checkpoint fills the cache; then

  (a) a second process in the same cgroup touches S/2 (3 GiB of a 6 GiB machine): it must
      succeed without any OOM kill in the cgroup, the daemon survives, reads stay bit-exact
      and the budget grows back once the process has exited;
  (b) no cgroup: a process touches memory past MemAvailable, system-wide, until the daemon has
      given back a quarter of its budget (short; the hog has oom_score_adj 1000 so that if
      anything is killed it is the hog, never another program of the machine);
  (c) a process in the cgroup keeps growing past what the cache can give: it is the OOM
      victim, not the daemon, and readers see the mount alive and bit-exact afterwards.

Every cgroup is created under the test's own memory cgroup and removed in `finally`, after
its processes are gone; hogs are killed there too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import GiB, MiB, drop_caches

S = 1152 * MiB
BUDGET = 768 * MiB
FLOOR = 256 * MiB  # the default floor for a 768 MiB budget (max(256 MiB, budget / 8))
REL = "dit_big.safetensors"

# Touches `size` bytes of fresh anonymous memory in 16 MiB steps, prints "touched N given_back G",
# holds the memory for `hold` seconds, exits 0. The bytes are random, not one repeated value: on a
# machine with compressed swap (zram, zswap) a page of one repeated byte is stored as that byte,
# so the kernel would make room for the hog out of the hog itself and never press on the cache.
# Modes:
# - "hold": as above;
# - "grow": keeps touching until `size` (exit 3 if it gets there: the OOM killer should have
#   stopped it first);
# - "until CHECK_FROM STATS WANT": past CHECK_FROM bytes it reads the mount's stats after each
#   step and stops once the daemon has given back WANT bytes, so it pushes the machine exactly
#   as far as it takes, whatever else the kernel finds to reclaim on the way. System-wide, so
#   with oom_score_adj 1000: if the machine runs out anyway, the kernel kills the hog, never
#   another program of the machine.
HOG = r"""
import ctypes, json, mmap, os, sys, time
size, hold, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if mode == "until":
    check_from, stats, want = int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
    open("/proc/self/oom_score_adj", "w").write("1000")
m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
buf = (ctypes.c_char * size).from_buffer(m)
addr = ctypes.addressof(buf)
step = 16 << 20
noise = ctypes.create_string_buffer(os.urandom(step), step)
touched = given = 0
for off in range(0, size, step):
    n = min(step, size - off)
    ctypes.memmove(addr + off, noise, n)
    touched = off + n
    if mode == "until" and touched >= check_from:
        with open(stats, "rb") as f:
            given = json.loads(f.read())["budget"]["given_back_bytes"]
        if given >= want:
            break
if mode == "grow":
    sys.exit(3)
print("touched", touched, "given_back", given, flush=True)
time.sleep(hold)
"""


def own_memory_cgroup() -> Path | None:
    """The v1 memory cgroup directory of this process, if the machine has that hierarchy."""
    root = Path("/sys/fs/cgroup/memory")
    if not (root / "memory.limit_in_bytes").exists():
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return root / path.lstrip("/")
    return None


class MemCgroup:
    """A v1 memory cgroup of `limit` bytes under this process's own."""

    def __init__(self, limit: int):
        parent = own_memory_cgroup()
        if parent is None:
            pytest.fail("no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
        self.dir = parent / f"tierfs-pressure-{os.getpid()}-{time.monotonic_ns()}"
        self.dir.mkdir()
        (self.dir / "memory.limit_in_bytes").write_text(str(limit))
        self.home = parent

    def procs(self) -> list[int]:
        return [int(p) for p in (self.dir / "cgroup.procs").read_text().split()]

    def facts(self) -> str:
        peak = int((self.dir / "memory.max_usage_in_bytes").read_text())
        failcnt = int((self.dir / "memory.failcnt").read_text())
        return f"cgroup peak usage {peak / MiB:.0f} MiB of {S / MiB:.0f}, failcnt {failcnt}"

    def oom_kills(self) -> int:
        for line in (self.dir / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    @contextmanager
    def entered(self):
        """Runs the block with this process in the cgroup, so that what it starts is born there."""
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:
            (self.home / "cgroup.procs").write_text(str(os.getpid()))

    def spawn_args(self) -> dict:
        procs = str(self.dir / "cgroup.procs")

        def enter():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        return {"preexec_fn": enter}

    def remove(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            pids = self.procs()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"cannot remove cgroup {self.dir}")


def start_hog(size: int, hold: float = 1.0, grow: bool = False, cgroup=None, until=None):
    """HOG in a child process; `until` = (check_from, stats path, want) for its "until" mode."""
    mode = "until" if until else "grow" if grow else "hold"
    args = [sys.executable, "-c", HOG, str(size), str(hold), mode, *(str(x) for x in until or ())]
    extra = cgroup.spawn_args() if cgroup else {}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **extra)


def fill_cache(m) -> dict:
    subprocess.run(["cat", str(m.mnt / REL)], stdout=subprocess.DEVNULL, check=True, timeout=120)
    st = m.stats()
    assert st["cache"]["used_bytes"] >= 0.9 * BUDGET, st["cache"]
    return st


def bit_exact(m, source: Path) -> None:
    res = subprocess.run(["cmp", str(source), str(m.mnt / REL)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"mount differs from the source: {res.stdout}{res.stderr}"


def wait_for(predicate, timeout: float, what: str, m):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = m.stats()
        if predicate(st):
            return st
        time.sleep(0.2)
    pytest.fail(f"{what} within {timeout} s; budget: {m.stats()['budget']}")


def has_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 24))
    return False


def report(name: str, st: dict, t0: float, extra: str = "") -> None:
    b = st["budget"]
    print(f"\n[pressure] {name}: {extra + ', ' if extra else ''}effective {b['effective_bytes'] / MiB:.0f} MiB of "
          f"{b['configured_bytes'] / MiB:.0f}, events {b['pressure_events']}, given back "
          f"{b['given_back_bytes'] / MiB:.0f} MiB, regrow steps {b['regrow_steps']}, "
          f"{time.monotonic() - t0:.1f} s")


@contextmanager
def cgroup_mount(mount, tree, limit: int):
    root, _ = tree
    cg = MemCgroup(limit)
    m = None
    try:
        with cg.entered():
            m = mount(root, str(BUDGET))
        assert m.pid in cg.procs(), "the daemon is not in the test cgroup"
        yield cg, m
    finally:
        if m is not None:
            m.close()
        cg.remove()


@pytest.mark.timeout(180)
def test_cgroup_allocation_takes_memory_from_the_cache(mount, tree):
    root, _ = tree
    t0 = time.monotonic()
    with cgroup_mount(mount, tree, S) as (cg, m):
        st = fill_cache(m)
        assert st["budget"]["effective_bytes"] == BUDGET
        assert any(w.startswith("cgroup v1 ") for w in st["budget"]["watching"]), st["budget"]
        t_hog = time.monotonic()
        hog = start_hog(S // 2, hold=1.0, cgroup=cg)
        try:
            out, err = hog.communicate(timeout=60)
        finally:
            hog.kill()
        t_calm = time.monotonic()
        hog_s = t_calm - t_hog
        assert hog.returncode == 0 and "touched" in out, f"allocation failed: rc {hog.returncode} {err}"
        assert cg.oom_kills() == 0
        facts = f"hog {S // 2 / MiB:.0f} MiB touched and held in {hog_s:.1f} s, {cg.facts()}"
        assert m.alive(), m.log_tail()
        st = m.stats()
        shrunk = st["budget"]["effective_bytes"]
        assert st["budget"]["pressure_events"] >= 1 and st["budget"]["given_back_bytes"] > 0, st["budget"]
        assert FLOOR <= shrunk < BUDGET, st["budget"]
        # The hog is gone: after the calm period the budget grows back to the configured one.
        st = wait_for(lambda s: s["budget"]["effective_bytes"] == BUDGET, 40, "no regrowth", m)
        facts += f", shrunk to {shrunk / MiB:.0f} MiB, regrown {time.monotonic() - t_calm:.1f} s after the hog exited"
        assert st["budget"]["regrow_steps"] >= 1 and st["budget"]["pressure_limit_bytes"] is None
        bit_exact(m, root / REL)
        st = fill_cache(m)
        report("cgroup", st, t0, facts)


@pytest.mark.timeout(180)
def test_a_hog_growing_past_the_floor_is_the_oom_victim(mount, tree):
    root, _ = tree
    t0 = time.monotonic()
    with cgroup_mount(mount, tree, S) as (cg, m):
        fill_cache(m)
        hog = start_hog(2 * S, grow=True, cgroup=cg)
        try:
            hog.communicate(timeout=90)
        finally:
            hog.kill()
        assert hog.returncode == -signal.SIGKILL, f"the hog was not OOM-killed (rc {hog.returncode})"
        assert cg.oom_kills() >= 1
        assert m.alive(), f"the daemon died: {m.log_tail()}"
        st = m.stats()
        assert st["budget"]["effective_bytes"] == FLOOR, st["budget"]
        adj = int(Path(f"/proc/{m.pid}/oom_score_adj").read_text())
        assert adj == (-500 if has_sys_resource() else 0), adj
        assert st["budget"]["oom_score_adj"] == adj
        bit_exact(m, root / REL)
        report("hog past the floor", st, t0, f"oom_score_adj {adj}, {cg.facts()}")


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable")


@pytest.mark.timeout(240)
def test_system_wide_allocation_takes_memory_from_the_cache(mount, tree):
    root, _ = tree
    t0 = time.monotonic()
    m = mount(root, str(BUDGET))
    fill_cache(m)
    # How far past what is free a program must go before the kernel has nothing left to reclaim
    # but the cache is not knowable in advance: MemAvailable is an estimate, and a hog sized
    # from it (MemAvailable + half the budget) took 146 MiB from the cache in one run and
    # nothing in another, the kernel having found the rest elsewhere. So the hog goes on in
    # 16 MiB steps past MemAvailable less a quarter of the budget until the daemon has given
    # back a quarter of its budget, up to MemAvailable + the whole budget: a daemon that gives
    # nothing back fails the test (the hog ends with less given back, or is killed).
    # The hog may go up to MemAvailable + the whole budget + the daemon's system reserve: the
    # daemon acts once MemAvailable is within that reserve.
    drop_caches()
    before = memory_facts()
    available = mem_available()
    want = BUDGET // 4
    size = available + BUDGET + system_reserve()
    hog = start_hog(size, until=(available - BUDGET // 4, m.mnt / ".tierfs" / "stats", want))
    try:
        out, err = hog.communicate(timeout=180)
    finally:
        hog.kill()
    facts = f"memory before: {before}; after: {memory_facts()}"
    assert hog.returncode == 0 and "touched" in out, \
        f"allocation up to {size / GiB:.1f} GiB failed: rc {hog.returncode} {err}; {facts}"
    assert m.alive(), m.log_tail()
    st = m.stats()
    assert st["budget"]["pressure_events"] >= 1 and st["budget"]["given_back_bytes"] >= want, \
        f"hog: {out.strip()}; budget: {st['budget']}; {facts}"
    bit_exact(m, root / REL)
    st = wait_for(lambda s: s["budget"]["effective_bytes"] == BUDGET, 40, "no regrowth", m)
    touched = int(out.split()[1])
    report(f"system-wide, hog {touched / GiB:.1f} GiB ({(touched - available) / MiB:+.0f} MiB past MemAvailable)",
           st, t0)


def system_reserve() -> int:
    """The daemon's system-wide reserve (`reserve_for` in core/src/budget/probe.rs)."""
    return min(max(mem_total() // 16, 128 * MiB), 512 * MiB)


def memory_facts() -> str:
    """The /proc/meminfo lines that say where a hog's memory can come from, and the swap devices."""
    keys = ("MemTotal", "MemFree", "MemAvailable", "Cached", "Shmem", "AnonPages", "SwapTotal", "SwapFree")
    lines = [ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.split(":")[0] in keys]
    swaps = Path("/proc/swaps").read_text().splitlines()[1:]
    return ", ".join(" ".join(ln.split()[:2]) for ln in lines) + f", swaps {[s.split()[0] for s in swaps]}"


def mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


@pytest.mark.timeout(60)
def test_a_budget_the_machine_cannot_hold_is_clamped(mount, tree, tierfs_bin):
    root, _ = tree
    m = mount(root, "100TiB")
    st = m.stats()
    total = mem_total()
    b = st["budget"]
    # RAM minus the reserve (a sixteenth, 128–512 MiB), or less under a memory cgroup's limit.
    assert b["configured_bytes"] <= total - min(max(total // 16, 128 * MiB), 512 * MiB), b
    assert st["cache"]["budget_bytes"] == b["effective_bytes"] == b["configured_bytes"]
    sentence = [line for line in m.log_tail(20000).splitlines() if "--ram-cache 100.00 TiB" in line]
    assert len(sentence) == 1 and "more than this machine can hold" in sentence[0], m.log_tail()
    shown = subprocess.run([str(tierfs_bin), "stats", str(m.mnt)], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    budget_line = next(line for line in shown.stdout.splitlines() if line.startswith("budget "))
    assert "configured" in budget_line and "floor" in budget_line, shown.stdout
    assert any(line.startswith("pressure ") for line in shown.stdout.splitlines()), shown.stdout
