"""tierfs for ComfyUI: tells a tierfs mount which model files the queued prompts will load.

ComfyUI imports this package from ``custom_nodes``. It adds no nodes to the graph
(``NODE_CLASS_MAPPINGS`` is empty); it hooks into the prompt queue (comfy_setup.py) and serves
a sidebar tab from ``WEB_DIRECTORY`` (web/), which reads the mounts' stats through the route
of routes.py. Nothing here raises at import: a missing piece is logged and skipped.
"""

from __future__ import annotations

import logging

log = logging.getLogger("tierfs")

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
WEB_DIRECTORY = "./web"

_registry = None
try:
    from .comfy_setup import setup as _setup

    _registry = _setup()
except Exception:  # noqa: BLE001 - a custom node never takes ComfyUI down
    log.exception("[tierfs] setup failed; the tierfs node is inactive")


def find_mounts() -> list:
    """The tierfs mounts among ComfyUI's model folders (mounts.Mount objects)."""
    return _registry.find_mounts() if _registry is not None else []


def _register_routes() -> None:
    """Register the sidebar's HTTP route (routes.py)."""
    try:
        from . import routes
        import server  # type: ignore[import-not-found]

        routes.register(server.PromptServer.instance, find_mounts)
    except Exception as e:  # noqa: BLE001 - the node works without its sidebar
        log.warning("[tierfs] sidebar routes not registered: %s", e)


if _registry is not None:
    _register_routes()
