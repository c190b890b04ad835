"""``MNT/.tierfs/control`` (ram-cache SIZE / drop / prefetch PATH / plan PATHS) and ``tierfs ctl``.

The control file is write-only for the mounting user (mode 0200), takes one command per
``write()`` (a trailing newline is fine), and answers anything else with ``EINVAL`` while leaving
the daemon, the budget and the cache exactly as they were. The rest of the mount stays read-only
(``EROFS``); the mount cannot carry the kernel's ``ro`` flag (the control file takes writes),
so the write paths are checked here.
"""

from __future__ import annotations

import errno
import os
import random
import re
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

import gen
from conftest import MiB, quiesce
from test_prefetch import DitModel, Reader, own_state

PANIC = re.compile(r"panicked at|RUST_BACKTRACE|stack backtrace", re.I)
MODEL_REL = "sub/model.safetensors"
DIT_REL = "dit.safetensors"


# ----------------------------------------------------------------------------- fixtures, helpers

@pytest.fixture(scope="session")
def ctl_source(data_dir, sorted_dit) -> Path:
    """SOURCE for control tests: sub/model.safetensors (~64 MiB DiT, 8 blocks), a link to the
    name-sorted 720 MiB DiT as dit.safetensors, and a text file. Never modified."""
    root = data_dir / "ctl_src"
    done = root / ".complete"
    if done.exists():
        return root
    (root / "sub").mkdir(parents=True, exist_ok=True)
    gen.write_streaming(root / MODEL_REL, gen.dit_specs(512, 2048, 8, ("BF16",)), seed=31)
    dit = root / DIT_REL
    if not dit.exists():
        try:
            os.link(sorted_dit, dit)
        except OSError:
            os.symlink(sorted_dit, dit)
    (root / "notes.txt").write_text("not a model\n")
    done.write_text("ok\n")
    return root


def control(mnt: Path) -> Path:
    return mnt / ".tierfs" / "control"


def ctl(mnt: Path, cmd: bytes | str) -> int:
    """One command, one write() on a fresh O_WRONLY descriptor; returns write()'s result."""
    data = cmd.encode() if isinstance(cmd, str) else cmd
    fd = os.open(control(mnt), os.O_WRONLY)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


def data_bytes(p: Path) -> int:
    hn, _ = gen.read_header(p)
    return p.stat().st_size - 8 - hn


def state(m) -> dict:
    """What an invalid command must leave unchanged."""
    st = m.stats()
    return {
        "budget_bytes": st["cache"]["budget_bytes"],
        "used_bytes": st["cache"]["used_bytes"],
        "chunks": st["cache"]["chunks"],
        "evicted_bytes": st["cache"]["evicted_bytes"],
        "disk.read_bytes": st["disk"]["read_bytes"],
        "prefetch.issued_bytes": st["prefetch"]["issued_bytes"],
        "files": {f["path"]: f["cached_bytes"] for f in st["files"]},
    }


def file_cached(m, rel: str) -> int | None:
    f = m.file_stats(rel)
    return None if f is None else f["cached_bytes"]


def read_exact(mnt_p: Path, src_p: Path) -> None:
    got, want = mnt_p.read_bytes(), src_p.read_bytes()
    assert got == want, f"{mnt_p}: {len(got)} B read through the mount differ from the source ({len(want)} B)"


