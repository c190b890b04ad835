"""All-in-one checkpoints (UNet, text encoder and VAE in one file), loaded the way ComfyUI loads them.

The file has SD1.5's layout (`gen.sd15_full_specs`: tensors in name order, each model's
non-block tensors with it), 1.4 GB. The loader maps it and does what
`load_state_dict_guess_config` does: a first touch of every tensor in name order (safetensors'
`get_tensor`), then every tensor copied in module order, UNet first (`time_embed`, the blocks,
`out`), then the VAE, then the text encoder (`gen.checkpoint_order`). Every byte copied is
compared with the source. Through a budget an eighth of the file, the load must read about the
file once: entering one model's embeddings must not read the other models ahead.
"""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

import pytest

import gen
from conftest import MiB, drop_caches, fresh_dir, quiesce

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def checkpoint():
    d = fresh_dir("checkpoint")
    path = d / "sd15_all_in_one.safetensors"
    gen.write_streaming(path, gen.sd15_full_specs(), seed=2617)
    yield path
    shutil.rmtree(d, ignore_errors=True)  # 1.4 GB: not kept for the rest of the session


def comfy_load(path: Path, source: Path) -> int:
    """Touch every tensor in name order, then copy each in ComfyUI's module order; returns the
    bytes copied. Raises on any byte that differs from `source`."""
    order = gen.checkpoint_order(source)
    copied = 0
    with open(path, "rb") as f, open(source, "rb") as ref:
        mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        try:
            view = memoryview(mm)
            for _, start, end in sorted(order, key=lambda t: t[1]):
                if end > start:
                    _ = view[start]
            for name, start, end in order:
                got = bytes(view[start:end])
                ref.seek(start)
                assert got == ref.read(end - start), f"{name}: bytes differ from the source"
                copied += end - start
            view.release()
        finally:
            mm.close()
    return copied


def test_an_all_in_one_checkpoint_is_read_about_once_through_an_eighth(mount, checkpoint):
    size = checkpoint.stat().st_size
    budget = size // 8
    src = checkpoint.parent / "src"  # removed with the checkpoint, after the mount is gone
    src.mkdir()
    os.link(checkpoint, src / checkpoint.name)
    state = fresh_dir("state")
    m = mount(src, f"{budget // MiB}MiB", ("--no-model-passthrough", "--state-dir", str(state)))
    drop_caches()
    copied = comfy_load(m.mnt / checkpoint.name, checkpoint)
    st = quiesce(m)
    f = next(x for x in st["files"] if x["path"] == checkpoint.name)
    disk = st["disk"]["read_bytes"] / size
    wasted = st["prefetch"]["wasted_bytes"] / size
    probes = st["disk"]["probe_bytes"] / size
    msg = (f"disk {disk:.3f} x file, prefetch wasted {wasted:.3f} x file, probes {probes:.3f}; "
           f"file {size / MiB:.0f} MiB, budget {budget / MiB:.0f} MiB; blocks {f['blocks']}")
    print(msg)
    assert copied == sum(e - s for _, s, e in gen.tensor_ranges(checkpoint))
    assert f["mode"] == "cache", f
    # What the loader's first touches read (one mmap read-around each, served exactly and not
    # cached: they are no stream) is read again by the copies; the rest must be the file once.
    assert wasted <= 0.03, msg
    assert disk - probes <= 1.05, msg
    assert disk <= 1.10, msg
    assert st["cache"]["used_bytes"] <= st["cache"]["budget_bytes"], st["cache"]
