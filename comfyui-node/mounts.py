"""Which of ComfyUI's model folders live on a tierfs mount.

Contract:

- A directory is the root of a tierfs mount when ``ROOT/.tierfs/stats`` exists (the daemon
  serves it at the root of every mount, on Linux and Windows alike). A path is *under* a mount
  when the path itself or one of its ancestors is such a root; the path is tried as written
  and, failing that, with its symbolic links resolved.
- :class:`MountRegistry` finds the mounts among ComfyUI's model folders
  (``folder_paths.folder_names_and_paths``: name -> (paths, extensions)), caches the answer for
  a few seconds, and never lets a hung mount block its caller: the probe runs in a helper
  thread and a caller waits at most ``probe_timeout`` seconds (it then gets the last answer).
- :class:`Mount` is what the rest of the node (and the sidebar route) sees: ``.root`` (the
  mount root, a str), ``.stats()`` (the parsed ``.tierfs/stats``; raises ``OSError`` or
  ``ValueError``), ``.control_path`` and ``.relative(path)``.
- When no mount is found, one log line says so and :func:`setup_hint` (also
  ``MountRegistry.message``) tells the user how to set one up.

No ComfyUI import here: the folder table is passed in (or a callable returning it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("tierfs")

STATS_REL = os.path.join(".tierfs", "stats")
CONTROL_REL = os.path.join(".tierfs", "control")
FUSE_FSTYPE = "fuse.tierfs"  # or plain "fuse" with the source "tierfs:SOURCE"

# ComfyUI's folder table: name -> (list of paths, extensions).
FolderTable = Mapping[str, Any]


def setup_hint() -> str:
    """How to put ComfyUI's models on a tierfs mount (shown when none is found)."""
    return (
        "No ComfyUI model folder is on a tierfs mount, so the tierfs node has nothing to prefetch. "
        "Mount the models folder and point ComfyUI at the mount: "
        "`tierfs mount MODELS MNT --ram-cache 16GiB`, then "
        "`tierfs comfyui-config MNT > tierfs_paths.yaml` and start ComfyUI with "
        "`--extra-model-paths-config tierfs_paths.yaml` (see docs/COMFYUI.md)."
    )


def _same_or_under(path: str, root: str) -> bool:
    p, r = os.path.normcase(path), os.path.normcase(root)
    if p == r:
        return True
    r = r if r.endswith(os.sep) else r + os.sep
    return p.startswith(r)


def _clean(path: str) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def is_mount_root(directory: str) -> bool:
    """True when `directory` holds ``.tierfs/stats`` (may block on a hung mount: call it off
    ComfyUI's threads, as :class:`MountRegistry` does)."""
    try:
        return os.path.isfile(os.path.join(directory, STATS_REL))
    except (OSError, ValueError):
        return False


def find_mount_root(path: str) -> str | None:
    """The root of the tierfs mount `path` is on (the path itself or an ancestor), else None.
    Tries the path as written, then with symbolic links resolved. May block on a hung mount."""
    candidates = [_clean(path)]
    try:
        real = os.path.realpath(candidates[0])
    except (OSError, ValueError):
        real = candidates[0]
    if os.path.normcase(real) != os.path.normcase(candidates[0]):
        candidates.append(real)
    for start in candidates:
        d = start
        while True:
            if is_mount_root(d):
                return d
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
    return None


def linux_tierfs_mountpoints(mountinfo: str = "/proc/self/mountinfo") -> set[str]:
    """Mount points that /proc/self/mountinfo shows as tierfs: type ``fuse.tierfs``, or a FUSE
    type with a ``tierfs:SOURCE`` source (Linux only; empty elsewhere). Only a cross-check:
    the ``.tierfs/stats`` probe decides."""
    points: set[str] = set()
    if not sys.platform.startswith("linux"):
        return points
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if "-" not in fields:
                    continue
                sep = fields.index("-")
                if len(fields) < sep + 3 or len(fields) < 5:
                    continue
                fstype, source = fields[sep + 1], fields[sep + 2]
                if fstype == FUSE_FSTYPE or (fstype.startswith("fuse")
                                             and source.startswith("tierfs:")):
                    points.add(fields[4].encode().decode("unicode_escape"))
    except OSError:
        pass
    return points


