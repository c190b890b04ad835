#!/usr/bin/env python3
"""The pictures of `tierfs top` and of the dashboard page in docs/pictures/, taken while a model
streams through a real mount.

    sudo .venv/bin/python tests/bench/pictures.py [--tierfs target/release/tierfs] [--out docs/pictures]

A source with a DiT of 40 blocks (1.3 GiB) and a sharded model (3 shards), mounted with a
256 MiB budget and `--metrics-addr`. The sharded model is read once; then a reader streams the
DiT in 1 MiB reads, slower than the disk, and both pictures are taken during its first pass, so
the strip shows the blocks kept for the next pass, what is left of those behind the reader, the
reader's block, prefetch ahead of it and the blocks not read yet:

- `top.png`: `tierfs top` in a 160×46 tmux pane, captured with its colours (`capture-pane -e`),
  turned into HTML by `ansi2html` and drawn by headless Chromium;
- `dashboard.png`: the `--metrics-addr` page in headless Chromium after 20 s of refreshes.

Needs tmux, chromium, and the venv's ansi2html and websocket-client (tests/setup-venv.sh).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import gen  # noqa: E402
import gen_gguf  # noqa: E402
from ops_overhead import spawn_mount, stop_mount  # noqa: E402

import websocket  # noqa: E402
from ansi2html import Ansi2HTMLConverter  # noqa: E402

COLUMNS, ROWS = 160, 46
STREAM_PAUSE = 0.025  # seconds after each 1 MiB read: the reader is slower than the disk


def stream(path: Path, stop: threading.Event) -> None:
    while not stop.is_set():
        with open(path, "rb") as f:
            while not stop.is_set() and f.read(1 << 20):
                time.sleep(STREAM_PAUSE)


class Browser:
    """Headless Chromium showing `url`, captured through the DevTools protocol whenever asked
    (Chromium's own `--screenshot` runs the page on virtual time, which skews a page's rates)."""

    def __init__(self, chromium: str, url: str, size: tuple[int, int], profile: Path):
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", "--hide-scrollbars", f"--window-size={size[0]},{size[1]}",
             "--remote-debugging-port=0", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit("chromium did not open its DevTools port")
            time.sleep(0.1)
        self.port = port_file.read_text().split()[0]

    def capture(self, out: Path) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
        try:
            ws.send(json.dumps({"id": 1, "method": "Page.captureScreenshot"}))
            while True:
                reply = json.loads(ws.recv())
                if reply.get("id") == 1:
                    break
        finally:
            ws.close()
        out.write_bytes(base64.b64decode(reply["result"]["data"]))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Terminal:
    """`tierfs top` in a tmux pane of its own server."""

    def __init__(self, tierfs: Path, mnt: Path):
        self.socket = f"tierfs-pictures-{os.getpid()}"
        self.tmux("new-session", "-d", "-s", "top", "-x", str(COLUMNS), "-y", str(ROWS),
                  f"{tierfs} top {mnt} --interval 0.5")

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout

    def capture(self) -> str:
        """The pane with its colours, as HTML in a terminal's font."""
        ansi = self.tmux("capture-pane", "-e", "-p", "-t", "top")
        html = Ansi2HTMLConverter(dark_bg=True, font_size="12px", title="tierfs top").convert(ansi)
        # Box drawing characters in the font's cell width, one screen line per line.
        return html.replace("</style>", ".ansi2html-content { font-family: 'DejaVu Sans Mono', "
                            "monospace; white-space: pre; line-height: 1.2; } body { margin: 8px; }"
                            "</style>", 1)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


def take(tierfs: Path, mnt: Path, addr: str, out: Path, chromium: str, work: Path) -> None:
    """Both pictures of the same moment, after 20 s of refreshes."""
    terminal = Terminal(tierfs, mnt)
    try:
        page = Browser(chromium, f"http://{addr}/", (1100, 520), work / "profile-page")
        try:
            time.sleep(20)
            top = terminal.capture()
            page.capture(out / "dashboard.png")
        finally:
            page.close()
    finally:
        terminal.close()
    (work / "top.html").write_text(top)
    shot = Browser(chromium, (work / "top.html").as_uri(), (1200, 900), work / "profile-top")
    try:
        time.sleep(1)
        shot.capture(out / "top.png")
    finally:
        shot.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tierfs", type=Path, default=REPO / "target" / "release" / "tierfs")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "pictures")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None or shutil.which("tmux") is None:
        raise SystemExit("needs chromium and tmux (tests/setup-system.sh)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tierfs-pictures.", dir="/var/tmp") as tmp:
        work = Path(tmp)
        src, mnt = work / "models", work / "mnt"
        mnt.mkdir()
        src.mkdir()
        dit = src / "wan2.2_dit.safetensors"
        gen.write_streaming(dit, gen.dit_specs(1024, 4096, 40, ("BF16",)), seed=61)
        gen_gguf.make_sharded(src / "text_encoder", "model", gen.dit_specs(1024, 2048, 8), 3, seed=62)
        log = work / "tierfs.log"
        proc = spawn_mount(args.tierfs, src, mnt, log, "--ram-cache", "256MiB", "--no-state",
                           "--metrics-addr", "0")
        stop = threading.Event()
        reader = threading.Thread(target=stream, args=(mnt / dit.name, stop), daemon=True)
        try:
            addr = re.search(r"metrics: http://([0-9.:]+)/metrics", log.read_text()).group(1)
            for shard in sorted((mnt / "text_encoder").glob("model-*.safetensors")):
                shard.read_bytes()
            reader.start()  # its first pass: blocks ahead of it never read yet
            take(args.tierfs, mnt, addr, args.out, chromium, work)
        finally:
            stop.set()
            reader.join(timeout=30)
            stop_mount(proc, mnt)
    print(f"wrote {args.out / 'top.png'} and {args.out / 'dashboard.png'}")


if __name__ == "__main__":
    main()
