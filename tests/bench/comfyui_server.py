#!/usr/bin/env python3
"""A real ComfyUI server loading a checkpoint through the mount and from the plain folder.

    sudo .venv/bin/python tests/bench/comfyui_server.py --comfyui PATH --python PYTHON
        [--reps 2] [--sources fast,slow,nfs,object] [--divs 8,0] [--out FILE]

`--comfyui` is a ComfyUI checkout, `--python` an interpreter that has its requirements (it
runs the server and writes the checkpoint). Nothing here imitates ComfyUI: its own `main.py`
serves on the loopback, and each prompt goes through its HTTP API the way its page sends it.

The checkpoint is SD1.5-shaped and complete (UNet, CLIP-L text encoder and VAE, 1132 fp16
tensors, 2.13 GB, stored in name order as checkpoint writers do), built from ComfyUI's own
model classes with seeded random weights, so that ComfyUI detects, loads and runs it like any
SD1.5 file. The workflow is the default one at its smallest: CheckpointLoaderSimple, two
CLIPTextEncode, EmptyLatentImage 64x64, KSampler (1 step, euler), VAEDecode, SaveImage, run on
the CPU (`--cpu`).

Sources are those of tests/bench/sources.py (ext4 on a RAM-backed block device; the slow one
read-throttled to 1 GB/s for every process of the run), and the network classes of
tests/bench/slow_sources.py: **nfs** and **object**, SeaweedFS through `weed mount
-cacheCapacityMB=0` in a network namespace at 1 Gbit/s, 1 ms and 20 ms per request
(tests/bench/netstore.py), a fresh client before every server; there the source's bytes are
those through the store's proxy and its speed one `dd bs=16M` of the checkpoint. Per source, budget (a share of the
checkpoint, `--divs`: 8 is an eighth, 0 a budget larger than the file) and repetition, two
servers in turn: one pointed at the plain folder, one at a fresh mount of it (its
`extra_model_paths.yaml` from `tierfs comfyui-config`). Each server runs:

1. **cold**: caches dropped, the first prompt (the checkpoint is loaded);
2. **reload**: `POST /free` (models unloaded, ComfyUI's caches reset), then the same prompt
   again, the page cache and tierfs's cache as the first load left them.

Per prompt: its time (submit to done), the device bytes read (the block device's own count),
and for the mount tierfs's prefetch wasted and its exact, uncached reads of first touches
(`disk.probe_bytes`). Every image is compared with the plain folder's.
Writes tests/bench/results/comfyui_server/sd15-checkpoint.md. Needs root.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(HERE))

import guest_memory  # noqa: E402
import machine  # noqa: E402
import netstore  # noqa: E402
import read_patterns as bench  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
CKPT = "sd15_random.safetensors"
# The network classes of slow_sources.py: milliseconds added per request.
NETWORK_DELAY_MS = {"nfs": 1.0, "object": 20.0}
GOAL_DISK_COLD = 1.15  # ComfyUI's own load of an all-in-one checkpoint at an eighth: disk / file

# Run by --python inside the ComfyUI checkout: an SD1.5 checkpoint from ComfyUI's own classes.
MAKE_CHECKPOINT = r"""
import sys
out = sys.argv[1]
seed_argv = list(sys.argv)
sys.argv = [sys.argv[0], "--cpu"]
import torch
import comfy.options
comfy.options.enable_args_parsing()
import comfy.ops
import comfy.sd1_clip
import comfy.ldm.models.autoencoder as autoencoder
from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel
from safetensors.torch import save_file

