"""Fixtures for tierfs end-to-end tests.

Everything lives under one session root in /tmp (``$TIERFS_TEST_ROOT`` if set,
e.g. by tests/run.sh, else a fresh ``mkdtemp``).  Large generated checkpoints
are session-scoped; set ``TIERFS_TEST_DATA=/some/dir`` to keep and reuse them
across sessions while developing.

Disk hygiene: a directory made with :func:`fresh_dir` belongs to what made it: made by a test
or a function-scoped fixture, it is removed after the test; by a module- or class-scoped
fixture, after the module; by a session-scoped one (the generated checkpoints), at the end. So
the session's files are the shared data plus one test's, on a machine whose disk may be small.

Mount hygiene: every mount goes through :class:`Mount`, whose teardown
SIGTERMs the daemon, waits, and ``umount -l``s the mountpoint if it is still
mounted.  A session finalizer (also registered with ``atexit``) unmounts
anything still mounted under the session root and kills leftover daemons.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import gen  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TIERFS_BIN = Path(os.environ.get("TIERFS_BIN", REPO / "target" / "release" / "tierfs"))
FAULTFS_BIN = Path(os.environ.get("FAULTFS_BIN", REPO / "target" / "release" / "faultfs"))
MiB = 1 << 20
GiB = 1 << 30
# A mount older than this is presumed hung: the watchdog SIGKILLs its daemon and lazily
# unmounts it, so blocked syscalls in the test fail (ENOTCONN) instead of hanging CI.
MOUNT_WATCHDOG_S = float(os.environ.get("TIERFS_MOUNT_WATCHDOG_S", "600"))
BIG_BYTES = int(os.environ.get("TIERFS_TEST_BIG_BYTES", str(GiB + 64 * MiB)))
# The loader checks' largest file (tests/python/test_loaders.py): at least 2 GiB, the size of a small real checkpoint.
BIG2_BYTES = int(os.environ.get("TIERFS_TEST_BIG2_BYTES", str(2 * GiB)))


def _pick_tmp() -> Path:
    """/tmp unless it is tmpfs (page-cache bounds are meaningless there)."""
    for cand in ("/tmp", "/var/tmp"):
        try:
            out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", cand],
                                 capture_output=True, text=True).stdout.strip()
        except FileNotFoundError:
            out = ""
        if out != "tmpfs":
            return Path(cand)
    return Path("/tmp")


if os.environ.get("TIERFS_TEST_ROOT"):
    SESSION_ROOT = Path(os.environ["TIERFS_TEST_ROOT"])
    SESSION_ROOT.mkdir(parents=True, exist_ok=True)
    _OWN_ROOT = False
else:
    SESSION_ROOT = Path(tempfile.mkdtemp(prefix="tierfs-tests.", dir=_pick_tmp()))
    _OWN_ROOT = True

_PROCS: list[subprocess.Popen] = []


# ----------------------------------------------------------------------------- mounts

def mounted_under(root: Path) -> list[str]:
    """Mountpoints in /proc/mounts at or under `root` (deepest first)."""
    res = []
    root_s = str(root.resolve())
    with open("/proc/mounts") as f:
        for line in f:
            mp = line.split()[1].encode().decode("unicode_escape")
            if mp == root_s or mp.startswith(root_s + "/"):
                res.append(mp)
    return sorted(res, key=len, reverse=True)


def is_mounted(mp: Path) -> bool:
    return str(Path(mp).resolve()) in mounted_under(mp)


def _safety_net() -> None:
    for p in _PROCS:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in _PROCS:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
    for mp in mounted_under(SESSION_ROOT):
        subprocess.run(["umount", "-l", mp], capture_output=True)
    for p in _PROCS:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)


def _atexit() -> None:
    _safety_net()
    if _OWN_ROOT and not mounted_under(SESSION_ROOT) and not os.environ.get("TIERFS_KEEP_TMP"):
        shutil.rmtree(SESSION_ROOT, ignore_errors=True)


atexit.register(_atexit)


def _on_sigterm(signum: int, _frame) -> None:
    """SIGTERM (a CI job's timeout, `kill`) skips ``atexit``: unmount and stop the daemons first,
    then die of the signal as before."""
    _safety_net()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


signal.signal(signal.SIGTERM, _on_sigterm)


# The fuse module's switch of its io_uring transport (Linux 6.14 and later).
ENABLE_URING = Path("/sys/module/fuse/parameters/enable_uring")


def fusectl() -> Path:
    """The fusectl file system's directory (a connection's `abort` is in its subdirectory named
    after the mount's minor device number), mounted first where nothing mounted it (a machine
    without systemd's `sys-fs-fuse-connections.mount`)."""
    ctl = Path("/sys/fs/fuse/connections")
    if ctl.is_dir() and not any(ctl.iterdir()):
        subprocess.run(["mount", "-t", "fusectl", "none", str(ctl)], capture_output=True, timeout=30)
    return ctl


def abort_fuse_connection(mnt: Path) -> bool:
    """Aborts the FUSE connection of the mount at `mnt` through fusectl, which fails every
    request in flight (ENOTCONN) and frees every thread blocked on one, even when the daemon
    is a zombie kept alive by a thread in uninterruptible sleep. Reads /proc/self/mountinfo,
    never the (possibly hung) mount itself."""
    ctl = fusectl()
    target = os.path.abspath(mnt)  # not resolve(): that would stat the hung mount
    aborted = False
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            mp = fields[4].encode().decode("unicode_escape")
            if mp == target and fields[sep + 1].startswith("fuse"):
                minor = fields[2].split(":")[1]
                try:
                    (ctl / minor / "abort").write_text("1")
                    aborted = True
                except OSError:
                    pass
    return aborted


# The scopes of the fixtures being set up now (innermost last), and whether a test runs:
# whose a fresh_dir() is (see "Disk hygiene" above).
_FIXTURE_SCOPES: list[str] = []
_IN_TEST = False
_TEST_DIRS: list[Path] = []
_MODULE_DIRS: list[Path] = []


def fresh_dir(name: str) -> Path:
    """A new directory under the session root, removed when what made it ends."""
    d = Path(tempfile.mkdtemp(prefix=name + ".", dir=SESSION_ROOT))
    scope = _FIXTURE_SCOPES[-1] if _FIXTURE_SCOPES else ("function" if _IN_TEST else "session")
    if scope == "function":
        _TEST_DIRS.append(d)
    elif scope in ("class", "module"):
        _MODULE_DIRS.append(d)
    return d


@contextlib.contextmanager
def weed_store(name: str, before_close=None, **kwargs):
    """A SeaweedFS store (tests/bench/netstore.py `WeedStore(**kwargs)`) in a fresh folder
    `name`: started (a store that does not start fails the test), closed when the block ends,
    and checked gone then: its client unmounted, its namespace removed, none of its processes
    left. `before_close(store)` runs first (a quicker stop of a store whose data is thrown
    away)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import netstore
    netstore.clean_stale()
    try:
        store = netstore.WeedStore(fresh_dir(name), **kwargs)
    except RuntimeError as e:
        pytest.fail(f"the SeaweedFS store did not start: {e}")
    ns = store.ns.name
    try:
        yield store
    finally:
        try:
            if before_close is not None:
                before_close(store)
        finally:
            store.close()
    assert not is_mounted(store.mnt)
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for p in (store.server, store.proxy, store.client):
        assert p is None or p.poll() is not None, "a store process outlived the fixture"


def _remove_dirs(dirs: list[Path]) -> None:
    """Removes `dirs`, but none with something mounted at or under it (the session guard
    reports those) and none while TIERFS_KEEP_TMP is set."""
    while dirs:
        d = dirs.pop()
        if not os.environ.get("TIERFS_KEEP_TMP") and not mounted_under(d):
            shutil.rmtree(d, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    _FIXTURE_SCOPES.append(fixturedef.scope)
    yield
    _FIXTURE_SCOPES.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _IN_TEST
    _IN_TEST = True
    yield
    _IN_TEST = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # every fixture of the test is torn down (and a module's, when it was the last)
    _remove_dirs(_TEST_DIRS)
    if nextitem is None or nextitem.module is not item.module:
        _remove_dirs(_MODULE_DIRS)


def _on_the_suites_disk(path: Path) -> bool:
    """Whether `path` is on the file system the suite's files live on (not a test's own
    source: a loop device, faultfs, a network store, tmpfs)."""
    try:
        return os.stat(path).st_dev == os.stat(SESSION_ROOT).st_dev
    except OSError:
        return False


class Mount:
    """A running `tierfs mount`.  Unpacks as (source, mountpoint, proc)."""

    def __init__(self, source: Path | str, budget: str = "64MiB", extra: tuple[str, ...] = (),
                 mnt: Path | None = None, wrap: tuple[str, ...] = (), env: dict | None = None):
        # A local folder, or an object store's URL (`s3://BUCKET/PREFIX`, kept as text: a
        # Path would fold its `//`). `wrap`: the command the daemon runs under (`nsenter` into
        # a store's network namespace); `env`: its environment (a store's credentials).
        self.source = source if isinstance(source, str) and "://" in source else Path(source)
        self.mnt = Path(mnt) if mnt is not None else fresh_dir("mnt")
        self.log_path = self.mnt.parent / (self.mnt.name + ".log")
        if mnt is not None:  # a reused mountpoint: keep the earlier mount's log
            self.log_path = self.mnt.parent / f"{self.mnt.name}.{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "wb")
        self.budget = budget
        self.transport_chosen = "--io-uring" in extra
        if not any(a in ("--state-dir", "--no-state") for a in extra):
            # Learned orders persist across mounts (by default in /var/lib/tierfs for root):
            # give every mount its own, so nothing leaks between tests or into the system.
            extra = (*extra, "--state-dir", str(fresh_dir("state")))
        if "--source-pacing" not in extra and isinstance(self.source, Path) and _on_the_suites_disk(self.source):
            # The suite's own disk stands for local flash. A virtual disk may say it rotates
            # (virtio's does) and drifts in speed, so `auto` would measure it, sometimes below
            # the 500 MB/s of a slow source, and serve models that fit from the chunk cache
            # instead of by passthrough. Slow sources are the loop devices, faultfs and stores
            # of their own tests, other file systems, judged by `auto` as the daemon ships.
            extra = (*extra, "--source-pacing", "parallel")
        cmd = [*wrap, str(TIERFS_BIN), "mount", str(self.source), str(self.mnt), "--ram-cache", budget, *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        _PROCS.append(self.proc)
        self.watchdog_fired = False
        self._watchdog = threading.Timer(MOUNT_WATCHDOG_S, self._fire_watchdog)
        self._watchdog.daemon = True
        self._watchdog.start()
        self._wait_ready(cmd)

    def _fire_watchdog(self) -> None:
        self.watchdog_fired = True
        sys.stderr.write(f"\n[watchdog] mount {self.mnt} older than {MOUNT_WATCHDOG_S}s: killing tierfs\n")
        self.kill()
        subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)

    def kill(self) -> None:
        """SIGKILL the daemon and abort its FUSE connection, so that neither a daemon thread
        stuck in the kernel nor a request nobody will answer outlives it; then reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        abort_fuse_connection(self.mnt)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"\n[mount] tierfs pid {self.proc.pid} not reaped 10 s after SIGKILL\n")

    def rearm_watchdog(self, seconds: float) -> None:
        """Restart the hung-mount watchdog to fire `seconds` from now (for long-running tests)."""
        self._watchdog.cancel()
        self._watchdog = threading.Timer(seconds, self._fire_watchdog)
        self._watchdog.daemon = True
        self._watchdog.start()

    def __iter__(self):
        return iter((self.source, self.mnt, self.proc))

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def _wait_ready(self, cmd) -> None:
        """Poll .tierfs/stats for up to 10 s.  The probe runs in a thread: a hung daemon
        must fail the test, not hang it (close() aborts the connection and frees the thread)."""
        deadline = time.monotonic() + 10
        ready = threading.Event()

        def probe():
            while not ready.is_set() and time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with open(self.mnt / ".tierfs" / "stats", "rb") as f:
                        json.loads(f.read())
                    ready.set()
                    return
                except (OSError, ValueError):
                    time.sleep(0.05)

        t = threading.Thread(target=probe, daemon=True)
        t.start()
        t.join(timeout=11)
        if ready.is_set():
            self._check_transport()
            return
        exited = self.proc.poll()
        self.close()
        if exited is not None:
            pytest.fail(f"tierfs exited with {exited} before the mount was ready\n"
                        f"cmd: {cmd}\nlog:\n{self.log_tail()}")
        pytest.fail(f"mount not ready (.tierfs/stats unreadable{' - probe hung' if t.is_alive() else ''}) "
                    f"after 10 s\ncmd: {cmd}\nlog:\n{self.log_tail()}")

    def _check_transport(self) -> None:
        """Under `TIERFS_IO_URING=on` (the suite's io_uring run), a mount that is not served
        through io_uring fails the test instead of passing on the other transport."""
        if os.environ.get("TIERFS_IO_URING") != "on" or self.transport_chosen:
            return
        transport = self.stats().get("transport", {})
        if transport.get("kind") != "io_uring":
            self.close()
            pytest.fail(f"TIERFS_IO_URING=on but the mount is served by {transport}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self) -> dict:
        with open(self.mnt / ".tierfs" / "stats", "rb") as f:
            return json.loads(f.read())

    def file_stats(self, rel: str) -> dict | None:
        for f in self.stats()["files"]:
            if f["path"] == rel:
                return f
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> int | None:
        """SIGTERM, wait, lazy-unmount if needed.  Returns the exit code (None if killed)."""
        rc = None
        self._watchdog.cancel()
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    rc = self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.kill()
            else:
                rc = self.proc.returncode
        finally:
            if is_mounted(self.mnt):
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            self.log.close()
        return rc


class FaultFs:
    """A running faultfs: mirrors `source` at `mnt`; faults listed in `faults_path`."""

    def __init__(self, source: Path, extra_args: tuple[str, ...] = (), name: str = "faultmnt"):
        """`extra_args` go to faultfs after the faults file (e.g. `--disk` and its model)."""
        self.source = source
        self.mnt = fresh_dir(name)
        self.faults_path = self.mnt.parent / (self.mnt.name + ".faults.json")
        self.log_path = self.mnt.parent / (self.mnt.name + ".log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(FAULTFS_BIN), str(source), str(self.mnt), "--faults", str(self.faults_path),
             *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT)
        _PROCS.append(self.proc)
        deadline = time.monotonic() + 10
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                pytest.fail(f"faultfs did not mount: {self.log_path.read_text(errors='replace')}")
            time.sleep(0.05)

    def set_faults(self, faults: list[dict]) -> None:
        tmp = self.faults_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(faults))
        os.replace(tmp, self.faults_path)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            if is_mounted(self.mnt):
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            self.log.close()


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session", autouse=True)
def _session_guard():
    yield
    _safety_net()
    leftover = mounted_under(SESSION_ROOT)
    if _OWN_ROOT and not leftover and not os.environ.get("TIERFS_KEEP_TMP"):
        shutil.rmtree(SESSION_ROOT, ignore_errors=True)
    assert not leftover, f"mounts left behind after the session: {leftover}"


