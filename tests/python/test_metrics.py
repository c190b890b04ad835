"""What the tier is doing, as scripts and monitoring systems read it: the stats' per-block
residency strips (`files[].residency`) through a real mount.

A model in the chunk cache (`--no-passthrough`, a budget larger than it) is read whole, so every
block is resident; a `drop` empties it; reading its first block again fills that block only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import gen
from conftest import quiesce
from test_control import ctl

MODEL_REL = "model.safetensors"


@pytest.fixture(scope="module")
def metrics_source(data_dir) -> Path:
    """SOURCE with one ~64 MiB DiT of 8 transformer blocks (plus its other tensors)."""
    root = data_dir / "metrics_src"
    done = root / ".complete"
    if not done.exists():
        root.mkdir(parents=True, exist_ok=True)
        gen.write_streaming(root / MODEL_REL, gen.dit_specs(512, 2048, 8, ("BF16",)), seed=47)
        done.write_text("ok\n")
    return root


def file_row(m, rel: str = MODEL_REL) -> dict:
    row = m.file_stats(rel)
    assert row is not None, f"{rel} not in files[]: {m.stats()['files']}"
    return row


def read_all(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


def test_schema_version_is_served(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough",))
    doc = m.stats()
    assert doc["schema_version"] == doc["version"] == 1, doc


def test_residency_strip_follows_the_cache(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough",))
    read_all(m.mnt / MODEL_REL)
    quiesce(m)
    row = file_row(m)
    assert row["mode"] == "cache", row
    strip, blocks = row["residency"], row["blocks"]
    assert len(strip) == blocks > 1, row
    assert strip == "#" * blocks, f"a model read whole within its budget, strip {strip!r}"
    current = row["residency_current"]
    assert isinstance(current, int) and 0 <= current < blocks, row

    assert ctl(m.mnt, "drop") > 0
    row = file_row(m)
    assert row["cached_bytes"] == 0 and row["residency"] == "." * blocks, row

    # A stream over the first eighth of the data region (a lone request is a probe, served
    # uncached) fills the blocks there and the one or two prefetch reads ahead, not all.
    header_bytes, _ = gen.read_header(metrics_source / MODEL_REL)
    size = (m.mnt / MODEL_REL).stat().st_size
    with open(m.mnt / MODEL_REL, "rb") as f:
        f.seek(8 + header_bytes)
        for _ in range(size // 8 // (1 << 20)):
            f.read(1 << 20)
    quiesce(m)
    strip = file_row(m)["residency"]
    assert len(strip) == blocks and set(strip) <= set("#+>."), strip
    assert strip.count(".") < blocks, f"a block was read, strip {strip!r}"
    assert "." in strip, f"only one block was read, strip {strip!r}"
