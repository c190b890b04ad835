"""File identity through a real mount: a file keeps its (st_dev, st_ino) for the life of the
mount however often the kernel forgets its inode (`drop_caches`, reclaim in a memory cgroup),
and it is the source's own inode number; hard links share one number (`find -samefile`, `du`,
`os.path.samefile` agree with SOURCE); a file on another device, reached through a link, never
shares a number with one of SOURCE's; a replaced file gets a new number. A loader that checks
`stat` before and after reading a checkpoint, as ComfyUI's asset hasher does, sees one file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gen
from conftest import MiB
from test_pressure import MemCgroup

PLAIN = 100


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _forget_everything(m, held: int = 0, seconds: float = 20.0) -> None:
    """Makes the kernel evict the mount's unused inodes (so it sends FORGET) until the daemon's
    table is down to the root, the control directory's files and `held` more."""
    deadline = time.monotonic() + seconds
    while True:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")
        inodes = m.stats()["fs"]["inodes"]
        if inodes <= 1 + held:
            return
        assert time.monotonic() < deadline, f"the kernel did not forget: {inodes} inodes left"
        time.sleep(0.2)


def _source_tree(src: Path) -> list[str]:
    (src / "sub").mkdir(parents=True)
    rels = []
    for i in range(PLAIN):
        rel = f"sub/f{i}.bin"
        (src / rel).write_bytes(os.urandom(100 + i))
        rels.append(rel)
    gen.write_small(src / "m.safetensors", gen.dit_specs(64, 128, 2), seed=3)
    return ["m.safetensors", "sub", *rels]


@pytest.mark.timeout(120)
def test_numbers_are_the_sources_and_survive_drop_caches(mount, workdir):
    src = workdir / "src"
    rels = _source_tree(src)
    m = mount(src)
    before = {rel: _identity(m.mnt / rel) for rel in rels}
    assert len({ino for _, ino in before.values()}) == len(rels), "one number per object"
    for rel, (_, ino) in before.items():
        assert ino == os.stat(src / rel).st_ino, f"{rel}: not the source's inode number"
    for _ in range(3):
        _forget_everything(m)
        after = {rel: _identity(m.mnt / rel) for rel in rels}
        changed = {rel: (before[rel], after[rel]) for rel in rels if before[rel] != after[rel]}
        assert not changed, f"identity changed after the kernel forgot: {list(changed.items())[:3]}"


# Looks up (stats) the files named on the command line and exits: run inside a memory cgroup,
# so the kernel objects the lookups make are charged to it.
STAT_FILES = "import os, sys\nfor p in sys.argv[1:]:\n    os.stat(p)\n"


@pytest.mark.timeout(120)
def test_numbers_survive_reclaim_in_a_memory_cgroup(mount, workdir):
    src = workdir / "src"
    rels = _source_tree(src)
    m = mount(src)
    before = {rel: _identity(m.mnt / rel) for rel in rels}
    _forget_everything(m)
    cgroup = MemCgroup(256 * MiB)
    try:
        paths = [str(m.mnt / rel) for rel in rels]
        subprocess.run([sys.executable, "-c", STAT_FILES, *paths], check=True, timeout=60,
                       **cgroup.spawn_args())
        looked_up = m.stats()["fs"]["inodes"]
        assert looked_up > len(rels), looked_up
        # Reclaims what the cgroup holds, the dentries and inodes of those lookups among it.
        deadline = time.monotonic() + 20
        while m.stats()["fs"]["inodes"] > 1 and time.monotonic() < deadline:
            (cgroup.dir / "memory.force_empty").write_text("0\n")
            time.sleep(0.2)
        left = m.stats()["fs"]["inodes"]
        assert left <= 1, f"the cgroup's reclaim left {left} of {looked_up} inodes"
    finally:
        cgroup.remove()
    after = {rel: _identity(m.mnt / rel) for rel in rels}
    assert after == before


@pytest.mark.timeout(120)
def test_hard_links_share_a_number_as_in_source(mount, workdir):
    src = workdir / "src"
    (src / "d").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(3 * MiB))
    os.link(src / "a.bin", src / "d" / "b.bin")
    gen.write_small(src / "m.safetensors", gen.dit_specs(64, 128, 2), seed=4)
    os.link(src / "m.safetensors", src / "d" / "m2.safetensors")
    (src / "c.bin").write_bytes(os.urandom(MiB))
    m = mount(src)
    mnt = m.mnt

    assert os.path.samefile(mnt / "a.bin", mnt / "d" / "b.bin")
    assert os.path.samefile(mnt / "m.safetensors", mnt / "d" / "m2.safetensors")
    assert not os.path.samefile(mnt / "a.bin", mnt / "c.bin")
    assert os.stat(mnt / "a.bin").st_nlink == 2
    _forget_everything(m)
    found = subprocess.run(["find", str(mnt), "-samefile", str(mnt / "d" / "b.bin")],
                           capture_output=True, text=True, check=True, timeout=30).stdout.split()
    assert sorted(found) == sorted([str(mnt / "a.bin"), str(mnt / "d" / "b.bin")])

    def du(root: Path) -> int:
        out = subprocess.run(["du", "-s", "-b", str(root)], capture_output=True, text=True,
                             check=True, timeout=30).stdout
        return int(out.split()[0])

    # Each hard-linked file counted once, as in SOURCE.
    assert du(mnt) == du(src)
    # Reading through one link, then the other, gives the same bytes.
    assert (mnt / "d" / "m2.safetensors").read_bytes() == (src / "m.safetensors").read_bytes()
    assert (mnt / "d" / "b.bin").read_bytes() == (src / "a.bin").read_bytes()


