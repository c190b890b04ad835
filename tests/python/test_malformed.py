"""Malformed safetensors are served byte-exact as plain files and flagged in stats."""

from __future__ import annotations

import json
import struct

import pytest

import gen


def _valid(tmp, name="good.safetensors"):
    p = tmp / name
    gen.write_small(p, gen.dit_specs(64, 128, 2, ("BF16", "F8_E4M3")), seed=5)
    return p


def _header_file(path, header: dict | bytes, data: bytes, declared_len: int | None = None):
    hj = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(hj) if declared_len is None else declared_len
    path.write_bytes(struct.pack("<Q", n) + hj + data)


def make_cases(d):
    """name -> path of each malformed case."""
    good = _valid(d)
    raw = good.read_bytes()
    n, h = gen.read_header(good)
    cases = {}
    # header length larger than the file
    p = d / "bad_len.safetensors"
    p.write_bytes(struct.pack("<Q", 10**12) + raw[8:])
    cases["header length past EOF"] = p
    # absurd header length with tiny file
    p = d / "tiny.safetensors"
    p.write_bytes(b"\x05\x00\x00")
    cases["file shorter than 8 bytes"] = p
    # bad JSON
    p = d / "bad_json.safetensors"
    _header_file(p, b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]', b"\0" * 8)
    cases["bad JSON"] = p
    # offsets past EOF
    p = d / "past_eof.safetensors"
    _header_file(p, {"a": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}, b"\1" * 100)
    cases["offsets past EOF"] = p
    # overlapping tensors
    p = d / "overlap.safetensors"
    _header_file(p, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                     "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, bytes(range(24)))
    cases["overlapping tensors"] = p
    # truncated valid file
    p = d / "truncated.safetensors"
    p.write_bytes(raw[: 8 + n + (len(raw) - 8 - n) // 2])
    cases["truncated"] = p
    # shape/offsets disagree
    p = d / "shape_mismatch.sft"
    _header_file(p, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, b"\2" * 16)
    cases["shape does not match offsets"] = p
    return good, cases


CASES = ["header length past EOF", "file shorter than 8 bytes", "bad JSON", "offsets past EOF",
         "overlapping tensors", "truncated", "shape does not match offsets"]


@pytest.mark.parametrize("what", CASES)
def test_malformed_served_byte_exact_and_flagged(mount, workdir, what):
    src = workdir / "src"
    src.mkdir()
    good, cases = make_cases(src)
    assert sorted(cases) == sorted(CASES)
    p = cases[what]
    m = mount(src)
    got = (m.mnt / p.name).read_bytes()
    want = p.read_bytes()
    assert got == want, f"{what}: bytes differ through the mount ({len(got)} B vs {len(want)} B)"
    fs = m.file_stats(p.name)
    assert fs is not None, f"{what}: {p.name} not listed in stats.files after opening: {m.stats()['files']}"
    assert fs.get("malformed") is True and isinstance(fs.get("malformed_reason"), str) and fs["malformed_reason"], (
        f"{what}: stats entry not flagged malformed with a reason: {fs}")
    assert m.alive(), f"daemon died after serving {what}"
    # Still serving a good file, which is not flagged.
    assert (m.mnt / good.name).read_bytes() == good.read_bytes()
    gs = m.file_stats(good.name)
    assert gs is not None and gs["malformed"] is False and gs["malformed_reason"] is None, gs
    assert gs["tensors"] == len(gen.tensor_ranges(good)), gs
    assert m.alive()
