"""`GET /tierfs/stats` on ComfyUI's server: the live stats of every tierfs mount it reads models from.

Contract:

    register(prompt_server, find_mounts, *, timeout=2.0) -> None

adds the route to ``prompt_server.routes`` (ComfyUI's aiohttp ``RouteTableDef``). ComfyUI loads
custom nodes before it adds its route table to the application, so a route added while the
node's package is imported is served, at ``/tierfs/stats`` and at ``/api/tierfs/stats`` (the
frontend's ``api.fetchApi`` path). Registering twice on the same server adds it once.

``find_mounts()`` returns the mounts, objects with ``.root`` (the mountpoint, a ``str``) and
``.stats()`` (``ROOT/.tierfs/stats`` parsed into a dict; raises ``OSError`` or ``ValueError``).

The answer, ``200 application/json``::

    {"mounts": [{"root": "/mnt/models", "stats": {...}},          # docs/STATS.md
                {"root": "/mnt/other",  "error": "timed out ..."}],
     "hint": "..."}                     # only when there is no mount: how to set one up
    {"mounts": [], "error": "...", "hint": "..."}   # when finding the mounts failed

Both ``find_mounts()`` and each ``stats()`` run off the event loop, on threads of this route's
own, each bounded by ``timeout`` seconds: a FUSE mount that stops answering makes its entry an
``error``, never the request or ComfyUI hang. One read of a mount is in flight at a time: a
read that timed out may stay blocked in the kernel, and until it returns later requests report
the mount as still hung instead of starting another, so a hung mount holds one thread, not one
per poll.

DNS rebinding guard: the stats name every model file that was opened, so the route answers only
requests whose ``Host`` header is a loopback name (``localhost``, ``*.localhost``) or an IP
address (``127.0.0.1:8188``, ``[::1]:8188``, a LAN address). A page on another site can point its
own name at 127.0.0.1 and read same-origin from it, but its requests then carry that name as
Host; a literal address needs no name, so it cannot be rebound. Anything else gets ``403`` with
the reason in the body. ComfyUI's own page is same-origin with the route, so its browser sends the
Host it was opened with. ``host_refusal`` is the check, a pure function.

Only ``make_handler`` and ``register`` need aiohttp: ``host_refusal``, ``parse_host`` and
``StatsReader.payload`` (the JSON document) are usable and tested without it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
import re
import threading
import time
from typing import Any, Callable, Iterable

ROUTE = "/tierfs/stats"
DEFAULT_TIMEOUT = 2.0  # seconds for find_mounts() and for each mount's stats()

HINT = (
    "No tierfs mount among ComfyUI's model folders. To read the models through tierfs:\n"
    "1. mount the models folder: mount-scripts/tierfs-mount.sh ~/ComfyUI/models /mnt/models 16GiB\n"
    "2. tierfs comfyui-config /mnt/models > tierfs_paths.yaml\n"
    "3. restart ComfyUI with --extra-model-paths-config tierfs_paths.yaml\n"
    "See docs/COMFYUI.md in tierfs."
)

log = logging.getLogger("tierfs")

# ----------------------------------------------------------------------------- Host guard

_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?")


def parse_host(header: str | None) -> str:
    """The host of a ``Host`` header, normalized: lower case, port and one trailing dot dropped,
    an IPv6 literal without its brackets. Raises ``ValueError`` saying why for a missing, empty
    or malformed header (an unbracketed IPv6 address, a port that is not a number, a character a
    host cannot hold)."""
    if header is None:
        raise ValueError("no Host header")
    value = header.strip()
    if not value:
        raise ValueError("empty Host header")
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            raise ValueError(f"Host {header!r} opens an IPv6 bracket it does not close")
        host, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError(f"Host {header!r} has {rest!r} after its IPv6 address")
        port = rest[1:] if rest else ""
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"Host {header!r}: {host!r} in brackets is not an IPv6 address") from None
    else:
        if value.count(":") > 1:
            raise ValueError(f"Host {header!r}: an IPv6 address must be in brackets")
        host, _, port = value.partition(":")
    if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ValueError(f"Host {header!r} has a port that is not a number from 0 to 65535")
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise ValueError(f"Host {header!r} names no host")
    return host


def is_ip_literal(host: str) -> bool:
    """Whether `host` (as `parse_host` returns it) is an IPv4 or IPv6 address."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def is_loopback_name(host: str) -> bool:
    """Whether `host` is ``localhost`` or a name under it (``app.localhost``): names that
    resolve to the loopback whatever DNS says (RFC 6761; browsers do not ask DNS for them)."""
    labels = host.split(".")
    if labels[-1] != "localhost":
        return False
    return all(_LABEL.fullmatch(label) for label in labels)


def host_refusal(header: str | None) -> str | None:
    """``None`` when a request with this ``Host`` header may read the stats, else the reason it
    may not (the 403's body)."""
    try:
        host = parse_host(header)
    except ValueError as e:
        return f"{e}: refused to guard against DNS rebinding (use http://127.0.0.1:PORT/)"
    if is_ip_literal(host) or is_loopback_name(host):
        return None
    return (f"Host {header} is not a loopback name or an address: refused to guard against DNS "
            f"rebinding (a page of another site can point its name at this machine). Open "
            f"ComfyUI as http://127.0.0.1:PORT/, http://localhost:PORT/ or by its IP address.")