unet = UNetModel(image_size=32, in_channels=4, out_channels=4, model_channels=320,
                 num_res_blocks=[2, 2, 2, 2], channel_mult=[1, 2, 4, 4],
                 transformer_depth=[1, 1, 1, 1, 1, 1, 0, 0], transformer_depth_middle=1,
                 transformer_depth_output=[1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
                 use_spatial_transformer=True, legacy=False, context_dim=768, num_heads=8,
                 use_linear_in_transformer=False, adm_in_channels=None, use_checkpoint=False,
                 use_temporal_attention=False, use_temporal_resblock=False,
                 dtype=torch.float32, operations=comfy.ops.manual_cast)
vae = autoencoder.AutoencoderKL(ddconfig={"double_z": True, "z_channels": 4, "resolution": 256,
                                          "in_channels": 3, "out_ch": 3, "ch": 128,
                                          "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2,
                                          "attn_resolutions": [], "dropout": 0.0}, embed_dim=4)
clip = comfy.sd1_clip.SDClipModel(device="cpu", dtype=torch.float32)
g = torch.Generator().manual_seed(int(seed_argv[2]) if len(seed_argv) > 2 else 99)
tensors = {}
for prefix, module in (("model.diffusion_model.", unet), ("first_stage_model.", vae),
                       ("cond_stage_model.", clip)):
    for name, v in module.state_dict().items():
        key = prefix + name
        if not v.is_floating_point():
            tensors[key] = v.contiguous()
        elif name.endswith("bias"):
            tensors[key] = torch.zeros_like(v, dtype=torch.float16)
        elif "norm" in name:
            tensors[key] = torch.ones_like(v, dtype=torch.float16)
        else:
            fan_in = v[0].numel() if v.dim() else 1
            tensors[key] = (torch.randn(v.shape, generator=g) / max(1, fan_in) ** 0.5).to(torch.float16)
save_file(tensors, out)
print(len(tensors), "tensors")
"""


def workflow(ckpt: str, size: int = 64, steps: int = 1) -> dict:
    """ComfyUI's default workflow (by default at its smallest: a 64×64 image, one step), in the
    API format its page sends."""
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat on a mat", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "5": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0],
            "seed": 1, "steps": steps, "cfg": 1.0, "sampler_name": "euler", "scheduler": "normal",
            "denoise": 1.0}},
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "bench"}},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ComfyUI server on the loopback, its models from `paths_yaml`."""

    def __init__(self, args, paths_yaml: Path, root: Path):
        self.port = free_port()
        self.out = Path(tempfile.mkdtemp(prefix="comfy-out.", dir=root))
        self.log_path = root / f"comfyui-{self.port}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(args.python), "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
             "--extra-model-paths-config", str(paths_yaml), "--output-directory", str(self.out),
             "--disable-auto-launch", "--database-url", "sqlite:///:memory:"],
            cwd=args.comfyui, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited ({self.proc.returncode}); log {self.log_path}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/system_stats", timeout=2).read()
                return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise RuntimeError(f"ComfyUI not ready within 180 s; log {self.log_path}")

    def _post(self, path: str, body: dict) -> bytes:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=60).read()

    def prompt(self, ckpt: str, timeout: float = 600) -> tuple[float, str]:
        """Runs the workflow; returns its time and the sha256 of the image it saved."""
        t0 = time.perf_counter()
        pid = json.loads(self._post("/prompt", {"prompt": workflow(ckpt), "client_id": str(uuid.uuid4())}))["prompt_id"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/history/{pid}", timeout=60).read())
            status = h.get(pid, {}).get("status", {})
            if status.get("completed") is not None:
                elapsed = time.perf_counter() - t0
                if status.get("status_str") != "success":
                    raise RuntimeError(f"prompt failed: {status}; log {self.log_path}")
                image = h[pid]["outputs"]["7"]["images"][0]
                data = (self.out / image.get("subfolder", "") / image["filename"]).read_bytes()
                return elapsed, hashlib.sha256(data).hexdigest()
            time.sleep(0.02)
        raise RuntimeError(f"prompt not done within {timeout} s; log {self.log_path}")

    def free(self) -> None:
        """Unloads the models and resets ComfyUI's caches (its `/free` endpoint), then waits a
        second: the server acts on it in its prompt worker's next turn, and says nothing when it
        has. Every reload measured so far read the checkpoint again (its disk bytes, or its time
        from the page cache against a prompt without a load), so the wait has been enough."""
        self._post("/free", {"unload_models": True, "free_memory": True})
        time.sleep(1.0)

    def close(self) -> None:
        stop(self.proc, 30)
        self.log.close()
        shutil.rmtree(self.out, ignore_errors=True)


def stop(proc: subprocess.Popen, timeout: float) -> None:
    """Stops `proc` by its PID: SIGTERM, then SIGKILL after `timeout` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def device_read_bytes(dev: str) -> int:
    return int((Path("/sys/block") / Path(dev).name / "stat").read_text().split()[2]) * 512


def paths_yaml(root: Path, models: Path, name: str) -> Path:
    p = root / f"paths-{name}.yaml"
    p.write_text(f"{name}:\n    base_path: {models}\n    checkpoints: checkpoints\n")
    return p


class DiskSource:
    """The checkpoint on the RAM-backed block device: bytes are the device's own count."""

    def __init__(self, disk):
        self.disk = disk
        self.models = disk.mnt / "models"

    def fresh(self) -> None:
        pass

    def read_bytes(self) -> int:
        return device_read_bytes(self.disk.dev)


class StoreSource:
    """The checkpoint in a SeaweedFS store through `weed mount`: bytes are those through the
    store's proxy; `fresh()` gives the next server a new client (nothing cached in it)."""

    def __init__(self, store: netstore.WeedStore):
        self.store = store
        self.models = store.mnt / "models"

    def fresh(self) -> None:
        self.store.remount()

    def read_bytes(self) -> int:
        return self.store.source_bytes()


def dd_gbs(path: Path) -> float:
    """One `dd bs=16M` of `path` with the caches dropped (GB/s): the source's sequential limit."""
    sources.drop_caches()
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M"], check=True, capture_output=True, timeout=900)
    return path.stat().st_size / (time.perf_counter() - t0) / 1e9


def one_server(args, src, root: Path, side: str, budget: int, size: int) -> dict:
    """Cold load then reload on one server (plain folder or a fresh mount)."""
    mount = None
    src.fresh()
    try:
        if side == "plain":
            yaml = paths_yaml(root, src.models, "plain")
        else:
            mount = bench.Mount(src.models, root, budget)
            text = subprocess.run([str(bench.BIN), "comfyui-config", str(mount.mnt)], capture_output=True,
                                  text=True, check=True, timeout=30).stdout
            yaml = root / "paths-tierfs.yaml"
            yaml.write_text(text)
        server = Server(args, yaml, root)
        try:
            out = {}
            for case in ("cold", "reload"):
                if case == "cold":
                    sources.drop_caches()
                    time.sleep(0.5)
                else:
                    server.free()
                s0 = mount.stats() if mount else None
                d0 = src.read_bytes()
                elapsed, image = server.prompt(CKPT)
                disk_bytes = src.read_bytes() - d0
                row = {"s": elapsed, "disk": disk_bytes / size, "image": image}
                if mount:
                    s1 = mount.stats()
                    row["wasted"] = (s1["prefetch"]["wasted_bytes"] - s0["prefetch"]["wasted_bytes"]) / size
                    row["probes"] = (s1["disk"]["probe_bytes"] - s0["disk"]["probe_bytes"]) / size
                    row["modes"] = sorted({f.get("mode") for f in s1.get("files", []) if f.get("path", "").endswith(CKPT)})
                out[case] = row
                print(f"  {side:5} {case:6} {elapsed:6.2f} s  disk/file {row['disk']:.3f}"
                      + (f"  wasted {row['wasted']:.3f}  probes {row['probes']:.3f} {row['modes']}" if mount else ""),
                      flush=True)
            return out
        finally:
            server.close()
    finally:
        if mount:
            mount.close()


def make_checkpoint(args, path: Path, seed: int = 99) -> None:
    """Writes the checkpoint to `path` (weights from `seed`) unless it is there."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    subprocess.run([str(args.python), "-c", MAKE_CHECKPOINT, str(tmp), str(seed)], cwd=args.comfyui, check=True,
                   timeout=900)
    tmp.rename(path)


def render(args, rows: list[dict], size: int, raw: dict, cmd: str, version: str) -> str:
    med = statistics.median
    out = ["# A real ComfyUI server: checkpoint load through the mount vs the plain folder\n",
           f"- command: `{cmd}`",
           f"- date: {datetime.datetime.now():%Y-%m-%d %H:%M}; kernel {os.uname().release}; {os.cpu_count()} CPUs",
           f"- ComfyUI {version} (`main.py --cpu`), checkpoint {CKPT}: SD1.5-shaped, complete, "
           f"{size / 1e9:.2f} GB; workflow: CheckpointLoaderSimple, CLIPTextEncode ×2, EmptyLatentImage "
           "64×64, KSampler 1 step, VAEDecode, SaveImage",
           "- sources: " + ", ".join(f"{k} {v:.2f} GB/s" for k, v in raw.items())
           + f"; median of {args.reps} repetitions, each a fresh server (and a fresh mount)",
           "- cold: caches dropped, first prompt; reload: `POST /free` (models unloaded, caches reset), "
           "then the same prompt; disk / file: the block device's own count of bytes read during the prompt "
           "(nfs, object: the bytes through the store's proxy, a fresh client for every server); "
           "first touches: what tierfs read exactly and uncached for reads that were no stream (`disk.probe_bytes`: "
           "ComfyUI's first touch of every tensor), part of the disk bytes",
           "",
           "| source | budget | case | plain s | mount s | plain / mount | plain disk / file | mount disk / file "
           "| wasted / file | first touches / file | mode | images identical |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        for case in ("cold", "reload"):
            p = [x[case] for x in r["plain"]]
            m = [x[case] for x in r["mount"]]
            ps, ms = med(x["s"] for x in p), med(x["s"] for x in m)
            same = len({x["image"] for x in p + m}) == 1
            out.append(f"| {r['source']} | {r['budget']} | {case} | {ps:.2f} | {ms:.2f} | {ps / ms:.2f} | "
                       f"{max(x['disk'] for x in p):.3f} | {max(x['disk'] for x in m):.3f} | "
                       f"{max(x['wasted'] for x in m):.3f} | {max(x['probes'] for x in m):.3f} | "
                       f"{', '.join(m[0]['modes'])} | {'yes' if same else 'NO'} |")
    out += ["", f"Goal for ComfyUI's own load of an all-in-one checkpoint through an eighth of it: cold disk / "
            f"file ≤ {GOAL_DISK_COLD}.", "", "Every pass:", ""]
    for r in rows:
        for side in ("plain", "mount"):
            for case in ("cold", "reload"):
                v = ", ".join(f"{x[case]['s']:.2f} s / {x[case]['disk']:.3f}" for x in r[side])
                out.append(f"- {r['source']}, {r['budget']}, {side}, {case}: {v}")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui", type=Path, required=True, help="a ComfyUI checkout (its main.py)")
    ap.add_argument("--python", type=Path, required=True, help="a Python with ComfyUI's requirements")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--sources", default="fast,slow")
    ap.add_argument("--divs", default="8,0", help="budgets as a share of the checkpoint: 8 is an eighth, 0 is "
                    "larger than it")
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data"))
    ap.add_argument("--slow-bps", type=float, default=1e9)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "comfyui_server" / "sd15-checkpoint.md")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (RAM-backed source, drop_caches, mounts)")
    if not (args.comfyui / "main.py").exists():
        raise SystemExit(f"{args.comfyui}: no ComfyUI main.py there")
    bench.BIN = args.tierfs
    stored = args.data / "comfyui" / CKPT
    make_checkpoint(args, stored)
    size = stored.stat().st_size
    version = subprocess.run([str(args.python), "-c", "import comfyui_version; print(comfyui_version.__version__)"],
                             cwd=args.comfyui, capture_output=True, text=True, timeout=60).stdout.strip()
    root = Path(tempfile.mkdtemp(prefix="tierfs-comfyui.", dir="/var/tmp"))
    rows, raw = [], {}
    wanted = args.sources.split(",")
    if set(wanted) - {"fast", "slow", *NETWORK_DELAY_MS}:
        raise SystemExit(f"--sources: any of fast, slow, {', '.join(NETWORK_DELAY_MS)}")

    def run_source(source: str, src) -> None:
        for div in (int(x) for x in args.divs.split(",")):
            budget = size // div if div else size + 256 * MiB
            label = f"file/{div}" if div else "> file"
            print(f"{source} source, budget {label} ({budget / MiB:.0f} MiB)", flush=True)
            r = {"source": source, "budget": label, "plain": [], "mount": []}
            for _ in range(args.reps):
                for side in ("plain", "mount"):
                    r[side].append(one_server(args, src, root, side, budget, size))
            rows.append(r)

    try:
        with guest_memory.SteadyMemory():
            local = [x for x in wanted if x in ("fast", "slow")]
            if local:
                with sources.RamDisk(size + 512 * MiB, root) as disk:
                    throttle = sources.Throttle(disk.majmin)
                    models = disk.put(stored, f"models/checkpoints/{CKPT}").parent
                    for source in local:
                        throttle.set(int(args.slow_bps) if source == "slow" else 0)
                        raw[source] = sources.cold_read_gbs(models / CKPT)
                        run_source(source, DiskSource(disk))
                    throttle.set(0)
                    throttle.close()
            network = [x for x in wanted if x in NETWORK_DELAY_MS]
            if network:
                with netstore.WeedStore(root, NETWORK_DELAY_MS[network[0]], 1_000_000_000) as store:
                    store.put(stored, f"models/checkpoints/{CKPT}")
                    for source in network:
                        store.set_delay(NETWORK_DELAY_MS[source])
                        store.remount()
                        raw[source] = dd_gbs(store.mnt / "models" / "checkpoints" / CKPT)
                        run_source(source, StoreSource(store))
        cmd = "sudo .venv/bin/python tests/bench/comfyui_server.py " + " ".join(sys.argv[1:])
        machine.write_results(args.out, render(args, rows, size, raw, cmd.strip(), version))
    finally:
        bench.cleanup(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
