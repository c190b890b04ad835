"""The ComfyUI custom node in ``comfyui-node/`` (Python only), without ComfyUI.

The node's package is loaded by path (its folder name has a dash). Covered: the execution
order of real workflow shapes (compared with ComfyUI's own ``ExecutionList`` on these and on
random graphs when ``TIERFS_COMFYUI`` names a ComfyUI checkout; the expected orders written
here are ComfyUI 0.8.0's), model name
resolution and mount detection on a real tierfs mount, the control writer against a real
mount (``prefetch``; ``plan`` bytes and a refused command), the planner's queue logic, the
fast-disk wrapper on a module shaped like ``comfy.storage``, the hooks with a fake prompt
server, and that a mount that stops answering never blocks the caller.
"""

from __future__ import annotations

import copy
import errno
import importlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import comfyui_workflows as W
import gen
from conftest import REPO, fresh_dir, quiesce

NODE_DIR = REPO / "comfyui-node"
PKG = "tierfs_comfyui_node"


def load_package(name: str = PKG, submodules: dict | None = None) -> types.ModuleType:
    """Import comfyui-node/ as package `name` (as ComfyUI does, from its __init__.py), with
    stand-ins for some of its submodules (`submodules`: short name -> module)."""
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
    for short, mod in (submodules or {}).items():
        sys.modules[f"{name}.{short}"] = mod
    spec = importlib.util.spec_from_file_location(name, NODE_DIR / "__init__.py",
                                                  submodule_search_locations=[str(NODE_DIR)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


node = load_package()
graph = importlib.import_module(f"{PKG}.graph")
mounts = importlib.import_module(f"{PKG}.mounts")
control = importlib.import_module(f"{PKG}.control")
planner = importlib.import_module(f"{PKG}.planner")
hooks = importlib.import_module(f"{PKG}.hooks")
fast_disk = importlib.import_module(f"{PKG}.fast_disk")


def models(prompt, outputs=None) -> list[str]:
    """The model names a prompt's loaders name, in execution order."""
    return [r.name for r in graph.model_refs(prompt, outputs)]


def fake_get_full_path(table: dict):
    """folder_paths.get_full_path over `table` (name -> ([paths], exts)), as ComfyUI does it."""
    legacy = {"unet": "diffusion_models", "clip": "text_encoders"}

    def get_full_path(folder: str, filename: str):
        folder = legacy.get(folder, folder)
        if folder not in table:
            return None
        filename = os.path.relpath(os.path.join("/", filename), "/")
        for d in table[folder][0]:
            p = os.path.join(d, filename)
            if os.path.isfile(p):
                return p
        return None
    return get_full_path


# ----------------------------------------------------------------------------- the package

def test_package_loads_without_comfyui():
    assert node.NODE_CLASS_MAPPINGS == {} and node.NODE_DISPLAY_NAME_MAPPINGS == {}
    assert node.WEB_DIRECTORY == "./web"
    assert node.find_mounts() == []


def test_pyproject_fields():
    import tomllib
    data = tomllib.loads((NODE_DIR / "pyproject.toml").read_text())
    project, comfy = data["project"], data["tool"]["comfy"]
    assert project["name"] == "comfyui-tierfs"
    assert project["version"].count(".") == 2
    assert project["description"]
    assert project["license"] == {"text": "Apache-2.0"}  # the repository's LICENSE
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200]
    assert project.get("dependencies", []) == []
    assert {"PublisherId", "DisplayName", "Icon"} <= set(comfy)


def test_modules_import_no_comfyui():
    """Only the hook-up module imports ComfyUI, and only when called."""
    code = (
        "import importlib, importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('n', {str(NODE_DIR / '__init__.py')!r},"
        f" submodule_search_locations=[{str(NODE_DIR)!r}])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['n'] = m; spec.loader.exec_module(m)\n"
        "for sub in ('graph', 'mounts', 'control', 'planner', 'hooks', 'fast_disk', 'comfy_setup'):\n"
        "    importlib.import_module('n.' + sub)\n"
        "bad = [x for x in ('folder_paths', 'server', 'nodes', 'comfy', 'torch') if x in sys.modules]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# ----------------------------------------------------------------------------- graph order

def test_sd15_order():
    # ComfyUI 0.8.0 runs the default graph in this order.
    assert graph.execution_order(W.SD15) == ["4", "5", "7", "6", "3", "8", "9"]
    assert models(W.SD15) == ["v1-5-pruned-emaonly.safetensors"]


def test_wan22_two_experts_order():
    """The high-noise expert is loaded before the low-noise one (its sampler runs first); the
    VAE and the text encoder come first, as ComfyUI 0.8.0 runs them."""
    assert graph.execution_order(W.WAN22) == [
        "39", "59", "38", "7", "6", "37", "54", "57", "56", "55", "58", "8", "60", "61"]
    assert models(W.WAN22) == [
        "wan_2.1_vae.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors",
        "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
        "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"]
    refs = graph.model_refs(W.WAN22)
    assert [r.folders for r in refs] == [("vae",), ("text_encoders",), ("diffusion_models",),
                                         ("diffusion_models",)]


def test_flux_dual_clip_order():
    assert graph.execution_order(W.FLUX) == [
        "10", "27", "12", "17", "16", "11", "6", "26", "22", "25", "13", "8", "9"]
    refs = graph.model_refs(W.FLUX)
    assert [(r.input_name, r.name) for r in refs] == [
        ("vae_name", "ae.safetensors"), ("unet_name", "flux1-dev.safetensors"),
        ("clip_name1", "t5xxl_fp16.safetensors"), ("clip_name2", "clip_l.safetensors")]


def test_lora_chain_controlnet_upscale_two_outputs():
    order = graph.execution_order(W.SDXL_LORAS)
    assert order == ["4", "21", "5", "13", "12", "10", "11", "7", "6", "14", "3", "8", "20",
                     "22", "23"]
    # the output order ComfyUI was given does not change this graph's order
    assert graph.execution_order(W.SDXL_LORAS, outputs=["23", "20"]) == order
    refs = graph.model_refs(W.SDXL_LORAS)
    assert [(r.name, r.folders) for r in refs] == [
        ("sd_xl_base_1.0.safetensors", ("checkpoints",)),
        ("4x-UltraSharp.safetensors", ("upscale_models",)),
        ("sdxl_canny.safetensors", ("controlnet",)),
        ("style/watercolor.safetensors", ("loras",)),
        ("detail.safetensors", ("loras",))]


def test_cached_nodes_do_not_run():
    """Nodes ComfyUI has cached from an earlier run (its execution_cached message) do not run,
    so their models are not loaded again (orders as ComfyUI 0.8.0 gives them)."""
    assert graph.execution_order(W.SD15, cached=["4"]) == ["5", "7", "6", "3", "8", "9"]
    assert models(W.SD15) and graph.model_refs(W.SD15, cached=["4"]) == []
    assert graph.execution_order(W.WAN22, cached=["37", "38", "39"]) == [
        "59", "7", "6", "54", "57", "56", "55", "58", "8", "60", "61"]
    assert [r.name for r in graph.model_refs(W.WAN22, cached=["37", "38", "39"])] == [
        "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"]


def test_only_what_the_outputs_need():
    """A loader nothing leads from to an output is not run by ComfyUI; a bypassed LoRA is not
    in the API format at all (the frontend rewires its inputs to its outputs)."""
    p = copy.deepcopy(W.SD15)
    p["40"] = {"class_type": "LoraLoader", "inputs": {"lora_name": "dangling.safetensors",
                                                       "model": ["4", 0], "clip": ["4", 1]}}
    p["41"] = {"class_type": "VAELoader", "inputs": {"vae_name": "unused.safetensors"}}
    assert models(p) == ["v1-5-pruned-emaonly.safetensors"]
    bypassed = copy.deepcopy(W.SDXL_LORAS)  # LoRA "10" bypassed: 11 takes 4's outputs
    del bypassed["10"]
    bypassed["11"]["inputs"].update(model=["4", 0], clip=["4", 1])
    assert "style/watercolor.safetensors" not in models(bypassed)
    assert "detail.safetensors" in models(bypassed)
    # only the outputs ComfyUI was told to run (partial execution) count
    assert models(W.SDXL_LORAS, outputs=["20"]) == [
        "sd_xl_base_1.0.safetensors", "sdxl_canny.safetensors", "style/watercolor.safetensors",
        "detail.safetensors"]


def test_linked_names_generic_names_and_dedupe():
    p = copy.deepcopy(W.SD15)
    p["4"]["inputs"]["ckpt_name"] = ["30", 0]  # the name comes from another node: unknown
    p["30"] = {"class_type": "PrimitiveString", "inputs": {"value": "from-a-node.safetensors"}}
    p["31"] = {"class_type": "MyPackLoader", "inputs": {"path": "custom/thing.gguf",
                                                         "other": "notes.txt", "n": 3}}
    p["32"] = {"class_type": "MyPackApply", "inputs": {"model": ["31", 0], "latent": ["3", 0]}}
    p["8"]["inputs"]["samples"] = ["32", 0]
    p["33"] = {"class_type": "CheckpointLoaderSimple",
               "inputs": {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}}
    p["34"] = {"class_type": "PreviewImage", "inputs": {"images": ["35", 0]}}
    p["35"] = {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["33", 2]}}
    refs = graph.model_refs(p)
    names = [r.name for r in refs]
    # the primitive's value counts (any string ending in a model extension), the link does not
    assert "from-a-node.safetensors" in names and "notes.txt" not in names
    generic = [r for r in refs if r.name == "custom/thing.gguf"]
    assert generic and generic[0].folders == ()
    # resolved paths are deduplicated, first occurrence kept
    got = graph.resolve_paths(refs, lambda f, n: f"/m/{f}/{n}" if f == "checkpoints" else None,
                              ["checkpoints"])
    assert got.count("/m/checkpoints/v1-5-pruned-emaonly.safetensors") == 1


@pytest.mark.parametrize("bad", [
    None, [], "prompt", 42, {"1": None}, {"1": {"inputs": {}}}, {"1": {"class_type": 3}},
    {"1": {"class_type": "SaveImage", "inputs": [1, 2]}},
    {"1": {"class_type": "SaveImage", "inputs": {"images": ["404", 0]}}},
    {"1": {"class_type": "SaveImage", "inputs": {"images": ["2", 0]}},
     "2": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["3", 2]}},
     "3": {"class_type": "KSampler", "inputs": {"latent_image": ["2", 0], "ckpt_name": "c.sft"}}},
    {"1": {"class_type": "SaveImage", "inputs": {"images": [1, 0], "x": ["2"], "y": [None, None]}}},
    {5: {"class_type": "SaveImage"}},
], ids=["none", "list", "str", "int", "node-none", "no-class", "class-int", "inputs-list",
        "missing-node", "cycle", "odd-links", "int-key"])
