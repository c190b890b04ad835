#!/usr/bin/env python3
"""A real ComfyUI server running a workflow of two models in turn, with and without tierfs's node.

    sudo .venv/bin/python tests/bench/comfyui_node.py --comfyui PATH --python PYTHON
        [--source 1g|disk] [--reps 2] [--steps 4] [--out FILE]

`--comfyui` is a ComfyUI checkout, `--python` an interpreter with its requirements (as for
tests/bench/comfyui_server.py, whose server, checkpoint and source set-up this reuses).

Two SD1.5-shaped checkpoints (2.13 GB each, seeded apart) stand for Wan 2.2's high- and
low-noise experts. The source is the RAM-backed block device read-throttled to 1 GB/s
(`--source 1g`), or the hard-disk class of tests/bench/slow_sources.py (`--source disk`: 200
MB/s and 200 read requests a second, said to rotate); the mount's budget holds one checkpoint,
not both. Three sides, each on a fresh server:

- **plain**: ComfyUI pointed at the plain folder;
- **mount**: at a fresh mount (no learned state), without the node;
- **node**: at a fresh mount, with `comfyui-node/` installed in `custom_nodes/`.

Two scenarios:

1. **workflow**: one prompt with two loaders and two samplers (CheckpointLoaderSimple A and B,
   KSamplerAdvanced over the first half of the steps with A, the second half with B, as Wan
   2.2's experts share the steps; VAEDecode, SaveImage). Run cold (caches dropped, first run of
   the workflow), then `--reps` later runs, each after `POST /free` (ComfyUI unloads the models
   and resets its caches, so every run loads both again).
2. **queued**: two prompts queued back to back, the first loading A only, the second B only
   (a user queueing two workflows, or a farm's queue): the switch to B comes after the first
   prompt's sampling.

Per run: the prompt's (or both prompts') time, the bytes the block device read over one
checkpoint, and each node's time from ComfyUI's own `executing` events (a websocket client in
`--python`). **The wait at the switch to B** is the time of B's loader node less the same
node's time when B is in RAM (the plain folder's later runs, whose page cache holds both
checkpoints without any budget), over B's loader time in the plain folder's cold run. For the
mount, tierfs's own figure beside it: the seconds B's readers waited for the disk
(`files[].stall_seconds`).

Writes tests/bench/results/comfyui_node/two-models.md (`two-models-disk.md` for the disk
class) and a .json beside it. Needs root.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
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

import comfyui_server as real  # noqa: E402
import slow_sources  # noqa: E402
import guest_memory  # noqa: E402
import machine  # noqa: E402
import read_patterns as bench  # noqa: E402
import sources  # noqa: E402

MiB = 1 << 20
CKPTS = ("expert_high.safetensors", "expert_low.safetensors")
NODE_DIR = REPO / "comfyui-node"
GOAL_SWITCH_WAIT = 0.05  # the wait at the switch, over B's cold load

# Run by --python: ComfyUI's websocket events, one JSON line each with its receipt time.
LISTEN = r"""
import asyncio, json, sys, time
import aiohttp
url, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
async def main():
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(url, heartbeat=20) as ws:
            with open(out, "a", buffering=1) as f:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    try:
                        msg = await ws.receive(timeout=1.0)
                    except asyncio.TimeoutError:
                        continue
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        if msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                            return
                        continue
                    f.write(json.dumps({"t": time.time(), "m": json.loads(msg.data)}) + "\n")
asyncio.run(main())
"""


def two_expert_workflow(a: str, b: str, steps: int) -> dict:
    """Two checkpoints sharing the steps, as Wan 2.2's high- and low-noise experts."""
    half = steps // 2
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": a}},
        "2": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": b}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat on a mat", "clip": ["1", 1]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 256, "height": 256, "batch_size": 1}},
        "6": {"class_type": "KSamplerAdvanced", "inputs": {
            "model": ["1", 0], "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["5", 0],
            "add_noise": "enable", "noise_seed": 1, "steps": steps, "cfg": 1.0, "sampler_name": "euler",
            "scheduler": "normal", "start_at_step": 0, "end_at_step": half,
            "return_with_leftover_noise": "enable"}},
        "7": {"class_type": "KSamplerAdvanced", "inputs": {
            "model": ["2", 0], "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["6", 0],
            "add_noise": "disable", "noise_seed": 1, "steps": steps, "cfg": 1.0, "sampler_name": "euler",
            "scheduler": "normal", "start_at_step": half, "end_at_step": steps,
            "return_with_leftover_noise": "disable"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["1", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "bench"}},
    }


