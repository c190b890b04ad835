"""Source I/O errors: EIO for the affected read only, no poisoned cache.

Stack: SOURCE dir -> faultfs (injects EIO on listed ranges) -> tierfs -> test.
"""

from __future__ import annotations

import errno
import os

import pytest

import gen

MiB = 1 << 20


@pytest.fixture
def stack(mount, faultfs, workdir):
    src = workdir / "src"
    src.mkdir()
    model = src / "model.safetensors"
    # 8 blocks of ~5 MiB tensors: faults in one tensor, reads in others.
    gen.write_small(model, gen.dit_specs(768, 1536, 8, ("BF16", "F16")), seed=31)
    other = src / "other.safetensors"
    gen.write_small(other, gen.dit_specs(256, 512, 2), seed=32)
    (src / "plain.bin").write_bytes(os.urandom(3 * MiB + 5))
    ff = faultfs(src)
    m = mount(ff.mnt, "64MiB")
    return src, ff, m


def _pread(path, off, ln):
    with open(path, "rb", buffering=0) as f:
        return os.pread(f.fileno(), ln, off)


def test_eio_on_faulty_range_only_and_recovers(stack):
    src, ff, m = stack
    model = src / "model.safetensors"
    ranges = {name: (a, b) for name, a, b in gen.tensor_ranges(model)}
    bad_name = "blocks.5.ffn.0.weight"
    a, b = ranges[bad_name]
    mid = (a + b) // 2
    ff.set_faults([{"file": "model.safetensors", "start": mid, "end": mid + 4096}])

    with pytest.raises(OSError) as ei:
        _pread(m.mnt / "model.safetensors", mid - 1000, 8192)
    assert ei.value.errno == errno.EIO, f"want EIO for a faulty range, got {ei.value!r}"
    # A second attempt fails the same way (the error is not turned into zeros/garbage).
    with pytest.raises(OSError) as ei:
        _pread(m.mnt / "model.safetensors", mid, 100)
    assert ei.value.errno == errno.EIO

    # Other ranges of the same file (other tensors, header) and other files are fine.
    for name in ("blocks.0.self_attn.q.weight", "blocks.7.ffn.2.weight", "head.head.weight"):
        x, y = ranges[name]
        assert _pread(m.mnt / "model.safetensors", x, y - x) == _pread(model, x, y - x), f"{name} differs"
    n, _ = gen.read_header(model)
    assert _pread(m.mnt / "model.safetensors", 0, 8 + n) == _pread(model, 0, 8 + n)
    assert (m.mnt / "other.safetensors").read_bytes() == (src / "other.safetensors").read_bytes()
    assert (m.mnt / "plain.bin").read_bytes() == (src / "plain.bin").read_bytes()
    assert m.alive(), "daemon died after a source I/O error"

    # Clear the fault: the same range now reads correctly (no poisoned cache entry).
    ff.set_faults([])
    assert _pread(m.mnt / "model.safetensors", mid - 1000, 8192) == _pread(model, mid - 1000, 8192)
    assert (m.mnt / "model.safetensors").read_bytes() == model.read_bytes()
    assert m.alive()


def test_eio_on_plain_file(stack):
    src, ff, m = stack
    ff.set_faults([{"file": "plain.bin", "start": 2 * MiB, "end": 2 * MiB + 1}])
    with pytest.raises(OSError) as ei:
        _pread(m.mnt / "plain.bin", 2 * MiB - 10, 100)
    assert ei.value.errno == errno.EIO, repr(ei.value)
    assert _pread(m.mnt / "plain.bin", 0, MiB) == _pread(src / "plain.bin", 0, MiB)
    ff.set_faults([])
    assert _pread(m.mnt / "plain.bin", 2 * MiB - 10, 100) == _pread(src / "plain.bin", 2 * MiB - 10, 100)
    assert m.alive()