def wait_for(pred, timeout: float, period: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(period)


def run_cli(tierfs_bin, *args, timeout=60):
    return subprocess.run([str(tierfs_bin), *map(str, args)], capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- the file itself

def test_control_listed_write_only(mount, ctl_source):
    m = mount(ctl_source, "64MiB", own_state())
    names = os.listdir(m.mnt / ".tierfs")
    assert "control" in names and "stats" in names, names
    st = os.stat(control(m.mnt))
    assert stat.S_ISREG(st.st_mode), oct(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o200, f"control mode {oct(stat.S_IMODE(st.st_mode))}, want 0o200"
    assert st.st_uid == os.getuid(), f"control owned by uid {st.st_uid}, want the mounting user {os.getuid()}"
    # the source has no .tierfs; nothing of it leaks into SOURCE
    assert not (ctl_source / ".tierfs").exists()


def test_control_not_readable(mount, ctl_source):
    m = mount(ctl_source, "64MiB", own_state())
    before = state(m)
    try:
        fd = os.open(control(m.mnt), os.O_RDONLY)
    except OSError as e:
        assert e.errno == errno.EACCES, f"open(O_RDONLY): {errno.errorcode.get(e.errno)}, want EACCES"
    else:
        try:
            with pytest.raises(OSError) as ei:
                os.read(fd, 4096)
            assert ei.value.errno in (errno.EACCES, errno.EBADF), (
                f"read of control: {errno.errorcode.get(ei.value.errno)}, want EACCES or EBADF")
        finally:
            os.close(fd)
    assert state(m) == before
    assert m.alive()


# ----------------------------------------------------------------------------- ram-cache

@pytest.mark.parametrize("size,want", [("512MiB", 512 << 20), ("8GiB", 8 << 30), ("8G", 8 << 30),
                                       ("1048576", 1 << 20)])
@pytest.mark.parametrize("newline", ["", "\n"], ids=["bare", "newline"])
def test_ram_cache_size_forms(mount, ctl_source, size, want, newline):
    m = mount(ctl_source, "64MiB", own_state())
    cmd = f"ram-cache {size}{newline}"
    assert ctl(m.mnt, cmd) == len(cmd)
    assert m.stats()["cache"]["budget_bytes"] == want


# The control tests below exercise the chunk cache: files that fit the budget would otherwise be
# served by passthrough (tests/python/test_passthrough.py covers that mode's budget and drop).
CACHE_ONLY = "--no-model-passthrough"


def test_ram_cache_shrink_evicts_at_once_then_grow(mount, ctl_source):
    src_dit = ctl_source / DIT_REL
    m = mount(ctl_source, "512MiB", (*own_state(), CACHE_ONLY))
    model = DitModel(src_dit)
    with Reader(model, m.mnt / DIT_REL) as r:
        for k in range(14):  # ~250 MiB
            r.block(k)
        assert not r.bad, r.bad[:3]
    st = quiesce(m)
    assert st["cache"]["used_bytes"] >= 200 * MiB, st["cache"]
    ev0 = st["cache"]["evicted_bytes"]

    ctl(m.mnt, "ram-cache 16MiB\n")
    st = m.stats()  # right after the write returned
    assert st["cache"]["budget_bytes"] == 16 * MiB, st["cache"]
    assert st["cache"]["used_bytes"] <= 16 * MiB, f"used_bytes right after shrinking to 16MiB: {st['cache']}"
    assert st["cache"]["evicted_bytes"] - ev0 >= 180 * MiB, f"shrink did not count evictions: {st['cache']}"
    assert (m.file_stats(DIT_REL) or {}).get("cached_bytes", 0) <= 16 * MiB

    # reads keep working under the small budget, and stay within it
    read_exact(m.mnt / MODEL_REL, ctl_source / MODEL_REL)
    st = quiesce(m)
    assert st["cache"]["budget_bytes"] == 16 * MiB and st["cache"]["used_bytes"] <= 16 * MiB, st["cache"]

    # grow: the new budget is used
    ctl(m.mnt, "ram-cache 1GiB")
    assert m.stats()["cache"]["budget_bytes"] == 1 << 30
    with Reader(model, m.mnt / DIT_REL) as r:
        for k in range(20):
            r.block(k)
        assert not r.bad, r.bad[:3]
    st = quiesce(m)
    assert st["cache"]["used_bytes"] > 300 * MiB, f"cache did not grow past the old budgets: {st['cache']}"
    assert st["cache"]["used_bytes"] <= 1 << 30
    assert m.alive()


def test_shrink_and_drop_under_concurrent_readers(mount, ctl_source):
    """8 reader threads stream the big file while the budget shrinks 512MiB -> 24MiB and the
    cache is dropped: used_bytes <= 24MiB right after the shrink and on every later sample,
    bytes stay exact, nothing deadlocks."""
    src_dit = ctl_source / DIT_REL
    m = mount(ctl_source, "512MiB", own_state())
    model = DitModel(src_dit)
    order = sorted(model.blocks)
    over: list[dict] = []
    errors: list[str] = []
    stop = threading.Event()
    shrunk = threading.Event()

    def reader():
        try:
            with Reader(model, m.mnt / DIT_REL) as r:
                r.run_pass(order, compute_s=0.0)
                r.run_pass(order, compute_s=0.0)
                errors.extend(r.bad)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            stop.set()

    def sampler():
        while not stop.is_set():
            if shrunk.is_set():
                c = m.stats()["cache"]
                if c["used_bytes"] > 24 * MiB:
                    over.append(c)
            time.sleep(0.02)

    t = threading.Thread(target=reader, daemon=True)
    s = threading.Thread(target=sampler, daemon=True)
    t.start()
    s.start()
    assert wait_for(lambda: m.stats()["cache"]["used_bytes"] > 128 * MiB, 30), m.stats()["cache"]
    ctl(m.mnt, "ram-cache 24MiB\n")
    c = m.stats()["cache"]
    shrunk.set()
    assert c["budget_bytes"] == 24 * MiB and c["used_bytes"] <= 24 * MiB, (
        f"right after shrinking under load: {c}")
    time.sleep(0.3)
    ctl(m.mnt, "drop")
    t.join(timeout=300)
    stop.set()
    s.join(timeout=10)
    assert not t.is_alive(), f"readers hung after shrink/drop\n{m.log_tail()}"
    assert not errors, f"{len(errors)} reader errors, first: {errors[:3]}"
    assert not over, f"used_bytes above the 24MiB budget after the shrink, {len(over)} samples, first: {over[:2]}"
    assert m.alive()


# ----------------------------------------------------------------------------- drop

def test_drop_empties_cache(mount, ctl_source):
    m = mount(ctl_source, "256MiB", (*own_state(), CACHE_ONLY))
    read_exact(m.mnt / MODEL_REL, ctl_source / MODEL_REL)
    st = quiesce(m)
    assert st["cache"]["used_bytes"] > 32 * MiB, st["cache"]
    assert ctl(m.mnt, "drop\n") == 5
    st = m.stats()
    assert st["cache"]["used_bytes"] == 0, f"used_bytes right after drop: {st['cache']}"
    assert st["cache"]["chunks"] == 0, st["cache"]
    assert st["cache"]["budget_bytes"] == 256 * MiB, "drop must not change the budget"
    assert all(f["cached_bytes"] == 0 for f in st["files"]), st["files"]
    # the next read goes to the disk again (beyond what the kernel page-cache window may hold)
    miss0, disk0, window = st["cache"]["misses"], st["disk"]["read_bytes"], st["kernel_page_cache"]["window_bytes"]
    read_exact(m.mnt / MODEL_REL, ctl_source / MODEL_REL)
    st = quiesce(m)
    assert st["cache"]["misses"] > miss0, st["cache"]
    assert st["disk"]["read_bytes"] - disk0 >= data_bytes(ctl_source / MODEL_REL) - window, st["disk"]
    assert ctl(m.mnt, "drop") == 4  # without newline too
    assert m.stats()["cache"]["used_bytes"] == 0
    assert m.alive()


# ----------------------------------------------------------------------------- prefetch PATH

def test_prefetch_warms_whole_file(mount, ctl_source):
    """prefetch of a file never opened: it shows in files[], cached_bytes reaches the file's
    data, and reading it afterwards is served from the cache."""
    m = mount(ctl_source, "256MiB", own_state())
    want = data_bytes(ctl_source / MODEL_REL)
    cmd = f"prefetch {MODEL_REL}\n"
    assert ctl(m.mnt, cmd) == len(cmd)
    ok = wait_for(lambda: (file_cached(m, MODEL_REL) or 0) >= want, 20)
    st = quiesce(m)
    assert ok, f"cached_bytes of {MODEL_REL} did not reach its {want} data bytes in 20 s: {m.file_stats(MODEL_REL)}"
    assert st["cache"]["used_bytes"] <= st["cache"]["budget_bytes"]
    hits0, disk0 = st["cache"]["hits"], st["disk"]["read_bytes"]
    read_exact(m.mnt / MODEL_REL, ctl_source / MODEL_REL)
    st = quiesce(m)
    d_disk = st["disk"]["read_bytes"] - disk0
    assert st["cache"]["hits"] > hits0, st["cache"]
    assert d_disk <= max(MiB, want // 100), f"read after prefetch went to disk for {d_disk} B (file data {want} B)"
    assert m.alive()


def test_prefetch_capped_by_budget_default_order(mount, ctl_source):
    """Budget a quarter of the name-sorted DiT: prefetch fills the budget (no more) with the
    *default* model order — blocks 0, 1, 2, 3 (far apart in the file) are then all cache hits."""
    src = ctl_source / DIT_REL
    model = DitModel(src)
    budget = (model.data_bytes // 4) // MiB * MiB
    m = mount(ctl_source, f"{budget // MiB}MiB", own_state())
    ctl(m.mnt, f"prefetch {DIT_REL}")
    wait_for(lambda: (file_cached(m, DIT_REL) or 0) >= budget - 8 * MiB, 20)
    st = quiesce(m)
    cached = file_cached(m, DIT_REL)
    assert cached is not None and budget - 8 * MiB <= cached <= budget, (
        f"cached_bytes {cached} after prefetch, want min(file data, budget) = {budget} (within 2 chunks)")
    assert st["cache"]["used_bytes"] <= budget, st["cache"]
    miss0 = st["cache"]["misses"]
    with Reader(model, m.mnt / DIT_REL) as r:
        for k in (0, 1, 2, 3):
            r.block(k)
        assert not r.bad, r.bad[:3]
    st = m.stats()
    assert st["cache"]["misses"] == miss0, (
        f"blocks 0-3 were not all warmed (misses +{st['cache']['misses'] - miss0}): prefetch did not follow "
        f"the default numeric order; file stats {m.file_stats(DIT_REL)}")
    assert m.alive()


def test_prefetch_follows_learned_order(mount, ctl_source):
    """After a full pass in a shuffled block order (order learned), drop + prefetch warms the
    file in that learned order: its first blocks are then cache hits."""
    src = ctl_source / DIT_REL
    model = DitModel(src)
    budget = (model.data_bytes // 4) // MiB * MiB
    m = mount(ctl_source, f"{budget // MiB}MiB", own_state())
    order = sorted(model.blocks)
    random.Random(9).shuffle(order)
    with Reader(model, m.mnt / DIT_REL) as r:
        r.run_pass(order, compute_s=0.0)
        # The next pass starts. A touch far behind the reader is only taken as a new pass once
        # the reader goes on from there (a straggling thread looks the same at first; see
        # "Restarts" in core/src/reader/tracker.rs), so the finished pass is learned when the
        # second block of the next one is entered: `pre`'s small tensors may all be read as
        # probes, which touch no block.
        r.read(model.pre)
        r.block(order[0])
        r.block(order[1])
        assert not r.bad, r.bad[:3]
    quiesce(m)
    f = m.file_stats(DIT_REL)
    assert f["order_learned"] is True, f
    ctl(m.mnt, "drop")
    assert m.stats()["cache"]["used_bytes"] == 0
    ctl(m.mnt, f"prefetch {DIT_REL}\n")
    wait_for(lambda: (file_cached(m, DIT_REL) or 0) >= budget - 8 * MiB, 20)
    st = quiesce(m)
    assert file_cached(m, DIT_REL) >= budget - 8 * MiB, m.file_stats(DIT_REL)
    miss0 = st["cache"]["misses"]
    with Reader(model, m.mnt / DIT_REL) as r:
        for k in order[:4]:
            r.block(k)
        assert not r.bad, r.bad[:3]
    st = m.stats()
    assert st["cache"]["misses"] == miss0, (
        f"first blocks of the learned order {order[:4]} not warmed (misses +{st['cache']['misses'] - miss0}); "
        f"file stats {m.file_stats(DIT_REL)}")
    assert m.alive()


# ----------------------------------------------------------------------------- invalid commands

def bad_commands(source: Path) -> list[bytes]:
    outside = os.path.relpath(source.parent / "sorted_dit" / "dit_sorted.safetensors", source)
    return [
        b"bogus", b"bogus\n", b"\n", b" ", b"\x00", b"\xff\xfe\xfd\n",
        b"ram-cache", b"ram-cache\n", b"ram-cache lots", b"ram-cache 12XB\n", b"ram-cache -5MiB",
        b"ram-cache 64MiB 128MiB", b"ram-cache 64MiB\x00",
        b"drop now", b"drop 1\n",
        b"prefetch", b"prefetch\n", b"prefetch nonexistent.safetensors", b"prefetch sub/nonexistent.safetensors\n",
        b"prefetch ../../etc/passwd", b"prefetch /etc/passwd", f"prefetch {outside}".encode(),
        f"prefetch {MODEL_REL} extra".encode(),
        b"x" * (1 << 20),
        b"ram-cache 32MiB" + b" " * (1 << 20),
        b"drop" + b"\n" * (1 << 20),
        b"prefetch " + MODEL_REL.encode() + b"\n" * (1 << 20),
        f"plan\n{MODEL_REL}\nnotes.txt".encode(), b"plan\n../../etc/passwd.safetensors",
        f"plan\n{MODEL_REL}\n/{MODEL_REL}".encode(),
        ("plan\n" + "".join(f"m{i}.safetensors\n" for i in range(65))).encode(),
    ]


def test_invalid_commands_einval_and_unchanged(mount, ctl_source):
    m = mount(ctl_source, "256MiB", own_state())
    read_exact(m.mnt / MODEL_REL, ctl_source / MODEL_REL)   # some cache content to keep
    quiesce(m)
    cmds = bad_commands(ctl_source)
    # the escape target really exists, so "prefetch ../<it>" is refused for escaping, not for missing
    assert (ctl_source.parent / "sorted_dit" / "dit_sorted.safetensors").exists()
    wrong = []
    for cmd in cmds:
        before = state(m)
        shown = cmd[:40] + (b"...(%d B)" % len(cmd) if len(cmd) > 40 else b"")
        try:
            n = ctl(m.mnt, cmd)
            wrong.append(f"{shown!r}: write returned {n}, want EINVAL")
        except OSError as e:
            if e.errno != errno.EINVAL:
                wrong.append(f"{shown!r}: {errno.errorcode.get(e.errno, e.errno)}, want EINVAL")
        time.sleep(0.1)  # a wrongly accepted prefetch/drop would show by now
        after = state(m)
        if after != before:
            wrong.append(f"{shown!r}: state changed: { {k: (before[k], after[k]) for k in before if before[k] != after[k]} }")
        if not m.alive():
            pytest.fail(f"daemon died on {shown!r}\n{m.log_tail()}")
    assert not wrong, f"{len(wrong)} of {len(cmds)} invalid commands mishandled:\n" + "\n".join(wrong)
    # the daemon still takes valid commands
    ctl(m.mnt, "ram-cache 128MiB")
    assert m.stats()["cache"]["budget_bytes"] == 128 * MiB


def test_empty_write(mount, ctl_source):
    """A zero-length write(). The contract says EINVAL; Linux FUSE does not send empty writes to
    the daemon (write(fd, "", 0) returns 0 in the kernel), so 0 is accepted as long as nothing
    changes."""
    m = mount(ctl_source, "256MiB", own_state())
    read_exact(m.mnt / MODEL_REL, ctl_source / MODEL_REL)
    quiesce(m)
    before = state(m)
    try:
        n = ctl(m.mnt, b"")
        assert n == 0, f"empty write returned {n}"
    except OSError as e:
        assert e.errno == errno.EINVAL, errno.errorcode.get(e.errno)
    time.sleep(0.1)
    assert state(m) == before
    assert m.alive()


def test_same_descriptor_several_commands(mount, ctl_source):
    """One command per write(): valid, invalid, valid again on one descriptor."""
    m = mount(ctl_source, "64MiB", own_state())
    fd = os.open(control(m.mnt), os.O_WRONLY)
    try:
        assert os.write(fd, b"ram-cache 32MiB\n") == 16
        assert m.stats()["cache"]["budget_bytes"] == 32 * MiB
        with pytest.raises(OSError) as ei:
            os.write(fd, b"ram-cache lots\n")
        assert ei.value.errno == errno.EINVAL
        assert m.stats()["cache"]["budget_bytes"] == 32 * MiB
        assert os.write(fd, b"ram-cache 48MiB") == 15
        assert m.stats()["cache"]["budget_bytes"] == 48 * MiB
        assert os.write(fd, b"drop\n") == 5
    finally:
        os.close(fd)
    assert m.alive()


# ----------------------------------------------------------------------------- read-only elsewhere

def test_rest_of_mount_still_erofs(mount, workdir):
    """Without the kernel's `ro` flag the daemon refuses every write path itself (EROFS); the
    control file's own metadata cannot be changed either."""
    import test_readonly
    src = workdir / "src"
    (src / "d").mkdir(parents=True)
    (src / "f.txt").write_text("hello\n")
    (src / "m.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (src / "d" / "inner.txt").write_text("x")
    os.symlink("f.txt", src / "lnk")
    m = mount(src, "64MiB", own_state())
    before = test_readonly._snapshot(src)
    c = str(control(m.mnt))
    ops = dict(test_readonly._ops(m.mnt))
    ops.update({
        "unlink control": lambda: os.unlink(c),
        "rename control": lambda: os.rename(c, str(m.mnt / ".tierfs" / "ctl2")),
        "rename onto control": lambda: os.rename(str(m.mnt / "f.txt"), c),
        "chmod control": lambda: os.chmod(c, 0o666),
        "chown control": lambda: os.chown(c, 1234, 1234),
        "utime control": lambda: os.utime(c, (0, 0)),
        "link control": lambda: os.link(c, str(m.mnt / "ctl-link")),
        "setxattr control": lambda: os.setxattr(c, "user.x", b"1"),
        "write via O_RDWR model": lambda: os.open(str(m.mnt / "m.safetensors"), os.O_RDWR),
        "mkdir in .tierfs": lambda: os.mkdir(str(m.mnt / ".tierfs" / "d")),
    })
    wrong = test_readonly.erofs_failures(ops)
    assert not wrong, "write paths not returning EROFS:\n" + "\n".join(wrong)
    assert test_readonly._snapshot(src) == before, "SOURCE changed"
    st = os.stat(c)
    assert stat.S_IMODE(st.st_mode) == 0o200 and st.st_uid == os.getuid()
    assert sorted(os.listdir(m.mnt / ".tierfs")) == ["control", "metrics", "stats"], os.listdir(m.mnt / ".tierfs")
    assert (m.mnt / "f.txt").read_text() == "hello\n"
    assert m.alive()


def test_shell_redirect_and_truncate(mount, ctl_source):
    """`echo CMD > control` works (its O_TRUNC arrives as a size-0 truncate, accepted and a no-op);
    a bad command through the shell fails; truncating to another size is refused, changing nothing."""
    m = mount(ctl_source, "64MiB", own_state())
    c = str(control(m.mnt))
    r = subprocess.run(["sh", "-c", f"echo 'ram-cache 32MiB' > '{c}'"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert m.stats()["cache"]["budget_bytes"] == 32 * MiB
    before = state(m)
    r = subprocess.run(["sh", "-c", f"echo 'ram-cache lots' > '{c}'"], capture_output=True, text=True)
    assert r.returncode != 0, "a bad command through the shell must fail"
    assert state(m) == before
    with pytest.raises(OSError) as ei:
        os.truncate(c, 5)
    assert ei.value.errno in (errno.EROFS, errno.EINVAL, errno.EACCES, errno.EPERM), ei.value
    assert state(m) == before and m.alive()


PY_FOR_NOBODY = "/usr/bin/python3"


@pytest.mark.skipif(not os.access(PY_FOR_NOBODY, os.X_OK), reason="no system python3 for the other user")
def test_other_user_cannot_write_control_nor_read_the_stats(mount, workdir):
    """With --allow-other, another user can neither write the control (0200) nor read the stats
    or the metrics (0400: they name every model anyone opened, which that user may not be able
    to list)."""
    import conftest
    src = workdir / "src"
    src.mkdir(mode=0o755)
    os.chmod(src, 0o755)
    (src / "a.txt").write_text("a\n")
    m = mount(src, "64MiB", ("--allow-other", *own_state()))
    # let "nobody" reach the mountpoint (the session dirs are 0700)
    dirs = [p for p in [conftest.SESSION_ROOT, *m.mnt.parents] if str(p).startswith(str(conftest.SESSION_ROOT))]
    saved = {p: stat.S_IMODE(os.stat(p).st_mode) for p in set(dirs)}
    child = (
        "import errno, json, os, sys\n"
        "d = sys.argv[1]\n"
        "for name in ('stats', 'metrics'):\n"
        "    try:\n"
        "        open(d + '/' + name).read()\n"
        "        print('READ')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode.get(e.errno, e.errno))\n"
        "try:\n"
        "    fd = os.open(d + '/control', os.O_WRONLY)\n"
        "    os.write(fd, b'ram-cache 1MiB')\n"
        "    print('WROTE')\n"
        "except OSError as e:\n"
        "    print(errno.errorcode.get(e.errno, e.errno))\n"
    )
    try:
        for p in saved:
            os.chmod(p, saved[p] | 0o711)
        r = subprocess.run([PY_FOR_NOBODY, "-c", child, str(m.mnt / ".tierfs")], user=65534, group=65534,
                           extra_groups=[], cwd="/", capture_output=True, text=True, timeout=30)
    finally:
        for p, mode in saved.items():
            os.chmod(p, mode)
    assert r.returncode == 0, f"child (uid 65534) failed: {r.stderr[-1500:]}"
    read, read_metrics, wrote = r.stdout.split()
    assert read == "EACCES", f"uid 65534 reading stats: {read}"
    assert read_metrics == "EACCES", f"uid 65534 reading metrics: {read_metrics}"
    assert wrote in ("EACCES", "EPERM"), f"uid 65534 writing control: {wrote}"
    assert stat.S_IMODE(os.stat(m.mnt / ".tierfs" / "stats").st_mode) == 0o400
    assert stat.S_IMODE(os.stat(m.mnt / ".tierfs" / "metrics").st_mode) == 0o400
    assert m.stats()["cache"]["budget_bytes"] == 64 * MiB


# ----------------------------------------------------------------------------- tierfs ctl

def test_cli_ctl_commands(tierfs_bin, mount, ctl_source):
    m = mount(ctl_source, "256MiB", own_state())
    r = run_cli(tierfs_bin, "ctl", m.mnt, "ram-cache", "8GiB")
    assert r.returncode == 0, r.stderr
    assert m.stats()["cache"]["budget_bytes"] == 8 << 30
    r = run_cli(tierfs_bin, "ctl", m.mnt, "ram-cache", "256MiB")
    assert r.returncode == 0 and m.stats()["cache"]["budget_bytes"] == 256 * MiB, r.stderr

    r = run_cli(tierfs_bin, "ctl", m.mnt, "prefetch", MODEL_REL)
    assert r.returncode == 0, r.stderr
    want = data_bytes(ctl_source / MODEL_REL)
    assert wait_for(lambda: (file_cached(m, MODEL_REL) or 0) >= want, 20), m.file_stats(MODEL_REL)
    quiesce(m)

    r = run_cli(tierfs_bin, "ctl", m.mnt, "drop")
    assert r.returncode == 0, r.stderr
    assert m.stats()["cache"]["used_bytes"] == 0
    assert not PANIC.search(r.stderr)
    assert m.alive()


@pytest.mark.parametrize("args", [["bogus"], ["ram-cache", "lots"], ["ram-cache"], ["ram-cache", "1GiB", "2GiB"],
                                  ["drop", "now"], ["prefetch"], ["prefetch", "nonexistent.safetensors"],
                                  ["prefetch", "../../etc/passwd"], []], ids=lambda a: " ".join(a) or "none")
def test_cli_ctl_bad_command(tierfs_bin, mount, ctl_source, args):
    m = mount(ctl_source, "256MiB", own_state())
    read_exact(m.mnt / MODEL_REL, ctl_source / MODEL_REL)
    quiesce(m)
    before = state(m)
    r = run_cli(tierfs_bin, "ctl", m.mnt, *args)
    assert r.returncode != 0, f"`tierfs ctl MNT {' '.join(args)}` succeeded"
    assert r.returncode != 101, "exit code 101 is Rust's panic code"
    err = r.stderr.strip()
    assert err and not PANIC.search(r.stderr), r.stderr[-2000:]
    if args:  # an empty command line may print clap's usage; a bad command must be one line
        assert len(err.splitlines()) == 1, f"error should be one line, got:\n{err}"
    time.sleep(0.1)
    assert state(m) == before
    assert m.alive()


def test_cli_ctl_not_a_mount(tierfs_bin, workdir):
    r = run_cli(tierfs_bin, "ctl", workdir, "drop")
    assert r.returncode not in (0, 101), r
    err = r.stderr.strip()
    assert err and len(err.splitlines()) == 1 and not PANIC.search(r.stderr), err


# ----------------------------------------------------------------------------- plan

@pytest.fixture(scope="session")
def plan_source(data_dir) -> Path:
    """SOURCE for the plan: two ~64 MiB DiTs (high and low noise, as Wan 2.2's experts), and a
    text file. Never modified."""
    root = data_dir / "plan_src"
    done = root / ".complete"
    if done.exists():
        return root
    (root / "diffusion_models").mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(("high noise.safetensors", "low noise.safetensors")):
        gen.write_streaming(root / "diffusion_models" / name, gen.dit_specs(512, 2048, 8, ("BF16",)), seed=40 + i)
    (root / "notes.txt").write_text("not a model\n")
    done.write_text("ok\n")
    return root


def test_plan_warms_each_file_when_the_one_before_is_done(mount, plan_source):
    """A budget that holds one expert, not both: `plan A B` warms A at once and B only once a
    reader has read A and closed it; each is then read from RAM, bit-exact."""
    a, b = "diffusion_models/high noise.safetensors", "diffusion_models/low noise.safetensors"
    m = mount(plan_source, "100MiB", own_state())
    want_a, want_b = data_bytes(plan_source / a), data_bytes(plan_source / b)
    assert want_a + want_b > 100 * MiB >= max(want_a, want_b)
    cmd = f"plan\n{a}\n{b}\n"
    assert ctl(m.mnt, cmd) == len(cmd)
    assert wait_for(lambda: (file_cached(m, a) or 0) >= want_a, 30), m.file_stats(a)
    st = quiesce(m)
    assert st["plan"] == {"files": [a, b], "current": 0}, st["plan"]
    assert not file_cached(m, b), "the next file is warmed only when the reader is done with A"

    disk0 = st["disk"]["read_bytes"]
    read_exact(m.mnt / a, plan_source / a)
    # A was read and closed: B is warmed, taking A's room.
    assert wait_for(lambda: (file_cached(m, b) or 0) >= want_b, 30), m.file_stats(b)
    st = quiesce(m)
    assert st["plan"]["current"] == 1, st["plan"]
    assert st["cache"]["used_bytes"] <= st["cache"]["budget_bytes"]
    assert st["disk"]["read_bytes"] - disk0 <= want_b + MiB, "A was read from RAM, B once from the source"

    disk1 = st["disk"]["read_bytes"]
    read_exact(m.mnt / b, plan_source / b)
    st = quiesce(m)
    assert st["disk"]["read_bytes"] - disk1 <= max(MiB, want_b // 100), "B was read from RAM"
    assert m.file_stats(b)["mode"] == "cache", m.file_stats(b)

    # `plan` alone clears it; a file gone since is left out, not refused.
    assert ctl(m.mnt, "plan\n") == len("plan\n")
    assert m.stats()["plan"] == {"files": [], "current": 0}
    cmd = f"plan\ndiffusion_models/gone.safetensors\n{a}"
    assert ctl(m.mnt, cmd) == len(cmd)
    assert m.stats()["plan"]["files"] == [a]
    assert m.alive()


def test_a_file_opened_while_its_plan_warms_it_is_read_once(mount, plan_source):
    """A loader that opens the plan's first file at once (the prompt starts as it is queued)
    reads it from the chunk cache the plan is filling, not by passthrough beside it: the
    source is read once."""
    a = "diffusion_models/high noise.safetensors"
    m = mount(plan_source, "100MiB", own_state())
    want = data_bytes(plan_source / a)
    cmd = f"plan\n{a}\n"
    assert ctl(m.mnt, cmd) == len(cmd)
    read_exact(m.mnt / a, plan_source / a)
    st = quiesce(m)
    f = m.file_stats(a)
    assert f["mode"] == "cache", f
    assert want <= st["disk"]["read_bytes"] <= want * 1.05 + MiB, (st["disk"], want)
    assert st["passthrough"]["open_files"] == 0 and st["passthrough"]["parked_files"] == 0, st["passthrough"]


def test_a_plan_does_not_warm_a_file_passthrough_serves(mount, plan_source):
    """A file whose last open was served by passthrough (here a loader's open that mapped it and
    closed at once, as safetensors' safe_open does) may still be read through the mapping, which
    the mount does not see: the plan leaves it to passthrough instead of reading it a second
    time, and goes on to the next file when a reader has read it and closed it."""
    a, b = "diffusion_models/high noise.safetensors", "diffusion_models/low noise.safetensors"
    m = mount(plan_source, "100MiB", own_state())
    if not m.stats()["passthrough"]["available"]:
        pytest.fail("passthrough is not available on this machine (root, Linux >= 6.9)")
    with open(m.mnt / a, "rb") as f:  # opened and closed: passthrough, parked
        f.read(8)
    assert m.file_stats(a)["mode"] == "passthrough", m.file_stats(a)
    cmd = f"plan\n{a}\n{b}\n"
    assert ctl(m.mnt, cmd) == len(cmd)
    time.sleep(0.5)
    st = quiesce(m)
    assert st["disk"]["read_bytes"] < MiB and not file_cached(m, a), (st["disk"], m.file_stats(a))
    read_exact(m.mnt / a, plan_source / a)
    assert wait_for(lambda: (file_cached(m, b) or 0) >= data_bytes(plan_source / b), 30), m.file_stats(b)
    assert m.file_stats(a)["mode"] == "passthrough" and not file_cached(m, a), m.file_stats(a)


def test_cli_ctl_plan_takes_paths_with_spaces(tierfs_bin, mount, plan_source):
    a = "diffusion_models/high noise.safetensors"
    m = mount(plan_source, "100MiB", own_state())
    r = run_cli(tierfs_bin, "ctl", m.mnt, "plan", a, "diffusion_models/low noise.safetensors")
    assert r.returncode == 0, r.stderr
    assert m.stats()["plan"]["files"] == [a, "diffusion_models/low noise.safetensors"]
    r = run_cli(tierfs_bin, "ctl", m.mnt, "plan", "notes.txt")
    assert r.returncode != 0 and "refused" in r.stderr, r.stderr
