#!/usr/bin/env python3
"""Regenerates the seed corpora under fuzz/corpus/ (run from the repo root with the .venv that has
`safetensors` and `numpy`):

    .venv/bin/python fuzz/make_seeds.py [SYNTH.safetensors ...]

Optional arguments are checkpoints written by `tierfs_core::synth` (e.g. `tierfs demo` files);
their headers are cut down to the first 24 tensors (in offset order) to keep seeds small.

index_parse seeds are `k (8 bytes LE) + file prefix`, see fuzz_targets/index_parse.rs: most use
mode 0 with `k = extra << 2` (the file is `extra` bytes longer than the header).
"""
import json
import os
import struct
import sys

import numpy as np
from safetensors.numpy import save

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def k(mode, v):
    return struct.pack("<Q", (v << 2) | mode)


def header_of(buf):
    n = struct.unpack("<Q", buf[:8])[0]
    return buf[: 8 + n], len(buf) - 8 - n


def seed_file(name, buf, trailing=0):
    """Header-only prefix with the data length as extra, plus the whole file with mode 1."""
    head, data_len = header_of(buf)
    write("index_parse", name, k(0, data_len + trailing) + head)
    write("index_parse", name + "-whole", k(1, 0) + buf)


def raw_header(name, obj_text, data_len):
    h = obj_text.encode()
    write("index_parse", name, k(0, data_len) + struct.pack("<Q", len(h)) + h)


def model(names, dtype=np.float16, shape=(2, 3)):
    return {n: np.zeros(shape, dtype=dtype) for n in names}


REAL_NAMES = {
    "wan": ["patch_embedding.weight", "blocks.0.self_attn.q.weight", "blocks.0.ffn.0.bias",
            "blocks.1.self_attn.q.weight", "blocks.10.cross_attn.k.weight", "head.head.weight",
            "time_embedding.0.weight"],
    "flux": ["img_in.weight", "double_blocks.0.img_attn.qkv.weight", "double_blocks.1.txt_mlp.0.bias",
             "single_blocks.0.linear1.weight", "single_blocks.37.norm.key_norm.scale",
             "final_layer.linear.weight"],
    "unet": ["model.diffusion_model.input_blocks.0.0.weight",
             "model.diffusion_model.input_blocks.4.1.transformer_blocks.0.attn1.to_q.weight",
             "model.diffusion_model.middle_block.1.norm.weight",
             "model.diffusion_model.output_blocks.11.0.in_layers.0.weight",
             "model.diffusion_model.out.2.weight", "first_stage_model.decoder.up.0.block.0.conv1.weight"],
    "diffusers": ["transformer_blocks.0.attn.to_q.weight", "single_transformer_blocks.7.proj_out.weight",
                  "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_k.weight",
                  "mid_block.resnets.0.conv1.weight", "up_blocks.0.resnets.1.norm1.bias"],
    "t5": ["shared.weight", "encoder.block.0.layer.0.SelfAttention.q.weight",
           "encoder.block.23.layer.1.DenseReluDense.wi_0.weight",
           "decoder.block.0.layer.0.SelfAttention.q.weight", "encoder.final_layer_norm.weight"],
    "clip": ["text_model.embeddings.token_embedding.weight",
             "text_model.encoder.layers.0.self_attn.q_proj.weight",
             "text_model.encoder.layers.11.mlp.fc1.weight", "text_model.final_layer_norm.bias"],
    "gpt2": ["wte.weight", "h.0.attn.c_attn.weight", "h.11.mlp.c_fc.bias", "transformer.h.0.ln_1.weight"],
}