@dataclass(frozen=True)
class Mount:
    """One tierfs mount: its root and the ComfyUI folders found on it."""

    root: str
    folders: tuple[str, ...] = field(default=(), compare=False)
    # True/False: /proc/self/mountinfo lists/does not list the root as fuse.tierfs; None: unknown.
    fuse_tierfs: bool | None = field(default=None, compare=False)

    @property
    def stats_path(self) -> str:
        return os.path.join(self.root, STATS_REL)

    @property
    def control_path(self) -> str:
        return os.path.join(self.root, CONTROL_REL)

    def stats(self, timeout: float | None = None) -> dict:
        """The parsed ``ROOT/.tierfs/stats``. Raises OSError (unreadable, mount gone; with
        `timeout`, ``TimeoutError`` when the mount has not answered in `timeout` seconds) or
        ValueError (not JSON). Without `timeout` it reads in the calling thread, which a hung
        mount blocks; with it, the read runs in a daemon thread."""
        if timeout is None:
            return self._read_stats()
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["value"] = self._read_stats()
            except Exception as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e
            done.set()

        threading.Thread(target=run, name="tierfs-stats", daemon=True).start()
        if not done.wait(timeout):
            raise TimeoutError(f"{self.stats_path}: no answer in {timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _read_stats(self) -> dict:
        with open(self.stats_path, "rb") as f:
            data = json.loads(f.read())
        if not isinstance(data, dict):
            raise ValueError(f"{self.stats_path}: not a JSON object")
        return data

    def relative(self, path: str) -> str | None:
        """`path` relative to this mount's root with ``/`` separators, or None when it is not
        under the root. Lexical only (resolve links before calling if needed)."""
        p = _clean(path)
        if not _same_or_under(p, self.root) or os.path.normcase(p) == os.path.normcase(self.root):
            return None
        rel = os.path.relpath(p, self.root)
        return rel.replace(os.sep, "/")


def folder_paths_of(table: FolderTable) -> list[tuple[str, str]]:
    """(folder name, path) pairs of ComfyUI's folder table, in table order; odd entries skipped."""
    out: list[tuple[str, str]] = []
    try:
        items = list(table.items())
    except Exception:  # noqa: BLE001 - a foreign object; never raise to ComfyUI
        return out
    for name, entry in items:
        try:
            paths = entry[0]
        except (TypeError, IndexError, KeyError):
            continue
        if isinstance(paths, (str, bytes)):
            paths = [paths]
        try:
            for p in paths:
                if isinstance(p, str) and p:
                    out.append((str(name), p))
        except TypeError:
            continue
    return out


def scan(table: FolderTable) -> list[Mount]:
    """The tierfs mounts under ComfyUI's model folders (blocking; see MountRegistry)."""
    roots: dict[str, list[str]] = {}
    seen: dict[str, str | None] = {}
    for name, path in folder_paths_of(table):
        key = _clean(path)
        if key not in seen:
            seen[key] = find_mount_root(key)
        root = seen[key]
        if root is not None:
            names = roots.setdefault(root, [])
            if name not in names:
                names.append(name)
    fuse_points = linux_tierfs_mountpoints()
    return [
        Mount(root=r, folders=tuple(names),
              fuse_tierfs=(r in fuse_points) if sys.platform.startswith("linux") else None)
        for r, names in roots.items()
    ]


class MountRegistry:
    """Cached, non-blocking view of the tierfs mounts among ComfyUI's model folders.

    `folders` is ComfyUI's folder table or a callable returning it (read anew at each probe, so
    folders added later by extra_model_paths or other nodes are seen)."""

    def __init__(self, folders: FolderTable | Callable[[], FolderTable], ttl: float = 5.0,
                 probe_timeout: float = 1.0):
        self._folders = folders
        self.ttl = ttl
        self.probe_timeout = probe_timeout
        self._lock = threading.Lock()
        self._mounts: list[Mount] = []
        self._stamp = float("-inf")
        self._probe: threading.Thread | None = None  # the probe running now, if any
        self._probe_done = threading.Event()
        self._probe_started = float("-inf")
        self._reported_roots: tuple[str, ...] | None = None  # the mount roots last logged

    @property
    def message(self) -> str | None:
        """For the UI: how to set up a mount when none was found, else None."""
        return setup_hint() if self._reported_roots == () else None

    def _table(self) -> FolderTable:
        return self._folders() if callable(self._folders) else self._folders

    def _run_probe(self, done: threading.Event) -> None:
        try:
            mounts = scan(self._table())
        except Exception as e:  # noqa: BLE001 - a probe never takes ComfyUI down
            log.warning("[tierfs] looking for tierfs mounts failed: %s", e)
            mounts = None
        with self._lock:
            if mounts is not None:
                self._mounts = mounts
                self._report(mounts)
            self._stamp = time.monotonic()
            self._probe = None
        done.set()

    def _report(self, mounts: list[Mount]) -> None:
        """Log the mounts found when they change; the setup hint once when there are none."""
        roots = tuple(sorted(m.root for m in mounts))
        if roots == self._reported_roots:
            return
        self._reported_roots = roots
        for m in mounts:
            log.info("[tierfs] tierfs mount at %s holds ComfyUI folders: %s", m.root,
                     ", ".join(m.folders))
        if not mounts:
            log.info("[tierfs] %s", setup_hint())

    def find_mounts(self, refresh: bool = False) -> list[Mount]:
        """The mounts found (a fresh list each call). Probes again when the cached answer is
        older than `ttl` (or `refresh`). Callers wait for a probe at most until
        `probe_timeout` seconds after it started, then get the last answer: a mount that does
        not answer costs each probe `probe_timeout` once, not every caller."""
        with self._lock:
            fresh = time.monotonic() - self._stamp < self.ttl
            if fresh and not refresh and self._probe is None:
                return list(self._mounts)
            if self._probe is None:
                self._probe_done = threading.Event()
                self._probe_started = time.monotonic()
                self._probe = threading.Thread(target=self._run_probe,
                                               args=(self._probe_done,),
                                               name="tierfs-mount-probe", daemon=True)
                self._probe.start()
            done = self._probe_done
            left = self._probe_started + self.probe_timeout - time.monotonic()
        if left > 0:
            done.wait(left)
        with self._lock:
            return list(self._mounts)

    def locate(self, path: str) -> tuple[Mount, str] | None:
        """(mount, path relative to its root) for a file under one of the known mounts, else
        None. Tries the path as written, then with links resolved (may touch the file system)."""
        mounts = self.find_mounts()
        if not mounts:
            return None
        return locate_in(mounts, path)


def locate_in(mounts: Iterable[Mount], path: str) -> tuple[Mount, str] | None:
    """(mount, relative path) of `path` among `mounts` (deepest root wins), else None."""
    ordered: Sequence[Mount] = sorted(mounts, key=lambda m: len(m.root), reverse=True)
    try:
        clean = _clean(path)
    except (TypeError, ValueError):
        return None
    for m in ordered:
        rel = m.relative(clean)
        if rel is not None:
            return m, rel
    try:
        real = os.path.realpath(clean)
    except (OSError, ValueError):
        return None
    if real != clean:
        for m in ordered:
            rel = m.relative(real)
            if rel is not None:
                return m, rel
    return None
