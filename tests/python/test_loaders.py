"""Real loaders through a real mount, every tensor bit-exact (loader checks 1-6).

The source is a ComfyUI-like models folder (:func:`models`): a >= 2 GiB DiT (bf16, fp16 and
fp8 block weights, fp32/fp16 norms, tensors in name order like real writers, so file order is
not model order), an SD-style UNet, a Flux with scaled-fp8 weights, 0-d scales and an empty
tensor, small DiTs (one `.sft`, one with a non-ASCII name), a symlinked model file, a symlinked
directory and non-model files.  Each test mounts it with a budget smaller than the largest
file and reads every tensor of every model file with one loader:

1. ``safetensors.safe_open(framework="numpy")``, in header order and in model (block) order;
2. ``safetensors.torch.load_file``;
3. ComfyUI's loader (``comfy/utils.py: load_safetensors``): ``comfy_aimdo.model_mmap.ModelMMAP``
   maps the whole file, each tensor is ``torch.frombuffer`` on its byte range, touched in model
   order;
4. ComfyUI's re-read under dynamic VRAM, as comfy-aimdo's file reader does it: each tensor's
   range cut into 2 MiB chunks that 8 threads ``pread``, ``posix_fadvise(DONTNEED)`` after each
   chunk, tensors in model order; two passes (the re-read comes back every sampling step);
5. ``runai_model_streamer.SafetensorsStreamer`` with its default concurrency;
6. discovery: ``os.walk(followlinks=True)``, ``getsize``/``getmtime`` of every file and
   directory, and a header read (<= 8 MiB) of every model file, on a cold mount and again with
   the tierfs cache full of other data and the kernel's caches dropped.

Tensor bytes are compared with the source file's bytes, raw (never as floats: NaN payloads and
fp8 must match bit for bit), along with dtype and shape from the source header.  After each
loader the mount's stats must show that the bytes streamed through the cache within its budget:
every data byte read from disk, chunks evicted (the budget is smaller than the big file), the
cache never above the budget.  Speed is not asserted here; ``tests/bench/loaders.py`` measures it.

Loaders 2, 3 and 5 need ``torch``, ``comfy-aimdo`` and ``runai-model-streamer``, which
``.ci/run`` installs; a test whose package is absent is skipped (reported), never passed.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pytest
from safetensors import safe_open

import gen
from conftest import MiB, Mount, drop_caches, parse_size, quiesce

BUDGET = "512MiB"             # < the 2 GiB checkpoint: every loader streams through evictions
CHUNK = 2 * MiB               # ComfyUI / comfy-aimdo re-read: chunk size ...
THREADS = 8                   # ... and reader threads
HEADER_MAX = 8 * MiB          # discovery reads a header only up to this size
HEADER_PROBE = 256 << 10      # what the daemon reads of a source file to index its header
BIG = "diffusion_models/wan_dit_2gib.safetensors"

Loaded = Iterator[tuple[str, str, tuple[int, ...], np.ndarray]]  # name, dtype, shape, raw bytes


# ----------------------------------------------------------------------------- the source tree

@pytest.fixture(scope="module")
def models(data_dir, tree, big2_file) -> Path:
    """A ComfyUI-style models folder built from hard links to the generated checkpoints.

      diffusion_models/wan_dit_2gib.safetensors   the >= 2 GiB DiT
      checkpoints/sd15_unet.safetensors           UNet-shaped (fp16/fp32)
      unet/flux_fp8.safetensors                   Flux-shaped (bf16, scaled fp8, 0-d, empty)
      text_encoders/dit_small.sft                 `.sft`, bf16/fp8/fp32
      loras/sub/lora ü.safetensors                non-ASCII name, nested
      vae/model.safetensors, vae/readme.md        another model, a non-model file
      flux_link.safetensors -> unet/flux_fp8.safetensors      (a file symlink)
      linked_unet -> unet                                     (a directory symlink)
      notes.txt
    """
    root = data_dir / "loader-models"
    if (root / ".complete").exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    _, named = tree
    links = {
        BIG: big2_file,
        "checkpoints/sd15_unet.safetensors": named["unet"],
        "unet/flux_fp8.safetensors": named["flux"],
        "text_encoders/dit_small.sft": named["dit_small_sft"],
        "loras/sub/lora ü.safetensors": named["unicode_model"],
        "vae/model.safetensors": named["nested_model"],
    }
    for rel, target in links.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(target, root / rel)
    (root / "vae" / "readme.md").write_text("# vae\n")
    (root / "notes.txt").write_text("models folder\n" * 50)
    os.symlink("unet/flux_fp8.safetensors", root / "flux_link.safetensors")
    os.symlink("unet", root / "linked_unet")
    (root / ".complete").write_text("ok\n")
    return root


def model_files(root: Path) -> list[str]:
    """Model files of the tree (each once: symlinks left out), largest first."""
    rels = [str(p.relative_to(root)) for p in root.rglob("*")
            if p.suffix in (".safetensors", ".sft") and not p.is_symlink() and not p.parent.is_symlink()]
    return sorted(rels, key=lambda r: -(root / r).stat().st_size)


def data_bytes(path: Path) -> int:
    return sum(e - s for _, s, e in gen.tensor_ranges(path))


# ----------------------------------------------------------------------------- bit-exact checks

class SourceTensors:
    """One source file's header (the truth for dtype and shape) and raw tensor bytes, read
    from the source itself, not through the mount."""

    def __init__(self, path: Path):
        self.path = path
        n, header = gen.read_header(path)
        self.meta = {k: (v["dtype"], tuple(v["shape"]), 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
                     for k, v in header.items() if k != "__metadata__"}
        self.fd = os.open(path, os.O_RDONLY)

    def raw(self, name: str) -> np.ndarray:
        _, _, start, end = self.meta[name]
        return np.frombuffer(os.pread(self.fd, end - start, start), dtype=np.uint8)

    def close(self) -> None:
        os.close(self.fd)


class Checker:
    """Compares what a loader produced with the source, tensor by tensor; collects mismatches."""

    def __init__(self, src: SourceTensors, label: str, passes: int = 1):
        self.src, self.label, self.passes = src, label, passes
        self.seen: list[str] = []
        self.bad: list[str] = []

    def check(self, name: str, dtype: str, shape: tuple[int, ...], raw: np.ndarray) -> None:
        self.seen.append(name)
        want = self.src.meta.get(name)
        if want is None:
            self.bad.append(f"{self.label}: unknown tensor {name!r}")
        elif (dtype, tuple(shape)) != want[:2]:
            self.bad.append(f"{self.label}: {name}: {dtype}{tuple(shape)}, source {want[0]}{want[1]}")
        elif not np.array_equal(raw, self.src.raw(name)):
            self.bad.append(f"{self.label}: {name}: bytes differ from the source")

    def problems(self) -> list[str]:
        """Mismatches, plus tensors not loaded exactly once per pass."""
        counts = {name: self.seen.count(name) for name in set(self.seen) | set(self.src.meta)}
        off = sorted(n for n, c in counts.items() if c != self.passes)
        extra = [f"{self.label}: {len(off)} tensors not loaded {self.passes}x, e.g. "
                 f"{[(n, counts[n]) for n in off[:3]]}"] if off else []
        return self.bad + extra


def verify(root: Path, mnt: Path, rels: Iterable[str], load: Callable[[Path, Path], Loaded],
           label: str, passes: int = 1) -> list[str]:
    """Runs `load(mounted_path, source_path)` on every file and checks each tensor it yields
    (`passes` times each)."""
    problems = []
    for rel in rels:
        src = SourceTensors(root / rel)
        try:
            chk = Checker(src, f"{label} {rel}", passes)
            for name, dtype, shape, raw in load(mnt / rel, root / rel):
                chk.check(name, dtype, shape, raw)
            problems += chk.problems()
        finally:
            src.close()
    return problems


def assert_streamed(m: Mount, root: Path, rels: list[str], passes: int = 1, o_direct: bool = False) -> None:
    """The loader's bytes of the largest file came through the daemon, within a budget smaller
    than that file: every data byte of the files served in cache mode was read from disk by
    the daemon (files that fit are served by passthrough: the kernel reads those), and chunks
    were evicted. An `O_DIRECT` reader (`o_direct`) of the largest file is served exactly what
    it asks for, uncached (`disk.direct_bytes`, `ModelStore::read_direct`): read once, from
    disk, nothing evicted."""
    st = quiesce(m)
    budget = parse_size(BUDGET)
    big = data_bytes(root / rels[0])
    modes = {f["path"]: f["mode"] for f in st["files"]}
    assert modes.get(rels[0]) == "cache", modes
    total = sum(data_bytes(root / r) for r in rels if modes.get(r) == "cache")
    assert big > budget, f"the largest file ({big} B of data) must exceed the budget"
    assert st["cache"]["budget_bytes"] == budget, st["cache"]
    assert st["cache"]["used_bytes"] <= budget, st["cache"]
    assert st["disk"]["read_bytes"] >= total, (st["disk"], total)
    if o_direct:
        assert st["disk"]["direct_bytes"] >= passes * big - 8 * MiB, (st["disk"], big)
        assert st["disk"]["read_bytes"] <= passes * total + 16 * MiB, (st["disk"], total)
    else:
        assert st["cache"]["evicted_bytes"] >= passes * (big - budget) - 64 * MiB, st["cache"]
    listed = {f["path"] for f in st["files"]}
    assert set(rels) <= listed, f"not in stats.files: {set(rels) - listed}"
    assert st["disk"]["errors"] == 0, st["disk"]
    assert m.alive(), m.log_tail()


def run_loader(mount, models: Path, load: Callable[[Path, Path], Loaded], label: str,
               passes: int = 1, o_direct: bool = False) -> None:
    m = mount(models, BUDGET)
    rels = model_files(models)
    problems = verify(models, m.mnt, rels, load, label, passes)
    assert not problems, f"{len(problems)} problems: {problems[:10]}"
    assert_streamed(m, models, rels, passes, o_direct)


# ----------------------------------------------------------------------------- loaders

def _np_raw(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _np_dtype_name(a: np.ndarray) -> str:
    return next((k for k, (dt, _) in gen.DTYPES.items() if np.dtype(dt) == a.dtype), str(a.dtype))


def safe_open_numpy(order: str) -> Callable[[Path, Path], Loaded]:
    """Loader 1: safe_open(framework="numpy"), tensor by tensor in `order` ("header"/"model")."""
    def load(mnt_path: Path, src_path: Path) -> Loaded:
        names = [n for n, _, _ in (gen.tensor_ranges(src_path) if order == "header" else gen.model_order(src_path))]
        with safe_open(str(mnt_path), framework="numpy") as f:
            assert sorted(f.keys()) == sorted(names)
            for name in names:
                a = f.get_tensor(name)
                yield name, _np_dtype_name(a), a.shape, _np_raw(a)
    return load


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed (.ci/run installs it)")


def _torch_raw(t) -> np.ndarray:
    import torch
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def _torch_dtype_name(t) -> str:
    import torch
    names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float8_e4m3fn: "F8_E4M3"}
    return names.get(t.dtype, str(t.dtype))


def torch_load_file(mnt_path: Path, src_path: Path) -> Loaded:
    """Loader 2: safetensors.torch.load_file (the whole state dict at once)."""
    from safetensors.torch import load_file
    sd = load_file(str(mnt_path))
    for name, t in sd.items():
        yield name, _torch_dtype_name(t), tuple(t.shape), _torch_raw(t)


def aimdo_mmap(mnt_path: Path, src_path: Path) -> Loaded:
    """Loader 3: ModelMMAP + torch.frombuffer, each tensor's pages touched in model order."""
    mapping, tensors = gen.aimdo_tensors(mnt_path)
    try:
        for name, _, _ in gen.model_order(src_path):
            t = tensors[name]
            yield name, _torch_dtype_name(t), tuple(t.shape), _torch_raw(t).copy()
    finally:
        tensors.clear()
        del mapping