def main():
    # --- index_parse: real files written by the reference implementation ---
    dtypes = [np.float16, np.float32, np.int8, np.uint8, np.float64, np.int64, np.bool_]
    for i, (fam, names) in enumerate(REAL_NAMES.items()):
        buf = save(model(names, dtypes[i % len(dtypes)]), metadata={"format": "pt"})
        seed_file(f"real-{fam}", buf, trailing=i * 13)
        write("block_key", f"real-{fam}", "\n".join(names))
    seed_file("empty", save({}))
    seed_file("zero-dim", save({"a": np.zeros((0, 4), np.float32), "b": np.zeros((3,), np.int16),
                                "c": np.zeros((0,), np.uint8)}))
    # Large shapes (data not present: only the header is seeded).
    raw_header("large-shapes",
               '{"blocks.0.w":{"dtype":"BF16","shape":[4096,4096],"data_offsets":[0,33554432]},'
               '"blocks.0.b":{"dtype":"F32","shape":[4096],"data_offsets":[33554432,33570816]},'
               '"blocks.1.w":{"dtype":"F8_E4M3","shape":[3072,1024],"data_offsets":[33570816,36716544]}}',
               36716544 + 100)
    raw_header("subbyte", '{"x":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]},'
               '"y":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[3,6]},'
               '"__metadata__":{"format":"pt"}}', 6)
    # Invalid headers, one per error class.
    bad = {
        "gap": '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}',
        "overlap": '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}',
        "dup": '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}',
        "dtype": '{"a":{"dtype":"F128","shape":[2],"data_offsets":[0,2]}}',
        "mismatch": '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,2]}}',
        "overflow": '{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}',
        "inverted": '{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}}',
        "misaligned": '{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}',
        "meta-null-valid": '{"__metadata__":null,"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
        "meta-num": '{"__metadata__":{"k":1}}',
        "not-object": '[1,2,3]',
        "bigoff": '{"a":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}}',
    }
    for name, text in bad.items():
        raw_header(name if name.endswith("-valid") else f"bad-{name}", text, 64)
    write("index_parse", "bad-len", k(2, 1 << 20) + struct.pack("<Q", 0xFFFFFFFF) + b"{}")
    write("index_parse", "bad-utf8", k(0, 0) + struct.pack("<Q", 4) + b"\xff\xfe{}")
    # Cut-down synth headers.
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            buf = f.read()
        head, _ = header_of(buf)
        hdr = json.loads(head[8:])
        meta = hdr.pop("__metadata__", None)
        items = sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"])[:24]
        out = {"__metadata__": meta} if meta else {}
        out.update(items)
        end = items[-1][1]["data_offsets"][1]
        text = json.dumps(out, separators=(",", ":"))
        text += " " * (-len(text) % 8)
        name = os.path.basename(path).split(".")[0]
        raw_header(f"synth-{name}", text, end)
        write("block_key", f"synth-{name}", "\n".join(n for n, _ in items))

    # --- block_key: edge cases ---
    edge = ["blocks.weight", "layers.x.weight", "blocks", "block.3.weight", "blocks.99999999999.weight",
            "blocks.-1.weight", "blocks.07.weight", "", "blocks.4294967295.w", "blocks.4294967296.w",
            "blocks.norm.layers.2.weight", "a..blocks.1", ".blocks.1.", "encoder.block.1", "x.decoder.block.0.y",
            "mid_block", "middle_block.0", "h.0", "é.blocks.1.ü", "blocks.１.w"]
    write("block_key", "edge", "\n".join(edge))

    # --- parse_size ---
    for i, s in enumerate(["512MiB", "8G", "8g", "8GiB", "1.5GiB", "4096", " 16 GiB ", "1073741824",
                           "18446744073709551615", "16EiB", "0.5", "1e3", "-1G", "8X", "GiB", "1,000",
                           "1_000", "99999999999999999999999", "1 KB", "3.000000000000000001 k"]):
        write("parse_size", f"s{i:02}", s)

    # --- control_parse ---
    for i, s in enumerate(["drop\n", "drop now", "ram-cache 8GiB\n", "  ram-cache 512MiB \n", "ram-cache",
                           "ram-cache lots", "ram-cache 1G 2G", "prefetch sub/m.safetensors\n",
                           "prefetch ./m.sft", "prefetch ../../etc/passwd", "prefetch /etc/passwd",
                           "prefetch .", "prefetch a/./b//c", "prefetch a/ /.", "prefetch\tx\u00a0y",
                           "dorp", "", "\n", "\u3000drop\u3000"]):
        write("control_parse", f"c{i:02}", s)
    write("control_parse", "c-notutf8", b"\xff\xfe")

    # --- chunk_plan: arbitrary-encoded; any bytes decode to some Input, so reuse a few ---
    for i, n in enumerate([64, 256, 1024]):
        write("chunk_plan", f"r{i}", bytes((j * 2654435761 >> 7) & 0xFF for j in range(n)))


if __name__ == "__main__":
    main()
