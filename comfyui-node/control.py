"""Writing commands to ``MNT/.tierfs/control`` without ever blocking ComfyUI.

Contract:

- :func:`write_command` does one ``write()`` of the whole command on a fresh descriptor and
  reports the outcome as a :class:`WriteResult`, giving up after `timeout` seconds (the write
  runs in a daemon thread; a mount that stops answering leaves that thread blocked, never the
  caller).
- :class:`ControlWriter` is the fire-and-forget front: :meth:`ControlWriter.submit` queues a
  command and returns at once. One daemon worker thread sends them in order, each with the
  timeout above. The queue is bounded (the oldest command is dropped when full), a newer plan
  for a mount replaces a plan still waiting for it, and while a write to a mount is stuck,
  commands for that mount are dropped (one log line) until it returns.
- Failures are logged once per (mount, kind) until a write to that mount succeeds again.
  ``EINVAL`` is the daemon refusing the command (it then changed nothing): the log line says
  which command and why it may have been refused. A mount that is gone (``ENOENT``,
  ``ENOTCONN``...) drops the command.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("tierfs")

GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENOTCONN, errno.ENODEV, errno.ENXIO, errno.ESTALE,
                         errno.ENOTDIR})


@dataclass(frozen=True)
class WriteResult:
    """Outcome of one control write. `error`: None when the daemon accepted the command."""

    path: str
    command: bytes
    error: int | None = None  # errno
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out

    @property
    def kind(self) -> str:
        """A short name of the outcome, for logs and log-once keys."""
        if self.timed_out:
            return "timeout"
        if self.error is None:
            return "ok"
        return errno.errorcode.get(self.error, str(self.error))

    def describe(self) -> str:
        verb = command_word(self.command)
        if self.timed_out:
            return (f"writing '{verb}' to {self.path} did not finish: the mount is not "
                    f"answering; later commands for it are dropped until it does")
        if self.error is None:
            return f"'{verb}' accepted by {self.path}"
        if self.error == errno.EINVAL:
            why = ("this tierfs daemon may be older than the node and not know 'plan', "
                   "or a path in it is not a model file under the mount"
                   if verb == "plan" else "the daemon did not accept it")
            return (f"the daemon at {self.path} refused '{verb}' (EINVAL: {why}); "
                    f"it changed nothing; its log says why")
        if self.error in GONE_ERRNOS:
            return f"cannot write '{verb}' to {self.path}: {os.strerror(self.error)} (mount gone?)"
        return f"writing '{verb}' to {self.path} failed: {os.strerror(self.error)}"


def command_word(command: bytes) -> str:
    head = command.split(None, 1)
    return head[0].decode("utf-8", "replace")[:32] if head else ""


def _write_once(path: str, data: bytes) -> int | None:
    """One write() of `data` to `path`; None on success, else the errno."""
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return e.errno or errno.EIO
    try:
        n = os.write(fd, data)
        if n != len(data):
            return errno.EIO  # a short write would be a different command
        return None
    except OSError as e:
        return e.errno or errno.EIO
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def write_command(path: str, data: bytes, timeout: float = 2.0,
                  on_late_finish: Callable[[int | None], None] | None = None) -> WriteResult:
    """Write `data` to the control file `path` in one write(), waiting at most `timeout` s.
    When it times out the write keeps going in its daemon thread; `on_late_finish(errno)`
    is called if and when it finishes."""
    box: dict[str, int | None] = {}
    lock = threading.Lock()
    state = {"done": False, "abandoned": False}

    def run() -> None:
        error = _write_once(path, data)
        with lock:
            box["error"] = error
            state["done"] = True
            abandoned = state["abandoned"]
            finished.set()
        if abandoned and on_late_finish is not None:
            try:
                on_late_finish(error)
            except Exception:  # noqa: BLE001 - a callback never kills the thread silently
                log.exception("[tierfs] control write callback failed")

    finished = threading.Event()
    threading.Thread(target=run, name="tierfs-control-write", daemon=True).start()
    finished.wait(timeout)
    with lock:  # exactly one of: the caller gets the outcome, or on_late_finish does
        if not state["done"]:
            state["abandoned"] = True
            return WriteResult(path, data, timed_out=True)
    return WriteResult(path, data, error=box.get("error"))


class ControlWriter:
    """A bounded, non-blocking queue of control commands, sent by one daemon thread."""

    def __init__(self, timeout: float = 2.0, max_pending: int = 64,
                 control_path: Callable[[str], str] | None = None):
        self.timeout = timeout
        self.max_pending = max_pending
        self._control_path = control_path or (lambda root: os.path.join(root, ".tierfs",
                                                                        "control"))
        self._cond = threading.Condition()
        self._pending: deque[tuple[str, bytes]] = deque()
        self._stuck: set[str] = set()
        self._logged: set[tuple[str, str]] = set()
        self._busy = False
        self._thread: threading.Thread | None = None
        self.results: deque[WriteResult] = deque(maxlen=32)  # latest outcomes, for tests/UI

    def submit(self, root: str, command: bytes) -> bool:
        """Queue `command` for the mount at `root`; returns at once. False if dropped."""
        with self._cond:
            if root in self._stuck:
                self._log_once(root, "stuck-drop", logging.DEBUG,
                               f"dropping '{command_word(command)}' for {root}: "
                               "an earlier write to it has not returned")
                return False
            if command_word(command) == "plan":
                kept = [(r, c) for r, c in self._pending
                        if not (r == root and command_word(c) == "plan")]
                self._pending = deque(kept)
            if len(self._pending) >= self.max_pending:
                old_root, old = self._pending.popleft()
                self._log_once(old_root, "queue-full", logging.WARNING,
                               f"too many control commands waiting; dropped "
                               f"'{command_word(old)}' for {old_root}")
            self._pending.append((root, command))
            self._ensure_thread()
            self._cond.notify()
            return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued command was handled (tests). True if it was in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="tierfs-control",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                root, command = self._pending.popleft()
                self._busy = True
            try:
                self._send(root, command)
            except Exception:  # noqa: BLE001 - the worker never dies
                log.exception("[tierfs] control worker error")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, root: str, command: bytes) -> None:
        path = self._control_path(root)
        with self._cond:
            if root in self._stuck:
                return

        returned_late = False

        def late(err: int | None) -> None:
            nonlocal returned_late
            with self._cond:
                returned_late = True
                self._stuck.discard(root)
            log.info("[tierfs] the write to %s returned after all (%s)", path,
                     "accepted" if err is None else errno.errorcode.get(err, err))

        result = write_command(path, command, self.timeout, on_late_finish=late)
        self.results.append(result)
        with self._cond:
            if result.timed_out:
                if not returned_late:  # it may already have come back
                    self._stuck.add(root)
                dropped = [(r, c) for r, c in self._pending if r == root]
                self._pending = deque((r, c) for r, c in self._pending if r != root)
            else:
                dropped = []
        if result.ok:
            with self._cond:
                self._logged = {k for k in self._logged if k[0] != root}
            log.debug("[tierfs] %s", result.describe())
            return
        level = logging.INFO if result.error in GONE_ERRNOS else logging.WARNING
        msg = result.describe()
        if dropped:
            msg += f" ({len(dropped)} queued command(s) for it dropped)"
        with self._cond:
            self._log_once(root, f"{command_word(command)}:{result.kind}", level, msg)

    def _log_once(self, root: str, kind: str, level: int, message: str) -> None:
        """Log `message` unless this (root, kind) was logged since the last success."""
        if (root, kind) in self._logged:
            return
        self._logged.add((root, kind))
        log.log(level, "[tierfs] %s", message)