@pytest.fixture(scope="session")
def tierfs_bin() -> Path:
    if not os.access(TIERFS_BIN, os.X_OK):
        pytest.fail(f"tierfs binary not found at {TIERFS_BIN} (run `cargo build --release --workspace`)")
    return TIERFS_BIN


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = Path(os.environ["TIERFS_TEST_DATA"]) if os.environ.get("TIERFS_TEST_DATA") else SESSION_ROOT / "data"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def big_file(data_dir) -> Path:
    """The >= 1 GiB DiT checkpoint (generated once per session, tensor by tensor)."""
    return gen.make_big_dit(data_dir / "big" / "dit_big.safetensors", BIG_BYTES)


@pytest.fixture(scope="session")
def big2_file(data_dir) -> Path:
    """The >= 2 GiB DiT checkpoint of the loader checks: bf16, fp16 and fp8 block weights, fp32
    and fp16 norms, tensors in name order like real writers (file order is not model order)."""
    return gen.make_big_dit(data_dir / "big2" / "dit_2gib.safetensors", BIG2_BYTES, seed=8, sort_names=True)


@pytest.fixture(scope="session")
def tree(data_dir, big_file) -> tuple[Path, dict[str, Path]]:
    """(root, named paths) of the shared, never-modified source tree."""
    root = data_dir / "tree"
    return root, gen.make_tree(root, big_file)


