"""The model files a ComfyUI prompt will load, in the order ComfyUI will load them.

Contract:

- :func:`execution_order` takes a prompt in ComfyUI's API format (``{node_id: {"class_type":
  str, "inputs": {name: value}}}``, where a value ``[node_id, slot]`` is a link to another
  node's output) and returns the node ids in the order ComfyUI's executor runs them, starting
  from the output nodes. It follows ``comfy_execution/graph.py`` (``ExecutionList``): the
  nodes each output needs are added depth-first, a node is ready once every node it links to
  has run, and among the ready nodes ``ux_friendly_pick_node`` picks an output or async node
  first, then one feeding an output, then one two steps from an output, else the first
  ready one. Nodes whose outputs ComfyUI has cached from an earlier run (``cached``, as its
  ``execution_cached`` message lists them) do not run, as in ``ExecutionList.is_cached``.
  Assumed: no node expands into new nodes, every link is needed (lazy inputs count as
  needed).
- :func:`model_refs` lists, in that order, the inputs that name a model file: known loader
  inputs (``ckpt_name`` -> checkpoints, ``unet_name`` -> diffusion_models, ...) and any other
  string input ending in a model extension (looked up in every folder).
- :func:`resolve_paths` turns those names into absolute paths with an injected resolver (in
  ComfyUI, ``folder_paths.get_full_path(folder, name)``), deduplicated, first occurrence kept.
- :func:`models_by_mount` keeps the paths on a tierfs mount, relative to its root, grouped by
  mount root in load order.

A malformed prompt never raises: what cannot be understood is skipped. The API format carries
no muted or bypassed nodes (the frontend leaves them out and rewires around bypassed ones), so
only what the prompt holds is considered, as ComfyUI does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("tierfs")

# Files tierfs serves as models (everything else passes through untouched).
MODEL_EXTENSIONS = (".safetensors", ".sft", ".gguf")

# Loader inputs by input name -> ComfyUI folders to look in, first match wins.
INPUT_FOLDERS: dict[str, tuple[str, ...]] = {
    "ckpt_name": ("checkpoints",),
    "unet_name": ("diffusion_models",),
    "vae_name": ("vae",),
    "clip_name": ("text_encoders",),
    "clip_name1": ("text_encoders",),
    "clip_name2": ("text_encoders",),
    "clip_name3": ("text_encoders",),
    "clip_name4": ("text_encoders",),
    "lora_name": ("loras",),
    "control_net_name": ("controlnet",),
    "style_model_name": ("style_models",),
    "gligen_name": ("gligen",),
    "hypernetwork_name": ("hypernetworks",),
    "photomaker_model_name": ("photomaker",),
    "audio_encoder_name": ("audio_encoders",),
}

# Where a class's input means something else than the same name elsewhere.
CLASS_INPUT_FOLDERS: dict[str, dict[str, tuple[str, ...]]] = {
    "CLIPVisionLoader": {"clip_name": ("clip_vision",)},
    "UpscaleModelLoader": {"model_name": ("upscale_models",)},
    "LatentUpscaleModelLoader": {"model_name": ("latent_upscale_models",)},
    "ModelPatchLoader": {"name": ("model_patches",)},
    # ComfyUI-GGUF registers its own folder names over the usual folders.
    "UnetLoaderGGUF": {"unet_name": ("unet_gguf", "diffusion_models")},
    "UnetLoaderGGUFAdvanced": {"unet_name": ("unet_gguf", "diffusion_models")},
    **{
        cls: {f"clip_name{i}" if i else "clip_name": ("clip_gguf", "text_encoders")
              for i in (0, 1, 2, 3, 4)}
        for cls in ("CLIPLoaderGGUF", "DualCLIPLoaderGGUF", "TripleCLIPLoaderGGUF",
                    "QuadrupleCLIPLoaderGGUF")
    },
}

# Output nodes of ComfyUI and common node packs, for when the real node classes are unknown
# (unit tests, a prompt looked at outside ComfyUI). In ComfyUI the classes' OUTPUT_NODE is used.
KNOWN_OUTPUT_CLASSES = frozenset({
    "SaveImage", "PreviewImage", "SaveAnimatedWEBP", "SaveAnimatedPNG", "SaveVideo", "SaveWEBM",
    "SaveLatent", "SaveAudio", "SaveAudioMP3", "SaveAudioOpus", "PreviewAudio", "SaveGLB",
    "PreviewAny", "SaveImageWebsocket", "VHS_VideoCombine", "ImageAndMaskPreview",
    "SaveImageExtended",
})


class NodeInfo(Protocol):
    """What the executor's pick rule needs to know about a node class."""

    def is_output(self, class_type: str) -> bool: ...

    def is_async(self, class_type: str) -> bool: ...


