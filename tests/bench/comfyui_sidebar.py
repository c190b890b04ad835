#!/usr/bin/env python3
"""The tierfs sidebar tab in a real ComfyUI page, checked while a model streams through a mount.

    sudo .venv/bin/python tests/bench/comfyui_sidebar.py --comfyui COMFYUI_CHECKOUT
        --python PYTHON_WITH_ITS_REQUIREMENTS [--tierfs BIN] [--node DIR] [--out PNG]

Contract: exits 0 after printing what it checked when the tab, opened in headless Chromium on
ComfyUI's own page, showed the model's residency strip advance between two moments of the
stream (more cached or read blocks, or the reader's block moved); exits non-zero saying what
it saw otherwise. Writes the second moment's screenshot to `--out` (default
docs/pictures/comfyui-sidebar.png, kept under 300 KB).

What it runs, every process stopped by its PID and the mount undone on every exit:

1. a name-sorted DiT of `--blocks` blocks (18 MiB each; 60: 1.1 GB, `tests/python/gen.py`) in
   `DATA/models/checkpoints/`, mounted with `tierfs mount --ram-cache BUDGET` (smaller than it);
2. ComfyUI from `--comfyui` (`main.py --cpu --listen 127.0.0.1 --port PORT
   --extra-model-paths-config`, the section `tierfs comfyui-config` prints), the node found at
   `custom_nodes/tierfs` (or `--node` linked there for the run, default this repository's
   `comfyui-node/`), its user settings in a folder of the run's own;
3. Chromium (`--chromium`, headless, a fresh profile) on the page; the tab opened by clicking
   its button in the sidebar; a reader streams the model through the mount in block order at
   `--mib-s`; the tab's DOM and a screenshot are taken `--settle` s after the stream starts and
   again `--gap` s later.

The check alone, against a server and a mount that already run (the ComfyUI benchmark's), is
`run_sidebar_check(comfy_url, mount_root, out_png, start_stream)`: `start_stream()` starts
reading a model through `mount_root` and returns a callable that stops it.

Needs root (the mount), `.venv` (websocket-client talks to Chromium's DevTools protocol), a
ComfyUI checkout and an interpreter with its requirements, and Chromium.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))

MiB = 1 << 20
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--remote-debugging-port=0"]
WINDOW = (1280, 760)
PNG_LIMIT = 300 * 1000
# ComfyUI's page settings for a first start without its welcome dialogs.
COMFY_SETTINGS = {"Comfy.TutorialCompleted": True, "Comfy.InstalledVersion": "99.0.0",
                  "Comfy.Sidebar.Size": "normal", "Comfy.ColorPalette": "dark"}


class CheckFailed(RuntimeError):
    """The page did not show what the check expects; the message says what it saw."""


def wait_for(what: str, probe: Callable[[], object], timeout: float, every: float = 0.25):
    """`probe()`'s first truthy value, polled every `every` s; `CheckFailed` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except CheckFailed:
            raise
        except (OSError, ValueError, RuntimeError) as e:
            last_error = e
        time.sleep(every)
    raise CheckFailed(f"{what}: not within {timeout:g} s" + (f" (last error: {last_error})" if last_error else ""))


