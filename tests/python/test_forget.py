"""Forget and release prune the daemon's inode and handle tables, through a real
mount: the kernel's FORGETs (here provoked by dropping its dentry and inode caches) shrink
`fs.inodes` in the stats, a file held open keeps its inode and its bytes, and every file reads
back bit-exact once looked up again under its new number."""

from __future__ import annotations

import os
import time

import pytest

import gen

FILES = 300


def _drop_dentries_and_inodes() -> None:
    """Makes the kernel evict unused dentries and inodes (and so send FORGET); page caches
    stay."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


def _tables(m) -> dict:
    return m.stats()["fs"]


def _wait_inodes_at_most(m, limit: int, seconds: float = 20.0) -> int:
    """FORGETs reach the daemon asynchronously: polls until the table is down to `limit`."""
    deadline = time.monotonic() + seconds
    while True:
        inodes = _tables(m)["inodes"]
        if inodes <= limit or time.monotonic() > deadline:
            return inodes
        _drop_dentries_and_inodes()
        time.sleep(0.2)


@pytest.mark.timeout(120)
def test_forgotten_inodes_are_pruned_and_files_still_read_bit_exact(mount, workdir):
    src = workdir / "src"
    (src / "d").mkdir(parents=True)
    contents: dict[str, bytes] = {}
    for i in range(FILES):
        rel = f"d/f{i}.bin"
        contents[rel] = os.urandom(1000 + i)
        (src / rel).write_bytes(contents[rel])
    gen.write_small(src / "m.safetensors", gen.dit_specs(64, 128, 2), seed=5)
    contents["m.safetensors"] = (src / "m.safetensors").read_bytes()
    m = mount(src)

    base = _tables(m)["inodes"]
    for rel in contents:
        os.stat(m.mnt / rel)
    looked_up = _tables(m)["inodes"]
    assert looked_up >= base + FILES + 1, (base, looked_up)  # the files and `d`

    with open(m.mnt / "d" / "f7.bin", "rb") as held, open(m.mnt / "m.safetensors", "rb") as model:
        _drop_dentries_and_inodes()
        # Left: the root, the two open files and `d` (the kernel keeps a parent while a child
        # is in use); a few more if other dentries of the mount were in use meanwhile.
        pruned_to = _wait_inodes_at_most(m, base + 3)
        assert pruned_to <= base + 3, f"inodes after the kernel forgot: {pruned_to} (from {looked_up})"
        assert held.read() == contents["d/f7.bin"], "an open file keeps its inode and bytes"
        assert model.read() == contents["m.safetensors"]
        # The stats document is rendered before its own handle is made: the two files.
        assert _tables(m)["handles"] == 2

    for rel, data in contents.items():
        assert (m.mnt / rel).read_bytes() == data, rel
    # The kernel sends RELEASE after close() returns: polls for it.
    deadline = time.monotonic() + 10
    while _tables(m)["handles"] != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _tables(m)["handles"] == 0, "every handle released"

    # With nothing open, forgetting takes every inode but the root (and whatever a concurrent
    # lookup of the mount still holds).
    _drop_dentries_and_inodes()
    assert _wait_inodes_at_most(m, base) <= base + 1