def dynamic_vram_reread(passes: int) -> Callable[[Path, Path], Loaded]:
    """Loader 4: per tensor, in model order, 2 MiB chunks read by 8 threads (all chunks of a
    tensor before the next tensor), `passes` times over the file."""
    def load(mnt_path: Path, src_path: Path) -> Loaded:
        order = gen.model_order(src_path)
        fd = os.open(mnt_path, os.O_RDONLY)
        try:
            with ThreadPoolExecutor(THREADS) as pool:
                for _ in range(passes):
                    for name, start, end in order:
                        buf = bytearray(end - start)
                        mv = memoryview(buf)
                        list(pool.map(lambda o: gen.aimdo_read_chunk(fd, mv[o:o + CHUNK], start + o),
                                      range(0, end - start, CHUNK)))
                        dtype, shape = SOURCE_META[src_path][name]
                        yield name, dtype, shape, np.frombuffer(buf, dtype=np.uint8)
        finally:
            os.close(fd)
    return load


class _SourceMeta(dict):
    """{source path: {name: (dtype, shape)}}, filled on first use: for readers of raw bytes,
    whose dtype and shape can only come from the header."""

    def __missing__(self, path: Path) -> dict:
        _, h = gen.read_header(path)
        self[path] = {k: (v["dtype"], tuple(v["shape"])) for k, v in h.items() if k != "__metadata__"}
        return self[path]