@pytest.mark.timeout(120)
def test_a_file_on_another_device_never_shares_a_number(mount, workdir):
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(workdir).st_dev:
        pytest.fail("the test needs /dev/shm on a device of its own")
    elsewhere = other / f"tierfs-ident-{os.getpid()}-{time.monotonic_ns()}"
    elsewhere.mkdir()
    try:
        src = workdir / "src"
        rels = _source_tree(src)
        (elsewhere / "far.bin").write_bytes(os.urandom(4096))
        os.symlink(elsewhere / "far.bin", src / "far.bin")
        m = mount(src)
        numbers = {rel: _identity(m.mnt / rel) for rel in [*rels, "far.bin"]}
        far = numbers["far.bin"]
        assert far not in [n for rel, n in numbers.items() if rel != "far.bin"]
        _forget_everything(m)
        assert _identity(m.mnt / "far.bin") == far
        assert (m.mnt / "far.bin").read_bytes() == (elsewhere / "far.bin").read_bytes()
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


# A loader's stat-identity check, as ComfyUI's asset hasher makes it: stat, read the checkpoint
# through safetensors, stat again; the digest is kept only if the file did not change.
LOADER = r"""
import os, sys, time
from safetensors import safe_open
path = sys.argv[1]
def ident(st):
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
start = ident(os.stat(path))
print("stat", flush=True)
sys.stdin.readline()  # the test makes the kernel forget the inode meanwhile
with safe_open(path, framework="pt") as f:
    total = sum(f.get_tensor(k).numel() for k in f.keys())
print("read", flush=True)
sys.stdin.readline()
end = ident(os.stat(path))
print("same" if start == end else f"changed {start} {end}", total, flush=True)
"""


@pytest.mark.timeout(180)
def test_a_loaders_stat_check_sees_one_file_across_forgets(mount, workdir):
    src = workdir / "src"
    src.mkdir()
    gen.write_small(src / "model.safetensors", gen.dit_specs(128, 256, 4), seed=9)
    m = mount(src)
    loader = subprocess.Popen([sys.executable, "-c", LOADER, str(m.mnt / "model.safetensors")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert loader.stdout.readline().strip() == "stat"
        _forget_everything(m)
        loader.stdin.write("\n")
        loader.stdin.flush()
        assert loader.stdout.readline().strip() == "read"
        _forget_everything(m)
        loader.stdin.write("\n")
        loader.stdin.flush()
        verdict = loader.stdout.readline().split()
        assert loader.wait(timeout=60) == 0
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait()
    assert verdict[0] == "same", verdict


@pytest.mark.timeout(120)
def test_a_replaced_file_gets_a_new_number(mount, workdir):
    src = workdir / "src"
    src.mkdir()
    (src / "m.bin").write_bytes(b"old" * 1000)
    gen.write_small(src / "m.safetensors", gen.dit_specs(64, 128, 2), seed=1)
    m = mount(src)
    old_plain, old_model = _identity(m.mnt / "m.bin"), _identity(m.mnt / "m.safetensors")
    with open(m.mnt / "m.bin", "rb") as held:
        # Deleted and written again: ext4 often gives the new file the freed inode number,
        # but the old one is still open here, so it cannot.
        os.unlink(src / "m.bin")
        (src / "m.bin").write_bytes(b"new" * 1000)
        gen.write_small(src / "m.safetensors", gen.dit_specs(64, 128, 2), seed=2)
        time.sleep(1.1)  # past the attribute timeout
        new_plain, new_model = _identity(m.mnt / "m.bin"), _identity(m.mnt / "m.safetensors")
        assert new_plain != old_plain and new_model != old_model
        assert new_plain[1] == os.stat(src / "m.bin").st_ino
        assert held.read() == b"old" * 1000
    assert (m.mnt / "m.bin").read_bytes() == b"new" * 1000
    # With nothing held, a file deleted and made again while the kernel still knows the old
    # inode: whatever number the new one takes, it reads as the new file.
    os.stat(m.mnt / "m.bin")
    os.unlink(src / "m.bin")
    (src / "m.bin").write_bytes(b"newer" * 1000)
    time.sleep(1.1)
    assert (m.mnt / "m.bin").read_bytes() == b"newer" * 1000
