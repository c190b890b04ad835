"""The io_uring transport (`--io-uring`): the same mount, served through the kernel's FUSE
io_uring rings instead of `/dev/fuse` reads and writes.

* Every operation a mount serves gives the same answers through the rings: bytes bit-exact
  (a model served from the chunk cache, one passed through, a plain file), listings, links,
  the source xattr, statfs, the control file, the read-only refusals; the stats say which
  transport serves and how many requests came through the rings.
* `--io-uring auto` on a kernel that does not allow it (the fuse module's `enable_uring` off)
  mounts through `/dev/fuse` and says why; `--io-uring on` refuses to mount and says why.
* A daemon killed with requests in its rings (reads blocked on a source that does not answer)
  leaves no reader hanging: each gets an error within a bound, and `tierfs unmount` cleans the
  dead mount; aborting the connection (fusectl) does the same with the daemon alive.

The whole suite also runs on this transport: `TIERFS_IO_URING=on` (conftest.py checks that each
mount is served by it). Root: the tests switch `enable_uring` on for themselves and restore it.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import gen
from conftest import ENABLE_URING, TIERFS_BIN, fusectl, is_mounted

MiB = 1 << 20
# How long a reader blocked in a killed or aborted mount may take to get its error: the kernel
# ends the requests at once; this is a loaded 2-core machine's slack.
READER_BOUND_S = 10.0


@pytest.fixture
def uring_switch():
    """Sets the fuse module's `enable_uring` for the test and restores it."""
    if not ENABLE_URING.exists():
        pytest.skip("this kernel has no FUSE io_uring transport (Linux 6.14 or later)")
    was = ENABLE_URING.read_text().strip()

    def set_to(on: bool) -> None:
        ENABLE_URING.write_text("Y" if on else "N")

    set_to(True)
    yield set_to
    ENABLE_URING.write_text(was)


@pytest.fixture
def tree(workdir):
    src = workdir / "src"
    (src / "sub").mkdir(parents=True)
    gen.write_small(src / "big.safetensors", gen.dit_specs(768, 1536, 6, ("BF16", "F16")), seed=61)
    gen.write_small(src / "small.safetensors", gen.dit_specs(128, 256, 2, ("BF16",)), seed=62)
    (src / "sub" / "notes.txt").write_text("through the rings\n" * 100)
    (src / "blob.bin").write_bytes(os.urandom(3 * MiB + 5))
    os.symlink("sub/notes.txt", src / "link")
    return src


def _possible_cpus() -> int:
    """The kernel's number of possible CPUs (`0-1,4-5` style list): one queue each."""
    n = 0
    for part in Path("/sys/devices/system/cpu/possible").read_text().strip().split(","):
        a, _, b = part.partition("-")
        n += int(b or a) - int(a) + 1
    return n


def _transport(m) -> dict:
    return m.stats()["transport"]