# ----------------------------------------------------------------------------- the document

def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class StatsReader:
    """Reads the mounts' stats on threads of its own, each read bounded by `timeout` seconds.

    ``await reader.payload()`` is the route's JSON document (see the module's docstring). It
    must run on an event loop; it never blocks it.

    One read of a mount at a time: a request that comes while one is in flight waits for that
    one (two open pages share it), for what is left of its `timeout`; a read older than that is
    hung, and the mount is reported so at once. The threads are daemon threads, so a read that
    never returns does not keep ComfyUI from exiting either."""

    def __init__(self, find_mounts: Callable[[], Iterable[Any]], timeout: float = DEFAULT_TIMEOUT):
        self.find_mounts = find_mounts
        self.timeout = timeout
        self._lock = threading.Lock()
        # Reads in flight: key -> (future, started at, per time.monotonic()).
        self._inflight: dict[str, tuple[concurrent.futures.Future, float]] = {}

    def _start(self, key: str, fn: Callable[[], Any]) -> tuple[concurrent.futures.Future, float]:
        """The read of `key` in flight, or a new one started on a thread of its own."""
        with self._lock:
            entry = self._inflight.get(key)
            if entry is not None:
                return entry
            future: concurrent.futures.Future = concurrent.futures.Future()
            future.set_running_or_notify_cancel()
            entry = self._inflight[key] = (future, time.monotonic())

        def read() -> None:
            try:
                result = fn()
            except BaseException as e:  # handed to whoever awaits the read
                outcome = (None, e)
            else:
                outcome = (result, None)
            with self._lock:
                del self._inflight[key]
            if outcome[1] is None:
                future.set_result(outcome[0])
            else:
                future.set_exception(outcome[1])

        threading.Thread(target=read, name=f"tierfs-stats {key}", daemon=True).start()
        return entry

    async def _bounded(self, key: str, fn: Callable[[], Any]) -> Any:
        """`fn()`'s result (or exception), from a thread; `TimeoutError` once the read is
        `timeout` s old."""
        future, started = self._start(key, fn)
        left = self.timeout - (time.monotonic() - started)
        if left <= 0 and not future.done():
            raise TimeoutError(f"still not answering: a read started {time.monotonic() - started:.0f} s "
                               f"ago has not returned (is the mount hung?)")
        waiting = asyncio.wrap_future(future)
        done, _ = await asyncio.wait({waiting}, timeout=max(left, 0))
        if done:
            return waiting.result()
        # Nobody will await it now: keep a late exception from being logged as never retrieved.
        waiting.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise TimeoutError(f"timed out after {self.timeout:g} s (is the mount hung?)")

    async def _entry(self, mount: Any) -> dict:
        root = str(getattr(mount, "root", "?"))
        try:
            stats = await self._bounded("stats " + root, mount.stats)
        except (OSError, ValueError) as e:  # TimeoutError is an OSError
            return {"root": root, "error": _describe(e)}
        except Exception as e:  # a bug in the reader: say it, keep the other mounts
            log.warning("tierfs: reading the stats of %s failed", root, exc_info=True)
            return {"root": root, "error": _describe(e)}
        if not isinstance(stats, dict):
            return {"root": root, "error": f"stats are a {type(stats).__name__}, not a JSON object"}
        return {"root": root, "stats": stats}

    async def payload(self) -> dict:
        """The route's JSON document."""
        try:
            mounts = list(await self._bounded("find_mounts", self.find_mounts))
        except Exception as e:
            if not isinstance(e, (OSError, ValueError)):
                log.warning("tierfs: finding the mounts failed", exc_info=True)
            return {"mounts": [], "error": "finding the tierfs mounts failed: " + _describe(e),
                    "hint": HINT}
        entries = list(await asyncio.gather(*(self._entry(m) for m in mounts)))
        doc: dict[str, Any] = {"mounts": entries}
        if not entries:
            doc["hint"] = HINT
        return doc


# ----------------------------------------------------------------------------- the route

def make_handler(reader: StatsReader) -> Callable:
    """The aiohttp handler of the route, answering from `reader`."""
    from aiohttp import web

    async def tierfs_stats(request: "web.Request") -> "web.Response":
        refusal = host_refusal(request.headers.get("Host"))
        if refusal is not None:
            return web.Response(status=403, text=refusal + "\n")
        doc = await reader.payload()
        return web.json_response(doc, headers={"Cache-Control": "no-store"})

    return tierfs_stats


def register(prompt_server: Any, find_mounts: Callable[[], Iterable[Any]], *,
             timeout: float = DEFAULT_TIMEOUT) -> None:
    """Adds ``GET /tierfs/stats`` to ``prompt_server.routes`` (see the module's docstring)."""
    routes = prompt_server.routes
    if any(getattr(r, "path", None) == ROUTE and getattr(r, "method", None) == "GET" for r in routes):
        return
    routes.get(ROUTE)(make_handler(StatsReader(find_mounts, timeout)))
