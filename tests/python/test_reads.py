"""Concurrent random reads (pread and mmap) and bit-exact safetensors loading."""

from __future__ import annotations

import mmap
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import gen
from conftest import fresh_dir

MAX_PAGES_LIMIT = Path("/proc/sys/fs/fuse/max_pages_limit")

MiB = 1 << 20


def _ranges(path: Path, n: int, seed: int) -> list[tuple[int, int]]:
    """(offset, length) pairs: around tensor boundaries, header/data boundary, EOF, and random."""
    size = path.stat().st_size
    hn, _ = gen.read_header(path)
    bounds = [0, 8, 8 + hn, size]
    for _, s, e in gen.tensor_ranges(path):
        bounds += [s, e]
    rng = random.Random(seed)
    lens = [1, 7, 4095, 4096, 65536, 131072 + 3, MiB + 13, 3 * MiB]
    out = [(0, 8), (0, 8 + hn + 100), (8 + hn - 5, 10), (size - 1, 1), (size - 100, 4096), (size, 10),
           (size - 3 * MiB, 3 * MiB)]
    while len(out) < n:
        b = rng.choice(bounds)
        off = max(0, b + rng.randint(-70000, 70000)) if rng.random() < 0.7 else rng.randrange(size)
        out.append((min(off, size), rng.choice(lens)))
    return out


def _check_pread(src_fd: int, mnt_fd: int, ranges) -> list[str]:
    bad = []
    for off, ln in ranges:
        want = os.pread(src_fd, ln, off)
        got = os.pread(mnt_fd, ln, off)
        if got != want:
            bad.append(f"pread off={off} len={ln}: got {len(got)} B, want {len(want)} B, equal prefix "
                       f"{next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))}")
    return bad