SOURCE_META = _SourceMeta()


def runai_streamer(mnt_path: Path, src_path: Path) -> Loaded:
    """Loader 5: runai-model-streamer's SafetensorsStreamer, default concurrency, to CPU."""
    from runai_model_streamer import SafetensorsStreamer
    with SafetensorsStreamer() as streamer:
        streamer.stream_file(str(mnt_path))
        for name, t in streamer.get_tensors():
            yield name, _torch_dtype_name(t), tuple(t.shape), _torch_raw(t).copy()


# ----------------------------------------------------------------------------- checks 1-5

def test_loader1_safe_open_numpy_header_and_model_order(mount, models):
    """safe_open(numpy) over the mount, in header order then in model order, bit-exact."""
    m = mount(models, BUDGET)
    rels = model_files(models)
    problems = verify(models, m.mnt, rels, safe_open_numpy("header"), "safe_open header order")
    problems += verify(models, m.mnt, rels, safe_open_numpy("model"), "safe_open model order")
    assert not problems, f"{len(problems)} problems: {problems[:10]}"
    assert_streamed(m, models, rels, passes=2)


def test_loader2_torch_load_file(mount, models):
    _torch()
    run_loader(mount, models, torch_load_file, "safetensors.torch.load_file")


def test_loader3_comfy_aimdo_model_mmap(mount, models):
    _torch()
    pytest.importorskip("comfy_aimdo.model_mmap", reason="comfy-aimdo is not installed (.ci/run installs it)")
    run_loader(mount, models, aimdo_mmap, "ModelMMAP")


