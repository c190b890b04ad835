"""Faults in SOURCE while readers stream through a real mount.

The source model is truncated, replaced with `mv`, deleted, made unreadable, or its directory
renamed while reader threads hold it open and stream it with `pread`.  Readers may get EIO
(or an early EOF after a truncation), but never bytes that are neither the old nor the new
content; handles opened before a replace/rename keep reading their version; new opens see
the change; and the daemon keeps serving other files correctly.  Every reader is joined with
a timeout: a hang kills the daemon (freeing the reader) and fails the test.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import gen

MiB = 1 << 20
SETTLE = 1.1        # attribute/entry timeout is 0.5 s; "changes show within a second"
LIST_SETTLE = 1.5   # a renamed directory must show in listings within this


@pytest.fixture(scope="module")
def model_bytes(data_dir) -> bytes:
    """A ~110 MiB DiT (6 blocks, 4.5 MiB weights), generated once and reused."""
    p = data_dir / "mount_faults" / "model.safetensors"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        gen.write_streaming(p, gen.dit_specs(768, 3072, 6, ("BF16", "F16")), seed=51)
    return p.read_bytes()


@pytest.fixture
def fault_src(workdir, model_bytes):
    src = workdir / "src"
    (src / "dirA").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(model_bytes)
    gen.write_small(src / "other.safetensors", gen.dit_specs(256, 512, 3), seed=52)
    (src / "plain.txt").write_bytes(os.urandom(2 * MiB + 3))
    return src


def check_others(m, src: Path) -> None:
    """The daemon still serves unrelated files exactly."""
    assert m.alive(), f"daemon died\n{m.log_tail()}"
    for rel in ("other.safetensors", "plain.txt"):
        assert (m.mnt / rel).read_bytes() == (src / rel).read_bytes(), f"{rel} wrong after the fault"
    assert m.alive(), f"daemon died\n{m.log_tail()}"


class Streamer(threading.Thread):
    """Streams an already-open fd with pread in `chunk` steps, wrapping at EOF, until stopped.

    `valid(off, got)` decides whether returned bytes are acceptable.  EIO and short reads are
    recorded (what they mean is up to the test); any other error ends the thread.
    """

    def __init__(self, fd: int, size: int, valid, start: int = 0, chunk: int = MiB):
        super().__init__(daemon=True)
        self.fd, self.size, self.valid, self.chunk = fd, size, valid, chunk
        self.off = start // 4096 * 4096
        self.stop_ev = threading.Event()
        self.bytes = 0
        self.mismatches: list[tuple[int, int]] = []
        self.errors: list[tuple[int, int | None]] = []   # (offset, errno)
        self.short: list[tuple[int, int]] = []           # (offset, length) of reads shorter than asked
        self.fatal: str | None = None

    def run(self) -> None:
        try:
            while not self.stop_ev.is_set():
                n = min(self.chunk, self.size - self.off)
                try:
                    got = os.pread(self.fd, n, self.off)
                except OSError as e:
                    self.errors.append((self.off, e.errno))
                    if e.errno != errno.EIO or len(self.errors) > 10_000:
                        self.fatal = repr(e)
                        return
                    self.off = self.off + n if self.off + n < self.size else 0
                    continue
                if got and not self.valid(self.off, got):
                    self.mismatches.append((self.off, len(got)))
                    if len(self.mismatches) > 20:
                        return
                self.bytes += len(got)
                if len(got) < n:
                    self.short.append((self.off, len(got)))
                    self.off = 0
                else:
                    self.off = self.off + n if self.off + n < self.size else 0
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.fatal = repr(e)


def stop_all(m, readers: list[Streamer], timeout: float = 20.0) -> None:
    """Stop and join readers; a reader still blocked after `timeout` s is a hang: kill the
    daemon (aborting the connection frees it) and fail."""
    for r in readers:
        r.stop_ev.set()
    deadline = time.monotonic() + timeout
    for r in readers:
        r.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [i for i, r in enumerate(readers) if r.is_alive()]
    if hung:
        tail = m.log_tail()
        m.proc.kill()
        subprocess.run(["umount", "-l", str(m.mnt)], capture_output=True)
        for r in readers:
            r.join(timeout=10)
        pytest.fail(f"reader(s) {hung} hung for {timeout} s (stuck at offsets "
                    f"{[readers[i].off for i in hung]})\n{tail}")


def start_readers(path: Path, n: int, size: int, valid, min_bytes: int = 8 * MiB) -> tuple[list[int], list[Streamer]]:
    fds = [os.open(path, os.O_RDONLY) for _ in range(n)]
    rs = [Streamer(fd, size, valid, start=size * i // n) for i, fd in enumerate(fds)]
    for r in rs:
        r.start()
    deadline = time.monotonic() + 30
    while min(r.bytes for r in rs) < min_bytes and time.monotonic() < deadline and all(r.is_alive() for r in rs):
        time.sleep(0.01)
    return fds, rs


def read_all(fd: int, size: int, chunk: int = 4 * MiB) -> bytes:
    out = bytearray()
    off = 0
    while off < size:
        b = os.pread(fd, min(chunk, size - off), off)
        if not b:
            break
        out += b
        off += len(b)
    return bytes(out)


def _close_all(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# ----------------------------------------------------------------------------- truncation

@pytest.mark.parametrize("regrow", [False, True], ids=["truncate", "truncate-and-regrow"])
def test_truncated_mid_read(mount, fault_src, model_bytes, regrow):
    """Truncate to about half mid-stream (and, for `regrow`, write different bytes back up to
    the old size, like a downloader rewriting the file in place)."""
    src, old = fault_src, model_bytes
    p = src / "model.safetensors"
    m = mount(src, "24MiB")
    mp = m.mnt / "model.safetensors"
    new_size = len(old) // 2 + 12345
    tail = np.random.default_rng(54).bytes(len(old) - new_size) if regrow else b""
    new = old[:new_size] + tail
    old_np = np.frombuffer(old, dtype=np.uint8)
    new_np = np.frombuffer(new.ljust(len(old), b"\0"), dtype=np.uint8)
    new_len = len(new)

    def valid(off, got):
        """Every byte is the old or the new content at its offset (never anything else)."""
        g = np.frombuffer(got, dtype=np.uint8)
        o = old_np[off:off + len(g)]
        if len(o) != len(g):
            return False
        ok = g == o
        end_new = max(0, min(len(g), new_len - off))
        ok[:end_new] |= g[:end_new] == new_np[off:off + end_new]
        return bool(ok.all())

    fds, rs = start_readers(mp, 4, len(old), valid)
    try:
        assert all(r.bytes > 0 for r in rs), [r.fatal for r in rs]
        before = [r.bytes for r in rs]
        os.truncate(p, new_size)
        if regrow:
            with open(p, "ab") as f:
                f.write(tail)
        time.sleep(SETTLE)
        # A new open sees the new file exactly, while the old handles stream on.
        assert os.stat(mp).st_size == len(new)
        assert mp.read_bytes() == new, "a new open after the change does not read the new file"
        time.sleep(0.5)
        stop_all(m, rs)
        after = [r.bytes for r in rs]
        for i, r in enumerate(rs):
            assert not r.mismatches, (f"reader {i}: WRONG BYTES (neither old nor new content) after truncating "
                                      f"{len(old)} -> {new_size}{' and regrowing' if regrow else ''}, "
                                      f"at [offset, len]: {r.mismatches[:5]}")
            assert r.fatal is None, f"reader {i}: {r.fatal} (errors {r.errors[:5]})"
            assert all(e == errno.EIO for _, e in r.errors), f"reader {i}: errors {r.errors[:5]}"
            if not regrow:
                # EIO is allowed anywhere by the contract, but a chunk (<= 4 MiB, docs/ARCHITECTURE.md) that lies
                # wholly below the new size still reads fine from disk: only reads within 4 MiB of
                # the new end (whose chunk straddles it) or past it may fail.
                low = [(o, e) for o, e in r.errors if o + MiB <= new_size - 4 * MiB]
                assert not low, f"reader {i}: EIO well below the new size {new_size}: {low[:5]}"
        if os.environ.get("TIERFS_TEST_VERBOSE"):
            for i, r in enumerate(rs):
                print(f"reader {i}: {r.bytes >> 20} MiB, EIO at {sorted(set(o for o, _ in r.errors))[:10]}, "
                      f"short {sorted(set(r.short))[:5]}")
        assert sum(after) > sum(before), "readers made no progress after the truncation"
        assert mp.read_bytes() == new
        check_others(m, src)
    finally:
        _close_all(fds)


# ----------------------------------------------------------------------------- mv replace

MMAP_CHILD = textwrap.dedent('''
    import hashlib, mmap, os, sys
    fd, size = int(sys.argv[1]), int(sys.argv[2])
    mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    h = hashlib.sha256()
    for off in range(0, size, 1 << 20):
        h.update(mm[off:off + (1 << 20)])
    print(h.hexdigest())
''')


def _mmap_sha(fd: int, size: int) -> str:
    """sha256 of an mmap of `fd` (in a child: a SIGBUS must fail the test, not kill pytest)."""
    r = subprocess.run([sys.executable, "-c", MMAP_CHILD, str(fd), str(size)], pass_fds=(fd,),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"mmap reader died rc={r.returncode} (-7 = SIGBUS): {r.stderr[-2000:]}"
    return r.stdout.strip()


def test_replaced_with_mv_while_open(mount, fault_src, model_bytes, workdir):
    src, old = fault_src, model_bytes
    p = src / "model.safetensors"
    m = mount(src, "24MiB")
    mp = m.mnt / "model.safetensors"
    tmp = workdir / "new.safetensors"
    gen.write_small(tmp, gen.dit_specs(768, 3328, 6, ("F16", "BF16")), seed=53)  # bigger, other bytes
    new = tmp.read_bytes()
    assert len(new) > len(old)

    fds, rs = start_readers(mp, 3, len(old), lambda off, got: got == old[off:off + len(got)])
    try:
        os.replace(tmp, p)
        time.sleep(SETTLE)
        # A new open reads the new version (read() and mmap), while the old handles stream on.
        with open(mp, "rb") as f:
            assert f.read() == new, "a new open after `mv` over the file does not read the new file"
            assert os.fstat(f.fileno()).st_size == len(new)
            assert _mmap_sha(f.fileno(), len(new)) == hashlib.sha256(new).hexdigest(), "mmap of the new file differs"
        time.sleep(0.5)
        stop_all(m, rs)
        for i, r in enumerate(rs):
            assert not r.mismatches, (f"reader {i} (opened before the mv): bytes differ from the version it opened, "
                                      f"at [offset, len]: {r.mismatches[:5]}")
            assert r.fatal is None and not r.errors and not r.short, (
                f"reader {i} (opened before the mv) failed: {r.fatal} errors={r.errors[:5]} short={r.short[:5]}")
        # The old handle still reads its whole version, with read() and with mmap.
        assert read_all(fds[0], len(old)) == old, "old handle no longer reads the version it opened"
        assert _mmap_sha(fds[1], len(old)) == hashlib.sha256(old).hexdigest(), (
            "mmap of a handle opened before the mv does not read the version it opened")
        with open(mp, "rb") as f:
            assert f.read() == new
        check_others(m, src)
    finally:
        _close_all(fds)


# ----------------------------------------------------------------------------- delete

def test_deleted_while_open(mount, fault_src, model_bytes):
    src, old = fault_src, model_bytes
    p = src / "model.safetensors"
    m = mount(src, "24MiB")
    mp = m.mnt / "model.safetensors"
    fds, rs = start_readers(mp, 3, len(old), lambda off, got: got == old[off:off + len(got)])
    try:
        os.unlink(p)
        time.sleep(SETTLE)
        with pytest.raises(FileNotFoundError):
            open(mp, "rb")
        assert "model.safetensors" not in os.listdir(m.mnt)
        time.sleep(0.5)
        stop_all(m, rs)
        for i, r in enumerate(rs):
            assert not r.mismatches, f"reader {i}: WRONG BYTES after the file was deleted: {r.mismatches[:5]}"
            assert r.fatal is None, f"reader {i}: {r.fatal}"
            assert all(e == errno.EIO for _, e in r.errors), r.errors[:5]
            assert not r.short, f"reader {i}: short reads of a deleted-but-open file: {r.short[:5]}"
        # Reading the whole file on an old handle: each range is right or EIO.
        off = 0
        while off < len(old):
            try:
                b = os.pread(fds[0], MiB, off)
                assert b == old[off:off + len(b)] and len(b) == min(MiB, len(old) - off), f"bad read at {off}"
            except OSError as e:
                assert e.errno == errno.EIO, repr(e)
            off += MiB
        check_others(m, src)
    finally:
        _close_all(fds)


# ----------------------------------------------------------------------------- permissions

NOBODY = 65534
PERM_CHILD = textwrap.dedent('''
    import hashlib, os, sys
    dfd, rel = int(sys.argv[1]), sys.argv[2]
    try:
        fd = os.open(rel, os.O_RDONLY, dir_fd=dfd)
    except OSError as e:
        print("err", e.errno); sys.exit(0)
    h = hashlib.sha256()
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        h.update(b)
    print("ok", h.hexdigest())
''')


def _as_nobody(dfd: int, rel: str) -> tuple[str, str]:
    # The mountpoint's parents are 0700 (mkdtemp): the child walks from an fd of the mount root.
    r = subprocess.run(["/usr/bin/python3", "-c", PERM_CHILD, str(dfd), rel], pass_fds=(dfd,),
                       user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"child as uid {NOBODY} failed: {r.stderr[-2000:]}"
    kind, val = r.stdout.split()
    return kind, val


def test_permission_changes_for_other_user(mount, fault_src, model_bytes):
    src, old = fault_src, model_bytes
    (src / "dirA" / "inner.txt").write_bytes(b"inner\n" * 1000)
    for p in (src, src / "dirA"):
        os.chmod(p, 0o755)
    for p in (src / "model.safetensors", src / "plain.txt", src / "dirA" / "inner.txt"):
        os.chmod(p, 0o644)
    m = mount(src, "24MiB", extra=("--allow-other",))
    mp = m.mnt / "model.safetensors"
    sha = {"model.safetensors": hashlib.sha256(old).hexdigest(),
           "plain.txt": hashlib.sha256((src / "plain.txt").read_bytes()).hexdigest(),
           "dirA/inner.txt": hashlib.sha256(b"inner\n" * 1000).hexdigest()}
    dfd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    # A root reader streams the model throughout: permission bits do not stop root.
    fds, rs = start_readers(mp, 2, len(old), lambda off, got: got == old[off:off + len(got)])
    try:
        for rel in sha:
            assert _as_nobody(dfd, rel) == ("ok", sha[rel]), f"{rel} not readable by uid {NOBODY} before chmod"
        for rel, chmod_path in (("model.safetensors", src / "model.safetensors"),
                                ("plain.txt", src / "plain.txt"),
                                ("dirA/inner.txt", src / "dirA")):
            restore = chmod_path.stat().st_mode & 0o7777
            os.chmod(chmod_path, 0o000)
            time.sleep(SETTLE)
            got = _as_nobody(dfd, rel)
            assert got == ("err", str(errno.EACCES)), (
                f"{rel}: after chmod 000 of {chmod_path.name}, uid {NOBODY} got {got}, want EACCES")
            with open(m.mnt / rel, "rb") as f:  # root still reads it
                assert hashlib.sha256(f.read()).hexdigest() == sha[rel], f"{rel}: root read differs under chmod 000"
            os.chmod(chmod_path, restore)
            time.sleep(SETTLE)
            assert _as_nobody(dfd, rel) == ("ok", sha[rel]), f"{rel}: not readable by uid {NOBODY} after chmod back"
        stop_all(m, rs)
        for i, r in enumerate(rs):
            assert not r.mismatches and r.fatal is None and not r.errors, (
                f"root reader {i}: mismatches={r.mismatches[:5]} fatal={r.fatal} errors={r.errors[:5]}")
        check_others(m, src)
    finally:
        stop_all(m, rs)
        _close_all(fds)
        os.close(dfd)


# ----------------------------------------------------------------------------- directory rename

def test_directory_renamed_under_reader(mount, fault_src, model_bytes):
    src, old = fault_src, model_bytes
    shutil.move(src / "model.safetensors", src / "dirA" / "model.safetensors")
    (src / "dirA" / "plain.bin").write_bytes(b"p" * 100_000)
    m = mount(src, "24MiB")
    mp = m.mnt / "dirA" / "model.safetensors"
    fds, rs = start_readers(mp, 3, len(old), lambda off, got: got == old[off:off + len(got)])
    pfd = os.open(m.mnt / "dirA" / "plain.bin", os.O_RDONLY)
    try:
        assert os.pread(pfd, 10, 0) == b"p" * 10
        os.rename(src / "dirA", src / "dirB")
        t0 = time.monotonic()
        while True:
            names = os.listdir(m.mnt)
            if "dirA" not in names and "dirB" in names:
                break
            if time.monotonic() - t0 > LIST_SETTLE:
                pytest.fail(f"{LIST_SETTLE} s after renaming dirA -> dirB in SOURCE the mount lists {sorted(names)}")
            time.sleep(0.05)
        time.sleep(SETTLE)
        assert not (m.mnt / "dirA").exists(), "old directory path still resolves"
        assert (m.mnt / "dirB" / "model.safetensors").read_bytes() == old, "new path does not read the file"
        assert sorted(os.listdir(m.mnt / "dirB")) == ["model.safetensors", "plain.bin"]
        time.sleep(0.3)
        stop_all(m, rs)
        for i, r in enumerate(rs):
            assert not r.mismatches, f"reader {i}: wrong bytes after its directory was renamed: {r.mismatches[:5]}"
            assert r.fatal is None and not r.errors and not r.short, (
                f"reader {i}: open handle broke when its directory was renamed: "
                f"fatal={r.fatal} errors={r.errors[:5]} short={r.short[:5]}")
        assert read_all(fds[0], len(old)) == old, "open handle does not read the whole file after the rename"
        assert os.pread(pfd, 100_000, 0) == b"p" * 100_000, "open plain-file handle broke after the rename"
        check_others(m, src)
    finally:
        stop_all(m, rs)
        _close_all(fds)
        os.close(pfd)


def test_directories_swapped_under_reader(mount, fault_src, model_bytes):
    """dirA and dirB swap names in SOURCE (via a third name) while a reader holds dirA's model:
    the open handle keeps its file; after the settle time each path reads what SOURCE has there."""
    src, old = fault_src, model_bytes
    shutil.move(src / "model.safetensors", src / "dirA" / "model.safetensors")
    (src / "dirB").mkdir()
    other = (src / "other.safetensors").read_bytes()
    (src / "dirB" / "model.safetensors").write_bytes(other)
    (src / "dirA" / "only_in_a.txt").write_text("a\n")
    m = mount(src, "24MiB")
    assert (m.mnt / "dirB" / "model.safetensors").read_bytes() == other
    fds, rs = start_readers(m.mnt / "dirA" / "model.safetensors", 2, len(old),
                            lambda off, got: got == old[off:off + len(got)])
    try:
        os.rename(src / "dirA", src / "tmpdir")
        os.rename(src / "dirB", src / "dirA")
        os.rename(src / "tmpdir", src / "dirB")
        time.sleep(SETTLE)
        assert sorted(os.listdir(m.mnt / "dirA")) == ["model.safetensors"], os.listdir(m.mnt / "dirA")
        assert sorted(os.listdir(m.mnt / "dirB")) == ["model.safetensors", "only_in_a.txt"], os.listdir(m.mnt / "dirB")
        assert os.stat(m.mnt / "dirA" / "model.safetensors").st_size == len(other)
        assert (m.mnt / "dirA" / "model.safetensors").read_bytes() == other, "dirA/ serves the old dirA's file"
        assert (m.mnt / "dirB" / "model.safetensors").read_bytes() == old, "dirB/ does not serve the moved file"
        assert (m.mnt / "dirB" / "only_in_a.txt").read_text() == "a\n"
        stop_all(m, rs)
        for i, r in enumerate(rs):
            assert not r.mismatches and r.fatal is None and not r.errors and not r.short, (
                f"reader {i} after the swap: mismatches={r.mismatches[:5]} fatal={r.fatal} "
                f"errors={r.errors[:5]} short={r.short[:5]}")
        check_others(m, src)
    finally:
        stop_all(m, rs)
        _close_all(fds)


def test_recreated_under_old_name_while_open(mount, fault_src, model_bytes):
    """The model is deleted while open and a different model is created under the same name:
    the old handle keeps the old bytes (or EIO), a new open reads the new file exactly."""
    src, old = fault_src, model_bytes
    p = src / "model.safetensors"
    m = mount(src, "24MiB")
    mp = m.mnt / "model.safetensors"
    fds, rs = start_readers(mp, 2, len(old), lambda off, got: got == old[off:off + len(got)])
    try:
        os.unlink(p)
        new = (src / "other.safetensors").read_bytes()
        p.write_bytes(new)
        time.sleep(SETTLE)
        assert mp.read_bytes() == new, "a new open after delete + recreate does not read the new file"
        stop_all(m, rs)
        for i, r in enumerate(rs):
            assert not r.mismatches, f"reader {i}: bytes of the recreated file on an old handle: {r.mismatches[:5]}"
            assert r.fatal is None and all(e == errno.EIO for _, e in r.errors), (r.fatal, r.errors[:5])
        check_others(m, src)
    finally:
        stop_all(m, rs)
        _close_all(fds)
