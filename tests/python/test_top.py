"""`tierfs top` in a real terminal (a tmux pane) while a model streams through a mount: a person
sees the model's residency strip and the figures, `d` drops the cache, `p` prefetches the selected
model, `+` raises the budget, `q` quits; a sharded model is one strip over all its shards; without
a terminal it prints the `tierfs stats` text view.

Every tmux call is bounded, and the tmux server (its own socket) goes at the end, whatever
happened.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time

import pytest

from conftest import MiB, TIERFS_BIN, quiesce
from test_metrics import MODEL_REL, file_row, metrics_source, read_all  # noqa: F401 (fixture)
from test_shards import INDEX, shard_names, shard_root  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Pane:
    """One tmux session on a server of its own, running `command` in a 150×45 pane."""

    def __init__(self, command: list[str]):
        self.socket = f"tierfs-top-{os.getpid()}-{time.monotonic_ns()}"
        self.tmux("new-session", "-d", "-s", "top", "-x", "150", "-y", "45", " ".join(command))

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              timeout=10)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top").stdout

    def wait_for(self, what: str, test, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if test(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout} s the screen shows no {what}:\n{screen}")
            time.sleep(0.1)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", "top").returncode == 0

    def close(self) -> None:
        self.tmux("kill-server")


def test_top_shows_the_strip_and_acts_on_keys(mount, metrics_source):
    m = mount(metrics_source, "32MiB", ("--no-passthrough",))
    read_all(m.mnt / MODEL_REL)  # the file is known, its order learned
    blocks = file_row(m)["blocks"]
    streaming = threading.Event()
    streaming.set()

    def stream():
        deadline = time.monotonic() + 20
        while streaming.is_set() and time.monotonic() < deadline:
            read_all(m.mnt / MODEL_REL)

    reader = threading.Thread(target=stream, daemon=True)
    pane = Pane([str(TIERFS_BIN), "top", str(m.mnt), "--interval", "0.2"])
    try:
        reader.start()
        strip = re.compile(r"^│([#>~+\-.]{%d}) *│$" % blocks, re.M)
        # The help line is the last drawn: a screen that has it is a whole frame.
        screen = pane.wait_for(f"strip of {blocks} blocks",
                               lambda s: strip.search(s) and "q quit" in s)
        assert MODEL_REL in screen and " cache " in screen, screen
        assert re.search(r"reader in block \d+ of %d +prefetch reaches \d+ blocks ahead" % blocks,
                         screen), screen
        assert re.search(r"hit rate \d+\.\d %", screen), screen
        assert re.search(r"pressure none \(0 events, 0 B given back\)", screen), screen
        assert re.search(r"^│read +\d+ +0 +[\d.]+ [µm]s +[\d.]+ [µm]s", screen, re.M), screen
        assert "q quit" in screen, screen
        # The source's line: its device and what it is, a latency above zero, its throughput
        # while reading, reads in flight and a peak of at least one.
        dev = os.stat(m.source / MODEL_REL).st_dev
        source = re.search(r"^│source (\d+:\d+) \((flash|spinning disk|unknown|[a-z0-9]+)\): latency ([\d.]+) "
                           r"(µs|ms) \(p50 [\d.]+ (?:µs|ms), p99 [\d.]+ (?:µs|ms)\), ([\d.]+) (?:B|KiB|MiB|GiB)/s "
                           r"while reading, (\d+) in flight \(peak (\d+)\), BDP ", screen, re.M)
        assert source, screen
        assert float(source.group(3)) > 0 and float(source.group(5)) > 0, source.group(0)
        assert int(source.group(7)) >= 1, source.group(0)
        assert source.group(1) == f"{os.major(dev)}:{os.minor(dev)}", source.group(0)
        # The model's own hit rate and served throughput, as a sparkline that peaks somewhere.
        pane.wait_for("the model's served sparkline",
                      lambda s: re.search(r"hit rate \d+\.\d % by bytes +served [▁-█]*█", s))
        streaming.clear()
        reader.join(timeout=30)

        pane.keys("d")
        pane.wait_for("'sent: drop'", lambda s: "sent: drop" in s)
        assert file_row(m)["cached_bytes"] == 0
        pane.wait_for("a strip of evicted blocks", lambda s: "│" + "-" * blocks + " " in s)

        # The only model is selected: `p` warms it through the control file.
        pane.keys("p")
        pane.wait_for(f"'sent: prefetch {MODEL_REL}'", lambda s: f"sent: prefetch {MODEL_REL}" in s)
        deadline = time.monotonic() + 10
        while file_row(m)["cached_bytes"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert file_row(m)["cached_bytes"] > 0, file_row(m)
        pane.wait_for("cached blocks again", lambda s: re.search(r"^│[#>~+\-]*#", s, re.M))

        pane.keys("+")
        pane.wait_for("'sent: ram-cache 40MiB'", lambda s: "sent: ram-cache 40MiB" in s)
        assert m.stats()["cache"]["budget_bytes"] == 40 * MiB

        pane.keys("q")
        deadline = time.monotonic() + 5
        while pane.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pane.alive(), f"still running after q:\n{pane.screen()}"
    finally:
        streaming.clear()
        pane.close()
        reader.join(timeout=30)


def test_top_shows_a_sharded_model_as_one_strip(mount, shard_root):
    m = mount(shard_root, "96MiB")
    for shard in shard_names(3):
        read_all(m.mnt / "big" / shard)
    model = next(x for x in quiesce(m)["models"] if x["name"] == f"big/{INDEX}")
    blocks = model["blocks"]
    pane = Pane([str(TIERFS_BIN), "top", str(m.mnt), "--interval", "0.2"])
    try:
        screen = pane.wait_for("the model's row", lambda s: f"big/{INDEX}  3 shards" in s)
        # Its shards are folded into it: no row of their own.
        assert not any(f"big/{name}" in screen for name in shard_names(3)), screen
        strip = re.search(r"^│([#>~+\-.]{%d}) *│$" % blocks, screen, re.M)
        assert strip and strip.group(1) == model["residency"], (screen, model)
        assert "-" in strip.group(1) and "#" in strip.group(1), screen
    finally:
        pane.close()


def test_top_without_a_terminal_prints_the_text_view(mount, metrics_source):
    m = mount(metrics_source, "32MiB", ("--no-passthrough",))
    read_all(m.mnt / MODEL_REL)
    # The read-ahead may still be reading when the reader is done: the view below is of the
    # mount at rest (nothing in flight, the peak kept).
    quiesce(m)
    r = subprocess.run([str(TIERFS_BIN), "top", str(m.mnt)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert MODEL_REL in r.stdout and "\x1b[" not in r.stdout, r.stdout
    assert re.search(r"^cache +\S+ \S+ used of 32.00 MiB budget", r.stdout, re.M), r.stdout[:500]
    assert re.search(r"^source +\d+:\d+ \([a-z0-9 ]+\): latency [\d.]+ (µs|ms) .* while reading, 0 in flight \(peak [1-9]",
                     r.stdout, re.M), r.stdout[:1500]
