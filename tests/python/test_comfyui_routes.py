"""The ComfyUI node's `GET /tierfs/stats` route (comfyui-node/routes.py).

- the DNS-rebinding guard: which `Host` headers may read the stats (a pure function);
- the JSON document: mounts with stats or an error, the hint when there is none, a failing
  `find_mounts`, a stats read that hangs (a FIFO with no writer, a blocked call) timing out
  without holding up the others or starting a second read of the hung mount;
- the stats of a real tierfs mount passed through the route's builder;
- the aiohttp handler itself (403 with the reason, 200 with the document, registered once),
  through aiohttp's test client (aiohttp is ComfyUI's web server; tests/setup-venv.sh installs
  it).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import threading
import time
from pathlib import Path

import pytest

import gen

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tierfs_comfyui_routes", REPO / "comfyui-node" / "routes.py")
routes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(routes)

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer


class FileMount:
    """A mount as the node's `mounts.Mount` is: `.root`, and `.stats()` parsing ROOT/.tierfs/stats."""

    def __init__(self, root: Path | str):
        self.root = str(root)

    def stats(self) -> dict:
        with open(os.path.join(self.root, ".tierfs", "stats")) as f:
            return json.load(f)


class FakeMount:
    def __init__(self, root: str, stats=None, exc: BaseException | None = None,
                 block: threading.Event | None = None):
        self.root, self._stats, self._exc, self._block = root, stats, exc, block
        self.calls = 0

    def stats(self):
        self.calls += 1
        if self._block is not None:
            self._block.wait(30)
        if self._exc is not None:
            raise self._exc
        return self._stats


def payload(reader: routes.StatsReader) -> dict:
    return asyncio.run(reader.payload())


# ----------------------------------------------------------------------------- the Host guard

@pytest.mark.parametrize("host", [
    "localhost", "localhost:8188", "LOCALHOST:8188", "LocalHost", "localhost.", "localhost.:8188",
    "app.localhost", "a.b.localhost:80", "127.0.0.1", "127.0.0.1:8188", "127.0.0.1.", "10.1.2.3:8188",
    "192.168.1.5", "[::1]", "[::1]:8188", "[::]:8188", "[fe80::1]:1", "[2001:db8::1]", "localhost:",
    " localhost:8188 ",
])
def test_loopback_names_and_addresses_are_accepted(host):
    assert routes.host_refusal(host) is None


@pytest.mark.parametrize("host", [
    None, "", "   ", "attacker.example", "attacker.example:8188", "localhost.attacker.example",
    "localhost.attacker.example:8188", "127.0.0.1.attacker.example", "mylocalhost", "localhost-x",
    ".localhost", "localhost..", "a..localhost", "::1", "::1:8188", "[::1", "[::1]x", "[::1]:x",
    "[localhost]:8188", "[127.0.0.1]", "localhost:abc", "localhost:99999", "localhost:-1", ":8188",
    "0x7f.1", "a b.localhost", "user@localhost",
])
def test_other_hosts_are_refused_with_the_reason(host):
    why = routes.host_refusal(host)
    assert why is not None
    assert "refused to guard against DNS rebinding" in why


def test_refusal_names_the_host():
    why = routes.host_refusal("attacker.example:8188")
    assert why.startswith("Host attacker.example:8188 is not a loopback name or an address")
    assert "no Host header" in routes.host_refusal(None)
    assert "empty Host header" in routes.host_refusal("")


@pytest.mark.parametrize("header,host", [
    ("LOCALHOST:8188", "localhost"), ("localhost.", "localhost"), ("[::1]:8188", "::1"),
    ("[::1]", "::1"), ("127.0.0.1:8188", "127.0.0.1"), ("App.Localhost.:80", "app.localhost"),
    ("Example.COM", "example.com"),
])
def test_parse_host_normalizes(header, host):
    assert routes.parse_host(header) == host


# ----------------------------------------------------------------------------- the document

def test_no_mount_gives_the_hint():
    doc = payload(routes.StatsReader(lambda: []))
    assert doc["mounts"] == []
    assert "tierfs" in doc["hint"] and "--extra-model-paths-config" in doc["hint"]
    assert "error" not in doc


