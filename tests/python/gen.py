"""Synthetic checkpoint generators for the tierfs end-to-end tests and benchmark.

Three model "shapes" with realistic tensor names and mixed dtypes:

* DiT  (Wan-style): ``patch_embedding.weight``, ``blocks.N.self_attn.q.weight``, ...,
  ``head.head.weight``
* UNet (SD-style):  ``model.diffusion_model.input_blocks.N...``
* Flux:             ``double_blocks.N...``, ``single_blocks.N...``, scaled-fp8 weights,
  a 0-d scale and a zero-element tensor.

Small files are written with ``safetensors.numpy.save_file``; large ones with
:func:`write_streaming`, which emits the same format tensor by tensor so memory
stays bounded (one tensor at a time).  Tensor bytes are random (seeded), which
is fine: every test compares bytes, never values.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import shutil
import struct
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np

# safetensors' numpy backend looks dtypes up on the numpy module; fp8 lives in ml_dtypes.
if not hasattr(np, "float8_e4m3fn"):
    np.float8_e4m3fn = ml_dtypes.float8_e4m3fn  # type: ignore[attr-defined]
if not hasattr(np, "bfloat16"):
    np.bfloat16 = ml_dtypes.bfloat16  # type: ignore[attr-defined]

from safetensors.numpy import save_file  # noqa: E402

DTYPES = {
    "BF16": (ml_dtypes.bfloat16, 2),
    "F16": (np.float16, 2),
    "F32": (np.float32, 4),
    "F8_E4M3": (ml_dtypes.float8_e4m3fn, 1),
}

Spec = tuple[str, str, tuple[int, ...]]  # (name, safetensors dtype, shape)


def nbytes(spec: Spec) -> int:
    _, dt, shape = spec
    return math.prod(shape) * DTYPES[dt][1]


def dit_specs(dim: int, ffn: int, n_blocks: int, weight_dtypes=("BF16",)) -> list[Spec]:
    """Wan-style DiT: block N's big weights use weight_dtypes[N % len]."""
    s: list[Spec] = [
        ("patch_embedding.weight", "BF16", (dim, 16, 1, 2, 2)),
        ("patch_embedding.bias", "F32", (dim,)),
        ("text_embedding.0.weight", "BF16", (dim, 512)),
        ("text_embedding.0.bias", "F32", (dim,)),
        ("time_embedding.0.weight", "F32", (dim, 256)),
        ("time_projection.1.weight", "BF16", (dim * 6, dim // 8)),
    ]
    for n in range(n_blocks):
        wd = weight_dtypes[n % len(weight_dtypes)]
        p = f"blocks.{n}"
        s.append((f"{p}.modulation", "F32", (1, 6, dim)))
        for att in ("self_attn", "cross_attn"):
            for proj in ("q", "k", "v", "o"):
                s.append((f"{p}.{att}.{proj}.weight", wd, (dim, dim)))
                s.append((f"{p}.{att}.{proj}.bias", "BF16", (dim,)))
            s.append((f"{p}.{att}.norm_q.weight", "F32", (dim,)))
            s.append((f"{p}.{att}.norm_k.weight", "F32", (dim,)))
        s.append((f"{p}.norm3.weight", "F16", (dim,)))
        s.append((f"{p}.norm3.bias", "F16", (dim,)))
        s.append((f"{p}.ffn.0.weight", wd, (ffn, dim)))
        s.append((f"{p}.ffn.0.bias", "BF16", (ffn,)))
        s.append((f"{p}.ffn.2.weight", wd, (dim, ffn)))
        s.append((f"{p}.ffn.2.bias", "BF16", (dim,)))
    s += [
        ("head.modulation", "F32", (1, 2, dim)),
        ("head.head.weight", "BF16", (64, dim)),
        ("head.head.bias", "F32", (64,)),
    ]
    return s


def unet_specs(ch: int = 320, levels: int = 3) -> list[Spec]:
    """SD-style UNet with a VAE and text-encoder prefix (mixed fp16 / fp32)."""
    m = "model.diffusion_model"
    s: list[Spec] = [(f"{m}.time_embed.0.weight", "F32", (ch * 4, ch))]
    s.append((f"{m}.input_blocks.0.0.weight", "F16", (ch, 4, 3, 3)))
    for i in range(1, levels * 3 + 1):
        c = ch * (1 + (i - 1) // 3)
        s += [
            (f"{m}.input_blocks.{i}.0.in_layers.2.weight", "F16", (c, c, 3, 3)),
            (f"{m}.input_blocks.{i}.0.in_layers.2.bias", "F16", (c,)),
            (f"{m}.input_blocks.{i}.1.proj_in.weight", "F16", (c, c)),
            (f"{m}.input_blocks.{i}.1.transformer_blocks.0.attn1.to_q.weight", "F16", (c, c)),
            (f"{m}.input_blocks.{i}.1.transformer_blocks.0.attn1.to_k.weight", "F16", (c, c)),
            (f"{m}.input_blocks.{i}.1.transformer_blocks.0.norm1.weight", "F32", (c,)),
        ]
    s += [
        (f"{m}.middle_block.1.transformer_blocks.0.attn2.to_v.weight", "F16", (ch * 3, 768)),
        (f"{m}.middle_block.0.emb_layers.1.weight", "F32", (ch * 3, ch * 4)),
    ]
    for i in range(levels * 3):
        s.append((f"{m}.output_blocks.{i}.0.out_layers.3.weight", "F16", (ch, ch, 3, 3)))
    s += [
        (f"{m}.out.2.weight", "F32", (4, ch, 3, 3)),
        ("first_stage_model.decoder.conv_in.weight", "F32", (512, 4, 3, 3)),
        ("first_stage_model.encoder.down.0.block.0.conv1.weight", "F16", (128, 128, 3, 3)),
        ("cond_stage_model.transformer.text_model.embeddings.token_embedding.weight", "F16", (4096, 768)),
        ("cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight", "F16", (768, 768)),
    ]
    return s


def checkpoint_specs(scale: int = 1) -> list[Spec]:
    """An SD1.5-shaped all-in-one checkpoint (about 1.37 GB; channels divided by `scale`): a
    CLIP-L text encoder (`cond_stage_model`, fp16), a VAE (`first_stage_model`, fp32) and a UNet
    (`model.diffusion_model`, fp16) in one file, tensors in name order as writers store them:
    file order and a loader's module order (gen.model_order) disagree across the three models."""
    c, v, m = "cond_stage_model.transformer.text_model", "first_stage_model", "model.diffusion_model"
    w = 768 // scale
    s: list[Spec] = [(f"{c}.embeddings.token_embedding.weight", "F16", (49408 // scale, w))]
    for i in range(12):
        p = f"{c}.encoder.layers.{i}"
        s += [(f"{p}.self_attn.{n}.weight", "F16", (w, w)) for n in ("q_proj", "k_proj", "v_proj", "out_proj")]
        s += [(f"{p}.mlp.fc1.weight", "F16", (4 * w, w)), (f"{p}.mlp.fc2.weight", "F16", (w, 4 * w))]
    for part in ("encoder.down", "decoder.up"):
        for i, ch in enumerate((128 // scale, 256 // scale, 512 // scale, 512 // scale)):
            s += [(f"{v}.{part}.{i}.block.{j}.conv{k}.weight", "F32", (ch, ch, 3, 3)) for j in (0, 1) for k in (1, 2)]
    chans = [320 // scale] * 4 + [640 // scale] * 4 + [1280 // scale] * 4
    for i, ch in enumerate(chans):
        p = f"{m}.input_blocks.{i}"
        s += [(f"{p}.0.in_layers.2.weight", "F16", (ch, ch, 3, 3)),
              (f"{p}.1.transformer_blocks.0.attn1.to_q.weight", "F16", (ch, ch)),
              (f"{p}.1.transformer_blocks.0.ff.net.0.proj.weight", "F16", (8 * ch, ch)),
              (f"{p}.1.transformer_blocks.0.ff.net.2.weight", "F16", (ch, 4 * ch))]
    top = 1280 // scale
    s += [(f"{m}.middle_block.0.in_layers.2.weight", "F16", (top, top, 3, 3)),
          (f"{m}.middle_block.1.transformer_blocks.0.ff.net.0.proj.weight", "F16", (8 * top, top))]
    for i, ch in enumerate(reversed(chans)):
        p = f"{m}.output_blocks.{i}"
        s += [(f"{p}.0.in_layers.2.weight", "F16", (ch, 2 * ch, 3, 3)),
              (f"{p}.1.transformer_blocks.0.ff.net.0.proj.weight", "F16", (8 * ch, ch)),
              (f"{p}.1.transformer_blocks.0.ff.net.2.weight", "F16", (ch, 4 * ch))]
    return sorted(s)


def sd15_full_specs(scale: int = 1) -> list[Spec]:
    """:func:`checkpoint_specs` with the tensors of each model that belong to no block, as a real
    SD1.5 checkpoint has them: the UNet's `time_embed` and `out`, the VAE's convolutions around
    its stages, its `mid` stages and `quant_conv`s, the text encoder's position embedding, final
    norm and `logit_scale`. In name order."""
    c, v, m = "cond_stage_model.transformer.text_model", "first_stage_model", "model.diffusion_model"
    w, ch, top = 768 // scale, 128 // scale, 512 // scale
    base, t = 320 // scale, 1280 // scale
    s = checkpoint_specs(scale)
    s += [("cond_stage_model.logit_scale", "F16", ()),
          (f"{c}.embeddings.position_embedding.weight", "F16", (77, w)),
          (f"{c}.final_layer_norm.weight", "F16", (w,)), (f"{c}.final_layer_norm.bias", "F16", (w,))]
    for part in ("encoder", "decoder"):
        s += [(f"{v}.{part}.conv_in.weight", "F32", (ch if part == "encoder" else top, 3 if part == "encoder" else 4, 3, 3)),
              (f"{v}.{part}.conv_out.weight", "F32", (8 if part == "encoder" else 3, ch, 3, 3)),
              (f"{v}.{part}.norm_out.weight", "F32", (ch,))]
        for blk in ("block_1", "block_2"):
            s += [(f"{v}.{part}.mid.{blk}.conv{k}.weight", "F32", (top, top, 3, 3)) for k in (1, 2)]
        s += [(f"{v}.{part}.mid.attn_1.{n}.weight", "F32", (top, top, 1, 1)) for n in ("q", "k", "v", "proj_out")]
    s += [(f"{v}.quant_conv.weight", "F32", (8, 8, 1, 1)), (f"{v}.post_quant_conv.weight", "F32", (4, 4, 1, 1))]
    s += [(f"{m}.time_embed.0.weight", "F16", (t, base)), (f"{m}.time_embed.2.weight", "F16", (t, t)),
          (f"{m}.input_blocks.0.0.weight", "F16", (base, 4, 3, 3)),
          (f"{m}.out.0.weight", "F16", (base,)), (f"{m}.out.2.weight", "F16", (4, base, 3, 3))]
    return sorted(s)


_CHECKPOINT_RANK = {"model.diffusion_model.": 0, "first_stage_model.": 1, "cond_stage_model.": 2}

# The order of a UNet's modules, which `load_state_dict` follows, by the name after its prefix.
_UNET_MODULES = ("time_embed", "input_blocks", "middle_block", "output_blocks", "out")


def checkpoint_order(path: Path) -> list[tuple[str, int, int]]:
    """[(name, abs_start, abs_end)] of an all-in-one checkpoint in the order ComfyUI's
    `load_checkpoint_guess_config` copies them: the UNet (`time_embed` first, then its blocks,
    `out` last), then the VAE (its encoder before its decoder), then the text encoder, each in
    its modules' order (numbers compared as numbers)."""
    def key(t: tuple[str, int, int]) -> tuple:
        name = t[0]
        rank = next((r for prefix, r in _CHECKPOINT_RANK.items() if name.startswith(prefix)), 3)
        part = 1 if ".decoder." in name else 0
        segments = name.split(".")
        unet_module = segments[2] if rank == 0 and len(segments) > 2 else ""
        module = _UNET_MODULES.index(unet_module) if unet_module in _UNET_MODULES else 0
        natural = tuple((0, int(x)) if x.isdigit() else (1, x) for x in re.split(r"(\d+)", name) if x)
        return rank, part, module, natural
    return sorted(tensor_ranges(path), key=key)


def flux_specs(dim: int = 512, n_double: int = 3, n_single: int = 4) -> list[Spec]:
    """Flux-style, with scaled-fp8 MLP weights, 0-d scales and a zero-element tensor."""
    s: list[Spec] = [
        ("img_in.weight", "BF16", (dim, 64)),
        ("img_in.bias", "BF16", (dim,)),
        ("time_in.in_layer.weight", "BF16", (dim, 256)),
        ("guidance_in.in_layer.weight", "BF16", (dim, 256)),
        ("guidance_in.unused", "F32", (0,)),
        ("txt_in.weight", "BF16", (dim, 4096)),
    ]
    for n in range(n_double):
        p = f"double_blocks.{n}"
        for side in ("img", "txt"):
            s += [
                (f"{p}.{side}_attn.qkv.weight", "BF16", (dim * 3, dim)),
                (f"{p}.{side}_attn.norm.query_norm.scale", "F32", (dim // 8,)),
                (f"{p}.{side}_mlp.0.weight", "F8_E4M3", (dim * 4, dim)),
                (f"{p}.{side}_mlp.0.scale_weight", "F32", ()),
                (f"{p}.{side}_mlp.2.weight", "F8_E4M3", (dim, dim * 4)),
                (f"{p}.{side}_mod.lin.weight", "BF16", (dim * 6, dim)),
            ]
    for n in range(n_single):
        p = f"single_blocks.{n}"
        s += [
            (f"{p}.linear1.weight", "F8_E4M3", (dim * 7, dim)),
            (f"{p}.linear1.scale_weight", "F32", ()),
            (f"{p}.linear2.weight", "BF16", (dim, dim * 5)),
            (f"{p}.norm.key_norm.scale", "F16", (dim // 8,)),
        ]
    s += [
        ("final_layer.linear.weight", "BF16", (64, dim)),
        ("final_layer.adaLN_modulation.1.weight", "BF16", (dim * 2, dim)),
    ]
    return s


def random_array(rng: np.random.Generator, spec: Spec) -> np.ndarray:
    _, dt, shape = spec
    raw = np.frombuffer(rng.bytes(nbytes(spec)), dtype=np.uint8)
    return raw.view(DTYPES[dt][0]).reshape(shape)


def write_small(path: Path, specs: list[Spec], seed: int) -> None:
    """Write with the reference writer, safetensors.numpy.save_file."""
    rng = np.random.default_rng(seed)
    tensors = {spec[0]: random_array(rng, spec) for spec in specs}
    tmp = path.with_name(path.name + ".part")
    save_file(tensors, str(tmp), metadata={"format": "pt", "generator": "tierfs-tests"})
    os.replace(tmp, path)


def write_streaming(path: Path, specs: list[Spec], seed: int, chunk: int = 64 << 20) -> None:
    """Write a safetensors file tensor by tensor (bounded memory), header in `specs` order."""
    header: dict = {"__metadata__": {"format": "pt", "generator": "tierfs-tests-stream"}}
    off = 0
    for spec in specs:
        n = nbytes(spec)
        header[spec[0]] = {"dtype": spec[1], "shape": list(spec[2]), "data_offsets": [off, off + n]}
        off += n
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    rng = np.random.default_rng(seed)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for spec in specs:
            left = nbytes(spec)
            while left:
                k = min(left, chunk)
                f.write(rng.bytes(k))
                left -= k
    os.replace(tmp, path)


def big_dit_specs(target_bytes: int) -> list[Spec]:
    """A DiT (dim 1536, ffn 8960; bf16 blocks with some fp16 / fp8) of at least target_bytes."""
    dim, ffn = 1536, 8960
    dts = ("BF16", "BF16", "F16", "F8_E4M3")
    n = 1
    while sum(map(nbytes, dit_specs(dim, ffn, n, dts))) < target_bytes:
        n += 1
    return dit_specs(dim, ffn, n, dts)


def make_big_dit(path: Path, target_bytes: int, seed: int = 7, sort_names: bool = False) -> Path:
    """Write (once) :func:`big_dit_specs`; `sort_names` lays tensors out in name order, as real
    writers do (``blocks.0, blocks.1, blocks.10, ...``), so file order is not model order."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        specs = big_dit_specs(target_bytes)
        write_streaming(path, sorted(specs, key=lambda s: s[0]) if sort_names else specs, seed)
    return path


def read_header(path: Path) -> tuple[int, dict]:
    """(header length n, header dict in file order) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n), object_pairs_hook=dict)


def tensor_ranges(path: Path) -> list[tuple[str, int, int]]:
    """[(name, abs_start, abs_end)] sorted by offset."""
    n, h = read_header(path)
    out = [(k, 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
           for k, v in h.items() if k != "__metadata__"]
    return sorted(out, key=lambda t: (t[1], t[2]))


def make_tree(root: Path, big: Path | None) -> dict[str, Path]:
    """The mirrored source tree.  Returns named paths of interest.

    Layout (symlinks are presented by tierfs as what they point to):
      dit_big.safetensors        (hard copy-free: a *hard link* to `big` if given)
      unet.safetensors, flux.safetensors, dit_small.sft
      nested/model.safetensors, nested/deeper/readme.md
      "my model ü – v2.safetensors", "héllo wörld.txt"
      notes.txt (0640), run.sh (0755), blob.bin (5 MiB + 123), empty.txt, old.txt (mtime 2001)
      link_file -> notes.txt, link_model -> unet.safetensors, link_dir -> nested
    """
    done = root / ".complete"
    paths = {
        "unet": root / "unet.safetensors",
        "flux": root / "flux.safetensors",
        "dit_small_sft": root / "dit_small.sft",
        "nested_model": root / "nested" / "model.safetensors",
        "unicode_model": root / "my model ü – v2.safetensors",
    }
    if big is not None:
        paths["big"] = root / "dit_big.safetensors"
    if done.exists():
        return paths
    if root.exists():
        shutil.rmtree(root)
    (root / "nested" / "deeper").mkdir(parents=True)
    if big is not None:
        os.link(big, paths["big"])
    write_small(paths["unet"], unet_specs(), seed=11)
    write_small(paths["flux"], flux_specs(), seed=12)
    write_small(paths["dit_small_sft"], dit_specs(256, 1024, 3, ("BF16", "F8_E4M3", "F32")), seed=13)
    write_small(paths["nested_model"], dit_specs(128, 512, 2, ("F16",)), seed=14)
    write_small(paths["unicode_model"], dit_specs(192, 384, 2, ("BF16",)), seed=15)
    (root / "notes.txt").write_text("tierfs test tree\n" * 100)
    os.chmod(root / "notes.txt", 0o640)
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "blob.bin").write_bytes(np.random.default_rng(16).bytes((5 << 20) + 123))
    (root / "empty.txt").write_bytes(b"")
    (root / "old.txt").write_text("old\n")
    os.utime(root / "old.txt", ns=(978_307_200_123_456_789, 978_307_200_123_456_789))
    (root / "héllo wörld.txt").write_text("unicode name ✓\n")
    (root / "nested" / "deeper" / "readme.md").write_text("# deep\n")
    os.symlink("notes.txt", root / "link_file")
    os.symlink("unet.safetensors", root / "link_model")
    os.symlink("nested", root / "link_dir")
    done.write_text("ok\n")
    return paths


def sorted_dit_specs(dim: int = 768, ffn: int = 3072, n_blocks: int = 40) -> list[Spec]:
    """A bf16 DiT laid out in *name* order, as writers sort it: ``blocks.0, blocks.1, blocks.10,
    ..., blocks.19, blocks.2, ...`` then ``head.*``, ``patch_embedding.*``, ..., so file order
    differs from the numeric (model) order of the blocks."""
    return sorted(dit_specs(dim, ffn, n_blocks, ("BF16",)), key=lambda s: s[0])


def make_sorted_dit(path: Path, dim: int = 768, ffn: int = 3072, n_blocks: int = 40, seed: int = 21) -> Path:
    """Write (once) a name-sorted DiT; with the defaults 40 blocks of ~18 MiB, ~720 MiB in all."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_streaming(path, sorted_dit_specs(dim, ffn, n_blocks), seed)
    return path


# ----------------------------------------------------------------------------- model order

# The outermost block of a tensor name, by family: UNet levels first (a UNet's input blocks hold
# `transformer_blocks.N` of their own), then Flux / DiT / text-encoder blocks.
_UNET_RE = re.compile(r"(?:^|\.)(?:(input_blocks|output_blocks)\.(\d+)|(middle_block))(?:\.|$)")
_BLOCK_RE = re.compile(r"(?:^|\.)(double_blocks|single_transformer_blocks|single_blocks|transformer_blocks"
                       r"|blocks|layers|h)\.(\d+)(?:\.|$)")
_FAMILY_RANK = {"input_blocks": 0, "middle_block": 1, "output_blocks": 2, "double_blocks": 0,
                "transformer_blocks": 0, "blocks": 0, "single_blocks": 1, "single_transformer_blocks": 1,
                "layers": 2, "h": 2}


def block_of(name: str) -> tuple[tuple, str]:
    """(sort key, label) of the block a tensor belongs to; ``(0,), "(other)"`` for none."""
    m = _UNET_RE.search(name) or _BLOCK_RE.search(name)
    if not m:
        return (0,), "(other)"
    family, num = m.group(1) or "middle_block", int(m.group(2) or 0)
    end = m.end(2) if m.group(2) else m.end(m.lastindex)
    return (1, _FAMILY_RANK[family], num), name[:end].lstrip(".")


def model_order(path: Path) -> list[tuple[str, int, int]]:
    """[(name, abs_start, abs_end)] in model (block) order: the file's ``(other)`` tensors first,
    then block by block (numeric; UNet input -> middle -> output; Flux double -> single), each
    block's tensors in file order.  What a loader walking the model's modules touches."""
    return sorted(tensor_ranges(path), key=lambda t: (block_of(t[0])[0], t[1]))


_TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F8_E4M3": "float8_e4m3fn"}


def aimdo_tensors(path: Path):
    """ComfyUI's `comfy.utils.load_safetensors`: the whole file mapped by comfy-aimdo's ModelMMAP,
    a `torch.frombuffer` view per tensor.  Returns (mapping, {name: tensor}); keep the mapping
    alive while the tensors are used."""
    import torch
    import comfy_aimdo.control
    import comfy_aimdo.model_mmap as model_mmap
    if model_mmap.lib is None:  # ComfyUI initialises aimdo at start-up; the CPU build loads too
        if not comfy_aimdo.control.init():
            raise RuntimeError("comfy_aimdo.control.init() failed")
        import importlib
        model_mmap = importlib.reload(model_mmap)
    size = os.path.getsize(path)
    mapping = model_mmap.ModelMMAP(str(path))
    mv = memoryview((ctypes.c_uint8 * size).from_address(mapping.get()))
    (n,) = struct.unpack("<Q", mv[:8])
    header = json.loads(mv[8:8 + n].tobytes())
    data = mv[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = getattr(torch, _TORCH_DTYPES[info["dtype"]])
        if start == end:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            tensors[name] = torch.frombuffer(data[start:end], dtype=dtype).view(info["shape"])
    return mapping, tensors


def aimdo_read_chunk(fd: int, dest: memoryview, off: int, drop: bool = True) -> int:
    """One chunk of comfy-aimdo's xfer-file reader (ComfyUI's dynamic-VRAM re-read): pread until
    `dest` is full, then drop the range from the page cache (`mark_cold`: POSIX_FADV_DONTNEED;
    not with `drop=False`). Returns the bytes read."""
    done = 0
    while done < len(dest):
        n = os.preadv(fd, [dest[done:]], off + done)
        if n <= 0:
            raise OSError(f"short read at {off + done}")
        if drop:
            os.posix_fadvise(fd, off + done, n, os.POSIX_FADV_DONTNEED)
        done += n
    return done


def small_safetensors(i: int) -> bytes:
    """A LoRA-like file of a few hundred bytes, different for every `i`."""
    data = struct.pack("<16e", *[(i * 16 + k) % 1000 / 8 for k in range(16)])
    header = {
        "__metadata__": {"ss_network_dim": "4", "index": str(i)},
        f"lora_unet_block_{i % 97}.lora_down.weight": {"dtype": "F16", "shape": [2, 4], "data_offsets": [0, 16]},
        f"lora_unet_block_{i % 97}.lora_up.weight": {"dtype": "F16", "shape": [4, 2], "data_offsets": [16, 32]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data