class Events:
    """ComfyUI's websocket events for one client id, collected by a subprocess of `--python`."""

    def __init__(self, python: Path, port: int, root: Path, seconds: float = 3600):
        self.client = str(uuid.uuid4())
        self.path = root / f"events-{port}-{self.client[:8]}.jsonl"
        self.path.touch()
        url = f"ws://127.0.0.1:{port}/ws?clientId={self.client}"
        self.proc = subprocess.Popen([str(python), "-c", LISTEN, url, str(self.path), str(seconds)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)

    def executing(self, prompt_id: str) -> list[tuple[float, str | None]]:
        """`prompt_id`'s `executing` events: (receipt time, node; None when the prompt ended)."""
        marks = []
        for line in self.path.read_text().splitlines():
            ev = json.loads(line)
            m = ev["m"]
            if m.get("type") == "executing" and m["data"].get("prompt_id") == prompt_id:
                marks.append((ev["t"], m["data"].get("node")))
        return marks

    def node_windows(self, prompt_id: str) -> dict[str, tuple[float, float]]:
        """When each node of `prompt_id` ran (wall clock): from its `executing` event to the
        next one."""
        marks = self.executing(prompt_id)
        return {node: (t0, t1) for (t0, node), (t1, _) in zip(marks, marks[1:]) if node is not None}

    def order(self, prompt_id: str) -> list[str]:
        return [node for _, node in self.executing(prompt_id) if node]

    def close(self) -> None:
        real.stop(self.proc, 10)


class DeviceSampler:
    """The block device's read bytes every 20 ms, with the wall clock, in a thread."""

    def __init__(self, dev: str):
        import threading

        self.dev, self.samples, self.stop_flag = dev, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_flag.is_set():
            self.samples.append((time.time(), real.device_read_bytes(self.dev)))
            self.stop_flag.wait(0.02)

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=5)

    def read_between(self, t0: float, t1: float) -> int:
        """Bytes the device read from `t0` to `t1` (the samples nearest inside them)."""
        inside = [b for t, b in self.samples if t0 <= t <= t1]
        return inside[-1] - inside[0] if len(inside) > 1 else 0


def submit(server: real.Server, prompt: dict, client: str) -> str:
    return json.loads(server._post("/prompt", {"prompt": prompt, "client_id": client}))["prompt_id"]