@pytest.fixture
def mount(tierfs_bin):
    """Factory: mount(source, budget="64MiB", extra=(), mnt=None) -> Mount; all are torn down after
    the test.  `mnt` reuses an existing mountpoint (default: a fresh one)."""
    mounts: list[Mount] = []

    def _mount(source, budget: str = "64MiB", extra: tuple[str, ...] = (), mnt: Path | None = None,
               wrap: tuple[str, ...] = (), env: dict | None = None) -> Mount:
        m = Mount(source, budget, extra, mnt, wrap, env)
        mounts.append(m)
        return m

    yield _mount
    for m in reversed(mounts):
        m.close()
    left = [str(m.mnt) for m in mounts if is_mounted(m.mnt)]
    assert not left, f"mount(s) left behind: {left}"
    hung = [str(m.mnt) for m in mounts if m.watchdog_fired]
    assert not hung, f"watchdog killed hung mount(s) after {MOUNT_WATCHDOG_S}s: {hung}"


@pytest.fixture
def workdir() -> Path:
    """A fresh directory under the session root (for per-test mutable sources)."""
    return fresh_dir("work")


@pytest.fixture(scope="session")
def faultfs_bin() -> Path:
    if not os.access(FAULTFS_BIN, os.X_OK):
        pytest.fail(f"faultfs binary not found at {FAULTFS_BIN} (run `cargo build --release --workspace`)")
    return FAULTFS_BIN