def test_malformed_prompts_never_raise(bad):
    graph.execution_order(bad)
    graph.model_refs(bad)
    assert graph.prompt_models(bad, lambda f, n: None, lambda p: None) == {}


def test_gguf_and_class_specific_inputs():
    p = {
        "1": {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": "wan-Q8_0.gguf"}},
        "2": {"class_type": "DualCLIPLoaderGGUF", "inputs": {
            "clip_name1": "t5-Q5.gguf", "clip_name2": "clip_l.safetensors", "type": "flux"}},
        "3": {"class_type": "CLIPVisionLoader", "inputs": {"clip_name": "vit-h.safetensors"}},
        "4": {"class_type": "SaveImage", "inputs": {"a": ["1", 0], "b": ["2", 0], "c": ["3", 0]}},
    }
    folders = {r.name: r.folders for r in graph.model_refs(p)}
    assert folders == {"wan-Q8_0.gguf": ("unet_gguf", "diffusion_models"),
                       "t5-Q5.gguf": ("clip_gguf", "text_encoders"),
                       "clip_l.safetensors": ("clip_gguf", "text_encoders"),
                       "vit-h.safetensors": ("clip_vision",)}


COMFYUI_CHECKOUT = os.environ.get("TIERFS_COMFYUI")


@pytest.mark.skipif(not COMFYUI_CHECKOUT, reason="set TIERFS_COMFYUI to a ComfyUI checkout to "
                    "compare with its executor")
def test_order_matches_comfyui_executor():
    """graph.execution_order against ComfyUI's own ExecutionList (TIERFS_COMFYUI=checkout), on
    the workflows here and on random graphs, with and without cached nodes. Node classes are
    stand-ins (ComfyUI's ``nodes`` module is not imported): outputs are the known output
    classes."""
    import asyncio
    import random

    sys.path.insert(0, COMFYUI_CHECKOUT)
    saved = sys.modules.get("nodes")
    classes = ["SaveImage", "PreviewImage", "SaveVideo", "VAEDecode", "KSampler", "VAELoader",
               "CheckpointLoaderSimple", "CLIPTextEncode"]
    for wf in W.WORKFLOWS.values():
        classes += [n["class_type"] for n in wf.values()]

    def make(name):
        return type(name, (), {"OUTPUT_NODE": name in graph.KNOWN_OUTPUT_CLASSES,
                               "FUNCTION": "run", "run": lambda self: None,
                               "INPUT_TYPES": classmethod(lambda cls: {})})
    sys.modules["nodes"] = types.SimpleNamespace(NODE_CLASS_MAPPINGS={c: make(c) for c in classes})
    try:
        from comfy_execution.graph import DynamicPrompt, ExecutionList

        class Cache:
            def __init__(self, cached):
                self.cached = set(cached)

            def get(self, k):
                return object() if k in self.cached else None

            def set(self, k, v):
                pass

        async def comfy_order(prompt, outputs, cached):
            el = ExecutionList(DynamicPrompt(prompt), Cache(cached))
            for o in outputs:
                el.add_node(o)
            order = []
            while not el.is_empty():
                node_id, error, _ = await el.stage_node_execution()
                if error is not None:
                    break
                order.append(node_id)
                el.complete_node_execution()
            return order

        rng = random.Random(7)
        cases = [(wf, []) for wf in W.WORKFLOWS.values()]
        cases += [(wf, [n for n in wf if rng.random() < 0.3]) for wf in W.WORKFLOWS.values()
                  for _ in range(10)]
        for _ in range(300):
            ids = list(dict.fromkeys(str(rng.randint(1, 60)) for _ in range(rng.randint(1, 14))))
            p = {}
            for i, nid in enumerate(ids):
                inputs = {f"in{k}": [ids[rng.randrange(i)], rng.randint(0, 2)]
                          if i and rng.random() < 0.8 else "x" for k in range(rng.randint(0, 4))}
                p[nid] = {"class_type": rng.choice(classes[:8]), "inputs": inputs}
            cases.append((p, [n for n in p if rng.random() < 0.2]))
        for prompt, cached in cases:
            outputs = graph.output_nodes(prompt)
            rng.shuffle(outputs)
            want = asyncio.run(comfy_order(prompt, outputs, cached))
            assert graph.execution_order(prompt, outputs, cached=cached) == want, (prompt, cached)
    finally:
        sys.path.remove(COMFYUI_CHECKOUT)
        if saved is None:
            sys.modules.pop("nodes", None)
        else:
            sys.modules["nodes"] = saved


# ----------------------------------------------------------------------------- mounts, paths

@pytest.fixture(scope="module")
def node_source(tmp_path_factory) -> Path:
    """A small ComfyUI models tree: two DiT-like files big enough to watch a prefetch."""
    root = fresh_dir("node_src")
    for rel, seed in (("checkpoints/v1-5-pruned-emaonly.safetensors", 1),
                      ("diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", 2),
                      ("diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", 3),
                      ("text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors", 4),
                      ("vae/wan_2.1_vae.safetensors", 5)):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        gen.write_streaming(p, gen.dit_specs(256, 1024, 4, ("BF16",)), seed=seed)
    (root / "loras").mkdir()
    (root / "loras" / "x.ckpt").write_bytes(b"not a safetensors")
    return root


def comfy_table(base: Path) -> dict:
    exts = {".safetensors", ".sft", ".ckpt"}
    return {name: ([str(base / sub)], exts) for name, sub in (
        ("checkpoints", "checkpoints"), ("diffusion_models", "diffusion_models"),
        ("text_encoders", "text_encoders"), ("vae", "vae"), ("loras", "loras"))}


def test_registry_finds_real_mount(mount, node_source, workdir, caplog):
    caplog.set_level(logging.INFO, logger="tierfs")
    m = mount(node_source, "256MiB")
    local = workdir / "local_models"
    (local / "vae").mkdir(parents=True)
    (local / "vae" / "local.safetensors").write_bytes(gen.small_safetensors(1))
    table = comfy_table(m.mnt)
    table["vae"] = ([str(local / "vae"), str(m.mnt / "vae")], {".safetensors"})
    reg = mounts.MountRegistry(table, ttl=60)
    found = reg.find_mounts()
    assert [x.root for x in found] == [str(m.mnt)]
    mt = found[0]
    assert set(mt.folders) == {"checkpoints", "diffusion_models", "text_encoders", "vae", "loras"}
    assert mt.fuse_tierfs is True  # /proc/self/mountinfo agrees
    st = mt.stats()
    assert "cache" in st and "files" in st
    assert mt.control_path == str(m.mnt / ".tierfs" / "control")
    assert reg.message is None
    assert sum("tierfs mount at" in r.getMessage() for r in caplog.records) == 1
    # a file on the mount, by its path; a local file is not on a mount
    assert reg.locate(str(m.mnt / "vae" / "wan_2.1_vae.safetensors"))[1] == "vae/wan_2.1_vae.safetensors"
    assert reg.locate(str(local / "vae" / "local.safetensors")) is None
    assert mounts.find_mount_root(str(m.mnt / "checkpoints")) == str(m.mnt)
    assert mounts.find_mount_root(str(local)) is None


def test_no_mount_hint_logged_once(workdir, caplog):
    caplog.set_level(logging.INFO, logger="tierfs")
    (workdir / "checkpoints").mkdir()
    reg = mounts.MountRegistry({"checkpoints": ([str(workdir / "checkpoints")], set())}, ttl=0)
    assert reg.find_mounts() == [] and reg.find_mounts() == []
    hint = reg.message
    assert hint and "tierfs mount MODELS MNT --ram-cache 16GiB" in hint
    assert "tierfs comfyui-config MNT > tierfs_paths.yaml" in hint
    assert "--extra-model-paths-config" in hint
    assert sum("No ComfyUI model folder is on a tierfs mount" in r.getMessage()
               for r in caplog.records) == 1


def test_prompt_models_through_symlinked_and_relative_folders(mount, node_source, workdir,
                                                              monkeypatch):
    """ComfyUI's folders may be links into the mount (a models dir symlinked to it) or
    relative paths; files resolve to paths relative to the mount root. A file that is not on
    a mount, or is not a model file, is left out."""
    m = mount(node_source, "256MiB")
    comfy = workdir / "ComfyUI" / "models"
    comfy.mkdir(parents=True)
    (comfy / "diffusion_models").symlink_to(m.mnt / "diffusion_models")  # a linked folder
    (comfy / "vae").mkdir()
    (comfy / "vae" / "wan_2.1_vae.safetensors").write_bytes(gen.small_safetensors(2))  # local
    monkeypatch.chdir(m.mnt)
    table = {
        "diffusion_models": ([str(comfy / "diffusion_models")], set()),
        "text_encoders": (["text_encoders"], set()),  # relative to the working directory
        "vae": ([str(comfy / "vae"), str(m.mnt / "vae")], set()),
        "loras": ([str(m.mnt / "loras")], set()),
    }
    reg = mounts.MountRegistry(table, ttl=60)
    p = copy.deepcopy(W.WAN22)
    p["70"] = {"class_type": "LoraLoaderModelOnly", "inputs": {
        "lora_name": "x.ckpt", "strength_model": 1.0, "model": ["54", 0]}}
    p["57"]["inputs"]["model"] = ["70", 0]
    got = graph.prompt_models(p, fake_get_full_path(table), reg.locate, all_folders=list(table))
    # the VAE resolves to the local copy (first in ComfyUI's list): not on the mount
    assert got == {str(m.mnt): [
        "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
        "diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
        "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"]}


def test_resolve_paths_fallback_and_errors():
    refs = [graph.ModelRef("1", "path", "a.safetensors", ()),
            graph.ModelRef("2", "ckpt_name", "b.safetensors", ("checkpoints",)),
            graph.ModelRef("3", "ckpt_name", "missing.safetensors", ("checkpoints",)),
            graph.ModelRef("4", "vae_name", "taesd", ("vae",))]

    def resolver(folder, name):
        if folder == "broken":
            raise RuntimeError("boom")
        return {("loras", "a.safetensors"): "/x/loras/a.safetensors",
                ("checkpoints", "b.safetensors"): "/x/ck/../ck/b.safetensors"}.get((folder, name))
    got = graph.resolve_paths(refs, resolver, ["broken", "checkpoints", "loras"])
    assert got == ["/x/loras/a.safetensors", "/x/ck/b.safetensors"]


# ----------------------------------------------------------------------------- control writer

def test_writer_sends_exact_bytes(workdir):
    target = workdir / "control"
    target.write_bytes(b"")
    cmd = planner.plan_command(["diffusion_models/high.safetensors", "vae/v.safetensors"])
    assert cmd == b"plan\ndiffusion_models/high.safetensors\nvae/v.safetensors\n"
    assert planner.plan_command([]) == b"plan\n"
    r = control.write_command(str(target), cmd, timeout=5)
    assert r.ok and target.read_bytes() == cmd
    w = control.ControlWriter(timeout=5, control_path=lambda root: os.path.join(root, "control"))
    target.write_bytes(b"")  # the control file takes each write whole; a plain file does not
    assert w.submit(str(workdir), b"plan\n")
    assert w.flush(5)
    assert target.read_bytes() == b"plan\n" and w.results[-1].ok


def test_prefetch_through_writer_warms_file(mount, node_source, caplog):
    caplog.set_level(logging.INFO, logger="tierfs")
    m = mount(node_source, "256MiB")
    rel = "diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors"
    src = node_source / rel
    hn, _ = gen.read_header(src)
    want = src.stat().st_size - 8 - hn
    before = (m.file_stats(rel) or {}).get("cached_bytes", 0)
    w = control.ControlWriter(timeout=5)
    assert w.submit(str(m.mnt), f"prefetch {rel}\n".encode())
    assert w.flush(10) and w.results[-1].ok, w.results[-1].describe()
    deadline = time.monotonic() + 20
    while (m.file_stats(rel) or {}).get("cached_bytes", 0) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    quiesce(m)
    assert (m.file_stats(rel) or {}).get("cached_bytes", 0) >= want > before


def test_refused_command_logged_clearly(mount, node_source, caplog):
    """An invalid command gets EINVAL and changes nothing; the log line names the command.
    A `plan` the daemon does not know (an older daemon) is refused the same way; a daemon
    that knows it accepts it."""
    caplog.set_level(logging.INFO, logger="tierfs")
    m = mount(node_source, "256MiB")
    used0 = m.stats()["cache"]["used_bytes"]
    w = control.ControlWriter(timeout=5)
    w.submit(str(m.mnt), b"prefetch ../../etc/passwd\n")
    assert w.flush(10)
    r = w.results[-1]
    assert r.error == errno.EINVAL and not r.ok
    msgs = [rec.getMessage() for rec in caplog.records if "refused 'prefetch'" in rec.getMessage()]
    assert len(msgs) == 1 and "EINVAL" in msgs[0] and str(m.mnt) in msgs[0]
    w.submit(str(m.mnt), b"prefetch ../../etc/passwd\n")  # the same failure is logged once
    assert w.flush(10)
    assert sum("refused 'prefetch'" in rec.getMessage() for rec in caplog.records) == 1

    plan = planner.plan_command(["vae/wan_2.1_vae.safetensors"])
    w.submit(str(m.mnt), plan)
    assert w.flush(10)
    r = w.results[-1]
    assert r.command == plan
    assert r.ok or r.error == errno.EINVAL, r.describe()
    if r.error == errno.EINVAL:
        assert any("refused 'plan'" in rec.getMessage() and "older" in rec.getMessage()
                   for rec in caplog.records)
        assert m.stats()["cache"]["used_bytes"] == used0
    w.submit(str(m.mnt), b"plan\n")  # clearing: accepted, or refused the same way
    assert w.flush(10) and (w.results[-1].ok or w.results[-1].error == errno.EINVAL)
    assert m.alive()


def test_vanished_mount_drops_command(workdir, caplog):
    caplog.set_level(logging.INFO, logger="tierfs")
    w = control.ControlWriter(timeout=2)
    gone = str(workdir / "no-such-mount")
    for _ in range(3):
        w.submit(gone, b"plan\n")
        assert w.flush(5)
    assert w.results[-1].error == errno.ENOENT
    assert sum("mount gone" in r.getMessage() for r in caplog.records) == 1


# ----------------------------------------------------------------------------- never blocking

def test_blocking_control_path_never_blocks_caller(workdir, caplog):
    """A control path whose open() blocks (a FIFO nobody reads) costs the caller at most the
    timeout; submit() returns at once; later commands for that mount are dropped while the
    write is stuck and flow again once it returns."""
    caplog.set_level(logging.INFO, logger="tierfs")
    root = workdir / "hung"
    (root / ".tierfs").mkdir(parents=True)
    fifo = root / ".tierfs" / "control"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    r = control.write_command(str(fifo), b"plan\n", timeout=0.3)
    assert r.timed_out and time.monotonic() - t0 < 1.5
    w = control.ControlWriter(timeout=0.3)
    t0 = time.monotonic()
    for _ in range(100):
        w.submit(str(root), b"plan\na.safetensors\n")
    assert time.monotonic() - t0 < 0.5, "submit() waited on the mount"
    assert w.flush(5)
    assert w.results[-1].timed_out
    assert not w.submit(str(root), b"plan\n"), "a stuck mount should drop new commands"
    assert any("not answering" in rec.getMessage() for rec in caplog.records)
    # unblock both stuck writers (each open() waits for a reader)
    for _ in range(2):
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        time.sleep(0.3)
        os.close(fd)
    deadline = time.monotonic() + 5
    while not w.submit(str(root), b"plan\n") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert time.monotonic() < deadline, "the mount stayed marked stuck after its write returned"


def test_stopped_daemon_never_blocks(mount, node_source, workdir):
    """A FUSE mount whose daemon stops answering (SIGSTOP): the control write and the mount
    probe return within their timeouts; everything completes once it answers again."""
    m = mount(node_source, "256MiB")
    table = comfy_table(m.mnt)
    reg = mounts.MountRegistry(table, ttl=0, probe_timeout=0.5)
    assert [x.root for x in reg.find_mounts()] == [str(m.mnt)]
    w = control.ControlWriter(timeout=0.5)
    os.kill(m.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = control.write_command(str(m.mnt / ".tierfs" / "control"), b"drop", timeout=0.5)
        assert r.timed_out and time.monotonic() - t0 < 2
        t0 = time.monotonic()
        for _ in range(5):
            w.submit(str(m.mnt), b"drop")
        reg.find_mounts(refresh=True)
        assert time.monotonic() - t0 < 2, "submit or the probe waited on a stopped daemon"
        t0 = time.monotonic()
        for _ in range(20):  # a probe that does not return costs its timeout once
            reg.find_mounts(refresh=True)
        assert time.monotonic() - t0 < 1
        with pytest.raises(TimeoutError):
            mounts.Mount(str(m.mnt)).stats(timeout=0.3)
        assert w.flush(5)
    finally:
        os.kill(m.pid, signal.SIGCONT)
    assert reg.find_mounts(refresh=True)
    assert m.alive()


# ----------------------------------------------------------------------------- planner

def test_planner_running_first_then_queued():
    pl = planner.Planner()
    pl.set_models("A", {"/mnt": ["vae.safetensors", "high.safetensors", "low.safetensors"]})
    pl.set_models("B", {"/mnt": ["flux.safetensors", "vae.safetensors"], "/other": ["x.sft"]})
    pl.set_models("C", {"/mnt": ["c.safetensors"]})
    pl.sync(running=["B"], queued=["A", "C"])
    assert pl.plans() == {"/mnt": ["flux.safetensors", "vae.safetensors", "high.safetensors",
                                   "low.safetensors", "c.safetensors"],
                          "/other": ["x.sft"]}
    # B finishes, A starts: B is forgotten, /other is cleared once, then no longer mentioned
    pl.mark_sent("/mnt", pl.plans()["/mnt"])
    pl.mark_sent("/other", ["x.sft"])
    pl.sync(running=["A"], queued=["C"])
    assert not pl.knows("B")
    changed = pl.changed()
    assert changed == {"/mnt": ["vae.safetensors", "high.safetensors", "low.safetensors",
                                "c.safetensors"], "/other": []}
    for root, plan in changed.items():
        pl.mark_sent(root, plan)
    assert pl.changed() == {}
    pl.sync(running=[], queued=[])
    assert pl.changed() == {"/mnt": []} and pl.tracked == []


def test_planner_bounded():
    pl = planner.Planner(max_prompts=4, max_models=5)
    ids = [f"p{i}" for i in range(10)]
    pl.sync(running=[ids[0]], queued=ids[1:])
    assert pl.missing() == ids[:4]  # only the first max_prompts are worth resolving
    for pid in ids:
        pl.set_models(pid, {"/m": [f"{pid}-{k}.safetensors" for k in range(9)]})
    assert len(pl.tracked) <= 4 and pl.tracked[0] == "p0"
    assert pl.plans()["/m"] == [f"p0-{k}.safetensors" for k in range(5)]
    many = [f"dir/{'x' * 200}-{k}.safetensors" for k in range(200)]
    cut = planner.bounded_plan(many)
    assert len(cut) <= planner.MAX_PLAN_FILES
    assert len(planner.plan_command(cut)) <= planner.MAX_PLAN_BYTES
    assert planner.bounded_plan(["a.sft", " b.sft", "c\nd.sft", "../e.sft", "/f.sft", "a.sft",
                                 "ok/g.gguf"]) == ["a.sft", "ok/g.gguf"]


# ----------------------------------------------------------------------------- hooks

class RecordingWriter:
    def __init__(self):
        self.sent: list[tuple[str, bytes]] = []

    def submit(self, root, command):
        self.sent.append((root, command))
        return True


def test_service_follows_queue():
    queue = {"running": [], "queued": []}
    per_prompt = {"wan": {"/mnt": ["vae.safetensors", "high.safetensors", "low.safetensors"]},
                  "flux": {"/mnt": ["flux.safetensors", "ae.safetensors"]}}
    seen_outputs = []

    def models_of(prompt, outputs, cached):
        seen_outputs.append(outputs)
        models = per_prompt[prompt["name"]]
        if "vae-node" in cached:  # as if the VAE loader's output were cached
            models = {r: [x for x in rels if x != "vae.safetensors"] for r, rels in models.items()}
        return models

    w = RecordingWriter()
    svc = hooks.PrefetchService(models_of, lambda: (queue["running"], queue["queued"]), w,
                                lambda: ["/mnt"])
    item = lambda n, pid, name: (n, pid, {"name": name}, {}, ["9"], {})  # noqa: E731
    queue["queued"] = [item(2, "id-flux", "flux"), item(1, "id-wan", "wan")]
    svc.queue_changed()
    assert svc.wait_idle(5)
    assert w.sent[-1] == ("/mnt", b"plan\nvae.safetensors\nhigh.safetensors\nlow.safetensors\n"
                                  b"flux.safetensors\nae.safetensors\n")
    assert ["9"] in seen_outputs  # the queue's outputs are used
    queue["running"], queue["queued"] = [item(1, "id-wan", "wan")], [item(2, "id-flux", "flux")]
    n = len(w.sent)
    svc.queue_changed()
    assert svc.wait_idle(5) and len(w.sent) == n  # same plan: nothing sent
    # ComfyUI reports the VAE loader cached: its file will not be opened, it leaves the plan
    svc.on_message("executing", {"node": "1", "prompt_id": "id-wan"})
    svc.on_message("execution_cached", {"nodes": ["vae-node"], "prompt_id": "id-wan"})
    assert svc.wait_idle(5)
    assert w.sent[-1] == ("/mnt", b"plan\nhigh.safetensors\nlow.safetensors\n"
                                  b"flux.safetensors\nae.safetensors\n")
    queue["running"], queue["queued"] = [item(2, "id-flux", "flux")], []
    svc.queue_changed()
    assert svc.wait_idle(5)
    assert w.sent[-1] == ("/mnt", b"plan\nflux.safetensors\nae.safetensors\n")
    queue["running"] = []
    svc.queue_changed()
    assert svc.wait_idle(5) and w.sent[-1] == ("/mnt", b"plan\n")


def test_loaders_that_ran_leave_the_running_prompts_plan():
    """A plan sent again mid-prompt (another prompt was queued) starts at the file loading now
    or next: the daemon warms a plan's first file nobody has open, which must not be a model
    the running prompt has already loaded."""
    loaders = {"n-vae": "vae.safetensors", "n-high": "high.safetensors", "n-low": "low.safetensors",
               "n-flux": "flux.safetensors"}
    order = {"wan": ["n-vae", "n-high", "n-low"], "flux": ["n-flux"]}
    queue = {"running": [], "queued": []}

    def models_of(prompt, outputs, done):
        return {"/mnt": [loaders[n] for n in order[prompt["name"]] if n not in done]}

    w = RecordingWriter()
    svc = hooks.PrefetchService(models_of, lambda: (queue["running"], queue["queued"]), w,
                                lambda: ["/mnt"])
    item = lambda n, pid, name: (n, pid, {"name": name}, {}, ["9"], {})  # noqa: E731
    queue["running"] = [item(1, "id-wan", "wan")]
    svc.queue_changed()
    assert svc.wait_idle(5)
    assert w.sent[-1] == ("/mnt", b"plan\nvae.safetensors\nhigh.safetensors\nlow.safetensors\n")
    for node, plan in (("n-vae", b"plan\nvae.safetensors\nhigh.safetensors\nlow.safetensors\n"),
                       ("n-high", b"plan\nhigh.safetensors\nlow.safetensors\n"),
                       ("sampler-high", b"plan\nlow.safetensors\n")):
        svc.on_message("executing", {"node": node, "prompt_id": "id-wan"})
        assert svc.wait_idle(5)
        assert w.sent[-1] == ("/mnt", plan), node
    # Another prompt queued while the high-noise sampler runs: the plan goes on from low noise.
    queue["queued"] = [item(2, "id-flux", "flux")]
    svc.queue_changed()
    assert svc.wait_idle(5)
    assert w.sent[-1] == ("/mnt", b"plan\nlow.safetensors\nflux.safetensors\n")
    # Messages of other prompts, malformed ones and the end-of-prompt None change nothing.
    n = len(w.sent)
    for data in ({"node": None, "prompt_id": "id-wan"}, {"node": "n-flux", "prompt_id": "id-other"},
                 {"node": 3, "prompt_id": "id-wan"}, "junk", {"prompt_id": None}):
        svc.on_message("executing", data)
    assert svc.wait_idle(5) and len(w.sent) == n


def test_on_prompt_returns_at_once_and_unchanged():
    gate = threading.Event()

    def slow_models(prompt, outputs, cached):
        gate.wait(10)  # a mount that does not answer
        return {}

    svc = hooks.PrefetchService(slow_models, lambda: ([], []), RecordingWriter(), lambda: [])
    body = {"prompt": copy.deepcopy(W.SD15), "client_id": "abc"}
    frozen = copy.deepcopy(body)
    t0 = time.monotonic()
    for _ in range(50):
        assert svc.on_prompt(body) is body
        svc.queue_changed()
    assert time.monotonic() - t0 < 0.5
    assert body == frozen
    assert svc.on_prompt("not a dict") == "not a dict"
    gate.set()
    assert svc.wait_idle(10)


def test_wrappers_idempotent():
    calls = []

    class Server:
        def queue_updated(self):
            calls.append("orig")

        def send_sync(self, event, data, sid=None):
            calls.append(("orig", event, sid))

    s = Server()
    assert hooks.wrap_queue_updated(s, lambda: calls.append("hook"))
    assert hooks.wrap_queue_updated(s, lambda: calls.append("hook"))
    s.queue_updated()
    assert calls == ["hook", "orig"]
    calls.clear()
    assert hooks.wrap_send_sync(s, lambda e, d: calls.append(("hook", e)))
    assert hooks.wrap_send_sync(s, lambda e, d: 1 / 0)  # a failing hook never reaches ComfyUI
    s.send_sync("status", {}, "sid")
    assert calls == [("orig", "status", "sid")]
    assert not hooks.wrap_send_sync(object(), lambda e, d: None)


# ----------------------------------------------------------------------------- fast disk

def fake_storage(result=False) -> types.ModuleType:
    """A module shaped like upstream comfy/storage.py."""
    mod = types.ModuleType("comfy.storage")
    mod.calls = []
    mod.args = types.SimpleNamespace(fast_disk=False, disable_fast_disk=False)

    def fast_storage(path):
        mod.calls.append(path)
        return result

    def model_fast_disk(paths):
        if mod.args.fast_disk or mod.args.disable_fast_disk:
            return not mod.args.disable_fast_disk
        results = [mod.fast_storage(p) for p in paths]  # the module global, as upstream
        return bool(results) and all(r is True for r in results)

    mod.fast_storage = fast_storage
    mod.model_fast_disk = model_fast_disk
    return mod


def test_fast_disk_wrapper(mount, node_source, workdir):
    m = mount(node_source, "256MiB")
    reg = mounts.MountRegistry(comfy_table(m.mnt), ttl=60)
    on_mount = lambda p: reg.locate(p) is not None  # noqa: E731
    storage = fake_storage(result=None)
    original = storage.fast_storage
    assert fast_disk.install(on_mount, storage)
    assert fast_disk.install(on_mount, storage)  # twice: still one wrapper
    assert getattr(storage.fast_storage, fast_disk.MARK) is original
    on = str(m.mnt / "vae" / "wan_2.1_vae.safetensors")
    off = str(workdir / "elsewhere.safetensors")
    assert storage.fast_storage(on) is True and storage.calls == []
    assert storage.fast_storage(off) is None and storage.calls == [off]  # the original's answer
    assert storage.model_fast_disk([on]) is True
    assert storage.model_fast_disk([on, off]) is False
    storage.args.disable_fast_disk = True  # ComfyUI honours it before asking fast_storage
    assert storage.model_fast_disk([on]) is False
    # a failing check lets ComfyUI decide
    broken = fake_storage(result=False)
    assert fast_disk.install(lambda p: 1 / 0, broken)
    assert broken.fast_storage(on) is False
    fast_disk.uninstall(storage)
    assert storage.fast_storage is original


def test_fast_disk_absent_is_noop(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="tierfs")
    monkeypatch.setattr(fast_disk, "_logged_absent", False)
    old = types.ModuleType("comfy.storage")  # no fast_storage: an older ComfyUI
    assert fast_disk.install(lambda p: True, old) is False
    assert not hasattr(old, "fast_storage")
    monkeypatch.setitem(sys.modules, "comfy", None)  # no comfy package at all
    assert fast_disk.install(lambda p: True) is False
    msgs = [r.getMessage() for r in caplog.records if "no per-file fast-disk choice" in r.getMessage()]
    assert len(msgs) == 1


# ----------------------------------------------------------------------------- in a fake ComfyUI

def test_setup_in_fake_comfyui(mount, node_source, monkeypatch, caplog):
    """The package loaded as ComfyUI loads it, with stand-ins for server, folder_paths, nodes
    and a routes module: the route gets (PromptServer.instance, find_mounts), a queued prompt's
    models reach the real mount's control file as one plan, in ComfyUI's order."""
    caplog.set_level(logging.INFO, logger="tierfs")
    m = mount(node_source, "256MiB")
    table = comfy_table(m.mnt)
    folder_paths = types.ModuleType("folder_paths")
    folder_paths.folder_names_and_paths = table
    folder_paths.get_full_path = fake_get_full_path(table)

    class PromptQueue:
        def __init__(self, server):
            self.server, self.queue, self.running = server, [], {}

        def put(self, item):
            self.queue.append(item)
            self.server.queue_updated()

        def get(self):
            self.queue.sort(key=lambda i: i[0])
            item = self.queue.pop(0)
            self.running[0] = item
            self.server.queue_updated()
            return item, 0

        def task_done(self, i):
            self.running.pop(i)
            self.server.queue_updated()

        def get_current_queue_volatile(self):
            return list(self.running.values()), list(self.queue)

    class PromptServer:
        instance = None

        def __init__(self):
            self.on_prompt_handlers, self.updates, self.messages = [], 0, []
            self.prompt_queue = PromptQueue(self)
            PromptServer.instance = self

        def add_on_prompt_handler(self, h):
            self.on_prompt_handlers.append(h)

        def queue_updated(self):
            self.updates += 1

        def send_sync(self, event, data, sid=None):
            self.messages.append((event, data, sid))

    server = types.ModuleType("server")
    server.PromptServer = PromptServer
    ps = PromptServer()
    nodes_mod = types.ModuleType("nodes")
    nodes_mod.NODE_CLASS_MAPPINGS = {c: type(c, (), {"OUTPUT_NODE": c in ("SaveVideo", "SaveImage"),
                                                     "FUNCTION": "run", "run": lambda self: None})
                                     for c in {n["class_type"] for n in W.WAN22.values()}}
    name = PKG + "_in_comfy"
    registered = []
    routes = types.ModuleType(name + ".routes")
    routes.__spec__ = importlib.util.spec_from_loader(name + ".routes", loader=None)
    routes.register = lambda prompt_server, find_mounts: registered.append((prompt_server, find_mounts))
    storage = fake_storage(result=False)
    comfy_pkg = types.ModuleType("comfy")
    comfy_pkg.storage = storage
    for mod_name, mod in (("folder_paths", folder_paths), ("server", server), ("nodes", nodes_mod),
                          ("comfy", comfy_pkg),
                          ("comfy.storage", storage)):
        monkeypatch.setitem(sys.modules, mod_name, mod)
    pkg = load_package(name, {"routes": routes})
    try:
        assert registered and registered[0][0] is ps
        found = registered[0][1]()
        assert [x.root for x in found] == [str(m.mnt)] and "cache" in found[0].stats()
        assert ps.on_prompt_handlers
        assert storage.fast_storage(str(m.mnt / "vae" / "wan_2.1_vae.safetensors")) is True

        body = {"prompt": copy.deepcopy(W.WAN22), "client_id": "c1"}
        frozen = copy.deepcopy(body)
        for h in ps.on_prompt_handlers:
            assert h(body) is body
        assert body == frozen
        ps.prompt_queue.put((1, "pid-1", body["prompt"], {}, ["61"], {}))
        assert ps.updates == 1  # the original still runs
        svc = pkg._registry.service
        assert svc.wait_idle(10)
        assert svc.writer.flush(10)
        want = planner.plan_command([
            "vae/wan_2.1_vae.safetensors", "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
            "diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
            "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"])
        sent = [r for r in svc.writer.results if r.path == str(m.mnt / ".tierfs" / "control")]
        assert sent and sent[-1].command == want
        assert sent[-1].ok or sent[-1].error == errno.EINVAL, sent[-1].describe()
        # the prompt runs and finishes: the plan is cleared
        ps.prompt_queue.get()
        ps.prompt_queue.task_done(0)
        assert svc.wait_idle(10) and svc.writer.flush(10)
        assert svc.writer.results[-1].command == b"plan\n"
        # run again: ComfyUI has the loaders cached, only the low-noise expert is loaded anew
        ps.prompt_queue.put((2, "pid-2", copy.deepcopy(W.WAN22), {}, ["61"], {}))
        ps.prompt_queue.get()
        ps.send_sync("execution_cached", {"nodes": ["37", "38", "39"], "prompt_id": "pid-2"}, "c1")
        assert ps.messages[-1][0] == "execution_cached"  # ComfyUI's own send still happens
        assert svc.wait_idle(10) and svc.writer.flush(10)
        assert svc.writer.results[-1].command == planner.plan_command(
            ["diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"])
        ps.prompt_queue.task_done(0)
        assert svc.wait_idle(10) and svc.writer.flush(10)
        assert m.alive()
    finally:
        fast_disk.uninstall(storage)
        for mod in [x for x in sys.modules if x == name or x.startswith(name + ".")]:
            del sys.modules[mod]
