"""Keeping the mounts' plans in step with ComfyUI's prompt queue.

Contract:

- :class:`PrefetchService` owns one daemon worker thread. Whatever ComfyUI calls
  (:meth:`on_prompt`, :meth:`queue_changed`, :meth:`on_message`) only records a little and
  wakes the worker; it returns at once and never touches a mount, so neither the event loop
  nor a running prompt waits on tierfs.
- On each wake-up the worker reads the queue (running prompt first, then the queued ones in
  run order), works out the models of prompts it has not seen (graph.prompt_models), updates
  the :class:`planner.Planner` (finished prompts are forgotten) and sends each mount whose
  plan changed its new plan through the :class:`control.ControlWriter`.

How the node learns about prompts (ComfyUI 0.8.0 ``server.py`` / ``execution.py``):

- The on-prompt handler (``PromptServer.add_on_prompt_handler``) is called with the POST
  /prompt body *before* the prompt is validated and before its prompt id is drawn (unless the
  client sent one), and it must return the body: it cannot tell which queue entry the prompt
  becomes. The node uses it to look the prompt's model names up early, on the worker (which
  fills the resolver's short-lived cache), and returns the body as received.
- ``PromptServer.queue_updated()`` is called by ``PromptQueue`` on every change to the queue:
  ``put`` (a validated prompt, with its id and the outputs ComfyUI will run), ``get`` (a prompt
  starts: it moves to "running"), ``task_done`` (it finished), ``wipe_queue`` and
  ``delete_queue_item``. Wrapping that one method is the single hook that sees prompts start,
  finish and leave the queue, whether or not the client has a websocket. (The
  ``execution_start`` message is not enough: ``PromptExecutor.add_message`` only sends it when
  the prompt has a client id.) The wrapper wakes the worker and calls the original.
- The queue itself is read with ``PromptQueue.get_current_queue_volatile()`` (a shallow copy
  under its lock): items ``(number, prompt_id, prompt, extra_data, outputs_to_execute, ...)``;
  queued items run in ``number`` order.
- When a prompt starts, ComfyUI lists the nodes whose outputs it has cached from earlier runs
  in an ``execution_cached`` message (``{"nodes": [...], "prompt_id": ...}``, sent through
  ``PromptServer.send_sync`` when the prompt has a client id, as prompts from the web UI do).
  Cached loaders do not open their files again, so :meth:`PrefetchService.on_message` takes
  that list and the running prompt's models are worked out again without them (a file the
  daemon is told about but nobody opens would hold up the rest of the plan). Without the
  message (no client id) the full list stands.
- Each node that starts sends ``executing`` (``{"node": id, "prompt_id": ...}``, likewise only
  with a client id). The nodes that started before the one running now are done: their outputs
  are there, as cached ones' are, so their loaders leave the running prompt's plan too. A plan
  thus always starts at the file loading now or next: the daemon warms the first file of a
  plan that nobody has open, and a plan sent again mid-prompt (another prompt was queued) must
  not make it warm a model the prompt has already loaded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import planner as _planner
from .control import ControlWriter

log = logging.getLogger("tierfs")

# (running items, queued items) as ComfyUI's PromptQueue gives them.
QueueSnapshot = Callable[[], "tuple[Sequence[Any], Sequence[Any]]"]
# prompt, outputs to execute (None: unknown), cached node ids -> {mount root: [relative paths]}
ModelsOf = Callable[[Any, "Sequence[str] | None", "frozenset[str]"], "dict[str, list[str]]"]


def queue_entry(item: Any) -> tuple[str, Any, list[str] | None, float] | None:
    """(prompt id, prompt, outputs, number) of a PromptQueue item, or None if malformed."""
    try:
        number, prompt_id, prompt = item[0], item[1], item[2]
        outputs = item[4] if len(item) > 4 else None
    except (TypeError, IndexError, KeyError):
        return None
    if not isinstance(prompt_id, str):
        return None
    try:
        number = float(number)
    except (TypeError, ValueError):
        number = 0.0
    if not isinstance(outputs, (list, tuple)):
        outputs = None
    return prompt_id, prompt, (list(outputs) if outputs is not None else None), number


class PrefetchService:
    """See the module docstring. `mount_roots()` gives the roots of the mounts found now."""

    def __init__(self, models_of: ModelsOf, queue_snapshot: QueueSnapshot,
                 writer: ControlWriter, mount_roots: Callable[[], Sequence[str]],
                 planner: _planner.Planner | None = None, max_submitted: int = 16):
        self.models_of = models_of
        self.queue_snapshot = queue_snapshot
        self.writer = writer
        self.mount_roots = mount_roots
        self.planner = planner or _planner.Planner()
        self._max_submitted = max_submitted
        self._cached: dict[str, frozenset[str]] = {}  # prompt id -> cached node ids
        self._started: dict[str, list[str]] = {}  # prompt id -> nodes started, in order
        self._applied: dict[str, frozenset[str]] = {}  # prompt id -> done nodes planned with
        self._submitted: list[Any] = []  # on-prompt bodies' prompts, for the worker
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._requested = 0  # wake-ups asked for
        self._handled = 0  # wake-ups the worker has caught up with
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()

    # ----------------------------------------------------------------- called by ComfyUI

    def on_prompt(self, json_data: Any) -> Any:
        """The on-prompt handler: note the prompt for the worker and return the body as is."""
        try:
            prompt = json_data.get("prompt") if isinstance(json_data, Mapping) else None
            if isinstance(prompt, Mapping):
                with self._lock:
                    if len(self._submitted) < self._max_submitted:
                        self._submitted.append(prompt)
                self.wake()
        except Exception:  # noqa: BLE001 - never in ComfyUI's way
            pass
        return json_data

    def queue_changed(self) -> None:
        """ComfyUI's queue changed (a prompt was queued, started, finished or removed)."""
        self.wake()

    def on_message(self, event: Any, data: Any) -> None:
        """A message ComfyUI sends its clients; ``execution_cached`` and ``executing`` are
        used (see above)."""
        if event not in ("execution_cached", "executing") or not isinstance(data, Mapping):
            return
        prompt_id = data.get("prompt_id")
        if not isinstance(prompt_id, str):
            return
        with self._lock:
            if event == "execution_cached":
                nodes = data.get("nodes")
                if not isinstance(nodes, (list, tuple)):
                    return
                if len(self._cached) >= 4 * self.planner.max_prompts:
                    self._cached.pop(next(iter(self._cached)))
                self._cached[prompt_id] = frozenset(n for n in nodes if isinstance(n, str))
            else:
                node = data.get("node")
                if not isinstance(node, str):
                    return  # None: the prompt is done; the queue says so too
                if prompt_id not in self._started and len(self._started) >= 4 * self.planner.max_prompts:
                    self._started.pop(next(iter(self._started)))
                started = self._started.setdefault(prompt_id, [])
                if node not in started and len(started) < 4096:
                    started.append(node)
        self.wake()

    def _done(self, prompt_id: str) -> frozenset[str]:
        """Nodes of `prompt_id` that will not open a file again: cached, or started before the
        one running now (under the lock)."""
        started = self._started.get(prompt_id, [])
        return self._cached.get(prompt_id, frozenset()) | frozenset(started[:-1])

    # ----------------------------------------------------------------- the worker

    def wake(self) -> None:
        """Ask the worker for a refresh (never blocks; wake-ups coalesce)."""
        with self._cond:
            self._requested += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tierfs-planner",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until the worker has caught up with every wake-up so far (tests)."""
        with self._cond:
            target = self._requested
            return self._cond.wait_for(lambda: self._handled >= target, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._handled < self._requested)
                target = self._requested
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the worker never dies
                log.exception("[tierfs] planning failed")
            with self._cond:
                self._handled = target
                self._cond.notify_all()

    def _models(self, prompt: Any, outputs: Sequence[str] | None,
                cached: frozenset[str] = frozenset()) -> dict[str, list[str]]:
        try:
            models = self.models_of(prompt, outputs, cached)
        except Exception as e:  # noqa: BLE001 - a prompt we cannot read plans nothing
            self._warn_once("models", f"could not list a prompt's models: {e!r}")
            return {}
        return models if isinstance(models, dict) else {}

    def refresh(self) -> dict[str, list[str]]:
        """Read the queue, update the plans, send the changed ones. Returns what was sent."""
        with self._lock:
            submitted, self._submitted = self._submitted, []
        for prompt in submitted:  # looked up early; the queue entry is what counts
            self._models(prompt, None)

        try:
            running_items, queued_items = self.queue_snapshot()
        except Exception as e:  # noqa: BLE001
            self._warn_once("queue", f"could not read ComfyUI's queue: {e!r}")
            return {}
        running = [e for e in map(queue_entry, running_items or []) if e]
        queued = sorted((e for e in map(queue_entry, queued_items or []) if e),
                        key=lambda e: e[3])
        self.planner.sync([e[0] for e in running], [e[0] for e in queued])
        with self._lock:
            live_ids = {e[0] for e in running + queued}
            for known in (self._cached, self._started, self._applied):
                for pid in [p for p in known if p not in live_ids]:
                    del known[pid]
            done = {e[0]: self._done(e[0]) for e in running}
        for prompt_id, prompt, outputs, _ in running:
            if done[prompt_id] and done[prompt_id] != self._applied.get(prompt_id):
                self._applied[prompt_id] = done[prompt_id]
                self.planner.set_models(prompt_id, self._models(prompt, outputs, done[prompt_id]))
        for prompt_id, prompt, outputs, _ in running + queued:
            if not self.planner.knows(prompt_id) and prompt_id in self.planner.missing():
                self.planner.set_models(prompt_id, self._models(prompt, outputs))

        live = set(self.mount_roots())
        sent: dict[str, list[str]] = {}
        for root, plan in self.planner.changed().items():
            if root not in live:
                self.planner.forget_mount(root)  # mount gone: drop the work
                continue
            self.writer.submit(root, _planner.plan_command(plan))
            self.planner.mark_sent(root, plan)
            sent[root] = plan
            if plan:
                log.info("[tierfs] plan for %s: %s", root, ", ".join(plan))
            else:
                log.info("[tierfs] plan for %s cleared (nothing queued)", root)
        return sent

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("[tierfs] %s", message)