def test_every_operation_answers_the_same_through_the_rings(uring_switch, mount, tree):
    src = tree
    big = (src / "big.safetensors").stat().st_size
    m = mount(src, f"{big // 3 // MiB}MiB", extra=("--io-uring", "on"))
    t = _transport(m)
    assert t["kind"] == "io_uring", t
    assert t["queues"] == _possible_cpus(), t
    assert t["entries_per_queue"] >= 1, t
    before = t["ring_requests"]
    # Bytes: a model larger than the budget (chunk cache), one that fits (passthrough as root),
    # a plain file, each read with several request sizes, and O_DIRECT.
    for rel in ("big.safetensors", "small.safetensors", "blob.bin", "sub/notes.txt"):
        want = (src / rel).read_bytes()
        assert (m.mnt / rel).read_bytes() == want, rel
        with open(m.mnt / rel, "rb", buffering=0) as f:
            for off, ln in ((0, 1), (4093, 10_000), (len(want) // 2, 3 * MiB), (len(want) - 7, 100)):
                assert os.pread(f.fileno(), ln, off) == want[off:off + ln], (rel, off, ln)
    fd = os.open(m.mnt / "big.safetensors", os.O_RDONLY | os.O_DIRECT)
    try:
        import mmap
        buf = mmap.mmap(-1, 4 * MiB)
        n = os.preadv(fd, [buf], 8 * MiB)
        assert buf[:n] == (src / "big.safetensors").read_bytes()[8 * MiB:8 * MiB + n]
    finally:
        os.close(fd)
    files = [f["path"] for f in m.stats()["files"]]
    assert "big.safetensors" in files, files
    # Names, links, attributes, the source xattr, statfs.
    assert sorted(os.listdir(m.mnt)) == sorted([*os.listdir(src), ".tierfs"])
    assert os.listdir(m.mnt / "sub") == ["notes.txt"]
    # A link is presented as what it leads to (as through /dev/fuse).
    assert (m.mnt / "link").read_text() == (src / "sub" / "notes.txt").read_text()
    for rel in ("big.safetensors", "sub", "link"):
        a, b = os.lstat(m.mnt / rel), os.stat(src / rel)
        assert (a.st_mode, a.st_size, int(a.st_mtime)) == (b.st_mode, b.st_size, int(b.st_mtime)), rel
    assert os.getxattr(m.mnt / "blob.bin", "user.tierfs.source") == str(src / "blob.bin").encode()
    assert "user.tierfs.source" in os.listxattr(m.mnt / "blob.bin")
    with pytest.raises(OSError) as ei:
        os.getxattr(m.mnt / "blob.bin", "user.nothing")
    assert ei.value.errno == errno.ENODATA
    assert os.statvfs(m.mnt).f_bsize == os.statvfs(src).f_bsize
    # Read-only everywhere but the control file, whose command goes through.
    for change in (lambda: (m.mnt / "new").write_bytes(b"x"), lambda: os.mkdir(m.mnt / "d"),
                   lambda: os.unlink(m.mnt / "blob.bin"), lambda: os.rename(m.mnt / "blob.bin", m.mnt / "b"),
                   lambda: os.setxattr(m.mnt / "blob.bin", "user.x", b"1"), lambda: os.chmod(m.mnt / "blob.bin", 0o600)):
        with pytest.raises(OSError) as ei:
            change()
        assert ei.value.errno == errno.EROFS, ei.value
    r = subprocess.run([str(TIERFS_BIN), "ctl", str(m.mnt), "ram-cache", "48MiB"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert m.stats()["cache"]["budget_bytes"] == 48 * MiB
    t = _transport(m)
    assert t["ring_requests"] > before + 100, t
    assert m.close() == 0, m.log_tail()


def test_auto_serves_through_dev_fuse_and_says_why_where_the_kernel_refuses(uring_switch, mount, tree, workdir):
    uring_switch(False)
    m = mount(tree, "64MiB", extra=("--io-uring", "auto"))
    t = _transport(m)
    assert t["kind"] == "dev_fuse", t
    assert "enable_uring" in t.get("reason", ""), t
    assert (m.mnt / "blob.bin").read_bytes() == (tree / "blob.bin").read_bytes()
    assert m.close() == 0
    mnt = workdir / "refused"
    mnt.mkdir()
    r = subprocess.run([str(TIERFS_BIN), "mount", str(tree), str(mnt), "--ram-cache", "64MiB", "--io-uring", "on",
                        "--no-state"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "--io-uring on" in r.stderr and "enable_uring" in r.stderr, r.stderr
    assert not is_mounted(mnt)


READERS = textwrap.dedent("""
    import json, os, sys, threading, time
    path, offsets = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
    out = {}
    def read(off):
        t0 = time.monotonic()
        try:
            with open(path, "rb", buffering=0) as f:
                os.pread(f.fileno(), 4096, off)
            out[off] = ["ok", time.monotonic() - t0]
        except OSError as e:
            out[off] = [e.errno, time.monotonic() - t0]
    threads = [threading.Thread(target=read, args=(o,), daemon=True) for o in offsets]
    for t in threads: t.start()
    print("started", flush=True)
    for t in threads: t.join()
    print(json.dumps(out), flush=True)
""")


def _hung_readers(m, ff, model: Path, count: int):
    """`count` readers, each blocked in a request the daemon is serving (its source read hangs
    in faultfs); returns the child process running them."""
    ranges = [(a, b) for _, a, b in gen.tensor_ranges(model) if b - a >= MiB][-count:]
    assert len(ranges) == count, "the model has too few large tensors for the test"
    offsets = [(a + b) // 2 // 4096 * 4096 for a, b in ranges]
    ff.set_faults([{"file": model.name, "read_fault": {"start": o, "end": o + 4096, "hang": True}}
                   for o in offsets])
    child = subprocess.Popen([sys.executable, "-c", READERS, str(m.mnt / model.name), ",".join(map(str, offsets))],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "started"
    # The readers wait on source reads that hang (theirs, or a read-ahead's of the same chunk).
    deadline = time.monotonic() + 30
    while b"hanging a read" not in ff.log_path.read_bytes():
        assert time.monotonic() < deadline, "no source read reached faultfs"
        time.sleep(0.05)
    time.sleep(1.0)
    assert child.poll() is None, "the readers finished although their source reads hang"
    return child, offsets


def _readers_ended(child, offsets) -> dict:
    try:
        out, _ = child.communicate(timeout=READER_BOUND_S)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail(f"readers still blocked {READER_BOUND_S} s after the daemon went")
    results = json.loads(out.strip().splitlines()[-1])
    assert len(results) == len(offsets), results
    for off, (outcome, _) in results.items():
        assert outcome in (errno.ENOTCONN, errno.ECONNABORTED, errno.ECANCELED, errno.EIO), (off, outcome)
    return results


@pytest.fixture
def hang_stack(faultfs, workdir):
    src = workdir / "src"
    src.mkdir()
    model = src / "model.safetensors"
    gen.write_small(model, gen.dit_specs(768, 1536, 8, ("BF16", "F16")), seed=63)
    return model, faultfs(src)


@pytest.mark.parametrize("transport", ["dev_fuse", "io_uring"])
def test_a_daemon_killed_with_requests_in_flight_leaves_no_reader_hanging(uring_switch, mount, hang_stack,
                                                                         transport):
    model, ff = hang_stack
    m = mount(ff.mnt, "64MiB", extra=("--no-model-passthrough", "--source-timeout", "120s",
                                      "--io-uring", "on" if transport == "io_uring" else "off"))
    assert _transport(m)["kind"] == transport
    child, offsets = _hung_readers(m, ff, model, 6)
    m.proc.kill()
    # A killed process ends once its threads leave the kernel: let the hung source reads return
    # (nothing of the daemon runs any more to answer its readers).
    ff.set_faults([])
    m.proc.wait(timeout=10)
    results = _readers_ended(child, offsets)
    print(f"\n{transport}: 6 readers blocked in the daemon got {sorted({r[0] for r in results.values()})} "
          f"within {max(r[1] for r in results.values()):.2f} s of their start")
    r = subprocess.run([str(TIERFS_BIN), "unmount", str(m.mnt)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert not is_mounted(m.mnt)


def test_an_aborted_connection_frees_readers_in_the_rings_and_ends_the_daemon(uring_switch, mount, hang_stack):
    model, ff = hang_stack
    m = mount(ff.mnt, "64MiB", extra=("--no-model-passthrough", "--source-timeout", "120s", "--io-uring", "on"))
    ctl = fusectl() / str(os.minor(os.stat(m.mnt).st_dev))
    child, offsets = _hung_readers(m, ff, model, 4)
    t0 = time.monotonic()
    (ctl / "abort").write_text("1")
    _readers_ended(child, offsets)
    print(f"\nreaders ended {time.monotonic() - t0:.2f} s after the abort")
    ff.set_faults([])  # the daemon's blocked source reads return; its threads see the end
    assert m.proc.wait(timeout=30) is not None
    print(f"daemon ended {time.monotonic() - t0:.2f} s after the abort")
    subprocess.run([str(TIERFS_BIN), "unmount", str(m.mnt)], capture_output=True, timeout=30)
    assert not is_mounted(m.mnt)
    print(f"unmounted {time.monotonic() - t0:.2f} s after the abort")
