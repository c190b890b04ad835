"""Crash recovery and shutdown under load.

* A daemon killed with SIGKILL leaves a dead mount ("Transport endpoint is not connected");
  the next `tierfs mount` on that path detects and replaces it, and `tierfs unmount` cleans it.
* SIGTERM while 8 threads stream a model larger than the budget (pread and mmap): the mount
  detaches, no reader hangs or sees wrong bytes, and the daemon exits 0 once they close.

The readers run in a child process, so a SIGBUS on an mmap of a dead mount fails the test
instead of killing pytest, and a hang is caught by a timeout (the daemon is then SIGKILLed,
which aborts the connection and frees every blocked reader).
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import gen
from conftest import Mount, TIERFS_BIN, fresh_dir, is_mounted, mounted_under

MiB = 1 << 20


def _mounts_at(mp: Path) -> int:
    s = str(Path(mp).resolve())
    return sum(1 for m in mounted_under(mp) if m == s)


def _wait_dead(m: Mount, timeout: float = 10.0) -> None:
    """Wait for the killed daemon, then for the mount to answer ENOTCONN (the root's cached
    attributes may answer a stat for up to the 0.5 s attribute timeout; with the io_uring
    transport, a request made while the kernel tears the dead daemon's rings down is ended with
    ECONNABORTED or ECANCELED, and the next one gets ENOTCONN)."""
    m.proc.wait(timeout=timeout)
    deadline = time.monotonic() + 3
    while True:
        try:
            os.stat(m.mnt)
        except OSError as e:
            if e.errno in (errno.ECONNABORTED, errno.ECANCELED) and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            assert e.errno == errno.ENOTCONN, f"want ENOTCONN on a killed daemon's mount, got {e!r}"
            break
        assert time.monotonic() < deadline, "stat of a killed daemon's mount still succeeds after 3 s"
        time.sleep(0.05)
    assert is_mounted(m.mnt), "the dead mount should still be in /proc/mounts (test premise)"


def _close_quietly(f) -> None:
    """close() of a file on a dead FUSE mount fails its flush with ENOTCONN (kernel behaviour)."""
    try:
        f.close()
    except OSError as e:
        assert e.errno == errno.ENOTCONN, repr(e)


@pytest.fixture
def small_src(workdir):
    src = workdir / "src"
    (src / "sub").mkdir(parents=True)
    gen.write_small(src / "model.safetensors", gen.dit_specs(256, 512, 3, ("BF16", "F16")), seed=41)
    (src / "sub" / "notes.txt").write_text("hello after a crash\n" * 50)
    (src / "blob.bin").write_bytes(os.urandom(3 * MiB + 7))
    return src


def _check_tree(src: Path, mnt: Path) -> None:
    for rel in ("model.safetensors", "sub/notes.txt", "blob.bin"):
        assert (mnt / rel).read_bytes() == (src / rel).read_bytes(), f"{rel} differs through the mount"
    assert sorted(os.listdir(mnt)) == sorted([*os.listdir(src), ".tierfs"])


@pytest.mark.parametrize("holder,mode", [(False, "cache"), (True, "cache"), (True, "passthrough")],
                         ids=["idle", "file-held-open", "passthrough-file-held-open"])
def test_sigkill_then_mount_recovers(mount, small_src, holder, mode):
    src = small_src
    m1 = mount(src, "32MiB", () if mode == "passthrough" else ("--no-model-passthrough",))
    _check_tree(src, m1.mnt)
    held = open(m1.mnt / "model.safetensors", "rb") if holder else None
    try:
        if held:
            held.read(4096)
        m1.proc.kill()
        _wait_dead(m1)
        # The next mount on the same path finds the dead mount and replaces it.
        m2 = mount(src, "32MiB", mnt=m1.mnt)
        assert m2.alive()
        _check_tree(src, m2.mnt)
        st = m2.stats()
        assert st["mount"]["pid"] == m2.pid, st["mount"]
        assert _mounts_at(m2.mnt) == 1, (
            f"dead mount not removed: {_mounts_at(m2.mnt)} mounts stacked at {m2.mnt}")
        assert "dead" in m2.log_tail().lower(), f"recovery not logged:\n{m2.log_tail()}"
        if held and mode == "cache":
            # The handle of the killed daemon's mount fails cleanly, it does not hang.
            with pytest.raises(OSError) as ei:
                os.pread(held.fileno(), 4096, 0)
            assert ei.value.errno in (errno.ENOTCONN, errno.EIO, errno.ECONNABORTED), repr(ei.value)
        elif held:
            # A passthrough handle reads the source through the kernel, not the daemon: it keeps
            # serving the file's exact bytes after the daemon died (or fails cleanly).
            want = (src / "model.safetensors").read_bytes()
            try:
                got = os.pread(held.fileno(), len(want), 0)
            except OSError as e:
                assert e.errno in (errno.ENOTCONN, errno.EIO, errno.ECONNABORTED), repr(e)
            else:
                assert got == want, "a passthrough handle served wrong bytes after the daemon died"
    finally:
        if held:
            _close_quietly(held)
    assert m2.close() == 0, f"recovered mount did not exit 0\n{m2.log_tail()}"
    assert not is_mounted(m1.mnt)


def test_sigkill_then_unmount_cleans(mount, small_src):
    m = mount(small_src, "32MiB")
    _check_tree(small_src, m.mnt)
    m.proc.kill()
    _wait_dead(m)
    r = subprocess.run([str(TIERFS_BIN), "unmount", str(m.mnt)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"`tierfs unmount` on a dead mount: rc={r.returncode} {r.stderr}"
    assert not is_mounted(m.mnt), "dead mount still in /proc/mounts after `tierfs unmount`"
    st = os.stat(m.mnt)  # a plain directory again
    assert st.st_mode & 0o170000 == 0o040000
    assert os.listdir(m.mnt) == [], "mountpoint should be the empty directory it was"
    # And it can be mounted again normally.
    m2 = Mount(small_src, "32MiB", mnt=m.mnt)
    try:
        _check_tree(small_src, m2.mnt)
    finally:
        assert m2.close() == 0


def test_unmount_of_dead_mount_with_open_file(mount, small_src):
    """A crashed daemon while a loader still holds a file: `tierfs unmount --lazy` cleans it
    (plain `tierfs unmount` may refuse with a clear message, since the mount is busy)."""
    m = mount(small_src, "32MiB")
    held = open(m.mnt / "blob.bin", "rb")
    try:
        held.read(10)
        m.proc.kill()
        _wait_dead(m)
        r = subprocess.run([str(TIERFS_BIN), "unmount", str(m.mnt)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            assert "lazy" in r.stderr, f"refusal should point at --lazy: {r.stderr!r}"
            r = subprocess.run([str(TIERFS_BIN), "unmount", "--lazy", str(m.mnt)],
                               capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"`tierfs unmount --lazy` on a dead busy mount: rc={r.returncode} {r.stderr}"
        assert not is_mounted(m.mnt)
        assert os.listdir(m.mnt) == []
    finally:
        _close_quietly(held)


# ----------------------------------------------------------------------------- SIGTERM under load

READER_CHILD = textwrap.dedent(r'''
    import errno, json, mmap, os, sys, threading, time
    src, path, nthreads, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    size = os.stat(src).st_size
    stop = threading.Event()
    res = [dict(kind=("mmap" if i % 2 else "pread"), bytes=0, mismatches=[], errors=[], done=False)
           for i in range(nthreads)]

    def reader(i):
        r = res[i]
        sfd = os.open(src, os.O_RDONLY)
        fd = None
        mm = None
        try:
            fd = os.open(path, os.O_RDONLY)
            if r["kind"] == "mmap":
                mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            off = (size // nthreads * i) // 4096 * 4096
            while not stop.is_set():
                n = min(chunk, size - off)
                if r["kind"] == "mmap":
                    got = mm[off:off + n]
                else:
                    got = os.pread(fd, n, off)
                want = os.pread(sfd, n, off)
                if got != want:
                    r["mismatches"].append([off, len(got)])
                    if len(r["mismatches"]) > 5:
                        break
                r["bytes"] += len(got)
                off = off + n if off + n < size else 0
        except OSError as e:
            r["errors"].append([e.errno, str(e)])
        finally:
            try:
                if mm is not None:
                    mm.close()
                if fd is not None:
                    os.close(fd)
            except OSError as e:
                r["errors"].append([e.errno, "close: " + str(e)])
            os.close(sfd)
            r["done"] = True

    ts = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(nthreads)]
    for t in ts:
        t.start()
    while min(r["bytes"] for r in res) < 8 * chunk and not all(r["done"] for r in res):
        time.sleep(0.01)
    print("streaming", flush=True)
    sys.stdin.readline()          # the parent says stop
    stop.set()
    for t in ts:
        t.join(timeout=20)
    out = {"readers": res, "hung": [i for i, t in enumerate(ts) if t.is_alive()]}
    print(json.dumps(out), flush=True)
    os._exit(0)
''')


def test_sigterm_while_streaming_pread_and_mmap(sorted_dit):
    """8 threads (4 pread, 4 mmap) stream a 720 MiB model through a 64 MiB budget; SIGTERM
    mid-stream.  Expected: the mount leaves /proc/mounts at once (lazy detach: files are open),
    readers keep getting correct bytes or errors and none hangs; once they close their files
    the daemon exits 0 within a few seconds; no mount is left."""
    size = sorted_dit.stat().st_size
    assert size >= 256 * MiB
    src = sorted_dit.parent
    m = Mount(src, "64MiB")
    child = None
    try:
        path = m.mnt / sorted_dit.name
        child = subprocess.Popen([sys.executable, "-c", READER_CHILD, str(sorted_dit), str(path), "8", str(MiB)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def line(timeout):
            r, _, _ = select.select([child.stdout], [], [], timeout)
            return child.stdout.readline() if r else None

        first = line(60)
        assert first and first.strip() == "streaming", (
            f"readers did not start streaming: {first!r}; rc={child.poll()} {child.stderr.read() if child.poll() is not None else ''}")
        stats_before = m.stats()
        t_sig = time.monotonic()
        m.proc.send_signal(signal.SIGTERM)
        deadline = t_sig + 5
        while is_mounted(m.mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        detached = not is_mounted(m.mnt)
        time.sleep(1.0)  # readers keep streaming from the detached mount for a while
        still_running_before_close = m.alive()
        child.stdin.write("stop\n")
        child.stdin.flush()
        out = line(30)
        if out is None:
            # Watchdog: readers hung. Kill the daemon (aborts the connection, frees them).
            m.proc.kill()
            subprocess.run(["umount", "-l", str(m.mnt)], capture_output=True)
            child.kill()
            pytest.fail(f"reader process hung 30 s after being told to stop (SIGTERM at t=0)\n{m.log_tail()}")
        if child.wait(timeout=10) != 0 or not out.strip().startswith("{"):
            pytest.fail(f"reader process died (rc={child.returncode}, SIGBUS is -7): {out!r}\n"
                        f"{child.stderr.read()[-3000:]}")
        t_closed = time.monotonic()
        res = json.loads(out)
        if os.environ.get("TIERFS_TEST_VERBOSE"):
            print(json.dumps(res), f"exit after close: {m.proc.poll()}")
        try:
            rc = m.proc.wait(timeout=10)
            exit_s = time.monotonic() - t_closed
        except subprocess.TimeoutExpired:
            rc, exit_s = None, None

        assert not res["hung"], f"reader threads {res['hung']} did not finish within 20 s of stop: {res}"
        bad = {i: r["mismatches"] for i, r in enumerate(res["readers"]) if r["mismatches"]}
        assert not bad, f"WRONG BYTES served around SIGTERM (thread: [offset, len]): {bad}"
        errs = {i: r["errors"] for i, r in enumerate(res["readers"]) if r["errors"]}
        for i, e in errs.items():
            assert all(x[0] in (errno.ENOTCONN, errno.EIO, errno.ECONNABORTED) for x in e), (
                f"reader {i}: unexpected error kind {e}")
        assert all(r["bytes"] > 0 for r in res["readers"]), res
        assert detached, "mount still in /proc/mounts 5 s after SIGTERM with files open"
        assert stats_before["cache"]["budget_bytes"] == 64 * MiB
        assert rc is not None, (f"daemon still running 10 s after the readers closed their files "
                                f"(alive before close: {still_running_before_close})\n{m.log_tail()}")
        assert rc == 0, f"daemon exit code {rc} after SIGTERM under load\n{m.log_tail()}"
        assert exit_s < 5, f"daemon took {exit_s:.1f} s to exit after the last close"
        assert not is_mounted(m.mnt)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        m.close()
    assert not is_mounted(m.mnt), "mount left behind"


def test_sigkill_then_daemon_mode_recovers(mount, small_src):
    """`tierfs mount --daemon` onto a dead mount: the parent waits while the child recovers
    the path and returns 0 once the new mount answers."""
    import re
    m1 = mount(small_src, "32MiB")
    m1.proc.kill()
    _wait_dead(m1)
    state = fresh_dir("state")
    r = subprocess.run([str(TIERFS_BIN), "mount", str(small_src), str(m1.mnt), "--ram-cache", "32MiB", "--daemon",
                        "--state-dir", str(state), "--log-file", str(state / "log")],
                       capture_output=True, text=True, timeout=60)
    mm = re.search(r"daemon (\d+)", r.stderr)
    pid = int(mm.group(1)) if mm else None
    try:
        assert r.returncode == 0, f"--daemon onto a dead mount: rc={r.returncode} {r.stderr}"
        assert pid is not None, r.stderr
        _check_tree(small_src, m1.mnt)
        assert _mounts_at(m1.mnt) == 1
        u = subprocess.run([str(TIERFS_BIN), "unmount", str(m1.mnt)], capture_output=True, text=True, timeout=30)
        assert u.returncode == 0, u.stderr
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}"), "daemon still running 10 s after `tierfs unmount`"
    finally:
        if is_mounted(m1.mnt):
            subprocess.run(["umount", "-l", str(m1.mnt)], capture_output=True)
        if pid is not None and os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
    assert not is_mounted(m1.mnt)
