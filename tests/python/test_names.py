"""Odd names in SOURCE are listed and read exactly through the mount.

Names are handled as bytes throughout (``os.fsencode``/bytes paths): Linux names are byte
strings, and a non-UTF-8 name must survive readdir, lookup and open unchanged.
"""

from __future__ import annotations

import os
import stat as st_mod
import time

import numpy as np
import pytest
from safetensors import deserialize

import gen

NAME_MAX = 255

# (file name bytes, is a model)
ODD_FILES: list[bytes] = [
    b"latin1-\xe9t\xe9.bin",                 # non-UTF-8 (Latin-1 bytes)
    b"bad-\xff\xfe\x80-bytes.txt",            # invalid UTF-8 sequences
    b"line\nbreak.txt",                      # a newline
    b"tab\tand\rcr.txt",
    b"  spaces  around  .txt",
    b"-leading-dash",
    b"...",
    b"back\\slash and 'quotes\" $HOME *?[x].txt",
    "日本語 ✓ 🎉 Ünïcödé.txt".encode(),
    "e\u0301 combining vs \u00e9 precomposed".encode(),
    "\u00e9 precomposed vs e\u0301 combining".encode(),
    b"x" * NAME_MAX,                          # the maximum, ASCII
    ("\u00e9" * 127 + "z").encode(),          # the maximum, 2-byte characters (255 bytes)
]

ODD_MODELS: list[bytes] = [
    b"odd \xff\xfe model\nname.safetensors",           # non-UTF-8 + newline + spaces
    ("\u2603 " * 60).encode() + b"abc.safetensors",    # 255 bytes (snowmen are 3 bytes)
    "Ünïcödé – Flux v2 (fp8).safetensors".encode(),
]

ODD_DIRS: list[bytes] = [b"dir \xff\nodd", "dír ünï".encode()]


assert len(ODD_MODELS[1]) == NAME_MAX, len(ODD_MODELS[1])


def _payload(name: bytes) -> bytes:
    rng = np.random.default_rng(abs(hash(name)) % (1 << 32))
    return name + b"\0" + rng.bytes(int(rng.integers(0, 300_000)))


@pytest.fixture
def odd_src(workdir):
    src = os.fsencode(workdir / "src")
    os.mkdir(src)
    expected: dict[bytes, bytes] = {}
    for d in [b""] + ODD_DIRS:
        base = os.path.join(src, d) if d else src
        if d:
            os.mkdir(base)
        for name in ODD_FILES:
            assert len(name) <= NAME_MAX
            data = _payload(d + b"/" + name)
            with open(os.path.join(base, name), "wb") as f:
                f.write(data)
            expected[os.path.join(d, name)] = data
    for i, name in enumerate(ODD_MODELS):
        assert len(name) <= NAME_MAX, len(name)
        p = os.path.join(src, name)
        tmp = workdir / f"tmp{i}.safetensors"
        gen.write_small(tmp, gen.dit_specs(128, 256, 2, ("BF16", "F16")), seed=100 + i)
        os.rename(tmp, p)
        with open(p, "rb") as f:
            expected[name] = f.read()
    # a symlink with an odd name to an odd file, and a dangling one
    os.symlink(ODD_FILES[0], os.path.join(src, b"link \xfe\nto-latin1"))
    with open(os.path.join(src, ODD_FILES[0]), "rb") as f:
        expected[b"link \xfe\nto-latin1"] = f.read()
    return src, expected