def test_loader4_dynamic_vram_reread(mount, models):
    run_loader(mount, models, dynamic_vram_reread(passes=2), "8x2MiB pread+DONTNEED", passes=2)


def test_loader5_runai_streamer(mount, models):
    _torch()
    pytest.importorskip("runai_model_streamer", reason="runai-model-streamer is not installed (.ci/run installs it)")
    run_loader(mount, models, runai_streamer, "SafetensorsStreamer", o_direct=True)


# ----------------------------------------------------------------------------- check 6: discovery

def header_exact(path: str) -> bytes | None:
    """A header read of exactly the header: `pread` of the 8-byte length, then of the JSON
    (as the safetensors crate and most native readers do); nothing past it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, 8, 0)
        (n,) = struct.unpack("<Q", head)
        return head + os.pread(fd, n, 8) if n <= HEADER_MAX else None
    finally:
        os.close(fd)


def header_comfyui(path: str) -> bytes | None:
    """ComfyUI's `comfy.utils.safetensors_header`: Python's buffered `open(path, "rb")`,
    `read(8)`, `read(n)`.  The buffered reader fills whole buffers, so its last read() goes up to
    a buffer (4 KiB here) past the end of the header, into the first tensor's bytes."""
    with open(path, "rb") as f:
        head = f.read(8)
        (n,) = struct.unpack("<Q", head)
        return head + f.read(n) if n <= HEADER_MAX else None


def discover(root: Path, read_header: Callable[[str], bytes | None]) -> dict[str, tuple]:
    """ComfyUI-style discovery: os.walk(followlinks=True), getsize/getmtime of every directory
    and file, the header of every model file.  {relative path: (kind, size, mtime, header)}."""
    out: dict[str, tuple] = {}
    for dirpath, _dirnames, filenames in os.walk(root, followlinks=True):
        rel_dir = os.path.relpath(dirpath, root)
        out[rel_dir] = ("dir", os.path.getsize(dirpath), os.path.getmtime(dirpath), None)
        for name in filenames:
            p = os.path.join(dirpath, name)
            header = read_header(p) if name.endswith((".safetensors", ".sft")) else None
            out[os.path.normpath(os.path.join(rel_dir, name))] = (
                "file", os.path.getsize(p), os.path.getmtime(p), header)
    return out


def without_control_dir(entries: dict[str, tuple]) -> dict[str, tuple]:
    return {k: v for k, v in entries.items() if k != ".tierfs" and not k.startswith(".tierfs/")}


