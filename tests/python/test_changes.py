"""A source file changed while mounted never yields stale bytes to a later open."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
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


# Maps a file of the mount and waits: on "touch" it faults every page in (the kernel asks the
# daemon through this process's handle), on "sha" it prints the sha256 of the whole mapping.
MAPPED_READER = r"""
import hashlib, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
mm = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
print("mapped", flush=True)
for line in sys.stdin:
    if line.strip() == "touch":
        print(sum(mm[i] for i in range(0, len(mm), 4096)), flush=True)
    elif line.strip() == "sha":
        print(hashlib.sha256(mm[:]).hexdigest(), flush=True)
"""


class _MappedReader:
    """A child process holding an mmap of `path` (a SIGBUS fails the test, not pytest)."""

    def __init__(self, path):
        self.proc = subprocess.Popen([sys.executable, "-c", MAPPED_READER, str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.ask(None) == "mapped"

    def ask(self, command):
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        assert line, f"mapped reader died (rc={self.proc.poll()}; -7 is SIGBUS)"
        return line

    def close(self):
        self.proc.kill()
        self.proc.wait()


@pytest.mark.timeout(120)
def test_mmap_readers_never_see_two_versions_after_an_in_place_rewrite(mount, workdir):
    """A model rewritten in place while an old handle keeps it mapped: once a new open read the
    new version, the old mapping's page faults (through the old handle) refill the page cache
    every handle of the inode shares. Neither the old mapping nor a reader opening after it may
    see the old version's header (kept in the daemon's memory) over the new data."""
    src = workdir / "src"
    src.mkdir()
    p = src / "model.safetensors"
    _model(p, seed=1)
    old = p.read_bytes()
    n, _ = gen.read_header(p)
    # Same size; the header (its metadata) and the data both differ.
    header = old[8:8 + n]
    assert b"tierfs-tests" in header
    new = old[:8] + header.replace(b"tierfs-tests", b"TIERFS-TESTS") + bytes(b ^ 0x5A for b in old[8 + n:])
    versions = {hashlib.sha256(old).hexdigest(): "old", hashlib.sha256(new).hexdigest(): "new"}
    m = mount(src, "64MiB", extra=("--no-model-passthrough",))
    mp = m.mnt / p.name
    old_reader = _MappedReader(mp)
    readers = [old_reader]
    try:
        assert versions.get(old_reader.ask("sha")) == "old"
        with open(p, "r+b") as f:  # in place: same inode, same size
            f.write(new)
        _bump_mtime(p)
        time.sleep(SETTLE)
        with open(mp, "rb") as f:  # a new open: the new version, the page cache dropped
            assert f.read() == new
        seen = versions.get(old_reader.ask("sha"), "a mix of both")
        assert seen in ("old", "new"), f"the old mapping, refilled after the rewrite, holds {seen}"
        later = _MappedReader(mp)
        readers.append(later)
        old_reader.ask("touch")
        seen = versions.get(later.ask("sha"), "a mix of both")
        assert seen == "new", f"a mapping opened after the rewrite holds {seen}"
        with open(mp, "rb") as f:
            assert f.read() == new
    finally:
        for reader in readers:
            reader.close()
    assert m.alive()