def stop_process(proc: subprocess.Popen, name: str, grace: float = 15) -> None:
    """SIGTERM, then SIGKILL after `grace` s, by the process's PID; waits at most 10 s more."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            print(f"{name} (pid {proc.pid}) did not stop within {grace:g} s: killing it", file=sys.stderr)
            proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print(f"{name} (pid {proc.pid}) not reaped 10 s after SIGKILL", file=sys.stderr)


# ----------------------------------------------------------------------------- the browser

class Chromium:
    """Headless Chromium on `url`, driven through its DevTools protocol (websocket-client)."""

    def __init__(self, binary: str, url: str, profile: Path, window: tuple[int, int] = WINDOW):
        import websocket  # websocket-client, in .venv

        profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.ws = None
        self.next_id = 0
        try:
            port_file = profile / "DevToolsActivePort"
            port = wait_for("Chromium's DevTools port",
                            lambda: port_file.exists() and port_file.read_text().split()[0], 30)

            def page_target():
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    return next((t for t in json.load(r) if t["type"] == "page"), None)
            target = wait_for("Chromium's page", page_target, 30)
            self.ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=30,
                                                  suppress_origin=True)
            # The page's viewport exactly `window` (a headless window's size includes its frame).
            self.call("Emulation.setDeviceMetricsOverride", {"width": window[0], "height": window[1],
                                                             "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()
            raise

    def call(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        self.next_id += 1
        mine = self.next_id
        self.ws.settimeout(timeout)
        self.ws.send(json.dumps({"id": mine, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == mine:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise CheckFailed(f"Chromium did not answer {method} within {timeout:g} s")

    def eval(self, expression: str, timeout: float = 30):
        """The JSON value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, timeout)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page error: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the first element matching `selector`."""
        box = self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                        f" if (!e) return null; const r = e.getBoundingClientRect();"
                        f" return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        if not box:
            raise CheckFailed(f"no element {selector} to click")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                   "clickCount": 1})

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, 60)["data"])

    def close(self) -> None:
        """Asks Chromium to quit, then stops it by its PID; its helper processes, in the process
        group it was started in, go with it."""
        if self.ws is not None:
            try:
                self.call("Browser.close", timeout=5)
            except Exception:  # it may be gone already, or not answer: stopped below anyway
                pass
            try:
                self.ws.close()
            except Exception:
                pass
            self.ws = None
        stop_process(self.proc, "chromium", grace=10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # helpers left behind in its own group
        except (ProcessLookupError, PermissionError):
            pass


# What the check reads from the tab: per strip of the mount, the counts tierfs.js puts on it.
READ_STRIPS = """(() => {
  const mount = [...document.querySelectorAll('.tierfs-mount')].find(m => m.dataset.root === %s);
  if (!mount) return null;
  const strips = [...mount.querySelectorAll('.tierfs-strip')].map(s => ({
    path: s.dataset.path, blocks: +s.dataset.blocks, cached: +s.dataset.cached, read: +s.dataset.read,
    current: s.dataset.current === '' ? null : +s.dataset.current}));
  const figures = mount.querySelector('.tierfs-figures');
  const error = mount.querySelector('.tierfs-error');
  return {strips, figures: figures ? figures.innerText.replace(/\\s+/g, ' ') : '',
          error: error ? error.textContent : null,
          updated: (document.querySelector('.tierfs-updated') || {}).textContent || ''};
})()"""


def advanced(first: dict, second: dict) -> list[str]:
    """How each strip of `second` moved on from the same strip in `first` (none: the check fails)."""
    before = {s["path"]: s for s in first["strips"]}
    moves = []
    for s in second["strips"]:
        b = before.get(s["path"])
        if b is None:
            continue
        what = []
        if s["cached"] > b["cached"]:
            what.append(f"cached blocks {b['cached']} -> {s['cached']}")
        if s["read"] > b["read"]:
            what.append(f"read blocks {b['read']} -> {s['read']}")
        if s["current"] is not None and s["current"] != b["current"]:
            what.append(f"reader's block {b['current']} -> {s['current']}")
        if what:
            moves.append(f"{s['path']}: " + ", ".join(what))
    return moves


def fit_png(browser: Chromium, png: bytes, limit: int = PNG_LIMIT) -> bytes:
    """`png`, or when it is over `limit` bytes the part of the page from its left edge to the tab
    panel's right edge, taken again."""
    if len(png) <= limit:
        return png
    right = browser.eval("(() => { const p = document.querySelector('.tierfs-panel');"
                         " return p ? Math.ceil(p.getBoundingClientRect().right) + 24 : null; })()")
    if right:
        clip = {"x": 0, "y": 0, "width": min(right, WINDOW[0]), "height": WINDOW[1], "scale": 1}
        png = base64.b64decode(browser.call("Page.captureScreenshot", {"format": "png", "clip": clip}, 60)["data"])
    if len(png) > limit:
        raise CheckFailed(f"the screenshot is {len(png)} bytes, over {limit}")
    return png