def _listing(root: bytes) -> dict[bytes, list[bytes]]:
    """dir rel path -> sorted entry names, walking with bytes paths (skips the root .tierfs)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == b".":
            dirnames[:] = [d for d in dirnames if d != b".tierfs"]
            filenames = [f for f in filenames if f != b".tierfs"]
        out[rel] = sorted(dirnames + filenames)
    return out


def test_odd_names_listed_and_read(mount, odd_src):
    src, expected = odd_src
    m = mount(os.fsdecode(src), "32MiB")
    mnt = os.fsencode(m.mnt)
    want, got = _listing(src), _listing(mnt)
    assert set(got) == set(want), f"directories differ: {set(got) ^ set(want)}"
    for d in want:
        assert got[d] == want[d], (f"listing of {d!r} differs: missing {sorted(set(want[d]) - set(got[d]))!r}, "
                                   f"extra {sorted(set(got[d]) - set(want[d]))!r}")
    # scandir types/sizes match, and reads are byte-exact
    for rel, data in expected.items():
        p = os.path.join(mnt, rel)
        s = os.stat(p)
        assert st_mod.S_ISREG(s.st_mode), f"{rel!r}: not a regular file through the mount"
        assert s.st_size == len(data), f"{rel!r}: size {s.st_size} != {len(data)}"
        with open(p, "rb") as f:
            assert f.read() == data, f"{rel!r}: bytes differ through the mount"
    for d in [b""] + ODD_DIRS:
        base = os.path.join(mnt, d) if d else mnt
        with os.scandir(base) as it:
            for e in it:
                if e.name == b".tierfs":
                    continue
                s_src = os.stat(os.path.join(src, d, e.name) if d else os.path.join(src, e.name))
                s_mnt = e.stat()
                assert s_mnt.st_size == s_src.st_size and st_mod.S_IFMT(s_mnt.st_mode) == st_mod.S_IFMT(s_src.st_mode), (
                    f"{d!r}/{e.name!r}: stat through the mount differs from the source")
    # a name one byte over the maximum is refused, not truncated or crashing the daemon
    try:
        os.stat(os.path.join(mnt, b"y" * (NAME_MAX + 1)))
        pytest.fail("a 256-byte name resolved")
    except OSError as e:
        assert e.errno == 36, f"want ENAMETOOLONG, got {e!r}"  # ENAMETOOLONG
    assert m.alive()


def test_odd_named_models_served_as_models(mount, odd_src):
    src, expected = odd_src
    m = mount(os.fsdecode(src), "32MiB")
    mnt = os.fsencode(m.mnt)
    for name in ODD_MODELS:
        p = os.path.join(mnt, name)
        with open(p, "rb") as f:
            data = f.read()
        assert data == expected[name], f"{name!r}: bytes differ"
        # parse what the mount served with the reference loader; pread of a middle range too
        tensors = dict(deserialize(data))  # the reference parser (Rust), dtype-agnostic
        with open(os.path.join(src, name), "rb") as f:
            want = dict(deserialize(f.read()))
        assert tensors.keys() == want.keys() and all(
            bytes(tensors[k]["data"]) == bytes(want[k]["data"]) for k in want), f"{name!r}: tensors differ"
        fd = os.open(p, os.O_RDONLY)
        try:
            mid = len(data) // 2
            assert os.pread(fd, 65536, mid) == data[mid:mid + 65536], f"{name!r}: pread differs"
        finally:
            os.close(fd)
    # they went through the model path (cache), not served as plain/malformed files
    files = m.stats()["files"]
    for name in ODD_MODELS:
        size = len(expected[name])
        hits = [f for f in files if f["size"] == size]
        assert hits, f"{name!r} (size {size}) not in stats files[]: {[f['path'] for f in files]}"
        assert all(f["malformed"] is False for f in hits), hits
    assert m.alive()


def test_directory_with_10000_files(mount, workdir):
    src = workdir / "src"
    big = src / "many"
    big.mkdir(parents=True)
    n = 10_000
    names = [f"f{i:05d}-{'é' if i % 3 == 0 else 'e'}{'x' * (i % 50)}.txt" for i in range(n)]
    names[7] = "f00007 \xe9\n.txt"
    for i, name in enumerate(names):
        fd = os.open(big / name, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, str(i).encode() * (i % 7))
        os.close(fd)
    (src / "neighbour.txt").write_text("still here\n")
    m = mount(src, "32MiB")
    t0 = time.monotonic()
    listed = os.listdir(m.mnt / "many")
    assert len(listed) == len(set(listed)), f"duplicate entries: {len(listed) - len(set(listed))}"
    assert sorted(listed) == sorted(os.listdir(big)), (
        f"listing of 10000 differs: {len(listed)} entries, missing {len(set(names) - set(listed))}, "
        f"extra {len(set(listed) - set(names))}")
    sizes = {}
    with os.scandir(m.mnt / "many") as it:
        for e in it:
            s = e.stat()
            assert st_mod.S_ISREG(s.st_mode), e.name
            sizes[e.name] = s.st_size
    assert len(sizes) == n
    bad = [nm for i, nm in enumerate(names) if sizes[nm] != len(str(i)) * (i % 7)]
    assert not bad, f"{len(bad)} sizes differ, e.g. {bad[:3]}"
    # a few reads, and a second listing (from the kernel's or daemon's caches) is the same
    for i in (0, 7, 4999, 9999):
        assert (m.mnt / "many" / names[i]).read_bytes() == str(i).encode() * (i % 7)
    assert sorted(os.listdir(m.mnt / "many")) == sorted(names)
    elapsed = time.monotonic() - t0
    assert elapsed < 30, f"listing + stat of 10000 files took {elapsed:.1f} s"
    assert (m.mnt / "neighbour.txt").read_text() == "still here\n"