@pytest.fixture
def faultfs(faultfs_bin):
    """Factory: faultfs(source) -> FaultFs; torn down after the test (after any tierfs on top)."""
    fss: list[FaultFs] = []

    def _make(source: Path) -> FaultFs:
        f = FaultFs(source)
        fss.append(f)
        return f

    yield _make
    for f in reversed(fss):
        f.close()


# ----------------------------------------------------------------------------- helpers

def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


_libc = ctypes.CDLL(None, use_errno=True)
_SYS_CACHESTAT = 451  # x86_64 and aarch64 (Linux >= 6.5)


class _CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def page_cache_bytes(path: Path) -> int:
    """Bytes of `path` resident in the page cache.

    Uses the cachestat(2) syscall, which does not disturb the file (fincore
    mmaps it, and mmap of a FOPEN_DIRECT_IO FUSE file invalidates its page
    cache); falls back to `fincore --bytes` where cachestat is unavailable.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        rng, cs = _CacheStatRange(0, 0), _CacheStat()
        r = _libc.syscall(_SYS_CACHESTAT, ctypes.c_uint(fd), ctypes.byref(rng), ctypes.byref(cs), ctypes.c_uint(0))
        if r == 0:
            return cs.nr_cache * os.sysconf("SC_PAGE_SIZE")
    finally:
        os.close(fd)
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout.strip()
    return int(out or 0)


def proc_status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


class Sampler(threading.Thread):
    """Samples daemon RSS, page cache of some files and the cache's used_bytes every `period` s."""

    def __init__(self, m: Mount, files: dict[str, Path], period: float = 0.1):
        super().__init__(daemon=True)
        self.m, self.files, self.period = m, files, period
        self.stop_ev = threading.Event()
        self.samples: list[dict] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop_ev.is_set():
            s = {"t": time.monotonic()}
            try:
                s["rss"] = proc_status_kib(self.m.pid, "VmRSS") * 1024
                for k, p in self.files.items():
                    s[k] = page_cache_bytes(p)
                s["cache_used"] = self.m.stats()["cache"]["used_bytes"]
                self.samples.append(s)
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(e))
            self.stop_ev.wait(self.period)

    def stop(self) -> None:
        self.stop_ev.set()
        self.join(timeout=10)

    def max(self, key: str) -> int:
        return max((s[key] for s in self.samples if key in s), default=0)