def test_random_reads_8_threads_pread_and_mmap(mount, tree, big_file):
    root, paths = tree
    m = mount(root, "64MiB")
    rel = "dit_big.safetensors"
    src_p, mnt_p = root / rel, m.mnt / rel
    size = src_p.stat().st_size
    all_ranges = _ranges(src_p, 8 * 48, seed=1234)
    chunks = [all_ranges[i::8] for i in range(8)]

    src_fd = os.open(src_p, os.O_RDONLY)
    mnt_fd = os.open(mnt_p, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(8) as ex:
            bad = sum(ex.map(lambda c: _check_pread(src_fd, mnt_fd, c), chunks), [])
        assert not bad, f"{len(bad)} pread mismatches, first: {bad[:5]}"

        mm = mmap.mmap(mnt_fd, 0, prot=mmap.PROT_READ)
        try:
            assert len(mm) == size

            def check_mmap(c):
                errs = []
                for off, ln in c:
                    want = os.pread(src_fd, ln, off)
                    got = mm[off:off + ln]
                    if got != want:
                        errs.append(f"mmap off={off} len={ln}: got {len(got)} B, want {len(want)} B")
                return errs

            mm_ranges = _ranges(src_p, 8 * 32, seed=99)
            with ThreadPoolExecutor(8) as ex:
                bad = sum(ex.map(check_mmap, [mm_ranges[i::8] for i in range(8)]), [])
            assert not bad, f"{len(bad)} mmap mismatches, first: {bad[:5]}"
        finally:
            mm.close()
    finally:
        os.close(src_fd)
        os.close(mnt_fd)
    st = m.stats()
    assert st["cache"]["used_bytes"] <= 64 * MiB, st["cache"]
    assert m.alive()


@pytest.mark.parametrize("max_pages", [None, 4096], ids=["kernel-requests", "requests-over-a-chunk"])
def test_reads_across_cached_chunks_are_exact(mount, max_pages):
    """Reads served from two or more cached chunks, which go back to the kernel in pieces (one
    vectored write, or one copy into a ring's buffer), equal the source: at the kernel's request
    size, with buffers off a page (requests of 1 MiB - 16 B, some across a chunk boundary), and
    with requests larger than a chunk (`fs.fuse.max_pages_limit` raised), which all span chunks."""
    root = fresh_dir("across")
    src = gen.make_big_dit(root / "dit.safetensors", 96 * MiB, seed=21)
    size = src.stat().st_size
    saved = None
    if max_pages is not None:
        if not MAX_PAGES_LIMIT.exists() or not os.access(MAX_PAGES_LIMIT, os.W_OK):
            pytest.fail(f"{MAX_PAGES_LIMIT} is not writable: the suite runs as root on Linux >= 6.13")
        saved = MAX_PAGES_LIMIT.read_text().strip()
        MAX_PAGES_LIMIT.write_text(str(max_pages))
    try:
        # Model passthrough off: the whole model in the chunk cache, every read below a hit.
        m = mount(root, "256MiB", extra=("--no-model-passthrough",))
    finally:
        if saved is not None:
            MAX_PAGES_LIMIT.write_text(saved)
    want = src.read_bytes()
    mnt_p = m.mnt / src.name
    with open(mnt_p, "rb") as f:
        assert f.read() == want, "the filling pass"
    before = m.stats()
    fd = os.open(mnt_p, os.O_RDONLY)
    try:
        rng = random.Random(5)
        spans = [(4 * MiB * k - 4096, 8 * MiB + 4096) for k in range(1, size // (4 * MiB))]
        spans += [(rng.randrange(size), rng.choice([MiB + 1, 3 * MiB + 17, 8 * MiB, 16 * MiB]))
                  for _ in range(40)]
        bad = []
        for off, ln in spans:
            buf = bytearray(ln + 16)
            got = os.preadv(fd, [memoryview(buf)[16:]], off)
            if bytes(buf[16:16 + got]) != want[off:off + ln]:
                bad.append((off, ln, got))
        assert not bad, f"{len(bad)} reads differ from the source, first {bad[:3]}"
    finally:
        os.close(fd)
    after = m.stats()
    assert after["disk"]["read_bytes"] == before["disk"]["read_bytes"], "every read from the cache"
    assert after["cache"]["hits"] > before["cache"]["hits"]
    assert m.alive()


def _header_order(path: Path) -> list[str]:
    return [name for name, _, _ in gen.tensor_ranges(path)]


def _compare_safe_open(src: Path, mnt: Path, order: list[str]) -> list[str]:
    bad = []
    with safe_open(str(src), framework="numpy") as fs, safe_open(str(mnt), framework="numpy") as fm:
        assert sorted(fs.keys()) == sorted(fm.keys()), f"{mnt}: tensor names differ"
        assert fs.metadata() == fm.metadata()
        for name in order:
            a, b = fs.get_tensor(name), fm.get_tensor(name)
            if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                bad.append(f"{mnt.name}:{name} ({a.dtype}{a.shape})")
    return bad


def test_safe_open_all_tensors_bit_exact(mount, tree):
    """Every tensor of every generated file, header order and reverse, equals the source bytes."""
    root, paths = tree
    m = mount(root, "64MiB")
    files = sorted(paths.values())
    dtypes_seen = set()
    bad = []
    for p in files:
        rel = p.relative_to(root)
        order = _header_order(p)
        _, h = gen.read_header(p)
        dtypes_seen |= {v["dtype"] for k, v in h.items() if k != "__metadata__"}
        bad += _compare_safe_open(p, m.mnt / rel, order)
        bad += _compare_safe_open(p, m.mnt / rel, order[::-1])
    assert not bad, f"{len(bad)} tensors differ through the mount: {bad[:10]}"
    assert {"BF16", "F16", "F32", "F8_E4M3"} <= dtypes_seen, dtypes_seen
    listed = {f["path"] for f in m.stats()["files"]}
    want = {str(p.relative_to(root)) for p in files}
    assert want <= listed, f"opened safetensors files missing from stats.files: {want - listed}"
    assert m.alive()
