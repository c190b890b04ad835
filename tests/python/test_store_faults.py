"""tierfs over a real network store that fails in the middle of a load.

Stack: SeaweedFS (`weed server -filer`) in a network namespace of its own, its filer behind the
delay proxy on a shaped loopback link, read through `weed mount` (tests/bench/netstore.py) ->
tierfs with a budget below the model (so it is served from the chunk cache) -> the test.  The
store fails in the two ways a network source does:

* **killed**: `weed server` gets SIGKILL (by its PID) while a loader reads, and is started again
  on the same data later (`WeedStore.stop_server` / `start_server`);
* **network cut**: the namespace's loopback goes down while every process stays up, and comes
  back later (`WeedStore.cut_network` / `restore_network`).

What is checked, every wait bounded: the loader gets its bytes, always equal to the original
file's, or EIO, within `--source-timeout` plus some slack, never a hang; the bytes the cache
holds keep being served, exactly, without a source read; once the store is back, the same reads
return the exact bytes; the stats count the timeouts, the retries and the errors; the mount
unmounts, during the outage as well as after it; a network blip shorter than the retries is not
seen by the loader; an error of the store's client that outlasts the client's own retries is
retried by tierfs, and counted.

How `weed mount` behaves, which the bounds here are set against: with its server killed the
proxy still accepts its connections and closes them, and the client retries each chunk for about
13 s (pauses of 1, 1.5, 2.25, ... s) before it answers EIO, a read of several chunks taking a
multiple of that; with the network cut its connection attempts time out after 30 s and are
retried, so a read hangs for minutes.  Either way tierfs answers at its own deadline, and its
thread stuck in the client's read (`disk.source_stuck`) comes back once the client answers.
Opening a file and `stat` go to the store too (EIO after 13-30 s) and are not bounded by
`--source-timeout` (docs/RELIABILITY.md), so the loaders here hold their file open, as loaders
do, before the store fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import gen
from conftest import drop_caches, fresh_dir, is_mounted, weed_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import netstore  # noqa: E402

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20
# --source-timeout of the mounts: short, so that the tests wait little, but long enough that a
# healthy read on the shaped link never hits it (requests are sized to a quarter of it), the
# first reads of a cold store included: on a loaded machine those took more than 6 s.
TIMEOUT_S = 10.0
# What a failed read may take beyond --source-timeout: the retries' pauses (0.7 s), handing the
# error back through FUSE, a loaded 2-core machine running the store, its client and the proxy.
SLACK_S = 8.0
EIO_BOUND_S = TIMEOUT_S + SLACK_S
# The longest the store takes to serve again once it is back: a restarted server elects its
# master and registers its volumes; the client's retries of a cut connection wait for their next
# attempt (TCP's connect retries after 1, 3, 7, ... s, weed's pauses up to 5 s).
RECOVERY_S = 90.0
# 66 MiB of model in the store, read through a 56 MiB budget: served from the chunk cache; the
# head, a load that fails after some 20 MiB and its read-ahead fit without evicting.  HEAD: what
# is read before a load starts.
BUDGET = "56MiB"
HEAD = 8 * MiB
# The object read through the store's client before a test (`_warm_client`).
WARM_BYTES = 256 << 10
# The link between the client and the store: 50 Mbit/s, so a load of the model lasts about ten
# seconds and the failure lands in the middle of it: tierfs reads a network source ahead in
# 16 MiB requests and the store's client reads ahead of those, so at 200 Mbit/s the whole
# model could be on this side of the link before the store fails.
LINK_BPS = 50_000_000


def _pread_fd(fd: int, off: int, ln: int) -> bytes:
    out = bytearray()
    while len(out) < ln:
        got = os.pread(fd, ln - len(out), off + len(out))
        if not got:
            break
        out += got
    return bytes(out)


def _pread_calls(fd: int, off: int, ln: int) -> tuple[bytes | OSError, float]:
    """`_pread_fd`, also handing back an error instead of raising it, with the longest single
    `pread` it made: the bound on an EIO is per call (a read the kernel splits may return the
    bytes before a failing piece, and the call after it then waits for the source once more)."""
    out, longest = bytearray(), 0.0
    while len(out) < ln:
        t0 = time.monotonic()
        try:
            got = os.pread(fd, ln - len(out), off + len(out))
        except OSError as e:
            return e, max(longest, time.monotonic() - t0)
        longest = max(longest, time.monotonic() - t0)
        if not got:
            break
        out += got
    return bytes(out), longest


def _timed(fn, bound: float):
    """Runs fn() in a thread; returns (result or exception, seconds). A call still running after
    `bound` seconds fails the test (the thread is a daemon: the mount's teardown frees it)."""
    out: dict = {}

    def run():
        t0 = time.monotonic()
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["value"] = e
        out["took"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=bound)
    assert not t.is_alive(), f"the call hung past {bound} s"
    return out["value"], out["took"]


def _wait_for(what: str, cond, bound: float, step: float = 0.1):
    deadline = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {bound} s"
        time.sleep(step)


def _eio_in_bound(got, took: float, what: str) -> None:
    assert isinstance(got, OSError), f"{what}: a read while the store is down returned {type(got).__name__}"
    assert got.errno == errno.EIO, f"{what}: {got!r}"
    assert took <= EIO_BOUND_S, f"{what}: EIO after {took:.2f} s (bound {EIO_BOUND_S} s)"


class Load(threading.Thread):
    """A loader reading the model front to back from `start` in 1 MiB `pread`s on a descriptor
    opened before it starts; it stops at its first error, as a loader does.  Every byte it gets is
    compared with the original file at once; a difference is recorded (`wrong_at`), never
    raised."""

    def __init__(self, path: Path, want: bytes, start: int):
        super().__init__(daemon=True)
        self.want, self.pos = want, start
        self.fd = os.open(path, os.O_RDONLY)
        self.error: OSError | None = None
        self.error_took = 0.0
        self.wrong_at: int | None = None
        self.finished = threading.Event()
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            while self.pos < len(self.want):
                t0 = time.monotonic()
                try:
                    got = os.pread(self.fd, MiB, self.pos)
                except OSError as e:
                    self.error, self.error_took = e, time.monotonic() - t0
                    return
                if not got or got != self.want[self.pos:self.pos + len(got)]:
                    self.wrong_at = self.pos
                    return
                self.pos += len(got)
        finally:
            self.ended_at = time.monotonic()
            self.finished.set()

    def close(self) -> None:
        if self.finished.is_set():
            os.close(self.fd)
        # else: the thread is stuck in the read; the mount's teardown frees it and the
        # descriptor goes with the test process


@pytest.fixture(scope="module")
def model(data_dir) -> tuple[Path, bytes]:
    """A ~66 MiB DiT (8 blocks of ~8 MiB, bf16, file order = model order) and its bytes."""
    p = data_dir / "store_faults" / "dit.safetensors"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        gen.write_small(p, gen.dit_specs(512, 2048, 8, ("BF16",)), seed=61)
    return p, p.read_bytes()


@pytest.fixture
def store(model):
    """A fresh SeaweedFS with the model in it, behind a 200 Mbit/s link with 1 ms per request;
    the client mounted again after the copy and the page cache dropped, so nothing of the model
    is in the client's memory or the kernel's when the test starts."""
    def quick_stop(s) -> None:
        # The store's data is thrown away: no need for its graceful stop (15 s for the filer).
        netstore.unmount(s.mnt, s.client)
        s.client = None
        s.stop_server()

    with weed_store("store", before_close=quick_stop, delay_ms=1.0) as s:
        warm = fresh_dir("store_warm") / "warm.bin"
        warm.write_bytes(os.urandom(WARM_BYTES))
        s.put(warm, "warm/" + warm.name)
        s.put(model[0], "models/" + model[0].name)
        s.remount()
        s.set_rate(LINK_BPS)
        drop_caches()
        _warm_client(s, warm)
        yield s


def _warm_client(store: netstore.WeedStore, warm: Path) -> None:
    """Reads a small object other than the model through the fresh client, exactly: its first
    read after a start asks the filer and the master where the chunks live and opens its
    connections, which on a loaded machine can outlast --source-timeout.  The test's reads then
    meet a serving store, and nothing of the model is in the client's memory."""
    got, took = _timed(lambda: (store.mnt / "warm" / warm.name).read_bytes(), RECOVERY_S)
    assert got == warm.read_bytes(), f"the store's client did not serve a small object: {got!r:.200}"
    print(f"\nthe store's client served its first read in {took:.2f} s")


@contextlib.contextmanager
def store_down(store: netstore.WeedStore, how: str):
    """The store killed (`kill`) or its network cut (`cut`) for the body; back afterwards, also
    when the body fails."""
    if how == "kill":
        store.stop_server()
    else:
        store.cut_network()
    try:
        yield
    finally:
        if how == "kill":
            store.start_server()
        else:
            store.restore_network()


def _mount_over(store, mount, model, extra=("--source-timeout", f"{TIMEOUT_S:g}s")):
    m = mount(store.mnt / "models", budget=BUDGET, extra=tuple(extra))
    return m, m.mnt / model[0].name


def _read_head(m, path: Path, want: bytes) -> int:
    """Opens the file through tierfs and reads its head exactly until a whole pass of it is served
    from the cache (a file's first read is a probe, served without caching; the second loads the
    chunks), waiting for the prefetch each pass started; returns the descriptor."""
    fd = os.open(path, os.O_RDONLY)
    for _ in range(4):
        misses = m.stats()["cache"]["misses"]
        t0 = time.monotonic()
        try:
            got = _pread_fd(fd, 0, HEAD)
        except OSError as e:  # the store is healthy: say what the daemon saw
            st = m.stats()
            pytest.fail(f"reading the head of a healthy store failed after {time.monotonic() - t0:.2f} s: {e!r}; "
                        f"disk {st['disk']}; cache {st['cache']}; daemon log:\n{m.log_tail()}")
        assert got == want[:HEAD]
        _wait_quiet(m)
        if m.stats()["cache"]["misses"] == misses:
            break
    else:
        pytest.fail(f"the head is not in the cache after 4 reads: {m.stats()['cache']}")
    row = m.file_stats(path.name)
    assert row is not None and row["mode"] == "cache", row  # served from the chunk cache
    return fd


def _read_cached_head(m, fd: int, want: bytes, what: str) -> None:
    """Reads the head, which was in the cache when the store failed, while the store is down:
    exact, at once, without a cache miss.  Nothing was evicted since (the budget holds the head,
    the load and its read-ahead), so all of it is still there."""
    cache = m.stats()["cache"]
    assert cache["evicted_bytes"] == 0, f"{what}: the cache evicted, the head may be gone: {cache}"
    head, took = _timed(lambda: _pread_fd(fd, 0, HEAD), EIO_BOUND_S)
    assert not isinstance(head, BaseException), \
        f"{what}: a read of the cached head failed: {head!r}; cache {m.stats()['cache']}, disk {m.stats()['disk']}"
    assert head == want[:HEAD], f"{what}: the cached head differs while the store is down"
    assert took < TIMEOUT_S, f"{what}: the cached head waited for the store: {took:.2f} s"
    assert m.stats()["cache"]["misses"] == cache["misses"], f"{what}: the head was read from the store"
    print(f"{what}: the cached head read exactly in {took:.3f} s")


def _wait_quiet(m, quiet_s: float = 0.5, bound: float = 30.0) -> dict:
    """The stats once the disk and prefetch counters stopped moving (a load started by a read is
    done)."""
    def key(st):
        return st["disk"]["read_bytes"], st["prefetch"]["issued_bytes"], st["cache"]["used_bytes"]
    deadline = time.monotonic() + bound
    st = m.stats()
    last, since = key(st), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"the daemon's reads did not settle within {bound} s: {st['disk']}"
        time.sleep(0.05)
        st = m.stats()
        if key(st) != last:
            last, since = key(st), time.monotonic()
    return st


def _start_load_and_fail(store, m, path, want, how: str) -> tuple[Load, float]:
    """Starts a load after the head and fails the store once it read 4 MiB more; returns the load
    and when the store failed."""
    load = Load(path, want, HEAD)
    load.start()
    _wait_for("the load read 4 MiB", lambda: load.pos >= HEAD + 4 * MiB or load.finished.is_set(), 60, 0.005)
    assert not load.finished.is_set(), (f"the load ended before the store failed (at {load.pos}, "
                                        f"error {load.error!r}, wrong at {load.wrong_at})")
    if how == "kill":
        store.stop_server()
    else:
        store.cut_network()
    return load, time.monotonic()


def _while_down(m, fd: int, path: Path, load: Load, failed_at: float, want: bytes, what: str) -> None:
    """The checks while the store is down: the load ends with EIO in bounded time and every byte
    it got was exact; the cached head reads exactly without the source; the load's range read
    again gets EIO in bounded time; the stats count the timeouts."""
    load.finished.wait(timeout=EIO_BOUND_S + 2 * TIMEOUT_S)
    assert load.finished.is_set(), f"{what}: the load hung ({time.monotonic() - failed_at:.1f} s after the failure)"
    assert load.wrong_at is None, f"{what}: the load got wrong bytes at {load.wrong_at}"
    assert load.pos < len(want), f"{what}: the load read the whole model with the store down"
    _eio_in_bound(load.error, load.error_took, f"{what}: the load at {load.pos}")
    # The read that failed may have joined a prefetch started before the failure (its deadline
    # is the prefetch's); from the failure on the load took at most one deadline more.
    assert load.ended_at - failed_at <= EIO_BOUND_S + TIMEOUT_S, \
        f"{what}: the load ended {load.ended_at - failed_at:.2f} s after the failure"
    print(f"\n{what}: load got {(load.pos - HEAD) / MiB:.1f} MiB exact after the head, then EIO after "
          f"{load.error_took:.2f} s, {load.ended_at - failed_at:.2f} s after the failure")

    _read_cached_head(m, fd, want, what)
    # The range the load failed on is not cached (its load failed) nor in the client's memory:
    # read again, it fails again, in bounded time.
    res, _ = _timed(lambda: _pread_calls(fd, load.pos, MiB), EIO_BOUND_S + 5)
    assert not isinstance(res, BaseException), f"{what}: the load's range read again raised {res!r}"
    got, took = res
    _eio_in_bound(got, took, f"{what}: the load's range read again")
    print(f"{what}: the load's range read again: EIO after {took:.2f} s")
    disk = m.stats()["disk"]
    assert disk["source_timeouts"] >= 1, disk
    assert disk["source_stuck"] >= 1, disk  # the client still holds the reads given up on
    assert disk["errors"] >= 2, disk  # the load's read and its second try, at least
    assert m.alive()


def _read_once_back(fd: int, off: int, ln: int, want: bytes, what: str, back_at: float) -> int:
    """Reads `ln` bytes at `off` until they come back exact; a try that fails must be EIO within
    the bound, and tries may fail only until RECOVERY_S after the store came back (`back_at`).
    Returns the failed tries."""
    failed = 0
    while True:
        # Every call within the bound, so all of them within one bound per MiB.
        res, _ = _timed(lambda: _pread_calls(fd, off, ln), (EIO_BOUND_S + 5) * max(1, ln // MiB))
        assert not isinstance(res, BaseException), f"{what}: the read at {off} raised {res!r}"
        got, took = res
        if isinstance(got, bytes):
            assert got == want[off:off + ln], f"{what}: the range at {off} differs once the store is back"
            return failed
        _eio_in_bound(got, took, f"{what}: a read at {off} once the store is back")
        assert time.monotonic() - back_at < RECOVERY_S, \
            f"{what}: the read at {off} still fails {RECOVERY_S} s after the store came back"
        failed += 1
        time.sleep(0.5)


def _after_recovery(m, fd: int, off: int, want: bytes, what: str) -> None:
    """The store is back: the range at `off` reads exactly within RECOVERY_S, then every range of
    the file.  A read may still fail until then, with EIO in bounded time and never other bytes:
    the store's client serves its own fetches that began while the store was down (its connection
    retries, up to 30 s apart when the network was cut) before new ones of the same chunks, so a
    range tierfs had asked for then may come back after the one the load stopped at."""
    t0 = time.monotonic()
    tries = _read_once_back(fd, off, MiB, want, what, t0) + 1
    print(f"{what}: the load's range read exactly {time.monotonic() - t0:.2f} s after the store came back "
          f"({tries} tries)")
    failed = 0
    for piece in range(0, len(want), 8 * MiB):
        failed += _read_once_back(fd, piece, min(8 * MiB, len(want) - piece), want, what, t0)
    print(f"{what}: the whole file read exactly {time.monotonic() - t0:.2f} s after the store came back "
          f"({failed} failed tries on the way)")
    _wait_for("the stuck source reads came back", lambda: m.stats()["disk"]["source_stuck"] == 0, RECOVERY_S, 0.5)
    assert m.alive()


def _unmount(m, tierfs_bin, bound: float = 10.0) -> float:
    t0 = time.monotonic()
    out = subprocess.run([str(tierfs_bin), "unmount", str(m.mnt)], capture_output=True, timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert not is_mounted(m.mnt)
    assert took < bound, f"unmount took {took:.2f} s"
    return took


@pytest.mark.parametrize("how", ["kill", "cut"], ids=["server_killed", "network_cut"])
def test_store_fails_mid_load_eio_in_bounded_time_cache_serves_reads_recover(store, model, mount, tierfs_bin, how):
    """The store fails while a loader reads: the loader's bytes are exact up to an EIO within the
    bound; the cached head is served; the failed range fails again; once the store is back every
    read is exact; the mount unmounts at once and the daemon exits."""
    want = model[1]
    m, path = _mount_over(store, mount, model)
    fd = _read_head(m, path, want)
    try:
        load = None
        try:
            load, failed_at = _start_load_and_fail(store, m, path, want, how)
            _while_down(m, fd, path, load, failed_at, want, how)
        finally:
            if load is not None:  # the store failed: back it comes
                if how == "kill":
                    store.start_server()
                else:
                    store.restore_network()
                load.finished.wait(timeout=RECOVERY_S)
                load.close()
        _after_recovery(m, fd, load.pos, want, how)
        disk = m.stats()["disk"]
        print(f"{how}: disk {disk}")
    finally:
        os.close(fd)
    took = _unmount(m, tierfs_bin)
    rc = m.proc.wait(timeout=30)
    assert rc == 0, f"exit code {rc}\n{m.log_tail()}"
    print(f"{how}: unmounted in {took:.2f} s")


def _thread_states(pid: int) -> dict[str, str]:
    """State (R, S, D, Z, ...) and kernel wait channel of each thread of `pid` still there."""
    states = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return states
    for tid in tids:
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
            wchan = open(f"/proc/{pid}/task/{tid}/wchan").read()
        except OSError:
            continue
        states[tid] = stat.rsplit(")", 1)[1].split()[0] + " " + wchan
    return states


def test_unmount_while_the_network_is_cut(store, model, mount, tierfs_bin):
    """The network stays cut: a read gets EIO within the bound, `tierfs unmount` returns at once,
    and the daemon, its mount gone, exits: at once, or, where a thread of it is still blocked in
    the store client's read (the only threads it may have left), as soon as the network is back
    and the client answers."""
    want = model[1]
    m, path = _mount_over(store, mount, model)
    fd = os.open(path, os.O_RDONLY)  # nothing read yet: every read goes to the store
    tail = len(want) - MiB
    with store_down(store, "cut"):
        try:
            got, took = _timed(lambda: _pread_fd(fd, tail, MiB), EIO_BOUND_S + 5)
            _eio_in_bound(got, took, "network cut: the tail")
            assert m.stats()["disk"]["source_stuck"] >= 1
        finally:
            os.close(fd)
        took = _unmount(m, tierfs_bin)
        print(f"\nnetwork cut: tail EIO, unmounted in {took:.2f} s")
        try:
            rc = m.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            states = _thread_states(m.pid)
            print(f"daemon threads left while the network is cut: {states}")
            assert all(st.split()[0] in ("D", "Z") for st in states.values()), \
                f"a thread of the daemon is held by something else than the store: {states}"
            rc = None
    if rc is None:
        t0 = time.monotonic()
        try:
            rc = m.proc.wait(timeout=RECOVERY_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tierfs did not exit once the network was back\n{_thread_states(m.pid)}\n{m.log_tail()}")
        print(f"network back: the daemon exited {time.monotonic() - t0:.2f} s later")
    assert rc == 0, f"exit code {rc}\n{m.log_tail()}"


def test_network_blip_during_a_load_is_not_seen(store, model, mount):
    """The network goes down for 1 s in the middle of a load, with the default --source-timeout
    (30 s): the loader gets every byte exactly and no error.  The blip never reaches tierfs as an
    error: TCP retransmits what was lost once the link is back and the store's client waits for
    it, so the reads in flight are only late (`disk.errors`, `disk.source_timeouts` and
    `disk.source_errors` stay 0)."""
    want = model[1]
    m, path = _mount_over(store, mount, model, extra=())
    load = Load(path, want, 0)
    try:
        load.start()
        _wait_for("the load read 8 MiB", lambda: load.pos >= HEAD or load.finished.is_set(), 60, 0.005)
        assert not load.finished.is_set(), f"the load ended before the blip: {load.error!r}"
        with store_down(store, "cut"):
            time.sleep(1.0)
        pos_when_back = load.pos
        load.finished.wait(timeout=60)
        assert load.finished.is_set(), "the load hung after the blip"
        assert load.wrong_at is None, f"wrong bytes at {load.wrong_at}"
        assert load.error is None, f"the load failed: {load.error!r}"
        assert load.pos == len(want)
    finally:
        load.finished.wait(timeout=RECOVERY_S)
        load.close()
    disk = m.stats()["disk"]
    print(f"\nnetwork back with the load at {pos_when_back / MiB:.1f} MiB of {len(want) / MiB:.1f}: it read every "
          f"byte exactly; disk {disk}")
    assert pos_when_back < len(want), "the load was over before the network came back"
    assert disk["errors"] == 0, disk
    assert disk["source_timeouts"] == 0, disk
    assert m.alive()


def test_store_client_error_is_retried_by_tierfs_and_counted(store, model, mount):
    """The store stays down longer than its client's own retries (about 13 s a chunk), within a
    60 s --source-timeout: the client answers EIO, tierfs counts it and tries again after its
    pause, the store is back meanwhile, and the loader gets the exact bytes, no error."""
    want = model[1]
    m, path = _mount_over(store, mount, model, extra=("--source-timeout", "60s"))
    fd = os.open(path, os.O_RDONLY)  # nothing read yet: every read goes to the store
    tail = len(want) - MiB
    out: dict = {}
    try:
        store.stop_server()
        t0 = time.monotonic()

        def read_tail():
            try:
                out["value"] = _pread_fd(fd, tail, MiB)
            except OSError as e:
                out["value"] = e
            out["took"] = time.monotonic() - t0

        reader = threading.Thread(target=read_tail, daemon=True)
        reader.start()
        try:
            _wait_for("the store's client answered an error", lambda: m.stats()["disk"]["source_errors"] >= 1, 50, 0.05)
            first_error = time.monotonic() - t0
        finally:
            store.start_server()
        back = time.monotonic() - t0
        reader.join(timeout=65)
        assert not reader.is_alive(), "the read hung"
    finally:
        os.close(fd)  # a read still in it keeps its file: the kernel holds a reference
    assert out["value"] == want[tail:], f"the read once the store was back: {out['value']!r:.120}"
    disk = m.stats()["disk"]
    print(f"\nfirst client error {first_error:.2f} s after the store died, store back at {back:.2f} s, "
          f"read exact after {out['took']:.2f} s; disk {disk}")
    assert disk["source_retries"] >= 1, disk
    assert disk["errors"] == 0, f"a retried error reached a reader: {disk}"
    assert disk["source_timeouts"] == 0, disk
    assert m.alive()
