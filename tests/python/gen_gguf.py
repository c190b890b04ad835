"""GGUF and sharded-safetensors test files for the tierfs end-to-end tests and benchmark.

GGUF files are written with gguf-py's own ``GGUFWriter`` (the writer of llama.cpp's converters
and of ComfyUI-GGUF's ``convert.py``), tensor by tensor (``add_tensor_info`` for all, then
``write_tensor_data`` one at a time), so memory stays bounded by one tensor.  Tensor bytes are
random (seeded): the tests compare bytes, never values, so quantised blocks need not decode to
anything meaningful.

Two shapes, with the names real files carry:

* DiT (ComfyUI-GGUF Flux, arch ``flux``): ``img_in.weight``, ``double_blocks.N.img_attn.qkv.weight``,
  ..., ``single_blocks.N.linear1.weight``, ``final_layer.linear.weight``; Q8_0 / Q4_K / Q5_K
  weights, F16 embeddings, F32 norm scales;
* llama (llama.cpp, arch ``llama``): ``token_embd.weight``, ``blk.N.attn_q.weight``, ...,
  ``output.weight``; Q4_K / Q6_K weights, F32 norms, plus a tokenizer vocabulary in the header.

Shapes are given in numpy order (rows, columns); ``ne[0]``, the GGUF first dimension, is the
column count and must be a whole number of quantisation blocks.

:func:`random_gguf` and :func:`mutate` feed the differential test against gguf-py's reader.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quant_shape_to_byte_shape

GSpec = tuple[str, Q, tuple[int, ...]]  # (name, ggml type, numpy shape)

_NP_TYPES = {Q.F32: np.float32, Q.F16: np.float16, Q.F64: np.float64, Q.I8: np.int8,
             Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64}


def gguf_nbytes(spec: GSpec) -> int:
    _, ty, shape = spec
    block, size = GGML_QUANT_SIZES[ty]
    return math.prod(shape) // block * size


def _array(rng: np.random.Generator, ty: Q, shape: tuple[int, ...]) -> np.ndarray:
    """Random bytes shaped as GGUFWriter wants them: the numpy dtype for plain types, uint8
    in byte shape for quantised ones."""
    if ty in _NP_TYPES:
        dt = np.dtype(_NP_TYPES[ty])
        raw = rng.integers(0, 256, size=math.prod(shape) * dt.itemsize, dtype=np.uint8)
        return raw.view(dt).reshape(shape)
    byte_shape = quant_shape_to_byte_shape(shape, ty)
    return rng.integers(0, 256, size=math.prod(byte_shape), dtype=np.uint8).reshape(byte_shape)


def write_gguf(path: Path, arch: str, specs: list[GSpec], seed: int, alignment: int | None = None,
               kvs=None) -> Path:
    """Writes `specs` with GGUFWriter, tensor by tensor; `kvs(writer)` adds key/values."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    if kvs is not None:
        kvs(w)
    for name, ty, shape in specs:
        if ty in _NP_TYPES:
            w.add_tensor_info(name, shape, np.dtype(_NP_TYPES[ty]), gguf_nbytes((name, ty, shape)))
        else:
            w.add_tensor_info(name, quant_shape_to_byte_shape(shape, ty), np.dtype(np.uint8),
                              gguf_nbytes((name, ty, shape)), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, ty, shape in specs:
        w.write_tensor_data(_array(rng, ty, shape))
    w.close()
    tmp.rename(path)
    return path


def dit_gguf_specs(dim: int = 1536, n_double: int = 8, n_single: int = 10) -> list[GSpec]:
    """Flux-shaped, as ComfyUI-GGUF's converter writes it (no prefix, names sorted)."""
    ffn = 4 * dim
    s: list[GSpec] = [("img_in.weight", Q.F16, (dim, 64)), ("img_in.bias", Q.F32, (dim,)),
                      ("time_in.in_layer.weight", Q.F16, (dim, 256)), ("txt_in.weight", Q.Q8_0, (dim, 4096))]
    for b in range(n_double):
        for side in ("img", "txt"):
            p = f"double_blocks.{b}.{side}_"
            s += [(p + "attn.norm.query_norm.scale", Q.F32, (128,)),
                  (p + "attn.proj.weight", Q.Q8_0, (dim, dim)),
                  (p + "attn.qkv.weight", Q.Q8_0, (3 * dim, dim)),
                  (p + "mlp.0.weight", Q.Q4_K, (ffn, dim)),
                  (p + "mlp.2.weight", Q.Q5_K, (dim, ffn)),
                  (p + "mod.lin.weight", Q.Q8_0, (6 * dim, dim))]
    for b in range(n_single):
        p = f"single_blocks.{b}."
        s += [(p + "linear1.weight", Q.Q8_0, (3 * dim + ffn, dim)),
              (p + "linear2.weight", Q.Q4_K, (dim, dim + ffn)),
              (p + "norm.query_norm.scale", Q.F32, (128,))]
    s += [("final_layer.linear.weight", Q.F16, (64, dim))]
    return sorted(s, key=lambda t: t[0])


def llama_gguf_specs(dim: int = 1024, ffn: int = 2816, n_blocks: int = 8, vocab: int = 8192) -> list[GSpec]:
    """llama.cpp-shaped: the order llama.cpp's converter writes (embedding, blocks, output)."""
    s: list[GSpec] = [("token_embd.weight", Q.Q4_K, (vocab, dim))]
    for b in range(n_blocks):
        p = f"blk.{b}."
        s += [(p + "attn_norm.weight", Q.F32, (dim,)), (p + "attn_q.weight", Q.Q4_K, (dim, dim)),
              (p + "attn_k.weight", Q.Q4_K, (dim // 4, dim)), (p + "attn_v.weight", Q.Q6_K, (dim // 4, dim)),
              (p + "attn_output.weight", Q.Q4_K, (dim, dim)), (p + "ffn_norm.weight", Q.F32, (dim,)),
              (p + "ffn_gate.weight", Q.Q4_K, (ffn, dim)), (p + "ffn_up.weight", Q.Q4_K, (ffn, dim)),
              (p + "ffn_down.weight", Q.Q6_K, (dim, ffn))]
    s += [("output_norm.weight", Q.F32, (dim,)), ("output.weight", Q.Q6_K, (vocab, dim))]
    return s


def llama_kvs(vocab: int):
    """A llama.cpp-style header: hyperparameters and a `vocab`-token vocabulary (arrays)."""
    def add(w: gguf.GGUFWriter) -> None:
        w.add_name("tierfs test llama")
        w.add_block_count(8)
        w.add_context_length(4096)
        w.add_tokenizer_model("llama")
        w.add_token_list([f"tok{i}" for i in range(vocab)])
        w.add_token_scores([float(-i) for i in range(vocab)])
        w.add_token_types([1] * vocab)
    return add


def make_dit_gguf(path: Path, seed: int = 31, **kw) -> Path:
    if not path.exists():
        write_gguf(path, "flux", dit_gguf_specs(**kw), seed)
    return path


def make_llama_gguf(path: Path, seed: int = 32, **kw) -> Path:
    if not path.exists():
        write_gguf(path, "llama", llama_gguf_specs(**kw), seed, kvs=llama_kvs(kw.get("vocab", 8192)))
    return path


# ----------------------------------------------------------------------------- reading

def gguf_tensors(path: Path) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """[(name, ggml type, dims (GGUF order), abs start, abs end)] in file order, per gguf-py."""
    r = gguf.GGUFReader(str(path))
    out = [(t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.data_offset),
            int(t.data_offset) + int(t.n_bytes)) for t in r.tensors]
    return sorted(out, key=lambda t: t[3])


_BLOCK_RE = re.compile(r"(?:^|\.)(blk|double_blocks|single_blocks|transformer_blocks|blocks)\.(\d+)(?:\.|$)")
_RANK = {"double_blocks": 0, "transformer_blocks": 0, "blocks": 0, "blk": 0, "single_blocks": 1}


def gguf_block(name: str) -> tuple:
    m = _BLOCK_RE.search(name)
    return (0,) if not m else (1, _RANK[m.group(1)], int(m.group(2)))


def gguf_model_order(path: Path) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """Tensors in model order: non-block tensors first, then block by block (double before
    single), each block's tensors in file order."""
    return sorted(gguf_tensors(path), key=lambda t: (gguf_block(t[0]), t[3]))


# ----------------------------------------------------------------------------- shards

def make_sharded(root: Path, stem: str, specs, n_shards: int, seed: int) -> Path:
    """A diffusers-style sharded checkpoint: ``{stem}-0000i-of-0000n.safetensors`` (tensors in
    name order, as transformers' and diffusers' ``save_pretrained`` write them, cut into
    `n_shards` runs of about equal bytes) and ``{stem}.safetensors.index.json`` (``weight_map``:
    tensor -> shard).  Returns the index path."""
    import gen
    index = root / f"{stem}.safetensors.index.json"
    if index.exists():
        return index
    root.mkdir(parents=True, exist_ok=True)
    specs = sorted(specs, key=lambda t: t[0])
    total = sum(map(gen.nbytes, specs))
    shards: list[list] = [[]]
    acc = 0
    for spec in specs:
        if acc >= total * len(shards) / n_shards and len(shards) < n_shards:
            shards.append([])
        shards[-1].append(spec)
        acc += gen.nbytes(spec)
    weight_map = {}
    for i, part in enumerate(shards, 1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        gen.write_streaming(root / name, part, seed + i)
        weight_map.update({s[0]: name for s in part})
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return index


# ----------------------------------------------------------------------------- differential

def random_gguf(path: Path, rng: np.random.Generator) -> None:
    """A small random but valid GGUF file: random key/values of every type (nested arrays
    included), a random alignment, 0-12 tensors of random types and shapes."""
    types = [t for t in Q if t in GGML_QUANT_SIZES]
    alignment = int(rng.choice([None, 1, 8, 32, 64, 256], p=[.4, .1, .1, .1, .2, .1]) or 0) or None

    def kvs(w: gguf.GGUFWriter) -> None:
        for i in range(int(rng.integers(0, 6))):
            k = f"test.k{i}"
            choice = int(rng.integers(0, 8))
            if choice == 0:
                w.add_uint8(k, int(rng.integers(0, 256)))
            elif choice == 1:
                w.add_int64(k, int(rng.integers(-2**40, 2**40)))
            elif choice == 2:
                w.add_float32(k, float(rng.random()))
            elif choice == 3:
                w.add_bool(k, bool(rng.integers(0, 2)))
            elif choice == 4:
                w.add_string(k, "é" * int(rng.integers(0, 40)))
            elif choice == 5:
                w.add_array(k, [int(x) for x in rng.integers(0, 1000, int(rng.integers(0, 30)))])
            elif choice == 6:
                w.add_array(k, [f"s{x}" for x in range(int(rng.integers(0, 30)))])
            else:
                w.add_array(k, [[1, 2], [3]])

    specs = []
    for i in range(int(rng.integers(0, 13))):
        ty = types[int(rng.integers(0, len(types)))]
        block, _ = GGML_QUANT_SIZES[ty]
        ne0 = block * int(rng.integers(1, 4)) if block > 1 else int(rng.integers(1, 40))
        shape = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 3)))) + (ne0,)
        name = rng.choice(["blk.{}.w", "double_blocks.{}.x", "blocks.{}.y", "t{}"]).format(i)
        specs.append((f"{name}.{i}", ty, shape))
    arch = str(rng.choice(["llama", "flux", "wan"]))
    write_gguf(path, arch, specs, int(rng.integers(0, 2**31)), alignment=alignment, kvs=kvs)


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """A hostile variant of a valid file: bytes overwritten in the header, a count or length
    replaced by an extreme value, or the file cut short."""
    b = bytearray(data)
    header_end = min(len(b), 24 + int(rng.integers(0, max(1, min(len(b), 4096)))))
    kind = int(rng.integers(0, 4))
    if kind == 0:
        for _ in range(int(rng.integers(1, 6))):
            b[int(rng.integers(0, header_end))] = int(rng.integers(0, 256))
    elif kind == 1:
        at = int(rng.integers(4, max(5, header_end - 8)))
        extremes = [0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, int(rng.integers(0, 2**16))]
        val = extremes[int(rng.integers(0, len(extremes)))]
        b[at:at + 8] = val.to_bytes(8, "little")
    elif kind == 2:
        del b[int(rng.integers(0, len(b))):]
    else:
        at = int(rng.integers(4, max(5, header_end - 4)))
        b[at:at + 4] = int(rng.integers(0, 64)).to_bytes(4, "little")
    return bytes(b)
