"""Sharded checkpoints as one model through a real mount.

A diffusers-style model (``diffusion_pytorch_model-0000N-of-00003.safetensors`` plus its
``.safetensors.index.json``) about twice the budget is read shard by shard with
``safe_open(framework="numpy")`` in index order, every tensor bit-exact against the source.
The stats must show one model of three shards, and that prefetch crossed from the end of one
shard into the next *before the reader opened it* (the next shard is indexed and has cached
bytes while only the first one was opened).  A second pass learns one order over the whole
model.  Small models check discovery by name pattern alone and a model with a missing shard
(each file stands alone, the stats say why).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from safetensors import safe_open

import gen
import gen_gguf
from conftest import parse_size, quiesce

BUDGET = "96MiB"     # the model is ~200 MiB: twice the budget; each shard (~67 MiB) fits alone
STEM = "diffusion_pytorch_model"
INDEX = f"{STEM}.safetensors.index.json"


def shard_names(n: int) -> list[str]:
    return [f"{STEM}-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


@pytest.fixture(scope="module")
def shard_root(data_dir):
    """big/: 8 Wan-style blocks (~25 MiB each) in 3 shards + index.json; pattern/: a small model
    in 3 shards without index.json; partial/: the same with its last shard missing."""
    root = data_dir / "shards"
    gen_gguf.make_sharded(root / "big", STEM, gen.dit_specs(1024, 2048, 8), 3, seed=51)
    for sub, keep in (("pattern", 3), ("partial", 2)):
        d = root / sub
        if not d.exists():
            tmp = root / f"{sub}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            gen_gguf.make_sharded(tmp, STEM, gen.dit_specs(256, 512, 4), 3, seed=52)
            (tmp / INDEX).unlink()
            for name in shard_names(3)[keep:]:
                (tmp / name).unlink()
            tmp.rename(d)
    return root


def check_shard(mnt_path, src_path, names) -> list[str]:
    """safe_open(numpy) over the mount, tensors in `names` order, raw bytes vs the source's."""
    problems = []
    n, header = gen.read_header(src_path)
    fd = os.open(src_path, os.O_RDONLY)
    try:
        with safe_open(str(mnt_path), framework="numpy") as f:
            for name in names:
                a = np.ascontiguousarray(f.get_tensor(name)).reshape(-1).view(np.uint8)
                s, e = (8 + n + o for o in header[name]["data_offsets"])
                if not np.array_equal(a, np.frombuffer(os.pread(fd, e - s, s), np.uint8)):
                    problems.append(f"{mnt_path.name}: {name}: bytes differ from the source")
    finally:
        os.close(fd)
    return problems


@pytest.mark.timeout(180)
def test_sharded_model_is_one_model_and_prefetch_crosses_shards(mount, shard_root):
    import json
    src = shard_root / "big"
    weight_map = json.loads((src / INDEX).read_text())["weight_map"]
    shards = sorted(set(weight_map.values()))
    assert shards == shard_names(3), shards
    model_bytes = sum((src / s).stat().st_size for s in shards)
    budget = parse_size(BUDGET)
    assert model_bytes >= 2 * budget, (model_bytes, budget)
    m = mount(shard_root, BUDGET)
    problems = []
    disk = []  # bytes read from disk by each pass
    for pass_no in range(2):
        before = quiesce(m)["disk"]["read_bytes"]
        for i, shard in enumerate(shards):
            names = [n for n, s in weight_map.items() if s == shard]  # index order
            problems += check_shard(m.mnt / "big" / shard, src / shard, names)
            if pass_no == 0 and i + 1 < len(shards):
                # Before the reader opens the next shard: prefetch opened it and cached its
                # first bytes.
                st = quiesce(m)
                model = next(x for x in st["models"] if x["name"] == f"big/{INDEX}")
                nxt = model["shards"][i + 1]
                assert nxt["path"] == f"big/{shards[i + 1]}", model
                assert nxt["indexed"] and nxt["cached_bytes"] > 0, (model, st["files"], st["cache"], st["prefetch"])
                if i + 2 < len(shards):
                    assert not model["shards"][i + 2]["indexed"], model
                    # One strip over every block of the model: the blocks of the shard not
                    # opened yet were never read.
                    strip = model["residency"]
                    assert len(strip) == model["blocks"] and set(strip) <= set("#>~+-."), model
                    assert strip.endswith(".") and set(strip) & set("#+~>"), model
        disk.append(quiesce(m)["disk"]["read_bytes"] - before)
    assert not problems, f"{len(problems)} problems: {problems[:8]}"
    st = quiesce(m)
    models = [x for x in st["models"] if x["name"] == f"big/{INDEX}"]
    assert len(models) == 1, st["models"]
    model = models[0]
    assert model["found_by"] == "index_json" and model["size"] == model_bytes, model
    assert [s["path"] for s in model["shards"]] == [f"big/{s}" for s in shards], model
    assert model["blocks"] == 9, model  # (other) + blocks.0-7 over all shards
    assert model["order_learned"], model
    # Two passes of a model twice the budget: part of it held, part evicted ("-", or "+" for a
    # block partly kept: which chunks stay moves from pass to pass, see the cache's eviction
    # docs), none never read; and the second pass read only what did not fit.
    strip = model["residency"]
    assert len(strip) == 9 and "#" in strip and set(strip) & set("+-") and "." not in strip, model
    assert disk[0] >= model_bytes, (disk, model_bytes)
    assert disk[1] <= (model_bytes - budget) * 1.10, (disk, model_bytes, budget)
    assert isinstance(model["residency_current"], int), model
    files = {f["path"]: f for f in st["files"]}
    for s in shards:
        f = files[f"big/{s}"]
        assert f["model"] == f"big/{INDEX}" and f["mode"] == "cache" and not f["malformed"], f
    assert st["cache"]["used_bytes"] <= budget, st["cache"]
    assert st["cache"]["evicted_bytes"] > 0 and st["disk"]["errors"] == 0, st
    assert m.alive(), m.log_tail()


@pytest.mark.timeout(60)
def test_shards_found_by_pattern_and_a_missing_shard_stands_alone(mount, shard_root):
    m = mount(shard_root, BUDGET)
    for sub in ("pattern", "partial"):
        first = shard_names(3)[0]
        with open(m.mnt / sub / first, "rb") as f, open(shard_root / sub / first, "rb") as g:
            assert f.read() == g.read(), f"{sub}/{first} differs from the source"
    st = m.stats()
    models = {x["name"]: x for x in st["models"]}
    pattern = models.get(f"pattern/{STEM}-*-of-00003.safetensors")
    assert pattern and pattern["found_by"] == "pattern", st["models"]
    assert [s["path"] for s in pattern["shards"]] == [f"pattern/{s}" for s in shard_names(3)]
    assert not any(name.startswith("partial/") for name in models), st["models"]
    files = {f["path"]: f for f in st["files"]}
    partial = files[f"partial/{shard_names(3)[0]}"]
    assert partial["model"] is None, partial
    assert "missing" in partial["standalone_reason"] and shard_names(3)[2] in partial["standalone_reason"], partial
    assert not partial["malformed"] and partial["tensors"] > 0, partial
    assert m.alive(), m.log_tail()
