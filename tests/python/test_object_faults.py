"""`tierfs mount s3://…` when the object store misbehaves: throttling, expired credentials, a
connection cut in the middle of an object, a stalled answer, a full local disk.

What is checked, each read against the source file's bytes: a few `503 SlowDown` answers are
retried and the model reads exactly, the retries and the throttling counted in the mount's
stats (`source.remote`); a store that never stops throttling fails a read with EIO within the
client's retry schedule, never a hang and never other bytes, and once it stops the same file
reads exactly without a remount; an expired token fails an open with EACCES and a read with
EIO (the error read(2) documents) at once, without retries, the daemon's log naming
`ExpiredToken` and the credentials to check, and the file
reads exactly once the store accepts the requests again; bodies cut short are read again and
the model reads exactly; an answer that stalls is abandoned after `--request-timeout` and
tried again, and one that always stalls fails the read within the retries' bound; a disk tier
on a full disk does not stop reads of an object-store model.

Stack: SeaweedFS with its S3 gateway in a network namespace of its own, behind the delay proxy
on a shaped loopback link (tests/bench/netstore.py, as tests/python/test_object_source.py),
and in front of that tests/bench/fault_proxy.py, which passes requests byte for byte and
injects the faults its control file names. tierfs runs in the namespace (`nsenter --net`) with
`--endpoint` the fault proxy. A read meant to fail is 4 KiB from the middle of the model through
a handle opened while the store behaved (opening a model reads its header). Every read runs in a
thread joined after HANG_S, so a hang fails the test instead of stalling the run (the mount's
teardown aborts its connection).
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import gen
from conftest import drop_caches, fresh_dir, weed_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import netstore  # noqa: E402

pytestmark = pytest.mark.timeout(300)

MiB = 1 << 20
# 66 MiB of model through a 64 MiB budget: served from the chunk cache, with evictions.
BUDGET = "64MiB"
LINK_BPS = 1_000_000_000
PREFIX = "faults"
MODEL_KEY = f"{PREFIX}/dit.safetensors"
# What the rules select: the GETs of the model's object (not the listings, not HEADs).
MODEL_GETS = {"method": "GET", "path_contains": "dit.safetensors"}
# The fault proxy's port in the store's namespace, in front of the delay proxy's S3 port.
FAULT_PORT = 8391
FAULT_PROXY = Path(__file__).resolve().parents[1] / "bench" / "fault_proxy.py"

# The object client's retry schedule (core/src/object/client.rs): 5 retries after the first
# try, pauses from 0.25 s doubling up to 8 s, each with up to 0.25 s of jitter.
RETRIES = 5
RETRY_PAUSES_S = sum(min(0.25 * 2 ** i, 8.0) + 0.25 for i in range(RETRIES))  # 9.0 s
# One request of the client against a store that answers every try at once with an error.
REFUSED_REQUEST_S = RETRY_PAUSES_S + (RETRIES + 1) * 0.1
# The failing reads are 4 KiB from a handle of the model: one request to the daemon, whose chunk
# is fetched as parts in parallel, each part one request of the client; and some slack.
FAILED_READ_BOUND_S = REFUSED_REQUEST_S + 5.0
# An answer the client does not retry (credentials): well under one retry pause sequence.
PROMPT_FAILURE_S = 3.0
# The stalls: each try given up after this; the proxy stalls much longer.
REQUEST_TIMEOUT_S = 2.0
STALL_S = 20.0
# A request that always stalls: every try waits its timeout, then the retries' pauses.
STALLED_READ_BOUND_S = (RETRIES + 1) * REQUEST_TIMEOUT_S + RETRY_PAUSES_S + 5.0
# A read whose first try stalled once: the timeout, a pause, the model's transfer, and slack.
STALLED_ONCE_BOUND_S = STALL_S / 2
# Every call that may block runs in a thread joined this long: still running then, it hangs.
HANG_S = 120.0


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=netstore.S3_KEY, AWS_SECRET_ACCESS_KEY=netstore.S3_SECRET)
    return env


class FaultProxy:
    """tests/bench/fault_proxy.py in the store's namespace, in front of its S3 gateway's delay
    proxy; `set_rules` replaces its rules, `stats` reads its counters, `close` stops it by PID."""

    def __init__(self, store: netstore.WeedStore):
        self.store = store
        self.control = store.root / "faults.json"
        self.stats_path = store.root / "fault_proxy.json"
        self.log_path = store.root / "fault_proxy.log"
        self.set_rules([])
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [*store.ns.cmd(sys.executable, str(FAULT_PROXY), "--listen", str(FAULT_PORT),
                           "--target", str(netstore.PROXY_S3), "--control", str(self.control),
                           "--stats", str(self.stats_path), "--max-seconds", "1800")],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            store._wait_port(FAULT_PORT, self.proc, "fault_proxy")
        except BaseException:
            self.close()
            raise

    @property
    def endpoint(self) -> str:
        return f"http://{netstore.LOOPBACK}:{FAULT_PORT}"

    def set_rules(self, rules: list[dict]) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(rules))
        os.replace(tmp, self.control)

    def stats(self) -> dict:
        """The counters once the proxy has written what it counted (it writes every 20 ms)."""
        time.sleep(0.1)
        return json.loads(self.stats_path.read_text())

    def injected(self, kind: str) -> int:
        return self.stats()["injected"][kind]

    def close(self) -> None:
        netstore.stop_pid(self.proc)
        self.log.close()


@pytest.fixture(scope="module")
def model(data_dir) -> Path:
    """A ~66 MiB DiT (bf16 blocks), the object under the store's `faults/`."""
    path = data_dir / "object_faults" / "dit.safetensors"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        gen.write_small(path, gen.dit_specs(512, 2048, 8, ("BF16",)), seed=81)
    return path