def test_each_mount_has_its_stats_or_its_error():
    mounts = [FakeMount("/a", stats={"cache": {"hit_bytes": 1}}),
              FakeMount("/b", exc=OSError(5, "Input/output error")),
              FakeMount("/c", exc=ValueError("Expecting value: line 1 column 1")),
              FakeMount("/d", stats=[1, 2]),
              FakeMount("/e", exc=KeyError("boom"))]
    doc = payload(routes.StatsReader(lambda: mounts))
    assert "hint" not in doc
    by_root = {m["root"]: m for m in doc["mounts"]}
    assert [m["root"] for m in doc["mounts"]] == ["/a", "/b", "/c", "/d", "/e"]
    assert by_root["/a"] == {"root": "/a", "stats": {"cache": {"hit_bytes": 1}}}
    assert "Input/output error" in by_root["/b"]["error"] and "stats" not in by_root["/b"]
    assert by_root["/c"]["error"].startswith("ValueError: Expecting value")
    assert "not a JSON object" in by_root["/d"]["error"]
    assert "KeyError" in by_root["/e"]["error"]
    json.dumps(doc)


def test_failing_find_mounts_is_reported():
    def broken():
        raise OSError(2, "No such file or directory", "/proc/self/mountinfo")
    doc = payload(routes.StatsReader(broken))
    assert doc["mounts"] == []
    assert doc["error"].startswith("finding the tierfs mounts failed: FileNotFoundError")
    assert doc["hint"]


def test_a_hung_read_times_out_without_holding_up_the_others():
    release = threading.Event()
    hung = FakeMount("/hung", stats={"ok": 1}, block=release)
    fine = FakeMount("/fine", stats={"ok": 2})
    reader = routes.StatsReader(lambda: [hung, fine], timeout=2.0)
    try:
        t0 = time.monotonic()
        doc = payload(reader)
        assert 1.9 < time.monotonic() - t0 < 6
        by_root = {m["root"]: m for m in doc["mounts"]}
        assert "timed out after 2 s" in by_root["/hung"]["error"]
        assert by_root["/fine"]["stats"] == {"ok": 2}

        # While the first read hangs, no second one starts: the mount is reported still hung, at once.
        t0 = time.monotonic()
        doc = payload(reader)
        assert time.monotonic() - t0 < 1.5
        assert "still not answering" in {m["root"]: m for m in doc["mounts"]}["/hung"]["error"]
        assert hung.calls == 1 and fine.calls == 2

        # Once it returns, the mount is read again.
        release.set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "stats" not in payload(reader)["mounts"][0]:
            time.sleep(0.05)
        assert {m["root"]: m for m in payload(reader)["mounts"]}["/hung"]["stats"] == {"ok": 1}
        assert hung.calls >= 2
    finally:
        release.set()


def test_requests_share_a_read_in_flight():
    """Two pages polling at once: one read of the mount, both answered from it."""
    release = threading.Event()
    slow = FakeMount("/slow", stats={"ok": 1}, block=release)
    reader = routes.StatsReader(lambda: [slow], timeout=5.0)

    async def two():
        asyncio.get_running_loop().call_later(0.3, release.set)
        return await asyncio.gather(reader.payload(), reader.payload())
    try:
        docs = asyncio.run(two())
        assert [d["mounts"][0]["stats"] for d in docs] == [{"ok": 1}, {"ok": 1}]
        assert slow.calls == 1
    finally:
        release.set()


def test_a_hung_find_mounts_times_out():
    release = threading.Event()
    reader = routes.StatsReader(lambda: release.wait(30) and [], timeout=0.3)
    try:
        doc = payload(reader)
        assert "timed out" in doc["error"] and doc["mounts"] == []
    finally:
        release.set()


