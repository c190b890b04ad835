"""The compressed RAM tier through a real mount (`--compress`).

A checkpoint of every float dtype (bf16, fp16, fp32, fp8), with odd element counts and small
tensors packed together, is read through the mount, left to the compressor, and read again:
whole, and in odd ranges that start mid-element and cross chunks.  Every byte must be the
source's; the stats must show what the tier holds (per file and mount-wide) and no decode
error; `off` holds nothing compressed; the daemon's peak RSS stays within 1.1 x budget + 64 MiB
while a file larger than the budget is read through a compressed cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from conftest import MiB, fresh_dir, proc_status_kib

EXTRA = ("--no-model-passthrough",)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _weights(path: Path, blocks: int, seed: int) -> Path:
    """Blocks of weights whose values follow a trained model's (normal, per-tensor deviation),
    in every float dtype, odd element counts, plus small norm tensors packed between them."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for b in range(blocks):
        std = float(np.exp(rng.uniform(np.log(0.005), np.log(0.08))))
        n = 1_048_573 + b  # odd: chunks of the split tensor start mid-element
        tensors[f"blocks.{b}.attn.qkv.weight"] = _bf16(rng.normal(0, std, n)).view(np.uint16).view("<u2")
        tensors[f"blocks.{b}.mlp.fc1.weight"] = rng.normal(0, std, 700_001).astype(np.float16)
        tensors[f"blocks.{b}.mlp.fc2.weight"] = rng.normal(0, std, 300_007).astype(np.float32)
        tensors[f"blocks.{b}.norm1.weight"] = rng.normal(1, 0.01, 1537).astype(np.float32)
        tensors[f"blocks.{b}.norm2.weight"] = _bf16(rng.normal(1, 0.01, 1539)).view("<u2")
        tensors[f"blocks.{b}.proj.weight"] = (np.clip(np.round(rng.normal(0, 24, 900_001)), -120, 120)
                                              .astype(np.int8).view(np.uint8))
    save_file(tensors, str(path))
    # safetensors.numpy writes uint16/uint8 arrays as U16/U8: give the header the real dtypes.
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] == "U16":
            t["dtype"] = "BF16"
        elif t["dtype"] == "U8":
            t["dtype"] = "F8_E4M3"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    return path


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def _settled(m, timeout: float = 60) -> dict:
    """The cache's figures once the compressor is done and the readers' windows are closed."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        c = m.stats()["cache"]
        now = (c["used_bytes"], c["compress"]["raw_bytes"])
        if now == last and c["compress"]["window_bytes"] == 0 and c["compress"]["raw_bytes"] > 0:
            return c
        last = now
        time.sleep(0.5)
    return m.stats()["cache"]


def _odd_ranges(src: Path, mnt: Path, count: int, seed: int) -> None:
    size = src.stat().st_size
    rng = random.Random(seed)
    with open(src, "rb") as a, open(mnt, "rb") as b:
        for _ in range(count):
            off = rng.randrange(0, size - 1)
            length = rng.choice([1, 3, 4095, 65_537, 1_000_003, 5 * MiB + 7])
            assert os.pread(b.fileno(), length, off) == os.pread(a.fileno(), length, off), (off, length)


def test_compressed_chunks_read_back_bit_exact_and_show_in_the_stats(mount):
    src = fresh_dir("compress-src")
    path = _weights(src / "m.safetensors", blocks=4, seed=11)
    want = _sha(path)
    m = mount(src, budget="256MiB", extra=(*EXTRA, "--compress", "on"))
    mf = m.mnt / "m.safetensors"
    assert _sha(mf) == want
    c = _settled(m)
    z = c["compress"]
    assert z["mode"] == "on"
    assert z["raw_bytes"] > 0.7 * path.stat().st_size, z
    assert 0.5 < z["ratio"] < 0.9, z
    assert z["frame_bytes"] < z["raw_bytes"]
    # Read again, from frames: whole, then odd ranges (mid-element starts, across chunks).
    assert _sha(mf) == want
    _odd_ranges(path, mf, 200, seed=3)
    s = m.stats()
    z = s["cache"]["compress"]
    assert z["decoded_bytes"] > 0 and z["decode_errors"] == 0, z
    row = next(f for f in s["files"] if f["path"] == "m.safetensors")
    assert row["compressed"]["raw_bytes"] > 0 and row["compressed"]["frame_bytes"] > 0, row
    assert abs(row["compressed"]["ratio"] - row["compressed"]["frame_bytes"] / row["compressed"]["raw_bytes"]) < 1e-6
    metrics = (m.mnt / ".tierfs" / "metrics").read_text()
    for name in ("tierfs_cache_compressed_raw_bytes", "tierfs_cache_compress_ratio",
                 "tierfs_file_compressed_raw_bytes", "tierfs_cache_decode_errors_total"):
        assert name in metrics, name


def test_off_holds_nothing_compressed(mount):
    src = fresh_dir("compress-off")
    path = _weights(src / "m.safetensors", blocks=2, seed=12)
    m = mount(src, budget="256MiB", extra=(*EXTRA, "--compress", "off"))
    assert _sha(m.mnt / "m.safetensors") == _sha(path)
    time.sleep(1)
    z = m.stats()["cache"]["compress"]
    assert (z["mode"], z["raw_bytes"], z["encoded_bytes"]) == ("off", 0, 0), z


def test_memory_stays_bounded_with_a_compressed_cache(mount):
    """A file 1.3-1.4 x the budget read three times through `--compress on`: the bytes are exact
    and the daemon's peak RSS stays within 1.1 x budget + 64 MiB."""
    src = fresh_dir("compress-mem")
    path = _weights(src / "m.safetensors", blocks=16, seed=13)
    budget = 64 * MiB
    assert path.stat().st_size > 1.3 * budget
    want = _sha(path)
    m = mount(src, budget="64MiB", extra=(*EXTRA, "--compress", "on"))
    for _ in range(3):
        assert _sha(m.mnt / "m.safetensors") == want
        time.sleep(1)
    hwm = proc_status_kib(m.pid, "VmHWM") * 1024
    assert hwm <= 1.1 * budget + 64 * MiB, f"peak RSS {hwm / MiB:.1f} MiB"
    z = m.stats()["cache"]["compress"]
    assert z["raw_bytes"] > 0 and z["decode_errors"] == 0, z