class DefaultNodeInfo:
    """Node facts without ComfyUI: output classes from a fixed list, nothing async."""

    def __init__(self, outputs: Iterable[str] = KNOWN_OUTPUT_CLASSES):
        self._outputs = frozenset(outputs)

    def is_output(self, class_type: str) -> bool:
        return class_type in self._outputs

    def is_async(self, class_type: str) -> bool:
        return False


@dataclass(frozen=True)
class ModelRef:
    """One input naming a model file: where to look for `name`, in order."""

    node_id: str
    input_name: str
    name: str
    folders: tuple[str, ...]  # empty: look in every folder


def is_link(value: Any) -> bool:
    """ComfyUI's test for a link input (``comfy_execution/graph_utils.py``)."""
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], (int, float)))


def _nodes(prompt: Any) -> dict[str, dict]:
    """The well-formed nodes of `prompt`: a dict with a str class_type and dict inputs."""
    if not isinstance(prompt, Mapping):
        return {}
    out: dict[str, dict] = {}
    for node_id, node in prompt.items():
        if not isinstance(node_id, str) or not isinstance(node, Mapping):
            continue
        if not isinstance(node.get("class_type"), str):
            continue
        inputs = node.get("inputs", {})
        out[node_id] = {"class_type": node["class_type"],
                        "inputs": dict(inputs) if isinstance(inputs, Mapping) else {}}
    return out


def output_nodes(prompt: Any, info: NodeInfo | None = None) -> list[str]:
    """The prompt's output nodes in prompt order; when none is known as an output, the nodes no
    other node links to (a guess that only applies outside ComfyUI)."""
    info = info or DefaultNodeInfo()
    nodes = _nodes(prompt)
    outs = [n for n, node in nodes.items() if _safe(info.is_output, node["class_type"])]
    if outs:
        return outs
    linked = {v[0] for node in nodes.values() for v in node["inputs"].values() if is_link(v)}
    return [n for n in nodes if n not in linked]


def _safe(pred: Callable[[str], bool], class_type: str) -> bool:
    try:
        return bool(pred(class_type))
    except Exception:  # noqa: BLE001 - an unknown class is simply not special
        return False


def execution_order(prompt: Any, outputs: Sequence[str] | None = None,
                    info: NodeInfo | None = None, cached: Iterable[str] = ()) -> list[str]:
    """Node ids in ComfyUI's execution order (see the module docstring). `outputs`: the output
    node ids ComfyUI will run, in its order (the queue item's list); default
    :func:`output_nodes`. `cached`: node ids whose outputs ComfyUI has cached. Never raises; a
    cycle ends the order where ComfyUI would stop."""
    try:
        return _execution_order(prompt, outputs, info or DefaultNodeInfo(), frozenset(cached))
    except Exception as e:  # noqa: BLE001 - never raise to the caller
        log.debug("[tierfs] could not order the prompt's nodes: %r", e)
        return []


def _execution_order(prompt: Any, outputs: Sequence[str] | None, info: NodeInfo,
                     cached: frozenset[str]) -> list[str]:
    nodes = _nodes(prompt)
    if outputs is None:
        outputs = output_nodes(prompt, info)
    pending: dict[str, bool] = {}  # insertion order matters, as in ExecutionList
    block_count: dict[str, int] = {}
    blocking: dict[str, dict[str, dict]] = {}

    def add_node(unique_id: str) -> None:
        stack = [unique_id]
        links: list[tuple[str, Any, str]] = []
        while stack:
            uid = stack.pop()
            if uid in pending or uid not in nodes:
                continue
            pending[uid] = True
            block_count[uid] = 0
            blocking[uid] = {}
            for value in nodes[uid]["inputs"].values():
                if is_link(value) and value[0] in nodes:
                    if value[0] not in cached:
                        stack.append(value[0])
                    links.append((value[0], value[1], uid))
        for from_id, socket, to_id in links:
            if from_id in cached:
                continue
            add_node(from_id)
            if to_id not in blocking[from_id]:
                blocking[from_id][to_id] = {}
                block_count[to_id] += 1
            blocking[from_id][to_id][socket] = True

    def is_output(node_id: str) -> bool:
        return _safe(info.is_output, nodes[node_id]["class_type"])

    def is_async(node_id: str) -> bool:
        return _safe(info.is_async, nodes[node_id]["class_type"])

    def pick(ready: list[str]) -> str:
        for n in ready:
            if is_output(n) or is_async(n):
                return n
        for n in ready:
            if any(is_output(b) for b in blocking[n]):
                return n
        for n in ready:
            if any(is_output(b1) for b in blocking[n] for b1 in blocking[b]):
                return n
        return ready[0]

    for out in outputs:
        if isinstance(out, str):
            add_node(out)
    order: list[str] = []
    while pending:
        ready = [n for n in pending if block_count[n] == 0]
        if not ready:
            break  # a cycle: ComfyUI stops with an error here
        node_id = pick(ready)
        order.append(node_id)
        del pending[node_id]
        for blocked in blocking[node_id]:
            block_count[blocked] -= 1
        del blocking[node_id]
    return order