def test_a_stats_file_that_never_answers_times_out(tmp_path):
    """A FIFO with no writer in place of the stats file: its open blocks like a hung mount's."""
    (tmp_path / ".tierfs").mkdir()
    fifo = tmp_path / ".tierfs" / "stats"
    os.mkfifo(fifo)
    reader = routes.StatsReader(lambda: [FileMount(tmp_path)], timeout=0.5)
    try:
        t0 = time.monotonic()
        doc = payload(reader)
        assert time.monotonic() - t0 < 3
        assert doc["mounts"][0]["root"] == str(tmp_path)
        assert "timed out" in doc["mounts"][0]["error"]
    finally:
        # Free the blocked reader thread: a writer that opens and closes gives it end of file
        # (a non-blocking open for writing fails until the reader is in its open).
        deadline = time.monotonic() + 10
        while True:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_real_mount_stats_pass_through(mount, workdir):
    src = workdir / "src"
    (src / "checkpoints").mkdir(parents=True)
    model = src / "checkpoints" / "dit.safetensors"
    gen.write_small(model, gen.dit_specs(256, 1024, 6), seed=3)
    m = mount(src, budget="64MiB")
    with open(m.mnt / "checkpoints" / "dit.safetensors", "rb") as f:
        while f.read(1 << 20):
            pass
    doc = payload(routes.StatsReader(lambda: [FileMount(m.mnt)]))
    assert "hint" not in doc
    (entry,) = doc["mounts"]
    assert entry["root"] == str(m.mnt)
    stats = entry["stats"]
    assert stats["mount"]["mountpoint"] == str(m.mnt)
    (row,) = [f for f in stats["files"] if f["path"] == "checkpoints/dit.safetensors"]
    # What the sidebar tab draws.
    assert set(row["residency"]) <= set("#>~+-.") and len(row["residency"]) == row["blocks"] > 1
    assert row["mode"] in ("cache", "passthrough", "uncached")
    for key in ("hit_bytes", "miss_bytes", "disk_read_bytes", "cached_bytes", "size", "residency_current"):
        assert key in row
    for key in ("hit_bytes", "miss_bytes", "used_bytes", "budget_bytes", "chunk_budget_bytes", "uncached_bytes"):
        assert key in stats["cache"]
    assert "read_bytes" in stats["disk"] and "effective_bytes" in stats["budget"]
    json.dumps(doc)


# ----------------------------------------------------------------------------- the handler

class FakePromptServer:
    def __init__(self):
        self.routes = web.RouteTableDef()


async def _get(prompt_server, host: str | None):
    app = web.Application()
    app.add_routes(prompt_server.routes)
    async with TestClient(TestServer(app)) as client:
        headers = {} if host is None else {"Host": host}
        resp = await client.get(routes.ROUTE, headers=headers)
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


def test_handler_refuses_a_foreign_host():
    server = FakePromptServer()
    routes.register(server, lambda: [])
    status, _, body = asyncio.run(_get(server, "localhost.attacker.example:8188"))
    assert status == 403
    assert "Host localhost.attacker.example:8188 is not a loopback name or an address" in body


@pytest.mark.parametrize("host", ["127.0.0.1:8188", "[::1]:8188", "localhost:8188"])
def test_handler_answers_the_document(host):
    server = FakePromptServer()
    routes.register(server, lambda: [FakeMount("/m", stats={"files": []})])
    status, ctype, body = asyncio.run(_get(server, host))
    assert status == 200 and ctype.startswith("application/json")
    assert json.loads(body) == {"mounts": [{"root": "/m", "stats": {"files": []}}]}


def test_register_adds_the_route_once():
    server = FakePromptServer()
    routes.register(server, lambda: [])
    routes.register(server, lambda: [])
    assert [(r.method, r.path) for r in server.routes] == [("GET", "/tierfs/stats")]


def test_handler_answers_in_time_with_a_hung_mount():
    release = threading.Event()
    server = FakePromptServer()
    routes.register(server, lambda: [FakeMount("/hung", stats={}, block=release)], timeout=0.5)
    try:
        t0 = time.monotonic()
        status, _, body = asyncio.run(_get(server, "127.0.0.1:8188"))
        assert time.monotonic() - t0 < 5
        assert status == 200 and "timed out" in json.loads(body)["mounts"][0]["error"]
    finally:
        release.set()
