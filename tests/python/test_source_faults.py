"""A source that stops answering or fails for a while: readers get EIO within --source-timeout,
never a hang; what is cached keeps being served; reads are exact again once the source is back;
the mount ends on SIGTERM and unmount while reads of the source hang, and the daemon exits once
the source answers; transient errors
that clear within the retries are invisible to readers and counted in the stats.

Stack: SOURCE dir -> faultfs (`read_fault` entries: reads that hang until cleared, reads that
fail the first N times) -> tierfs -> test. Every wait is bounded.

The reader's error for a read that timed out is EIO, not ETIMEDOUT: EIO is the error read(2)
documents and every loader handles as a failed read (ETIMEDOUT from read() is what an NFS
`softerr` mount gives, which many programs report as a network error of their own); the daemon's
log says that the source timed out.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time

import pytest

import gen
from conftest import is_mounted, quiesce

MiB = 1 << 20
TIMEOUT_S = 2.0
# What a timed-out read may take beyond the timeout: handing the error back through FUSE, a
# loaded 2-core machine.
SLACK_S = 8.0


@pytest.fixture
def stack(faultfs, workdir):
    src = workdir / "src"
    src.mkdir()
    model = src / "model.safetensors"
    # 8 blocks of ~14 MiB: the head is cached, the hang is far from anything read ahead.
    gen.write_small(model, gen.dit_specs(768, 1536, 8, ("BF16", "F16")), seed=51)
    ff = faultfs(src)
    return src, model, ff


def _pread(path, off, ln):
    with open(path, "rb", buffering=0) as f:
        return os.pread(f.fileno(), ln, off)


def _timed(fn, bound: float):
    """Runs fn() in a thread; returns (result or exception, seconds). A call still running after
    `bound` seconds fails the test (the thread is a daemon: teardown aborts the mount)."""
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


def _wait_for(what: str, cond, bound: float = 30.0, step: float = 0.05):
    deadline = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {bound} s"
        time.sleep(step)


def _hang_entry(a: int, b: int) -> dict:
    return {"file": "model.safetensors", "read_fault": {"start": a, "end": b, "hang": True}}


def _mid_of(model, name: str) -> int:
    ranges = {n: (a, b) for n, a, b in gen.tensor_ranges(model)}
    a, b = ranges[name]
    return (a + b) // 2 // 4096 * 4096


def test_a_hung_read_gets_eio_in_bounded_time_cached_bytes_serve_and_it_recovers(stack, mount):
    src, model, ff = stack
    m = mount(ff.mnt, "64MiB", extra=("--no-model-passthrough", "--source-timeout", f"{TIMEOUT_S}s"))
    want = model.read_bytes()
    head_end = 16 * MiB
    assert _pread(m.mnt / "model.safetensors", 0, head_end) == want[:head_end]
    quiesce(m)

    mid = _mid_of(model, "blocks.7.ffn.2.weight")
    ff.set_faults([_hang_entry(mid, mid + 4096)])
    got, took = _timed(lambda: _pread(m.mnt / "model.safetensors", mid - 1000, 8192),
                       TIMEOUT_S + SLACK_S + 20)
    assert isinstance(got, OSError), f"a read of a hung source returned {type(got)}"
    assert got.errno == errno.EIO, repr(got)
    assert TIMEOUT_S * 0.9 <= took <= TIMEOUT_S + SLACK_S, f"EIO after {took:.2f} s"
    print(f"\nhung read: EIO after {took:.2f} s (--source-timeout {TIMEOUT_S} s)")

    # The source still hangs (the daemon's read of it is stuck): the cached head reads exactly,
    # in far less than the timeout, and the stats say what happened.
    cached, took_cached = _timed(lambda: _pread(m.mnt / "model.safetensors", 0, head_end),
                                 TIMEOUT_S + SLACK_S)
    assert cached == want[:head_end], "cached bytes differ while the source hangs"
    assert took_cached < TIMEOUT_S, f"a cached read waited for the hung source: {took_cached:.2f} s"
    disk = m.stats()["disk"]
    assert disk["source_timeouts"] >= 1, disk
    assert disk["source_stuck"] >= 1, disk
    assert m.alive()

    # The source is back: the stuck read returns, the same range reads bit-exact, and so does
    # the whole file.
    ff.set_faults([])
    _wait_for("the stuck source read returned", lambda: m.stats()["disk"]["source_stuck"] == 0)
    assert _pread(m.mnt / "model.safetensors", mid - 1000, 8192) == want[mid - 1000:mid + 7192]
    assert (m.mnt / "model.safetensors").read_bytes() == want
    assert m.alive()


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


def _exits_once_the_source_answers(m, ff) -> int:
    """The daemon, its mount gone, exits at once or is held only by threads blocked in the
    source's FUSE read (the kernel waits uninterruptibly for a FUSE server's answer once a
    request was sent: no process can leave such a read, see docs/RELIABILITY.md); clearing the
    fault lets it exit. Returns its exit code."""
    try:
        return m.proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass
    states = _thread_states(m.pid)
    print(f"daemon threads left after the mount ended: {states}")
    assert states, "the daemon neither exited nor has threads"
    assert all(st.split()[0] in ("D", "Z") for st in states.values()), \
        f"a thread of the daemon is held by something else than the source: {states}"
    ff.set_faults([])
    try:
        return m.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tierfs did not exit once the source answered\n{_thread_states(m.pid)}\n"
                    f"{m.log_tail()}")


def test_sigterm_while_a_read_hangs_ends_the_mount_in_bounded_time(stack, mount):
    src, model, ff = stack
    m = mount(ff.mnt, "64MiB", extra=("--no-model-passthrough", "--source-timeout", f"{TIMEOUT_S}s"))
    mid = _mid_of(model, "blocks.6.ffn.0.weight")
    ff.set_faults([_hang_entry(mid, mid + 4096)])
    result: dict = {}

    def reader():
        try:
            result["value"] = _pread(m.mnt / "model.safetensors", mid, 4096)
        except OSError as e:
            result["value"] = e

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    _wait_for("faultfs saw the read", lambda: b"hanging a read" in ff.log_path.read_bytes())
    t0 = time.monotonic()
    m.proc.send_signal(signal.SIGTERM)
    t.join(timeout=TIMEOUT_S + SLACK_S)
    assert not t.is_alive(), "the reader hung after SIGTERM"
    assert isinstance(result.get("value"), OSError), result
    assert result["value"].errno == errno.EIO, result
    _wait_for("the mount is gone", lambda: not is_mounted(m.mnt), bound=TIMEOUT_S + SLACK_S)
    took = time.monotonic() - t0
    rc = _exits_once_the_source_answers(m, ff)
    print(f"\nSIGTERM with a hung source read: reader got EIO and the mount ended {took:.2f} s later")
    assert rc == 0, f"exit code {rc}\n{m.log_tail()}"


def test_unmount_while_a_prefetch_hangs(stack, mount, tierfs_bin):
    src, model, ff = stack
    m = mount(ff.mnt, "256MiB", extra=("--no-model-passthrough", "--source-timeout", "60s"))
    mid = _mid_of(model, "blocks.3.ffn.0.weight")
    ff.set_faults([_hang_entry(mid, mid + 4096)])
    # Warm the whole file in the background: one of its reads hangs, for far longer than the
    # test waits; no reader holds the file.
    fd = os.open(m.mnt / ".tierfs" / "control", os.O_WRONLY)
    try:
        os.write(fd, b"prefetch model.safetensors\n")
    finally:
        os.close(fd)
    _wait_for("faultfs saw the prefetch", lambda: b"hanging a read" in ff.log_path.read_bytes())
    t0 = time.monotonic()
    out = subprocess.run([str(tierfs_bin), "unmount", str(m.mnt)], capture_output=True, timeout=30)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert not is_mounted(m.mnt)
    print(f"\nunmount with a hung prefetch read: {took:.2f} s")
    assert took < 10, f"unmount waited for the hung source: {took:.2f} s"
    rc = _exits_once_the_source_answers(m, ff)
    assert rc == 0, f"exit code {rc}\n{m.log_tail()}"


@pytest.mark.parametrize("code", [errno.EIO, errno.ECONNRESET, errno.ESTALE],
                         ids=["EIO", "ECONNRESET", "ESTALE"])
def test_transient_errors_are_retried_invisibly_and_counted(stack, mount, code):
    src, model, ff = stack
    m = mount(ff.mnt, "64MiB", extra=("--no-model-passthrough",))
    want = model.read_bytes()
    faults = []
    for name in ("blocks.1.self_attn.q.weight", "blocks.4.ffn.2.weight"):
        mid = _mid_of(model, name)
        faults.append({"file": "model.safetensors",
                       "read_fault": {"start": mid, "end": mid + 4096, "fail_first": 2, "errno": code}})
    ff.set_faults(faults)
    got, took = _timed(lambda: (m.mnt / "model.safetensors").read_bytes(), 120)
    assert got == want, "bytes differ after transient errors"
    disk = quiesce(m)["disk"]
    print(f"\ntransient errno {code}: whole file read in {took:.2f} s; disk {disk}")
    # Two ranges, each failing twice before it reads (one try may meet both failures of a
    # range: a short read, then the error); every error was retried, none reached a read.
    assert disk["source_retries"] >= 2, disk
    assert disk["source_errors"] == disk["source_retries"], disk
    assert disk["errors"] == 0, f"a transient error reached a read: {disk}"
    assert disk["source_timeouts"] == 0, disk
    if code == errno.ESTALE:
        # A dead file handle: the retries opened the file again, found it the same version
        # and read on through the new descriptors.
        assert disk["source_reopens"] >= 1, disk
    log = ff.log_path.read_bytes()
    assert log.count(f"transient errno {code}".encode()) == 4, "faultfs did not inject them"
    assert m.alive()