def wait_done(server: real.Server, pid: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{server.port}/history/{pid}", timeout=60).read())
        status = h.get(pid, {}).get("status", {})
        if status.get("completed") is not None:
            if status.get("status_str") != "success":
                raise RuntimeError(f"prompt failed: {status}; log {server.log_path}")
            return
        time.sleep(0.05)
    raise RuntimeError(f"prompt not done within {timeout} s; log {server.log_path}")


def file_figures(mount, rel_end: str) -> dict:
    for f in mount.stats().get("files", []):
        if f.get("path", "").endswith(rel_end):
            return f
    return {}


def install_node(comfyui: Path, on: bool) -> None:
    link = comfyui / "custom_nodes" / "tierfs"
    if link.is_symlink() or link.exists():
        link.unlink()
    if on:
        link.symlink_to(NODE_DIR)


def one_side(args, disk, root: Path, side: str, budget: int, size: int) -> dict:
    """Every scenario on one fresh server (and a fresh mount for `mount` and `node`)."""
    mount = None
    install_node(args.comfyui, side == "node")
    try:
        if side == "plain":
            yaml = real.paths_yaml(root, disk.mnt / "models", "plain")
        else:
            mount = bench.Mount(disk.mnt / "models", root, budget)
            text = subprocess.run([str(bench.BIN), "comfyui-config", str(mount.mnt)], capture_output=True,
                                  text=True, check=True, timeout=30).stdout
            yaml = root / "paths-tierfs.yaml"
            yaml.write_text(text)
        sources.drop_caches()
        time.sleep(0.5)
        server = real.Server(args, yaml, root)
        events = Events(args.python, server.port, root)
        try:
            runs = []
            for i in range(1 + args.reps):
                case = "first" if i == 0 else "later"
                if i:
                    server.free()
                runs.append(measure(server, events, mount, disk, size, case,
                                    [two_expert_workflow(*CKPTS, args.steps)]))
            server.free()
            runs.append(measure(server, events, mount, disk, size, "queued",
                                [real.workflow(CKPTS[0], 256, args.steps), real.workflow(CKPTS[1], 256, args.steps)]))
            node_log = server.log_path.read_text(errors="replace")
            return {"side": side, "runs": runs,
                    "node_lines": [ln for ln in node_log.splitlines() if "[tierfs]" in ln][:20]}
        finally:
            events.close()
            server.close()
    finally:
        install_node(args.comfyui, False)
        if mount:
            mount.close()


def measure(server, events: Events, mount, disk, size: int, case: str, prompts: list[dict]) -> dict:
    s0 = {c: file_figures(mount, c) for c in CKPTS} if mount else {}
    d0 = real.device_read_bytes(disk.dev)
    sampler = DeviceSampler(disk.dev)
    t0 = time.perf_counter()
    try:
        ids = [submit(server, p, events.client) for p in prompts]
        for pid in ids:
            wait_done(server, pid)
        elapsed = time.perf_counter() - t0
        disk_bytes = real.device_read_bytes(disk.dev) - d0
        time.sleep(0.5)  # the last events
    finally:
        sampler.stop()
    windows = [events.node_windows(pid) for pid in ids]
    order = [events.order(pid) for pid in ids]
    if len(ids) == 1:
        win_a, win_b = windows[0].get("1"), windows[0].get("2")
    else:
        win_a, win_b = windows[0].get("1"), windows[1].get("1")
    load_a = win_a[1] - win_a[0] if win_a else None
    load_b = win_b[1] - win_b[0] if win_b else None
    row = {"case": case, "s": elapsed, "disk": disk_bytes / size, "load_a": load_a, "load_b": load_b,
           "disk_during_b": (sampler.read_between(*win_b) / size) if win_b else None,
           "order": order, "node_windows": windows}
    if mount:
        s1 = {c: file_figures(mount, c) for c in CKPTS}
        row["stall_b"] = s1[CKPTS[1]].get("stall_seconds", 0) - s0.get(CKPTS[1], {}).get("stall_seconds", 0)
        row["stall_a"] = s1[CKPTS[0]].get("stall_seconds", 0) - s0.get(CKPTS[0], {}).get("stall_seconds", 0)
        row["modes"] = {c: s1[c].get("mode") for c in CKPTS}
        row["plan"] = mount.stats().get("plan")
    print(f"    {case:6} {elapsed:6.2f} s  disk/ckpt {row['disk']:.2f}  load A {fmt(load_a)}  load B {fmt(load_b)}"
          f"  disk during B {row['disk_during_b'] if row['disk_during_b'] is None else round(row['disk_during_b'], 3)}"
          + (f"  B stalled {row['stall_b']:.2f} s {row['modes']}" if mount else "")
          + f"  order {order}", flush=True)
    return row


def fmt(x) -> str:
    return "-" if x is None else f"{x:.2f} s"


def secs(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(args, results: list[dict], size: int, raw_gbs: float, budget: int, cmd: str, version: str,
           date: str | None = None) -> str:
    med = statistics.median
    by = {r["side"]: r for r in results}
    if "plain" in by:
        plain_cold_b = by["plain"]["runs"][0]["load_b"]
        warm_b = med(x["load_b"] for x in by["plain"]["runs"] if x["case"] == "later")
    else:  # no reference: the wait is B's whole loader time over itself
        plain_cold_b, warm_b = float("nan"), 0.0
    out = ["# A real ComfyUI server: two models in turn, with and without tierfs's node\n",
           f"- command: `{cmd}`",
           f"- date: {date or f'{datetime.datetime.now():%Y-%m-%d %H:%M}'}; kernel {os.uname().release}; "
           f"{os.cpu_count()} CPUs",
           f"- ComfyUI {version} (`main.py --cpu`); checkpoints {', '.join(CKPTS)}: SD1.5-shaped, "
           f"{size / 1e9:.2f} GB each; source: {raw_gbs:.2f} GB/s by a cold sequential read() of the plain file ({getattr(args, 'source_text', '') or 'read-throttled RAM-backed device'}); "
           f"budget {budget / MiB:.0f} MiB (one checkpoint, not both); {args.steps} steps at 256×256",
           "- workflow: CheckpointLoaderSimple A and B, KSamplerAdvanced steps 0–½ with A and ½–1 with B, "
           "VAEDecode, SaveImage; first: caches dropped, fresh server and mount; later: after `POST /free`; "
           "queued: a prompt with A then a prompt with B, queued together",
           f"- load A, load B: the loader node's time (ComfyUI's `executing` events); on this 2-CPU machine "
           f"it is mostly ComfyUI's own CPU work: B from the page cache takes {warm_b:.2f} s (the plain folder's "
           f"later runs), cold {plain_cold_b:.2f} s; source during B: what the device read while B's loader ran, "
           f"over one checkpoint; B stalled: the seconds tierfs's readers of B waited for the disk "
           f"(`files[].stall_seconds`); **wait at the switch**: B stalled over B's cold load on the plain folder, "
           f"goal ≤ {GOAL_SWITCH_WAIT:.0%}",
           "",
           "| side | run | prompt s | disk / checkpoint | load A s | load B s | source during B | B stalled s | "
           "wait at switch | execution order |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        for x in r["runs"]:
            stall = f"{x['stall_b']:.2f}" if "stall_b" in x else "-"
            wait = f"{x['stall_b'] / plain_cold_b:.1%}" if "stall_b" in x else "-"
            if x.get("modes", {}).get(CKPTS[1]) == "passthrough":
                # The kernel reads a passthrough file: the mount sees no reader wait.
                stall = wait = "- (passthrough)"
            during = "-" if x.get("disk_during_b") is None else f"{x['disk_during_b']:.2f}"
            order = " / ".join(" ".join(o) for o in x["order"])
            out.append(f"| {r['side']} | {x['case']} | {x['s']:.2f} | {x['disk']:.2f} | {secs(x['load_a'])} | "
                       f"{secs(x['load_b'])} | {during} | {stall} | {wait} | {order} |")
    out += ["", "The node's lines in ComfyUI's log:", ""]
    lines = [ln for ln in by.get("node", {}).get("node_lines", []) if "[tierfs]" in ln]
    out += [f"    {ln}" for ln in lines] or ["    (none)"]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui", type=Path, required=True, help="a ComfyUI checkout (its main.py)")
    ap.add_argument("--python", type=Path, required=True, help="a Python with ComfyUI's requirements")
    ap.add_argument("--reps", type=int, default=2, help="later runs of the workflow")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--sides", default="plain,mount,node")
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/tierfs-bench-data"))
    ap.add_argument("--source", choices=("1g", "disk"), default="1g",
                    help="1g: the device read-throttled to 1 GB/s; disk: slow_sources.py's hard-disk class")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--render", type=Path, help="render the table again from a results .json (with the "
                    "--out, --steps and --reps of its run)")
    args = ap.parse_args()
    if args.out is None:
        name = "two-models.md" if args.source == "1g" else f"two-models-{args.source}.md"
        args.out = HERE / "results" / "comfyui_node" / name
    if args.render:
        saved = json.loads(args.render.read_text())
        args.source_text = saved.get("source_text", "")
        args.out.write_text(render(args, saved["results"], saved["size"], saved["source_gbs"], saved["budget"],
                                   saved["command"], saved["comfyui"], saved.get("date")))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (RAM-backed source, drop_caches, mounts)")
    if not (args.comfyui / "main.py").exists():
        raise SystemExit(f"{args.comfyui}: no ComfyUI main.py there")
    if "node" in args.sides and not (NODE_DIR / "__init__.py").exists():
        raise SystemExit(f"{NODE_DIR}: the node is not there")
    bench.BIN = args.tierfs
    stored = []
    for i, name in enumerate(CKPTS):
        path = args.data / "comfyui" / name
        real.make_checkpoint(args, path, seed=100 + i)
        stored.append(path)
    size = stored[0].stat().st_size
    budget = size + size // 2
    version = subprocess.run([str(args.python), "-c", "import comfyui_version; print(comfyui_version.__version__)"],
                             cwd=args.comfyui, capture_output=True, text=True, timeout=60).stdout.strip()
    root = Path(tempfile.mkdtemp(prefix="tierfs-comfynode.", dir="/var/tmp"))
    results = []
    try:
        with guest_memory.SteadyMemory(), sources.RamDisk(2 * size + 512 * MiB, root) as disk:
            throttle = sources.Throttle(disk.majmin)
            models = None
            for p in stored:
                models = disk.put(p, f"models/checkpoints/{p.name}").parent
            disk_class = None
            if args.source == "disk":
                disk_class = slow_sources.DiskSource(disk, throttle)
                args.source_text = disk_class.describe
            else:
                throttle.set(int(1e9))
                args.source_text = "read-throttled RAM-backed device"
            raw = sources.cold_read_gbs(models / CKPTS[0])
            for side in args.sides.split(","):
                print(f"{side}:", flush=True)
                results.append(one_side(args, disk, root, side, budget, size))
            if disk_class:
                disk_class.close()
            throttle.set(0)
            throttle.close()
        cmd = "sudo .venv/bin/python tests/bench/comfyui_node.py " + " ".join(sys.argv[1:])
        machine.write_results(args.out, render(args, results, size, raw, budget, cmd.strip(), version), {
            "results": results, "size": size, "source_gbs": raw, "budget": budget, "command": cmd.strip(),
            "comfyui": version, "source_text": args.source_text,
            "date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}"})
    finally:
        install_node(args.comfyui, False)
        bench.cleanup(root)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
