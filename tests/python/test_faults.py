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