@pytest.fixture(scope="module")
def want(model) -> bytes:
    return model.read_bytes()


@pytest.fixture(scope="module")
def store(model):
    """SeaweedFS's S3 gateway with the model under `faults/`, and the fault proxy before it."""
    proxy = None

    def stop_proxy(_store) -> None:
        if proxy is not None:
            proxy.close()

    with weed_store("faultstore", before_close=stop_proxy, delay_ms=1.0, rate_bps=LINK_BPS,
                    client="rclone") as store:
        store.put(model, MODEL_KEY)
        proxy = FaultProxy(store)
        store.fault_proxy = proxy
        yield store
    assert proxy is None or proxy.proc.poll() is not None, "the fault proxy outlived the store"


@pytest.fixture
def faults(store) -> FaultProxy:
    """The fault proxy, its rules removed after the test."""
    yield store.fault_proxy
    store.fault_proxy.set_rules([])


def _mount(mount, store, budget: str = BUDGET, extra: tuple[str, ...] = ()):
    return mount(f"s3://{netstore.S3_BUCKET}/{PREFIX}", budget=budget,
                 extra=("--endpoint", store.fault_proxy.endpoint, *extra),
                 wrap=tuple(store.ns.cmd()), env=_env())


def _remote(m) -> dict:
    """The mount's object-store client figures (`source.remote` of its stats)."""
    source = m.stats().get("source", {})
    assert "remote" in source, f"the mount's stats have no source.remote: source = {source}"
    return source["remote"]


def _bounded(what: str, fn):
    """Runs `fn` in a thread: (its result or the OSError it raised, seconds it took). A call
    still running after HANG_S fails the test as a hang."""
    out: dict = {}

    def run():
        t0 = time.monotonic()
        try:
            out["value"] = fn()
        except OSError as e:
            out["value"] = e
        out["took"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG_S)
    if t.is_alive():
        pytest.fail(f"{what} still running after {HANG_S:.0f} s: a hang")
    return out["value"], out["took"]