def _is_model_name(value: str) -> bool:
    return value.lower().endswith(MODEL_EXTENSIONS)


def model_refs(prompt: Any, outputs: Sequence[str] | None = None,
               info: NodeInfo | None = None, cached: Iterable[str] = ()) -> list[ModelRef]:
    """The inputs naming model files, in execution order (inputs in the node's order)."""
    nodes = _nodes(prompt)
    refs: list[ModelRef] = []
    for node_id in execution_order(prompt, outputs, info, cached):
        node = nodes[node_id]
        by_class = CLASS_INPUT_FOLDERS.get(node["class_type"], {})
        for input_name, value in node["inputs"].items():
            if not isinstance(value, str) or not value or not isinstance(input_name, str):
                continue
            folders = by_class.get(input_name) or INPUT_FOLDERS.get(input_name)
            if folders is not None:
                refs.append(ModelRef(node_id, input_name, value, folders))
            elif _is_model_name(value):
                refs.append(ModelRef(node_id, input_name, value, ()))
    return refs


Resolver = Callable[[str, str], "str | None"]


def resolve_paths(refs: Iterable[ModelRef], resolver: Resolver,
                  all_folders: Sequence[str] = ()) -> list[str]:
    """Absolute paths of the model files `refs` name, deduplicated (first kept). A name is
    looked up in its folders, then, if it ends in a model extension, in `all_folders`; names
    found nowhere are skipped. Resolver errors count as not found."""
    def lookup(folder: str, name: str) -> str | None:
        try:
            p = resolver(folder, name)
        except Exception:  # noqa: BLE001 - a resolver failure is a miss
            return None
        return p if isinstance(p, str) and p else None

    out: list[str] = []
    seen: set[str] = set()
    for ref in refs:
        path = None
        for folder in ref.folders:
            path = lookup(folder, ref.name)
            if path:
                break
        if path is None and _is_model_name(ref.name):
            for folder in all_folders:
                if folder in ref.folders:
                    continue
                path = lookup(folder, ref.name)
                if path:
                    break
        if path is None:
            continue
        path = os.path.normpath(os.path.abspath(path))
        key = os.path.normcase(path)
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


Locator = Callable[[str], "tuple[Any, str] | None"]


def models_by_mount(paths: Iterable[str], locate: Locator) -> dict[str, list[str]]:
    """{mount root: [paths relative to it, in order]} for the `paths` on a tierfs mount;
    `locate(path)` returns (mount, relative path) or None (see mounts.MountRegistry.locate).
    Only model files (.safetensors, .sft, .gguf) are kept: tierfs prefetches nothing else."""
    out: dict[str, list[str]] = {}
    for path in paths:
        try:
            found = locate(path)
        except Exception:  # noqa: BLE001 - a path we cannot place is skipped
            found = None
        if not found:
            continue
        mount, rel = found
        if not _is_model_name(rel):
            continue
        root = getattr(mount, "root", mount)
        rels = out.setdefault(root, [])
        if rel not in rels:
            rels.append(rel)
    return out


def prompt_models(prompt: Any, resolver: Resolver, locate: Locator,
                  all_folders: Sequence[str] = (), outputs: Sequence[str] | None = None,
                  info: NodeInfo | None = None, cached: Iterable[str] = ()) -> dict[str, list[str]]:
    """All of the above: {mount root: [relative paths in load order]} for one prompt. Never
    raises."""
    try:
        refs = model_refs(prompt, outputs, info, cached)
        return models_by_mount(resolve_paths(refs, resolver, all_folders), locate)
    except Exception as e:  # noqa: BLE001 - never raise to the caller
        log.debug("[tierfs] could not list the prompt's models: %r", e)
        return {}