def daemon_disk_read_bytes(pid: int) -> int:
    """Bytes the daemon caused to be read from a block device (/proc/PID/io read_bytes)."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def fill_cache(m: Mount, rel: str) -> dict:
    """Reads `rel` through the mount (more than the budget): the cache ends up full of its data."""
    with open(m.mnt / rel, "rb", buffering=0) as f:
        while f.read(4 * MiB):
            pass
    return quiesce(m)


# What a discovery pass must leave untouched when the cache is full: no read of model data from
# disk, no prefetch, no eviction (headers are held apart from the cache, never evicted).
UNTOUCHED = (("disk", "read_bytes"), ("disk", "reads"), ("prefetch", "issued_bytes"),
             ("cache", "evicted_bytes"), ("cache", "used_bytes"), ("cache", "misses"))


def check_discovery(mount, models: Path, read_header: Callable[[str], bytes | None]) -> None:
    """Discovery through the mount sees exactly what it sees on the source (names, sizes, mtimes,
    header bytes), on a cold mount; then, with the tierfs cache full of other data and the
    kernel's caches dropped, it changes none of UNTOUCHED."""
    want = discover(models, read_header)
    n_headers = sum(1 for v in want.values() if v[3] is not None)
    assert n_headers >= 8  # model files, symlinked ones included
    m = mount(models, BUDGET)

    drop_caches()
    t0 = time.perf_counter()
    cold = without_control_dir(discover(m.mnt, read_header))
    t_cold = time.perf_counter() - t0
    assert cold == want, sorted(set(cold.items()) ^ set(want.items()))[:6]

    before = fill_cache(m, BIG)
    assert before["cache"]["used_bytes"] >= parse_size(BUDGET) - 8 * MiB, before["cache"]  # full
    drop_caches()
    io0 = daemon_disk_read_bytes(m.pid)
    t0 = time.perf_counter()
    again = without_control_dir(discover(m.mnt, read_header))
    t_full = time.perf_counter() - t0
    io1 = daemon_disk_read_bytes(m.pid)
    after = quiesce(m)
    changed = {f"{a}.{b}": after[a][b] - before[a][b] for a, b in UNTOUCHED if after[a][b] != before[a][b]}
    print(f"\ndiscovery ({read_header.__name__}): {len(want)} entries, {n_headers} headers; cold mount "
          f"{t_cold * 1e3:.0f} ms; full cache, kernel caches dropped {t_full * 1e3:.0f} ms, daemon block "
          f"reads {io1 - io0} B, changed {changed or 'nothing'}")
    assert again == want
    assert not changed, f"discovery with a full cache changed {changed}"
    # Re-reading a header costs the daemon a 256 KiB probe read of the source; what a pass over
    # known files may read is the source's metadata (directories, inodes), far less than that.
    assert io1 - io0 < n_headers * HEADER_PROBE // 2, f"daemon read {io1 - io0} B from disk during discovery"
    assert m.alive()


def test_discovery_exact_header_reads(mount, models):
    check_discovery(mount, models, header_exact)


def test_discovery_comfyui_header_reads(mount, models):
    check_discovery(mount, models, header_comfyui)


# ----------------------------------------------------------------------------- GGUF and shards
#
# GGUF: gguf-py's GGUFReader (np.memmap of the file, a view per tensor) reading every tensor, and
# ComfyUI-GGUF's loader (`loader.py: gguf_sd_loader`).  ComfyUI-GGUF is a ComfyUI custom-node
# repository, not a package: its loader imports ComfyUI's `comfy` modules, so it cannot be
# installed here; `comfy_gguf_sd_loader` below makes the same calls it makes (GGUFReader, the
# architecture check, `torch.from_numpy(tensor.data)` on the memory map, `.view(*shape)` for
# F32/F16), then touches each tensor in model order as ComfyUI does when it moves a layer to the
# GPU (a copy of its bytes).  Tensor bytes are compared with the source's, read with pread at the
# offsets gguf-py finds in the *source* file.
#
# Shards: a diffusers-style checkpoint of three `.safetensors` shards plus its index.json, read
# with safe_open shard by shard in index order, and across shards in block order.

import json  # noqa: E402

import gguf  # noqa: E402  (.ci/run installs it)

import gen_gguf  # noqa: E402

GGUF_BUDGET = "128MiB"        # < each model's data: every loader streams through evictions


