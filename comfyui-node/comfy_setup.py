"""Hooks the node into a running ComfyUI; the only module that imports ComfyUI.

Contract: :func:`setup` is called once from the package's ``__init__`` while ComfyUI loads
custom nodes. It imports ``server``, ``folder_paths``, ``nodes`` (and, in fast_disk,
``comfy.storage``) at call time, then:

- builds the :class:`mounts.MountRegistry` over ``folder_paths.folder_names_and_paths`` and
  starts its first probe in the background (the "no mount" hint is logged by the registry);
- registers the on-prompt handler and wraps ``PromptServer.queue_updated`` and
  ``PromptServer.send_sync`` (see hooks.py for why these), which drive the planner's worker
  thread;
- wraps ``comfy.storage.fast_storage`` so that files on a mount count as a fast disk.

It returns the registry (the sidebar route's ``find_mounts`` is its ``find_mounts``), or None
when it is not running inside ComfyUI. It never raises for a missing piece: each is logged
and skipped.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from . import fast_disk, graph
from .control import ControlWriter
from .hooks import PrefetchService, queue_reader, wrap_queue_updated, wrap_send_sync
from .mounts import MountRegistry, find_mount_root

log = logging.getLogger("tierfs")


class ComfyNodeInfo:
    """graph.NodeInfo from ComfyUI's node classes (``nodes.NODE_CLASS_MAPPINGS``), as
    ``ExecutionList.ux_friendly_pick_node`` reads them."""

    def __init__(self, mappings: dict[str, Any]):
        self._mappings = mappings

    def is_output(self, class_type: str) -> bool:
        cls = self._mappings.get(class_type)
        return cls is not None and getattr(cls, "OUTPUT_NODE", False) is True

    def is_async(self, class_type: str) -> bool:
        cls = self._mappings.get(class_type)
        if cls is None:
            return False
        try:
            return inspect.iscoroutinefunction(getattr(cls, cls.FUNCTION))
        except Exception:  # noqa: BLE001 - no FUNCTION: not async
            return False


class CachedResolver:
    """``folder_paths.get_full_path`` with a short-lived cache, so that a prompt's names looked
    up when it is posted are not looked up again when it is queued a moment later."""

    def __init__(self, resolve: Callable[[str, str], str | None], ttl: float = 10.0,
                 max_entries: int = 512):
        self._resolve = resolve
        self.ttl = ttl
        self.max_entries = max_entries
        self._cache: dict[tuple[str, str], tuple[float, str | None]] = {}

    def __call__(self, folder: str, name: str) -> str | None:
        now = time.monotonic()
        hit = self._cache.get((folder, name))
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        path = self._resolve(folder, name)
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        self._cache[(folder, name)] = (now, path)
        return path


def setup() -> MountRegistry | None:
    """Hook the node into ComfyUI (see the module docstring)."""
    try:
        import folder_paths  # type: ignore[import-not-found]
        import server  # type: ignore[import-not-found]
    except ImportError:
        log.info("[tierfs] not running inside ComfyUI: nothing hooked")
        return None

    registry = MountRegistry(lambda: folder_paths.folder_names_and_paths)
    threading.Thread(target=registry.find_mounts, name="tierfs-first-probe", daemon=True).start()

    def on_mount(path: str) -> bool:
        return registry.locate(path) is not None or find_mount_root(path) is not None

    try:
        fast_disk.install(on_mount)
    except Exception as e:  # noqa: BLE001
        log.warning("[tierfs] fast-disk hook not installed: %s", e)

    prompt_server = getattr(server.PromptServer, "instance", None)
    if prompt_server is None or not hasattr(prompt_server, "prompt_queue"):
        log.warning("[tierfs] ComfyUI's prompt server is not there: no prefetch plans")
        return registry

    try:
        import nodes  # type: ignore[import-not-found]
        info: graph.NodeInfo = ComfyNodeInfo(nodes.NODE_CLASS_MAPPINGS)
    except Exception:  # noqa: BLE001
        info = graph.DefaultNodeInfo()
    resolver = CachedResolver(folder_paths.get_full_path)

    def models_of(prompt: Any, outputs: Any, cached: Any) -> dict[str, list[str]]:
        return graph.prompt_models(prompt, resolver, registry.locate,
                                   all_folders=list(folder_paths.folder_names_and_paths),
                                   outputs=outputs, info=info, cached=cached)

    service = PrefetchService(
        models_of=models_of,
        queue_snapshot=lambda: queue_reader(prompt_server.prompt_queue)(),
        writer=ControlWriter(),
        mount_roots=lambda: [m.root for m in registry.find_mounts()],
    )
    try:
        prompt_server.add_on_prompt_handler(service.on_prompt)
    except Exception as e:  # noqa: BLE001
        log.warning("[tierfs] on-prompt handler not registered: %s", e)
    if not wrap_queue_updated(prompt_server, service.queue_changed):
        log.warning("[tierfs] this ComfyUI has no PromptServer.queue_updated: "
                    "plans follow posted prompts only")
    if not wrap_send_sync(prompt_server, service.on_message):
        log.info("[tierfs] this ComfyUI has no PromptServer.send_sync: models of cached "
                 "loaders stay in the plan")
    log.info("[tierfs] node loaded: prompts' model files are announced to tierfs mounts")
    setattr(registry, "service", service)
    return registry