def test_faultfs_itself(faultfs, workdir):
    """The harness works: faultfs mirrors bytes and injects EIO (independent of tierfs)."""
    src = workdir / "src"
    (src / "sub").mkdir(parents=True)
    data = os.urandom(100_000)
    (src / "sub" / "x.bin").write_bytes(data)
    ff = faultfs(src)
    assert (ff.mnt / "sub" / "x.bin").read_bytes() == data
    ff.set_faults([{"file": "sub/x.bin", "start": 50_000, "end": 50_001}])
    fd = os.open(ff.mnt / "sub" / "x.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.pread(fd, 4096, 0) == data[:4096]
        with pytest.raises(OSError) as ei:
            os.pread(fd, 4096, 49_152)
        assert ei.value.errno == errno.EIO
    finally:
        os.close(fd)
    ff.set_faults([])
    assert (ff.mnt / "sub" / "x.bin").read_bytes() == data
    with pytest.raises(OSError) as ei:
        os.open(ff.mnt / "sub" / "y", os.O_WRONLY | os.O_CREAT)
    assert ei.value.errno == errno.EROFS


def test_a_stalled_source_file_stalls_only_its_own_opens(mount, faultfs, workdir):
    """A source that stalls for seconds on one file's opens (a network share): opens and reads
    of other models, and the stats, go on meanwhile. The stalled open passes through tierfs's
    open path twice (the requester's open, then the reopen that becomes the passthrough backing
    file), so for its whole length no lock of the daemon may be held across source I/O. The
    source is a FUSE file system, which tierfs reads in ordered requests from the cache unless
    told otherwise: `--source-pacing parallel` keeps the passthrough path this test is about."""
    import threading
    import time

    src = workdir / "src"
    src.mkdir()
    gen.write_small(src / "slow.safetensors", gen.dit_specs(256, 512, 2), seed=41)
    fast = src / "fast.safetensors"
    gen.write_small(fast, gen.dit_specs(256, 512, 2), seed=42)
    want = fast.read_bytes()
    ff = faultfs(src)
    m = mount(ff.mnt, "256MiB", ("--source-pacing", "parallel"))
    assert (m.mnt / "fast.safetensors").read_bytes() == want  # known and indexed
    stall = 3.0
    ff.set_faults([{"file": "slow.safetensors", "stall_open_ms": int(stall * 1000)}])

    took: dict[str, float] = {}

    def open_slow() -> None:
        t0 = time.monotonic()
        with open(m.mnt / "slow.safetensors", "rb") as f:
            took["open"] = time.monotonic() - t0
            f.read(4096)

    t = threading.Thread(target=open_slow, daemon=True)
    t.start()
    time.sleep(0.2)
    latencies, stats_latencies, budget_latencies = [], [], []
    deadline = time.monotonic() + 30
    budgets = ["192MiB", "256MiB"]
    while t.is_alive() and time.monotonic() < deadline:
        t0 = time.monotonic()
        with open(m.mnt / "fast.safetensors", "rb") as f:
            assert f.read(1 << 20) == want[: 1 << 20]
        latencies.append(time.monotonic() - t0)
        t0 = time.monotonic()
        m.stats()
        stats_latencies.append(time.monotonic() - t0)
        # The budget governor: a new budget, applied to the cache and the passthrough tier.
        t0 = time.monotonic()
        cmd = f"ram-cache {budgets[len(budget_latencies) % 2]}\n".encode()
        fd = os.open(m.mnt / ".tierfs" / "control", os.O_WRONLY)
        try:
            assert os.write(fd, cmd) == len(cmd)
        finally:
            os.close(fd)
        budget_latencies.append(time.monotonic() - t0)
    t.join(timeout=30)
    ff.set_faults([])
    assert not t.is_alive(), "the stalled open never finished"
    assert took["open"] >= 2 * stall * 0.9, f"the source did not stall both opens: {took}"
    latencies.sort()
    stats_latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    print(f"\nstalled open {took['open']:.2f} s; {len(latencies)} opens+reads of another model "
          f"meanwhile: p50 {latencies[len(latencies) // 2] * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
          f"max {latencies[-1] * 1e3:.1f} ms; stats reads max {stats_latencies[-1] * 1e3:.1f} ms; "
          f"budget changes max {max(budget_latencies) * 1e3:.1f} ms")
    assert len(latencies) >= 10
    assert latencies[-1] < stall / 3, f"an open of another model waited for the stalled one: {latencies[-5:]}"
    assert stats_latencies[-1] < stall / 3, f"the stats waited for the stalled open: {stats_latencies[-5:]}"
    assert max(budget_latencies) < stall / 3, f"the governor waited for the stalled open: {budget_latencies}"