@pytest.fixture(scope="module")
def gguf_models(data_dir) -> Path:
    """unet/flux.gguf (Flux-shaped, ~300 MiB: Q8_0/Q4_K/Q5_K/F16/F32) and
    text_encoders/llama.gguf (llama-shaped, ~150 MiB: Q4_K/Q6_K/F32, a vocabulary in the header),
    and diffusion_models/sharded/ (a Wan-style DiT of ~300 MiB in three shards + index.json)."""
    root = data_dir / "gguf-models"
    gen_gguf.make_dit_gguf(root / "unet" / "flux.gguf", dim=1536, n_double=4, n_single=6)
    gen_gguf.make_llama_gguf(root / "text_encoders" / "llama.gguf", dim=2048, ffn=5632, n_blocks=6,
                             vocab=16384)
    gen_gguf.make_sharded(root / "diffusion_models" / "sharded", "diffusion_pytorch_model",
                          gen.dit_specs(1536, 4096, 10), 3, seed=41)
    return root


GGUF_RELS = ("unet/flux.gguf", "text_encoders/llama.gguf")


class GgufSource:
    """A source GGUF's tensors as gguf-py reads them from the source file, and their raw bytes."""

    def __init__(self, path: Path):
        self.meta = {n: (ty, dims, s, e) for n, ty, dims, s, e in gen_gguf.gguf_tensors(path)}
        self.fd = os.open(path, os.O_RDONLY)

    def check(self, name: str, ty: str, dims: tuple[int, ...], raw: np.ndarray) -> str | None:
        want = self.meta.get(name)
        if want is None:
            return f"unknown tensor {name}"
        if (ty, tuple(dims)) != want[:2]:
            return f"{name}: {ty}{dims}, source {want[0]}{want[1]}"
        if not np.array_equal(raw, np.frombuffer(os.pread(self.fd, want[3] - want[2], want[2]), np.uint8)):
            return f"{name}: bytes differ from the source"
        return None

    def close(self) -> None:
        os.close(self.fd)


def gguf_reader_all(mnt_path: Path, _src: Path):
    """gguf-py's GGUFReader over the mount: every tensor's data view, in file order."""
    r = gguf.GGUFReader(str(mnt_path))
    for t in r.tensors:
        yield t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), _np_raw(np.asarray(t.data)).copy()


IMG_ARCHS = {"flux", "sd1", "sdxl", "sd3", "aura", "hidream", "cosmos", "ltxv", "hyvid", "wan", "lumina2", "qwen_image"}
TXT_ARCHS = {"t5", "t5encoder", "llama", "qwen2vl", "qwen3", "qwen3vl"}


def comfy_gguf_sd_loader(mnt_path: Path, src: Path):
    """ComfyUI-GGUF's `gguf_sd_loader`, its calls replicated (see the section comment), then
    each tensor's bytes copied in model order."""
    import torch
    import warnings
    reader = gguf.GGUFReader(str(mnt_path))
    field = reader.get_field("general.architecture")
    assert field is not None and field.types == [gguf.GGUFValueType.STRING]
    arch = str(field.parts[field.data[-1]], encoding="utf-8")
    assert arch in IMG_ARCHS | TXT_ARCHS, arch
    state_dict = {}
    for tensor in reader.tensors:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(tensor.data)  # the memory map, no copy
        shape = torch.Size(tuple(int(v) for v in reversed(tensor.shape)))
        if tensor.tensor_type in {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16}:
            t = t.view(*shape)
        state_dict[tensor.name] = (t, tensor)
    for name, *_ in gen_gguf.gguf_model_order(src):
        t, tensor = state_dict[name]
        copy = t.clone()  # what `.to(device)` reads when ComfyUI loads the layer
        yield name, tensor.tensor_type.name, tuple(int(d) for d in tensor.shape), _torch_raw(copy)


