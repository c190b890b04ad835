"""Model headers and indexes are held to `--index-cache`.

Each known model file keeps its header and parsed index in the daemon, outside the chunk
budget. Two hostile folders must keep the daemon's resident memory within its bound:
- 10 000 model files, each with a 24 KiB header, all opened and their headers read
  (about 500 MiB of headers and indexes if nothing were forgotten);
- one file with a maximal header (100 MB, the safetensors limit) under 6 names (hard links,
  so generating it costs one 100 MB write), each opened in turn, and then all held open at
  once (open files cannot be forgotten: the ones that do not fit are served as plain bytes).

The bound checked is the RSS of the daemon after mounting, plus the cap, plus the chunk budget,
plus the io_uring transport's ring buffers where it serves, plus `SLACK`, plus for the maximal
headers one header being parsed (its buffer and parsed index exist before the table can evict
for it): what docs/MEMORY.md states. The figures are printed (`-s`).
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest

import conftest

MiB = 1 << 20
# Memory besides headers, indexes and chunks that grows with what was opened: request buffers,
# the inode table (10 000 entries), the allocator's slack. Measured: 17 MiB over the RSS after
# mounting for 10 000 files under a 1 MiB cap.
SLACK = 32 * MiB


def write_model(path: Path, header: dict, data: bytes) -> None:
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.write(data)


def many_tensors_header(n: int) -> tuple[dict, bytes]:
    header: dict = {}
    for i in range(n):
        header[f"model.diffusion_model.blocks.{i // 8}.attention.to_q.lora_up.weight.{i:05d}"] = {
            "dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
    return header, bytes(4 * n)


def maximal_header_names(src: Path, data: bytes) -> tuple[Path, int]:
    """`src/big0.safetensors`, a model with a 100 MB header (the limit: most of it one metadata
    string, which the index keeps too) and the 4 bytes `data`, and 5 more names of it (hard
    links, so generating it costs one 100 MB write); returns big0 and its header length."""
    src.mkdir()
    pad = 100_000_000 - 8 - len(json.dumps({"__metadata__": {"pad": ""}, "t": {
        "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, separators=(",", ":")))
    header = {"__metadata__": {"pad": "x" * pad}, "t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    big = src / "big0.safetensors"
    write_model(big, header, data)
    del header
    with open(big, "rb") as f:
        n_hdr = struct.unpack("<Q", f.read(8))[0]
    assert 99_000_000 < n_hdr <= 100_000_000
    for i in range(1, 6):
        os.link(big, src / f"big{i}.safetensors")
    return big, n_hdr


def rss_kib(m) -> int:
    return conftest.proc_status_kib(m.pid, "VmRSS")


def ring_buffers(m) -> int:
    """The io_uring transport's ring buffers, held outside the budget where it serves (0 with
    /dev/fuse): docs/MEMORY.md."""
    return m.stats()["transport"]["buffer_bytes"]


def open_header(path: Path, n: int) -> None:
    with open(path, "rb") as f:
        assert len(f.read(n)) > 8


@pytest.mark.timeout(240)
def test_ten_thousand_model_files_stay_within_the_index_cap(mount, workdir):
    src = workdir / "src"
    src.mkdir()
    header, data = many_tensors_header(260)
    one = src / "m00000.safetensors"
    write_model(one, header, data)
    body = one.read_bytes()
    for i in range(1, 10_000):
        (src / f"m{i:05d}.safetensors").write_bytes(body)
    cap = 32 * MiB
    m = mount(src, "16MiB", ("--index-cache", str(cap)))
    base = rss_kib(m)
    t0 = time.monotonic()
    peak = base
    for i in range(10_000):
        open_header(m.mnt / f"m{i:05d}.safetensors", 64 << 10)
        if i % 500 == 0:
            peak = max(peak, rss_kib(m))
    took = time.monotonic() - t0
    peak = max(peak, rss_kib(m))
    c = m.stats()["cache"]
    per_file = c["index_bytes"] / max(c["index_entries"], 1)
    print(f"\n10 000 files, header {len(body) >> 10} KiB each: opened in {took:.1f} s; "
          f"RSS {base >> 10} MiB after mount, peak {peak >> 10} MiB; index_bytes {c['index_bytes'] >> 20} MiB "
          f"of cap {cap >> 20} MiB, entries {c['index_entries']}, evictions {c['index_evictions']}, "
          f"estimate {per_file / 1024:.0f} KiB per file; without the cap: {10_000 * per_file / MiB:.0f} MiB")
    assert c["index_cap_bytes"] == cap
    assert c["index_bytes"] <= cap, c
    assert c["index_evictions"] >= 10_000 - c["index_entries"] and c["index_evictions"] > 5000, c
    bound_kib = base + (cap + 16 * MiB + SLACK + ring_buffers(m)) // 1024
    assert peak <= bound_kib, f"RSS peak {peak} KiB over the bound {bound_kib} KiB"
    # Forgotten files open again, byte-exact.
    assert (m.mnt / "m00001.safetensors").read_bytes() == body
    assert m.alive()


@pytest.mark.timeout(240)
def test_maximal_headers_stay_within_the_index_cap(mount, workdir):
    src = workdir / "src"
    _, n_hdr = maximal_header_names(src, b"\0\0\0\0")
    cap = 256 * MiB  # the default
    m = mount(src, "16MiB")
    base = rss_kib(m)
    peaks = []
    for i in range(6):
        open_header(m.mnt / f"big{i}.safetensors", 4096)
        peaks.append(rss_kib(m))
    c = m.stats()["cache"]
    hwm = conftest.proc_status_kib(m.pid, "VmHWM")
    print(f"\n6 names of a {n_hdr / 1e6:.0f} MB header: RSS {base >> 10} MiB after mount, after each open "
          f"{[p >> 10 for p in peaks]} MiB, high-water {hwm >> 10} MiB; index_bytes {c['index_bytes'] >> 20} MiB "
          f"of cap {c['index_cap_bytes'] >> 20} MiB, entries {c['index_entries']}, evictions {c['index_evictions']}")
    assert c["index_cap_bytes"] == cap and c["index_bytes"] <= cap, c
    assert c["index_evictions"] >= 4, c
    # After each open: the cap and the budget.
    bound_kib = base + (cap + 16 * MiB + SLACK + ring_buffers(m)) // 1024
    assert max(peaks) <= bound_kib, f"RSS {max(peaks)} KiB over the bound {bound_kib} KiB"
    # While a header is indexed: its read buffer, its parse and its index, next to the file it
    # replaces in the table (evicted only once the new one is in): three header sizes at most.
    hwm_bound_kib = base + (cap + 16 * MiB + 3 * 100 * MiB + SLACK + ring_buffers(m)) // 1024
    assert hwm <= hwm_bound_kib, f"RSS high-water {hwm} KiB over {hwm_bound_kib} KiB"
    with open(m.mnt / "big5.safetensors", "rb") as f:
        f.seek(8 + n_hdr)
        assert f.read() == b"\0\0\0\0"
    assert m.alive()


@pytest.mark.timeout(240)
def test_open_files_never_take_the_index_past_its_cap(mount, workdir):
    """Six names of the maximal header, all held open at once: open files cannot be forgotten,
    so the ones that do not fit beside them are served as plain bytes (uncached, no header
    held), with the reason in the stats, and indexed at an open after the others closed."""
    src = workdir / "src"
    big, n_hdr = maximal_header_names(src, b"\1\2\3\4")
    cap = 256 * MiB
    m = mount(src, "16MiB")
    base = rss_kib(m)
    handles = []
    try:
        for i in range(6):
            f = open(m.mnt / f"big{i}.safetensors", "rb")
            handles.append(f)
            assert len(f.read(4096)) == 4096
        rss = rss_kib(m)
        stats = m.stats()
        c = stats["cache"]
        reasons = {f["path"]: f["mode_reason"] for f in stats["files"]}
        print(f"\n6 names of a {n_hdr / 1e6:.0f} MB header held open: RSS {base >> 10} MiB after mount, "
              f"{rss >> 10} MiB with all open; index_bytes {c['index_bytes'] >> 20} MiB of cap "
              f"{c['index_cap_bytes'] >> 20} MiB, refusals {c['index_refusals']}; reasons {reasons}")
        assert c["index_bytes"] <= cap, c
        assert c["index_refusals"] >= 4, c
        raw = [p for p, r in reasons.items() if r == "the index cap is full of open files' headers"]
        assert len(raw) == c["index_refusals"], reasons
        assert rss <= base + (cap + 16 * MiB + SLACK) // 1024, f"RSS {rss} KiB"
        # Every handle, indexed or not, reads the file's bytes.
        size = big.stat().st_size
        with open(big, "rb") as f:
            head = f.read(1 << 20)
            f.seek(size - (1 << 20))
            tail = f.read()
        assert tail.endswith(b"\1\2\3\4")
        for f in handles:
            f.seek(0)
            assert f.read(1 << 20) == head
            f.seek(size - (1 << 20))
            assert f.read() == tail
    finally:
        for f in handles:
            f.close()
    # Closed, they make room: the next open of a file served raw indexes it.
    name = raw[-1]
    with open(m.mnt / name, "rb") as f:
        f.read(4096)
        reasons = {e["path"]: e["mode_reason"] for e in m.stats()["files"]}
        assert reasons[name] != "the index cap is full of open files' headers", reasons
    assert m.stats()["cache"]["index_bytes"] <= cap
    assert m.alive()