def run_sidebar_check(comfy_url: str, mount_root: str, out_png: Path | str,
                      start_stream: Callable[[], Callable[[], None]], *, chromium: str = "/usr/bin/chromium",
                      settle: float = 4.0, gap: float = 4.0, page_timeout: float = 180,
                      work: Path | None = None) -> dict:
    """Opens ComfyUI's page at `comfy_url` in headless Chromium, opens the tierfs tab, waits
    until it shows the mount `mount_root`, calls `start_stream()` (which starts reading a model
    through the mount and returns a callable that stops it), reads the tab's strips `settle` s
    later and again `gap` s after that, and writes the second screenshot to `out_png`.

    Returns {"first", "second": what the tab showed (strips, figures), "advanced": how the
    strips moved, "opened_by": how the tab was opened, "png": the path, "png_bytes"}. Raises
    `CheckFailed` when the tab does not appear, does not show the mount, or no strip advanced.
    Chromium and the stream are stopped before it returns or raises."""
    out_png = Path(out_png)
    own_work = work is None
    work = Path(tempfile.mkdtemp(prefix="comfyui-sidebar.")) if own_work else work
    stop_stream = None
    browser = Chromium(chromium, comfy_url, work / "profile")
    try:
        wait_for("the tierfs tab's button in ComfyUI's sidebar",
                 lambda: browser.eval("!!document.querySelector('.tierfs-tab-button')"), page_timeout, 0.5)
        time.sleep(1.0)  # the page's first layout settles (dialogs, the canvas)
        browser.call("Input.dispatchKeyEvent", {"type": "keyDown", "key": "Escape", "code": "Escape",
                                                "windowsVirtualKeyCode": 27})
        browser.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": "Escape", "code": "Escape",
                                                "windowsVirtualKeyCode": 27})
        browser.click(".tierfs-tab-button")
        opened = "a mouse click on its sidebar button"
        try:
            wait_for("the tab's panel", lambda: browser.eval("!!document.querySelector('.tierfs-panel')"), 10, 0.25)
        except CheckFailed:  # something covered the button (a dialog of a first start): click it from the page
            browser.eval("document.querySelector('.tierfs-tab-button').click()")
            opened = "the page's click() of its sidebar button (a mouse click did not open it)"
        expr = READ_STRIPS % json.dumps(mount_root)
        shown = wait_for(f"the tab showing the mount {mount_root}", lambda: browser.eval(expr), 30, 0.5)
        if shown.get("error"):
            raise CheckFailed(f"the tab shows an error for {mount_root}: {shown['error']}")
        stop_stream = start_stream()
        wait_for("a strip with a block read",
                 lambda: any(s["read"] for s in (browser.eval(expr) or {"strips": []})["strips"]), 60, 0.5)
        time.sleep(settle)
        first = browser.eval(expr)
        (work / "first.png").write_bytes(browser.screenshot())
        time.sleep(gap)
        second = browser.eval(expr)
        png = fit_png(browser, browser.screenshot())
    except CheckFailed as e:
        try:  # what the page showed, for the report
            (work / "failed.png").write_bytes(browser.screenshot())
            panel = browser.eval("(document.querySelector('.tierfs-panel') || {}).innerText || null")
        except (OSError, RuntimeError, CheckFailed):
            panel = None
        raise CheckFailed(f"{e}; the tab showed: {panel!r}; the page: {work / 'failed.png'}") from None
    finally:
        try:
            if stop_stream is not None:
                stop_stream()
        finally:
            browser.close()
    moves = advanced(first, second)
    if not moves:
        raise CheckFailed(f"no strip advanced in {gap:g} s while the model streamed: first {first}, second {second}")
    out_png.parent.mkdir(parents=True, exist_ok=True)
    out_png.write_bytes(png)
    if own_work:
        shutil.rmtree(work, ignore_errors=True)
    return {"first": first, "second": second, "advanced": moves, "opened_by": opened, "png": str(out_png),
            "png_bytes": len(png)}