def run_gguf_loader(mount, root: Path, load, label: str) -> None:
    m = mount(root, GGUF_BUDGET)
    problems, data = [], 0
    for rel in GGUF_RELS:
        src = GgufSource(root / rel)
        try:
            seen = []
            for name, ty, dims, raw in load(m.mnt / rel, root / rel):
                seen.append(name)
                if (p := src.check(name, ty, dims, raw)) is not None:
                    problems.append(f"{label} {rel}: {p}")
            if sorted(seen) != sorted(src.meta):
                problems.append(f"{label} {rel}: loaded {len(seen)} tensors, source has {len(src.meta)}")
            data += sum(e - s for _, _, s, e in src.meta.values())
        finally:
            src.close()
    assert not problems, f"{len(problems)} problems: {problems[:8]}"
    st = quiesce(m)
    budget = parse_size(GGUF_BUDGET)
    files = {f["path"]: f for f in st["files"]}
    for rel in GGUF_RELS:
        f = files.get(rel)
        assert f and not f["malformed"] and f["tensors"] > 0 and f["blocks"] > 1, f
    assert st["cache"]["used_bytes"] <= budget, st["cache"]
    assert st["disk"]["read_bytes"] >= data, (st["disk"], data)
    assert st["cache"]["evicted_bytes"] > 0, st["cache"]
    assert st["disk"]["errors"] == 0 and m.alive(), m.log_tail()


@pytest.mark.timeout(300)
def test_gguf_loader_gguf_py_reader(mount, gguf_models):
    run_gguf_loader(mount, gguf_models, gguf_reader_all, "GGUFReader")


@pytest.mark.timeout(300)
def test_gguf_loader_comfyui_gguf(mount, gguf_models):
    _torch()
    run_gguf_loader(mount, gguf_models, comfy_gguf_sd_loader, "ComfyUI-GGUF gguf_sd_loader")


def shard_index(root: Path) -> tuple[Path, dict[str, str]]:
    index = root / "diffusion_models" / "sharded" / "diffusion_pytorch_model.safetensors.index.json"
    return index.parent, json.loads(index.read_text())["weight_map"]


@pytest.mark.timeout(300)
def test_sharded_safe_open_index_order_and_block_order(mount, gguf_models):
    """safe_open(numpy) over a sharded model through the mount: shard by shard in index order,
    then across all shards in block order (every shard open at once), bit-exact."""
    shard_dir, weight_map = shard_index(gguf_models)
    # `tierfs inspect` takes the index.json: the three shards as one model, blocks over all.
    import subprocess
    from conftest import TIERFS_BIN
    doc = json.loads(subprocess.run(
        [str(TIERFS_BIN), "inspect", "--json", str(shard_dir / "diffusion_pytorch_model.safetensors.index.json")],
        capture_output=True, text=True, timeout=30, check=True).stdout)
    assert [s["file"] for s in doc["shards"]] == sorted(set(weight_map.values())), doc["shards"]
    assert sum(s["tensors"] for s in doc["shards"]) == len(weight_map)
    assert [b["name"] for b in doc["blocks"]] == ["(other)"] + [f"blocks.{i}" for i in range(10)]
    m = mount(gguf_models, GGUF_BUDGET)
    mnt_dir = m.mnt / shard_dir.relative_to(gguf_models)
    shards = sorted(set(weight_map.values()))
    assert len(shards) == 3, shards
    srcs = {s: SourceTensors(shard_dir / s) for s in shards}
    problems = []
    try:
        # 1. index order: each shard in turn, its tensors in weight_map order.
        for shard in shards:
            chk = Checker(srcs[shard], f"index order {shard}")
            with safe_open(str(mnt_dir / shard), framework="numpy") as f:
                for name in (n for n, s in weight_map.items() if s == shard):
                    a = f.get_tensor(name)
                    chk.check(name, _np_dtype_name(a), a.shape, _np_raw(a))
            problems += chk.problems()
        # 2. block order across shards.
        handles = {s: safe_open(str(mnt_dir / s), framework="numpy") for s in shards}
        order = sorted(weight_map, key=lambda n: (gen.block_of(n)[0], shards.index(weight_map[n]),
                                                  srcs[weight_map[n]].meta[n][2]))
        chks = {s: Checker(srcs[s], f"block order {s}") for s in shards}
        for name in order:
            a = handles[weight_map[name]].get_tensor(name)
            chks[weight_map[name]].check(name, _np_dtype_name(a), a.shape, _np_raw(a))
        problems += [p for c in chks.values() for p in c.problems()]
    finally:
        for s in srcs.values():
            s.close()
    assert not problems, f"{len(problems)} problems: {problems[:8]}"
    st = quiesce(m)
    total = sum(data_bytes(shard_dir / s) for s in shards)
    assert st["cache"]["used_bytes"] <= parse_size(GGUF_BUDGET), st["cache"]
    assert st["disk"]["read_bytes"] >= total and st["cache"]["evicted_bytes"] > 0, (st["disk"], st["cache"])
    assert m.alive(), m.log_tail()