def _read_all(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _assert_exact(got, want: bytes, what: str) -> None:
    assert not isinstance(got, OSError), f"{what}: {got!r}"
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        pytest.fail(f"{what}: {len(got)} bytes, differing from the source's {len(want)} at {at}")


def _read_exact(m, want: bytes, what: str) -> float:
    """Reads the model through the mount, checks every byte; the seconds it took."""
    got, took = _bounded(what, lambda: _read_all(m.mnt / "dit.safetensors"))
    _assert_exact(got, want, what)
    return took


def _open_model(m) -> int:
    """A handle on the model, opened (and its header indexed) while the store behaves."""
    return os.open(m.mnt / "dit.safetensors", os.O_RDONLY)


# Where the failing reads read: the middle of the model's weights, which nothing read before.
def _middle(want: bytes) -> int:
    return len(want) // 2


def _expect_error(fd: int, want: bytes, what: str):
    """4 KiB from the middle of the model that must fail: (the OSError, seconds)."""
    at = _middle(want)
    got, took = _bounded(what, lambda: os.pread(fd, 4096, at))
    assert isinstance(got, OSError), (
        f"{what}: the read returned {len(got)} bytes after {took:.1f} s "
        f"({'the source' if got == want[at:at + len(got)] else 'NOT the source'}'s), not an error")
    return got, took


def _reads_again(m, fd: int, want: bytes, what: str) -> float:
    """After a fault is gone: the handle that met it reads exactly, and so does the whole model
    (no remount); the whole read's seconds."""
    at = _middle(want)
    got, _ = _bounded(what, lambda: os.pread(fd, 4096, at))
    _assert_exact(got, want[at:at + 4096], f"{what}: the handle that met the fault")
    return _read_exact(m, want, f"{what}: the whole model")


def _log_lines(m, word: str) -> list[str]:
    """The daemon's log lines holding `word`, without their colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", m.log_tail(200_000))
    return [line for line in text.splitlines() if word in line]


def test_a_few_slowdown_answers_are_retried_and_the_model_reads_bit_exact(store, faults, mount, want):
    m = _mount(mount, store)
    faults.set_rules([{**MODEL_GETS, "kind": "slowdown", "count": 3}])
    took = _read_exact(m, want, "the model read through 3 SlowDown answers")
    injected = faults.injected("slowdown")
    remote = _remote(m)
    print(f"\n3 x SlowDown: the model read exactly in {took:.2f} s; the proxy answered {injected} SlowDown; "
          f"source.remote: {remote}")
    assert injected == 3, f"the proxy answered {injected} SlowDown, not 3"
    assert remote["throttled"] >= 3, remote
    assert remote["retries"] >= 3, remote
    metrics = (m.mnt / ".tierfs" / "metrics").read_text()
    throttled = re.search(r"^tierfs_remote_throttled_total (\d+)$", metrics, re.M)
    assert throttled and int(throttled.group(1)) >= 3, "no tierfs_remote_throttled_total of 3 in the metrics"
    assert re.search(r'^tierfs_source_storage_info\{device="[^"]*",storage="s3"\} 1$', metrics, re.M), \
        "the metrics do not name the source's kind"


def test_a_store_that_keeps_throttling_fails_a_read_with_eio_in_bounded_time_then_reads_again(
        store, faults, mount, want):
    m = _mount(mount, store)
    fd = _open_model(m)
    try:
        faults.set_rules([{**MODEL_GETS, "kind": "slowdown", "count": -1}])
        err, took = _expect_error(fd, want, "a read under endless SlowDown")
        injected = faults.injected("slowdown")
        print(f"\nendless SlowDown: {err!r} after {took:.1f} s (bound {FAILED_READ_BOUND_S:.1f} s: "
              f"{RETRY_PAUSES_S:.2f} s of pauses + {RETRIES + 1} tries + 5 s); the proxy answered {injected} SlowDown; "
              f"daemon: {(_log_lines(m, 'read failed') or ['(no read failed line)'])[-1][-300:]}")
        faults.set_rules([])
        again = _reads_again(m, fd, want, "once the store stopped throttling")
    finally:
        os.close(fd)
    print(f"then the handle read exactly and the whole model in {again:.2f} s, no remount; "
          f"source.remote: {m.stats().get('source', {}).get('remote')}")
    assert m.alive(), m.log_tail()
    assert err.errno == errno.EIO, f"{err!r}, not EIO"
    assert took < FAILED_READ_BOUND_S, f"the read failed after {took:.1f} s, past {FAILED_READ_BOUND_S:.1f} s"


def test_an_expired_token_fails_an_open_with_eacces_and_a_read_with_eio_at_once_and_says_to_check_the_credentials(
        store, faults, mount, want):
    m = _mount(mount, store)
    retries_before = _remote(m)["retries"]
    faults.set_rules([{**MODEL_GETS, "kind": "expired_token", "count": -1}])
    # An open reads the model's header from the store: refused, it is EACCES, as a file's would be.
    opened, open_took = _bounded("an open answered ExpiredToken", lambda: _open_model(m))
    faults.set_rules([])
    fd = _open_model(m)
    try:
        faults.set_rules([{**MODEL_GETS, "kind": "expired_token", "count": -1}])
        # A read: EIO, the error read(2) documents and loaders handle; the log says why.
        err, took = _expect_error(fd, want, "a read answered ExpiredToken")
        injected = faults.injected("expired_token")
        retries = _remote(m)["retries"] - retries_before
        named = _log_lines(m, "ExpiredToken")
        print(f"\nExpiredToken: the open {opened!r} after {open_took:.2f} s; the read {err!r} after {took:.2f} s "
              f"(bound {PROMPT_FAILURE_S:.1f} s); the proxy answered {injected} ExpiredToken; client retries "
              f"{retries}; log lines naming ExpiredToken: {len(named)}; "
              f"daemon: {(named or _log_lines(m, 'read failed') or ['(no read failed line)'])[-1][-400:]}")
        faults.set_rules([])
        again = _reads_again(m, fd, want, "once the token was accepted again")
    finally:
        os.close(fd)
    print(f"then the handle read exactly and the whole model in {again:.2f} s, no remount")
    assert isinstance(opened, OSError) and opened.errno == errno.EACCES, f"the open gave {opened!r}, not EACCES"
    assert open_took < PROMPT_FAILURE_S, f"an expired token took {open_took:.1f} s to fail an open"
    assert err.errno == errno.EIO, f"{err!r}, not EIO"
    assert took < PROMPT_FAILURE_S, f"an expired token took {took:.1f} s to fail a read"
    assert retries == 0, f"the client retried {retries} times on a credentials answer"
    assert named, f"the daemon's log does not name ExpiredToken:\n{m.log_tail()}"
    assert any("check the credentials" in line for line in named), \
        f"the daemon's log does not say to check the credentials:\n{named[:3]}"


def test_bodies_cut_mid_object_are_read_again_and_the_model_reads_bit_exact(store, faults, mount, want):
    m = _mount(mount, store)
    faults.set_rules([{**MODEL_GETS, "kind": "cut", "after_bytes": 1 * MiB, "count": 3}])
    took = _read_exact(m, want, "the model read through 3 cut connections")
    st = faults.stats()
    remote = _remote(m)
    print(f"\n3 x cut after 1 MiB: the model read exactly in {took:.2f} s; the proxy cut {st['injected']['cut']} "
          f"bodies (and passed {st['cut_too_short']} bodies of at most 1 MiB whole); source.remote: {remote}")
    assert st["injected"]["cut"] == 3, st
    assert remote["retries"] >= 3, remote


def test_an_answer_that_stalls_once_is_abandoned_after_the_request_timeout_and_tried_again(
        store, faults, mount, want):
    m = _mount(mount, store, extra=("--request-timeout", f"{REQUEST_TIMEOUT_S:g}s"))
    faults.set_rules([{**MODEL_GETS, "kind": "stall", "stall_s": STALL_S, "count": 1}])
    took = _read_exact(m, want, "the model read through one stalled answer")
    injected = faults.injected("stall")
    remote = _remote(m)
    print(f"\none stall of {STALL_S:g} s, --request-timeout {REQUEST_TIMEOUT_S:g}s: the model read exactly "
          f"in {took:.2f} s (bound {STALLED_ONCE_BOUND_S:g} s); the proxy stalled {injected}; source.remote: {remote}")
    assert injected == 1, f"the proxy stalled {injected} answers, not 1"
    assert took < STALLED_ONCE_BOUND_S, f"a read behind one stalled answer took {took:.1f} s"
    assert remote["retries"] >= 1, remote


def test_answers_that_always_stall_fail_a_read_with_eio_within_the_retries_bound(store, faults, mount, want):
    m = _mount(mount, store, extra=("--request-timeout", f"{REQUEST_TIMEOUT_S:g}s"))
    fd = _open_model(m)
    try:
        faults.set_rules([{**MODEL_GETS, "kind": "stall", "stall_s": STALL_S, "count": -1}])
        err, took = _expect_error(fd, want, "a read whose every answer stalls")
        injected = faults.injected("stall")
        print(f"\nevery answer stalls {STALL_S:g} s, --request-timeout {REQUEST_TIMEOUT_S:g}s: {err!r} after "
              f"{took:.1f} s (bound {STALLED_READ_BOUND_S:.1f} s: {RETRIES + 1} tries x {REQUEST_TIMEOUT_S:g} s + "
              f"{RETRY_PAUSES_S:.2f} s of pauses + 5 s); the proxy stalled {injected}; "
              f"source.remote: {m.stats().get('source', {}).get('remote')}; "
              f"daemon: {(_log_lines(m, 'read failed') or ['(no read failed line)'])[-1][-300:]}")
        faults.set_rules([])
        again = _reads_again(m, fd, want, "once the store answered again")
    finally:
        os.close(fd)
    print(f"then the handle read exactly and the whole model in {again:.2f} s, no remount")
    assert err.errno == errno.EIO, f"{err!r}, not EIO"
    assert took < STALLED_READ_BOUND_S, f"the read failed after {took:.1f} s, past {STALLED_READ_BOUND_S:.1f} s"


def test_a_full_local_disk_under_an_object_store_source_does_not_stop_reads(store, faults, mount, want):
    tier_dir = fresh_dir("tier-full")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tierfs-test-full", str(tier_dir)], check=True)
    try:
        m = _mount(mount, store, extra=("--disk-cache", str(tier_dir), "--disk-cache-size", "200MiB"))
        first = _read_exact(m, want, "the first read with the disk tier on a full disk")
        drop_caches()
        second = _read_exact(m, want, "the second read with the disk tier on a full disk")
        tier = m.stats()["disk_tier"]
        print(f"\nfull 6 MiB disk under a 200 MiB tier: two exact reads in {first:.2f} s and {second:.2f} s; "
              f"disk tier {tier}")
        assert m.alive(), m.log_tail()
        assert tier["write_errors"] >= 1, f"the tier never met the full disk: {tier}"
        assert tier["used_bytes"] <= tier["capacity_bytes"] < 6 * MiB, tier
        m.close()
    finally:
        subprocess.run(["umount", "-l", str(tier_dir)], check=False)