# ----------------------------------------------------------------------------- the stream

def stream(path: Path, mib_s: float) -> None:
    """Reads `path` in block order (`gen.model_order`) in 1 MiB `pread`s at `mib_s` MiB/s, pass
    after pass, until killed. Run as `comfyui_sidebar.py --stream PATH --mib-s N`."""
    import gen

    ranges = [(start, end) for _, start, end in gen.model_order(path)]
    fd = os.open(path, os.O_RDONLY)
    started, done = time.monotonic(), 0
    while True:
        for start, end in ranges:
            for off in range(start, end, MiB):
                done += len(os.pread(fd, min(MiB, end - off), off))
                ahead = done / (mib_s * MiB) - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)


def start_reader(path: Path, mib_s: float) -> Callable[[], None]:
    """`stream(path, mib_s)` in a process of its own; returns the callable that stops it."""
    proc = subprocess.Popen([sys.executable, __file__, "--stream", str(path), "--mib-s", str(mib_s)])
    return lambda: stop_process(proc, "the reader", grace=5)


# ----------------------------------------------------------------------------- standalone run

class Run:
    """The mount and the ComfyUI server of a standalone run; `close()` undoes everything."""

    def __init__(self, args, work: Path):
        self.args, self.work = args, work
        self.mount_proc = self.comfy = self.linked = None
        self.mnt = work / "mnt"

    def mount(self, source: Path) -> None:
        self.mnt.mkdir()
        log = (self.work / "tierfs.log").open("wb")
        self.mount_proc = subprocess.Popen(
            [str(self.args.tierfs), "mount", str(source), str(self.mnt), "--ram-cache", self.args.budget,
             "--no-state"], stdout=log, stderr=subprocess.STDOUT)
        stats = self.mnt / ".tierfs" / "stats"

        def ready():
            if self.mount_proc.poll() is not None:
                raise CheckFailed(f"tierfs exited: {(self.work / 'tierfs.log').read_text()[-2000:]}")
            return stats.exists()
        wait_for(f"the mount at {self.mnt}", ready, 30, 0.1)

    def link_node(self) -> None:
        target = self.args.comfyui / "custom_nodes" / "tierfs"
        if target.exists() or target.is_symlink():
            print(f"node: {target} (already there)")
            return
        node = self.args.node.resolve()
        if not (node / "__init__.py").exists():
            raise CheckFailed(f"{node} has no __init__.py: the tierfs node's package is needed (--node DIR)")
        target.symlink_to(node, target_is_directory=True)
        self.linked = target
        print(f"node: {node} linked at {target} for the run")

    def start_comfyui(self) -> str:
        paths = self.work / "tierfs_paths.yaml"
        paths.write_text(subprocess.run([str(self.args.tierfs), "comfyui-config", str(self.mnt)], check=True,
                                        capture_output=True, text=True, timeout=30).stdout)
        user = self.work / "user"
        (user / "default").mkdir(parents=True)
        (user / "default" / "comfy.settings.json").write_text(json.dumps(COMFY_SETTINGS))
        (self.work / "out").mkdir()
        self.log_path = self.work / "comfyui.log"
        self.comfy = subprocess.Popen(
            [str(self.args.python), "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.args.port),
             "--extra-model-paths-config", str(paths), "--user-directory", str(user),
             "--output-directory", str(self.work / "out"), "--disable-auto-launch",
             "--database-url", "sqlite:///:memory:"],
            cwd=self.args.comfyui, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{self.args.port}/"

        def ready():
            if self.comfy.poll() is not None:
                raise CheckFailed(f"ComfyUI exited ({self.comfy.returncode}): {self.log_path.read_text()[-3000:]}")
            with urllib.request.urlopen(url + "api/tierfs/stats", timeout=5) as r:
                return json.load(r)
        try:
            doc = wait_for("ComfyUI's /api/tierfs/stats", ready, 180, 0.5)
        except CheckFailed as e:
            raise CheckFailed(f"{e}; log {self.log_path}") from None
        roots = [m["root"] for m in doc["mounts"]]
        if str(self.mnt) not in roots:
            raise CheckFailed(f"/api/tierfs/stats does not list the mount {self.mnt}: {doc}")
        return url

    def close(self) -> None:
        if self.comfy is not None:
            stop_process(self.comfy, "ComfyUI", grace=30)
        if self.mount_proc is not None:
            stop_process(self.mount_proc, "tierfs", grace=15)
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True, timeout=30)
            self.mount_proc = None
        if self.linked is not None and self.linked.is_symlink():
            self.linked.unlink()
            self.linked = None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfyui", type=Path, help="a ComfyUI checkout")
    ap.add_argument("--python", type=Path, help="an interpreter with ComfyUI's requirements")
    ap.add_argument("--tierfs", type=Path, default=Path(os.environ.get("TIERFS_BIN", REPO / "target/release/tierfs")))
    ap.add_argument("--node", type=Path, default=REPO / "comfyui-node",
                    help="the node, linked as custom_nodes/tierfs when that is absent")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "pictures" / "comfyui-sidebar.png")
    ap.add_argument("--data", type=Path,
                    help="where the model is written (kept for the next run); default: the run's folder")
    ap.add_argument("--blocks", type=int, default=60, help="blocks of the model (18 MiB each)")
    ap.add_argument("--budget", default="256MiB")
    ap.add_argument("--mib-s", type=float, default=40.0, help="the reader's pace")
    ap.add_argument("--port", type=int, default=8191)
    ap.add_argument("--settle", type=float, default=4.0)
    ap.add_argument("--gap", type=float, default=4.0)
    ap.add_argument("--stream", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stream:
        stream(args.stream, args.mib_s)
        return 0
    if not args.comfyui or not args.python:
        ap.error("--comfyui and --python are needed")
    if os.geteuid() != 0:
        ap.error("needs root (the mount)")

    work = Path(tempfile.mkdtemp(prefix="comfyui-sidebar."))
    run = Run(args, work)
    atexit.register(run.close)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    import gen

    source = (args.data or work / "data") / "models"
    model = gen.make_sorted_dit(source / "checkpoints" / f"dit_sorted_{args.blocks}.safetensors",
                                n_blocks=args.blocks)
    print(f"model: {model} ({model.stat().st_size / 1e9:.2f} GB, {args.blocks} blocks); budget {args.budget}")
    try:
        run.mount(source)
        run.link_node()
        url = run.start_comfyui()
        print(f"ComfyUI: {url} (pid {run.comfy.pid}), mount {run.mnt} (tierfs pid {run.mount_proc.pid})")
        rel = model.relative_to(source)
        result = run_sidebar_check(url, str(run.mnt), args.out, lambda: start_reader(run.mnt / rel, args.mib_s),
                                   chromium=args.chromium, settle=args.settle, gap=args.gap, work=work)
    except CheckFailed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        print(f"logs kept in {work}", file=sys.stderr)
        return 1
    finally:
        run.close()
    for name in ("first", "second"):
        shot = result[name]
        strips = "; ".join(f"{s['path']}: {s['cached']}/{s['blocks']} cached, {s['read']} read, "
                           f"reader at {s['current']}" for s in shot["strips"])
        print(f"{name}: {strips} | {shot['figures']}")
    print(f"tab opened by {result['opened_by']}")
    print("advanced: " + " | ".join(result["advanced"]))
    print(f"screenshot: {result['png']} ({result['png_bytes']} bytes)")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
