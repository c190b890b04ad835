"""Symlinked models outside SOURCE go through the cache; directory loops stay finite."""

from __future__ import annotations

import os
import stat
import threading

import gen


def test_symlinked_model_outside_source_uses_cache(mount, workdir, big_file):
    src = workdir / "src"
    src.mkdir()
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    small = elsewhere / "small.safetensors"
    gen.write_small(small, gen.dit_specs(256, 512, 4, ("BF16", "F8_E4M3")), seed=21)
    os.symlink(big_file, src / "linked.safetensors")          # absolute, outside SOURCE
    os.symlink(os.path.relpath(small, src), src / "rel.safetensors")  # relative, outside SOURCE
    m = mount(src, "64MiB")

    assert stat.S_ISREG(os.lstat(m.mnt / "linked.safetensors").st_mode)
    assert os.stat(m.mnt / "linked.safetensors").st_size == big_file.stat().st_size

    s0 = m.stats()
    # Read 3 whole tensors (~80 MiB) and the header: compare with the target.
    ranges = gen.tensor_ranges(big_file)
    picks = [ranges[0], ranges[len(ranges) // 2], ranges[-1]]
    n, _ = gen.read_header(big_file)
    with open(m.mnt / "linked.safetensors", "rb") as f, open(big_file, "rb") as g:
        assert os.pread(f.fileno(), 8 + n, 0) == os.pread(g.fileno(), 8 + n, 0)
        for name, a, b in picks:
            assert os.pread(f.fileno(), b - a, a) == os.pread(g.fileno(), b - a, a), f"tensor {name} differs"
    want = sum(b - a for _, a, b in picks)
    s1 = m.stats()
    d_disk = s1["disk"]["read_bytes"] - s0["disk"]["read_bytes"]
    d_miss = s1["cache"]["miss_bytes"] - s0["cache"]["miss_bytes"]
    # Every byte was cold in the tierfs cache, so it came from the disk at least once.
    assert d_disk >= want * 0.9 and d_miss > 0, (
        f"reads of the symlinked model must go through the cache: read {want} B cold, "
        f"disk.read_bytes +{d_disk}, cache.miss_bytes +{d_miss}")
    fs = m.file_stats("linked.safetensors")
    assert fs is not None, f"linked.safetensors not in stats.files: {[f['path'] for f in s1['files']]}"
    assert fs["tensors"] == len(ranges) and fs["malformed"] is False, fs

    assert (m.mnt / "rel.safetensors").read_bytes() == small.read_bytes()
    assert m.file_stats("rel.safetensors") is not None
    assert m.alive()


def test_directory_symlink_loop_and_dangling(mount, workdir):
    src = workdir / "src"
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "e" / "f.txt").write_text("f")
    os.symlink("..", src / "d" / "loop")            # -> src: an ancestor
    os.symlink("e", src / "d" / "sib")              # -> sibling dir: followed
    os.symlink("nowhere", src / "dangling")
    # On the plain source the kernel's 40-symlink limit ends the walk (~160 dirs).  If the
    # mount presented the loop as a real directory, the walk would never end.
    limit = 2 * sum(1 for _ in os.walk(src, followlinks=True))
    m = mount(src)

    result: dict = {}

    def walk():
        seen = 0
        for dp, dns, fns in os.walk(m.mnt, followlinks=True):
            seen += 1
            if seen > limit:
                result["runaway"] = True
                return
        result["dirs"] = seen

    t = threading.Thread(target=walk, daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "os.walk(followlinks=True) did not finish within 30 s"
    assert not result.get("runaway"), f"os.walk(followlinks=True) visited > {limit} dirs: a loop was followed"
    assert os.path.islink(m.mnt / "d" / "loop"), "a loop link must stay a symlink"
    assert os.readlink(m.mnt / "d" / "loop") == ".."
    assert stat.S_ISDIR(os.lstat(m.mnt / "d" / "sib").st_mode), "a non-loop dir link is presented as a directory"
    assert (m.mnt / "d" / "sib" / "f.txt").read_text() == "f"
    assert os.path.islink(m.mnt / "dangling") and os.readlink(m.mnt / "dangling") == "nowhere"
    assert m.alive()