def wrap_queue_updated(server: Any, on_change: Callable[[], None]) -> bool:
    """Make ``server.queue_updated()`` also call `on_change()` (first, non-blocking). Wrapping
    twice replaces the earlier wrapper instead of nesting. Returns False if there is none."""
    current = getattr(server, "queue_updated", None)
    if not callable(current):
        return False
    original = getattr(current, "__tierfs_original__", current)

    def queue_updated(*args: Any, **kwargs: Any) -> Any:
        try:
            on_change()
        except Exception:  # noqa: BLE001 - never in ComfyUI's way
            pass
        return original(*args, **kwargs)

    queue_updated.__tierfs_original__ = original  # type: ignore[attr-defined]
    server.queue_updated = queue_updated
    return True


def wrap_send_sync(server: Any, on_message: Callable[[Any, Any], None]) -> bool:
    """Make ``server.send_sync(event, data, sid)`` also call `on_message(event, data)` (first,
    non-blocking). Wrapping twice replaces the earlier wrapper. False if there is none."""
    current = getattr(server, "send_sync", None)
    if not callable(current):
        return False
    original = getattr(current, "__tierfs_original__", current)

    def send_sync(event: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            on_message(event, data)
        except Exception:  # noqa: BLE001 - never in ComfyUI's way
            pass
        return original(event, data, *args, **kwargs)

    send_sync.__tierfs_original__ = original  # type: ignore[attr-defined]
    server.send_sync = send_sync
    return True


def queue_reader(prompt_queue: Any) -> QueueSnapshot:
    """A QueueSnapshot over ComfyUI's PromptQueue (volatile read when available)."""
    get = getattr(prompt_queue, "get_current_queue_volatile", None) or \
        getattr(prompt_queue, "get_current_queue")
    return lambda: get()
