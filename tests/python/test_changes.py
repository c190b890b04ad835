"""A source file changed while mounted never yields stale bytes to a later open."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import gen

SETTLE = 1.1  # contract: attribute timeout is 1 s


def _model(path, seed, dim=256, blocks=3):
    gen.write_small(path, gen.dit_specs(dim, 2 * dim, blocks, ("BF16", "F16")), seed=seed)


def _bump_mtime(p):
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def mv_replace(p, work):
    tmp = work / "replacement.safetensors"
    _model(tmp, seed=999, dim=320)
    os.replace(tmp, p)


def rewrite_in_place(p, work):
    """Same size, different bytes (one tensor's data flipped), new mtime."""
    size = p.stat().st_size
    n, _ = gen.read_header(p)
    with open(p, "r+b") as f:
        off = 8 + n + 100
        f.seek(off)
        old = f.read(200_000)
        f.seek(off)
        f.write(bytes(b ^ 0xFF for b in old))
    _bump_mtime(p)
    assert p.stat().st_size == size


def append(p, work):
    with open(p, "ab") as f:
        f.write(np.random.default_rng(3).bytes(300_000))
    _bump_mtime(p)


def truncate(p, work):
    os.truncate(p, p.stat().st_size // 2)
    _bump_mtime(p)


def rewrite_plain_text(p, work):
    p.write_text("v2 " * 1000)
    _bump_mtime(p)


@pytest.mark.parametrize("change", [mv_replace, rewrite_in_place, append, truncate])
def test_change_never_serves_stale_bytes(mount, workdir, change):
    src = workdir / "src"
    src.mkdir()
    p = src / "model.safetensors"
    _model(p, seed=1)
    (src / "other.safetensors").write_bytes(p.read_bytes())  # a neighbour that must stay correct
    m = mount(src, "64MiB")
    mp = m.mnt / p.name
    before = p.read_bytes()
    # Read fully twice: the second read is served from the tierfs cache.
    assert mp.read_bytes() == before
    assert mp.read_bytes() == before
    # Keep an fd open across the change too (old-fd semantics are not asserted, only no crash).
    keep = open(mp, "rb")
    try:
        change(p, workdir)
        after = p.read_bytes()
        assert after != before, "test bug: change did not change the file"
        time.sleep(SETTLE)
        with open(mp, "rb") as f:
            got = f.read()
        assert len(got) == len(after), f"{change.__name__}: size through mount {len(got)} != source {len(after)}"
        if got != after:
            same_as_old = sum(1 for i in range(0, min(len(got), len(before)), 4096)
                              if got[i:i + 4096] == before[i:i + 4096] and after[i:i + 4096] != before[i:i + 4096])
            pytest.fail(f"{change.__name__}: stale/wrong bytes through the mount after {SETTLE}s "
                        f"({same_as_old} 4 KiB pages still hold the old contents)")
        assert os.stat(mp).st_size == len(after)
        keep.read(10)  # the old fd may return old or new bytes, but must not hang or kill the daemon
    finally:
        keep.close()
    assert (m.mnt / "other.safetensors").read_bytes() == before
    assert m.alive()


def test_change_plain_file(mount, workdir):
    src = workdir / "src"
    src.mkdir()
    p = src / "notes.txt"
    p.write_text("v1 " * 1000)
    m = mount(src)
    assert (m.mnt / "notes.txt").read_text() == "v1 " * 1000
    rewrite_plain_text(p, workdir)
    time.sleep(SETTLE)
    assert (m.mnt / "notes.txt").read_text() == "v2 " * 1000
