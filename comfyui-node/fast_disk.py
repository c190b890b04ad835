"""Tell ComfyUI that model files on a tierfs mount are on a fast disk.

Contract:

- Recent ComfyUI decides per model file whether its disk is fast in ``comfy/storage.py``:
  ``model_fast_disk(paths)`` calls the module global ``fast_storage(path)`` (True, False or
  None) for each file, and only when neither ``--fast-disk`` nor ``--disable-fast-disk`` was
  given. Its detection looks for an NVMe block device, which a FUSE mount never is, so a
  model on the mount would be treated as slow and ComfyUI would keep its own RAM copy of
  weights it offloads.
- :func:`install` replaces ``fast_storage`` in that module with a wrapper: a path under a
  tierfs mount is fast (True), every other path goes to the original function unchanged (as do
  paths whose check fails). Installing twice wraps once.
- ``--fast-disk`` and ``--disable-fast-disk`` keep their meaning: ComfyUI honours them before
  calling ``fast_storage``, so with ``--disable-fast-disk`` the wrapper is never asked.
- On a ComfyUI without ``comfy.storage.fast_storage`` (before the per-file choice existed)
  :func:`install` changes nothing and logs that once.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger("tierfs")

MARK = "__tierfs_original__"
_logged_absent = False


def install(is_on_mount: Callable[[str], bool], storage: ModuleType | None = None) -> bool:
    """Wrap ``storage.fast_storage`` (default: import ``comfy.storage``) so that paths for
    which `is_on_mount(path)` is true are fast. Returns True when the wrapper is in place."""
    global _logged_absent
    if storage is None:
        try:
            storage = importlib.import_module("comfy.storage")
        except Exception:  # noqa: BLE001 - absent or broken: older ComfyUI
            storage = None
    original = getattr(storage, "fast_storage", None) if storage is not None else None
    if not callable(original):
        if not _logged_absent:
            _logged_absent = True
            log.info("[tierfs] this ComfyUI has no per-file fast-disk choice "
                     "(comfy.storage.fast_storage); pass --fast-disk where it exists "
                     "(see docs/COMFYUI.md)")
        return False
    original = getattr(original, MARK, original)  # already wrapped: wrap the original again

    def fast_storage(path: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            on_mount = isinstance(path, (str, bytes)) or hasattr(path, "__fspath__")
            on_mount = on_mount and bool(is_on_mount(_as_str(path)))
        except Exception:  # noqa: BLE001 - unsure: let ComfyUI decide
            on_mount = False
        if on_mount:
            return True
        return original(path, *args, **kwargs)

    setattr(fast_storage, MARK, original)
    fast_storage.__name__ = getattr(original, "__name__", "fast_storage")
    fast_storage.__doc__ = getattr(original, "__doc__", None)
    storage.fast_storage = fast_storage
    log.info("[tierfs] model files on a tierfs mount count as a fast disk for ComfyUI "
             "(--fast-disk / --disable-fast-disk still decide when given)")
    return True


def uninstall(storage: ModuleType) -> None:
    """Put the original ``fast_storage`` back (tests)."""
    current = getattr(storage, "fast_storage", None)
    original = getattr(current, MARK, None)
    if original is not None:
        storage.fast_storage = original


def _as_str(path: Any) -> str:
    p = os.fspath(path)
    return os.fsdecode(p) if isinstance(p, bytes) else p