def parse_size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for u, mul in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if s.endswith(u):
            return int(s[: -len(u)]) * mul
    return int(s)


def results_file() -> Path:
    p = Path(os.environ.get("TIERFS_RESULTS", REPO / "tests" / "bench" / "results" / "memory" / "bounded-memory.md"))
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


@pytest.fixture(scope="session")
def sorted_dit(data_dir) -> Path:
    """A ~720 MiB bf16 DiT with 40 blocks laid out in name order (``blocks.0, blocks.1,
    blocks.10, ...``), so file order differs from model order (generated once per session)."""
    return gen.make_sorted_dit(data_dir / "sorted_dit" / "dit_sorted.safetensors")


def quiesce(m: "Mount", quiet_s: float = 0.4, timeout: float = 15.0) -> dict:
    """Wait until the daemon's disk and prefetch counters stop moving (background prefetch
    finished) and return the stats then; after `timeout` s return the latest stats anyway."""
    def key(st):
        return (st["disk"]["read_bytes"], st["prefetch"]["issued_bytes"], st["cache"]["used_bytes"])
    deadline = time.monotonic() + timeout
    st = m.stats()
    last, since = key(st), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        st = m.stats()
        k = key(st)
        if k != last:
            last, since = k, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
    return st


def pytest_report_header(config):
    """Which FUSE transport the mounts of this run use (`TIERFS_IO_URING`), and whether the
    kernel allows io_uring at all."""
    try:
        enabled = ENABLE_URING.read_text().strip()
    except OSError:
        enabled = "absent (kernel older than 6.14)"
    mode = os.environ.get("TIERFS_IO_URING", "off")
    disk = shutil.disk_usage(SESSION_ROOT)
    return [f"tierfs transport: --io-uring {mode}; kernel enable_uring: {enabled}",
            f"test root: {SESSION_ROOT}, {disk.free / GiB:.1f} GiB free of {disk.total / GiB:.1f} GiB"]
