"""What the tier is doing, as scripts and monitoring systems read it, through real mounts: the
stats' per-block residency strips (`files[].residency`), and the Prometheus metrics in
`.tierfs/metrics` and at `--metrics-addr`, parsed with the reference Python parser
(`prometheus_client`).

A model in the chunk cache (`--no-passthrough`, a budget larger than it) is read whole, so every
block is resident; a `drop` empties it; a stream over its first blocks fills those only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import gen
from conftest import MiB, TIERFS_BIN, fresh_dir, quiesce
from test_control import ctl

MODEL_REL = "model.safetensors"


@pytest.fixture(scope="module")
def metrics_source(data_dir) -> Path:
    """SOURCE with one ~64 MiB DiT of 8 transformer blocks (plus its other tensors)."""
    root = data_dir / "metrics_src"
    done = root / ".complete"
    if not done.exists():
        root.mkdir(parents=True, exist_ok=True)
        gen.write_streaming(root / MODEL_REL, gen.dit_specs(512, 2048, 8, ("BF16",)), seed=47)
        done.write_text("ok\n")
    return root


def file_row(m, rel: str = MODEL_REL) -> dict:
    row = m.file_stats(rel)
    assert row is not None, f"{rel} not in files[]: {m.stats()['files']}"
    return row


def read_all(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


def test_schema_version_is_served(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough",))
    doc = m.stats()
    assert doc["schema_version"] == doc["version"] == 2, doc


def test_residency_strip_follows_the_cache(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough",))
    read_all(m.mnt / MODEL_REL)
    quiesce(m)
    row = file_row(m)
    assert row["mode"] == "cache", row
    strip, blocks = row["residency"], row["blocks"]
    assert len(strip) == blocks > 1, row
    assert strip == "#" * blocks, f"a model read whole within its budget, strip {strip!r}"
    # The file's own figures: everything it served went through the chunk cache (the kernel
    # may ask for a range more than once), read from the source about once.
    size = (m.mnt / MODEL_REL).stat().st_size
    assert row["hit_bytes"] + row["miss_bytes"] >= 0.9 * size, row
    assert 0.9 * size <= row["disk_read_bytes"] <= 1.1 * size, row
    # Again, with the kernel's page cache of the mounted file dropped: all from memory.
    fd = os.open(m.mnt / MODEL_REL, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    read_all(m.mnt / MODEL_REL)
    again = file_row(m)
    assert again["hit_bytes"] - row["hit_bytes"] >= 0.9 * size, (row, again)
    assert (again["miss_bytes"], again["disk_read_bytes"]) == (row["miss_bytes"], row["disk_read_bytes"])
    current = row["residency_current"]
    assert isinstance(current, int) and 0 <= current < blocks, row

    assert ctl(m.mnt, "drop") > 0
    row = file_row(m)
    # Every block was read, and none is held now: evicted, not never read.
    assert row["cached_bytes"] == 0 and row["residency"] == "-" * blocks, row

    # A stream over the first eighth of the data region (a lone request is a probe, served
    # uncached) fills the blocks there and the one or two prefetch reads ahead, not all.
    header_bytes, _ = gen.read_header(metrics_source / MODEL_REL)
    size = (m.mnt / MODEL_REL).stat().st_size
    with open(m.mnt / MODEL_REL, "rb") as f:
        f.seek(8 + header_bytes)
        for _ in range(size // 8 // (1 << 20)):
            f.read(1 << 20)
    quiesce(m)
    row = file_row(m)
    strip = row["residency"]
    # Prefetch read ahead of the reader's block: the front is a block after it (in the order,
    # which goes on from the end of the strip to its start).
    current, front = row["residency_current"], row["residency_prefetch_front"]
    assert isinstance(front, int) and 0 < (front - current) % blocks <= blocks // 2, row
    assert len(strip) == blocks and set(strip) <= set("#>~+-"), strip
    assert strip.count("-") < blocks, f"a block was read again, strip {strip!r}"
    assert "-" in strip, f"only some blocks were read again, strip {strip!r}"


# ----------------------------------------------------------------------------- source meter

def source_device(doc: dict, path: Path) -> dict:
    """The `source.devices[]` entry of the device `path` is on."""
    dev = os.stat(path).st_dev
    found = [d for d in doc["source"]["devices"] if d["dev"] == dev]
    assert len(found) == 1, (dev, doc["source"])
    assert found[0]["device"] == f"{os.major(dev)}:{os.minor(dev)}", found[0]
    return found[0]


def test_source_section_measures_the_reads_of_a_model(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough",))
    read_all(m.mnt / MODEL_REL)
    doc = quiesce(m)
    size = (m.mnt / MODEL_REL).stat().st_size
    d = source_device(doc, metrics_source / MODEL_REL)
    # Every read of the source: the chunks (page-aligned, so at least what `disk` counts) and
    # the header.
    assert d["bytes"] >= doc["disk"]["read_bytes"] >= 0.9 * size, (d, doc["disk"])
    assert d["reads"] > doc["disk"]["reads"] > 0, (d, doc["disk"])
    assert d["busy_seconds"] > 0 and d["latency_mean_us"] > 0, d
    assert 0 < d["latency_p50_us"] <= d["latency_p99_us"], d
    assert d["latency_smoothed_us"] > 0 and d["throughput_bytes_per_second"] > 0, d
    assert d["in_flight"] == 0 and d["in_flight_peak"] >= 1 and d["in_flight_mean"] >= 1, d
    # Enough reads for an estimate: bandwidth × unqueued latency, in bytes.
    assert d["window_reads"] == d["reads"] >= 16, d
    bdp = d["bandwidth_delay_bytes"]
    assert bdp is not None and bdp > 0, d
    expected = d["bandwidth_bytes_per_second"] * d["latency_floor_us"] / 1e6
    assert abs(bdp - expected) <= 1 + expected * 1e-6, d

    # The same figures in the metrics, per device.
    fams = families(read_metrics(m))
    after = source_device(m.stats(), metrics_source / MODEL_REL)
    label = {"device": d["device"]}
    assert fams["tierfs_source_read_bytes"].type == "counter"
    assert d["bytes"] <= value(fams, "tierfs_source_read_bytes", **label) <= after["bytes"]
    assert d["reads"] <= value(fams, "tierfs_source_reads", **label) <= after["reads"]
    assert value(fams, "tierfs_source_latency_p99_seconds", **label) > 0
    assert value(fams, "tierfs_source_throughput_bytes_per_second", **label) > 0
    assert value(fams, "tierfs_source_reads_in_flight_peak", **label) >= 1
    assert value(fams, "tierfs_source_bandwidth_delay_bytes", **label) > 0
    hist = [s for s in fams["tierfs_source_read_duration_seconds"].samples if s.labels.get("device") == d["device"]]
    count = next(s.value for s in hist if s.name.endswith("_count"))
    assert d["reads"] <= count <= after["reads"], (count, d)
    assert next(s.value for s in hist if s.name.endswith("_sum")) > 0


# ----------------------------------------------------------------------------- metrics

def families(text: str) -> dict:
    """{family name: family} of exposition `text`, parsed by the reference parser (which
    raises on anything malformed); counter families are named without `_total`."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, name: str, **labels) -> float:
    for sample in fams[name].samples:
        if sample.name in (name, name + "_total") and sample.labels == labels:
            return sample.value
    raise AssertionError(f"no sample {name}{labels} in {fams[name].samples}")


def read_metrics(m) -> str:
    with open(m.mnt / ".tierfs" / "metrics") as f:
        return f.read()


def test_metrics_file_parses_and_agrees_with_the_stats(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough",))
    path = m.mnt / ".tierfs" / "metrics"
    assert "metrics" in {p.name for p in path.parent.iterdir()}
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    read_all(m.mnt / MODEL_REL)
    before = quiesce(m)
    fams = families(read_metrics(m))
    after = m.stats()

    types = {name: f.type for name, f in fams.items()}
    for name in ("tierfs_cache_hit_bytes", "tierfs_cache_miss_bytes", "tierfs_disk_read_bytes",
                 "tierfs_stall_seconds", "tierfs_prefetch_issued_bytes", "tierfs_file_stall_seconds"):
        assert types.get(name) == "counter", (name, types.get(name))
    for name in ("tierfs_budget_bytes", "tierfs_cache_used_bytes", "tierfs_cache_chunks",
                 "tierfs_file_cached_bytes", "tierfs_file_resident_blocks"):
        assert types.get(name) == "gauge", (name, types.get(name))
    assert types.get("tierfs_op_duration_seconds") == "histogram", types

    assert value(fams, "tierfs_budget_bytes") == 256 * MiB
    for name, section, key in (("tierfs_disk_read_bytes", "disk", "read_bytes"),
                               ("tierfs_cache_hit_bytes", "cache", "hit_bytes"),
                               ("tierfs_cache_used_bytes", "cache", "used_bytes")):
        got = value(fams, name)
        assert before[section][key] <= got <= after[section][key], (name, got, before[section][key])
    row = file_row(m)
    assert value(fams, "tierfs_file_cached_bytes", path=MODEL_REL) == row["cached_bytes"] > 0
    assert value(fams, "tierfs_file_resident_blocks", path=MODEL_REL) == row["blocks"]
    assert value(fams, "tierfs_file_passthrough", path=MODEL_REL) == 0

    # The reads of the model are in the read histogram: cumulative buckets up to +Inf = count.
    reads = [s for s in fams["tierfs_op_duration_seconds"].samples if s.labels.get("op") == "read"]
    buckets = [(float(s.labels["le"]), s.value) for s in reads if s.name.endswith("_bucket")]
    count = next(s.value for s in reads if s.name.endswith("_count"))
    assert count >= (m.mnt / MODEL_REL).stat().st_size // MiB, count
    assert [b for _, b in buckets] == sorted(b for _, b in buckets), buckets
    assert buckets[-1] == (float("inf"), count), buckets
    assert next(s.value for s in reads if s.name.endswith("_sum")) > 0


def test_metrics_label_only_the_most_recently_opened_files(mount, workdir):
    src = workdir / "many"
    src.mkdir()
    names = [f"lora_{i:03d}.safetensors" for i in range(70)]
    for i, name in enumerate(names):
        (src / name).write_bytes(gen.small_safetensors(i))
    m = mount(src, "64MiB")
    for name in names:  # opened in this order: the last 64 are the most recent
        (m.mnt / name).read_bytes()
    assert len(m.stats()["files"]) == 70
    labelled = {s.labels["path"] for s in families(read_metrics(m))["tierfs_file_size_bytes"].samples}
    assert labelled == set(names[-64:]), sorted(set(names) ^ labelled)


def served_addr(m, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"metrics: http://([0-9.:]+)/metrics", m.log_tail(20000))
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise AssertionError(f"no metrics address in the log:\n{m.log_tail()}")


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def test_metrics_endpoint_serves_scrapes_until_unmount(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough", "--metrics-addr", "0"))
    addr = served_addr(m)
    assert addr.startswith("127.0.0.1:"), "a bare port is loopback"
    read_all(m.mnt / MODEL_REL)
    quiesce(m)
    status, ctype, text = get(f"http://{addr}/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype)
    fams = families(text)
    assert value(fams, "tierfs_disk_read_bytes") == m.stats()["disk"]["read_bytes"] > 0
    assert value(fams, "tierfs_file_resident_blocks", path=MODEL_REL) == file_row(m)["blocks"]
    device = source_device(m.stats(), metrics_source / MODEL_REL)
    assert value(fams, "tierfs_source_read_bytes", device=device["device"]) == device["bytes"] > 0
    assert value(fams, "tierfs_source_latency_smoothed_seconds", device=device["device"]) > 0
    assert get(f"http://{addr}/other")[0] == 404
    m.close()
    with pytest.raises(OSError):
        socket.create_connection(tuple_addr(addr), timeout=5).close()


def get_as(addr: str, path: str, host: str | None) -> tuple[int, str]:
    """GET http://ADDR/PATH with the `Host` header set to `host` (None: no Host at all)."""
    import http.client

    ip, port = tuple_addr(addr)
    conn = http.client.HTTPConnection(ip, port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def test_a_page_elsewhere_cannot_read_the_endpoint_through_dns_rebinding(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough", "--metrics-addr", "0"))
    addr = served_addr(m)
    read_all(m.mnt / MODEL_REL)
    # What a browser sends after a name it was given resolved to 127.0.0.1.
    for host in ("attacker.example", f"attacker.example:{tuple_addr(addr)[1]}", "localhost.attacker.example"):
        for path in ("/stats", "/metrics", "/"):
            status, body = get_as(addr, path, host)
            assert status == 403, (host, path, status)
            assert "DNS rebinding" in body and MODEL_REL not in body and str(m.pid) not in body, body
    assert get_as(addr, "/stats", None)[0] == 403
    for host in (addr, f"localhost:{tuple_addr(addr)[1]}", "localhost"):
        status, body = get_as(addr, "/stats", host)
        assert status == 200 and MODEL_REL in body, (host, status)


def tuple_addr(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def test_metrics_addr_taken_or_malformed_fails_the_mount(metrics_source):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for addr, says in ((str(port), "cannot serve metrics on 127.0.0.1:"), ("nowhere", "neither a port")):
            mnt = fresh_dir("mnt")
            r = subprocess.run([str(TIERFS_BIN), "mount", str(metrics_source), str(mnt), "--no-state",
                                "--metrics-addr", addr], capture_output=True, text=True, timeout=30)
            assert r.returncode != 0 and says in r.stderr, (addr, r.returncode, r.stderr[-2000:])
            assert not any(str(mnt) in line for line in Path("/proc/mounts").read_text().splitlines())


# ----------------------------------------------------------------------------- dashboard

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_dashboard_is_self_contained_and_serves_the_stats(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough", "--metrics-addr", "0"))
    addr = served_addr(m)
    status, ctype, page = get(f"http://{addr}/")
    assert status == 200 and ctype.startswith("text/html"), (status, ctype)
    assert "://" not in page, "the page loads nothing from elsewhere"
    read_all(m.mnt / MODEL_REL)
    quiesce(m)
    status, ctype, text = get(f"http://{addr}/stats")
    assert status == 200 and ctype == "application/json", (status, ctype)
    doc = json.loads(text)
    assert doc["schema_version"] == 2 and doc["disk"]["read_bytes"] == m.stats()["disk"]["read_bytes"]


def chromium(addr: str, *extra: str) -> str:
    """The page at `addr` loaded in headless Chromium (a profile of its own), after it has run
    for five seconds of virtual time; its DOM then."""
    profile = fresh_dir("chromium")
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={profile}", "--virtual-time-budget=5000", *extra,
                        f"http://{addr}/"], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def page_strip(dom: str) -> tuple[str, str, str, str]:
    """(model name, strip characters, the reader's index in it, the strip's HTML) drawn first."""
    entry = re.search(r'<div class="file" data-path="([^"]+)">.*?'
                      r'<div class="strip" data-current="(\d*)">(.*?)</div>', dom, re.S)
    assert entry, dom[-3000:]
    return entry.group(1), re.sub(r"<[^>]+>", "", entry.group(3)), entry.group(2), entry.group(3)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tests/setup-system.sh)")
def test_dashboard_draws_the_strip_in_a_browser(mount, metrics_source):
    m = mount(metrics_source, "256MiB", ("--no-passthrough", "--metrics-addr", "0"))
    addr = served_addr(m)
    read_all(m.mnt / MODEL_REL)
    quiesce(m)
    blocks = file_row(m)["blocks"]
    dom = chromium(addr, "--dump-dom")
    name, strip, current, html = page_strip(dom)
    assert name == MODEL_REL, name
    assert strip == "#" * blocks, f"the page draws {strip!r}, the stats say {blocks} blocks cached"
    assert current == str(file_row(m)["residency_current"]), (current, file_row(m))
    assert '<span class="c-resident current">#</span>' in html, html
    assert re.search(r"hit rate \d+\.\d % by bytes", dom), dom[-3000:]
    assert "<polyline" in dom, "no throughput chart"
    assert '<div id="error"></div>' in dom, "the page could not read /stats"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tests/setup-system.sh)")
@pytest.mark.timeout(240)
def test_dashboard_shows_the_strip_advancing_while_a_model_streams(mount, metrics_source):
    """A reader streams a model three times the budget, slowly; the page, loaded again and
    again, shows its block moving along the strip, and a screenshot shows the strip's colours."""
    from PIL import Image
    m = mount(metrics_source, "24MiB", ("--no-passthrough", "--metrics-addr", "0"))
    addr = served_addr(m)
    read_all(m.mnt / MODEL_REL)  # the order is learned
    streaming = threading.Event()
    streaming.set()

    def stream():
        while streaming.is_set():
            with open(m.mnt / MODEL_REL, "rb") as f:
                while streaming.is_set() and f.read(1 << 20):
                    time.sleep(0.06)

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    try:
        seen = set()
        for _ in range(6):
            name, strip, current, _ = page_strip(chromium(addr, "--dump-dom"))
            assert name == MODEL_REL and set(strip) <= set("#>~+-.") and current != "", strip
            seen.add((strip, current))
            if len({c for _, c in seen}) >= 2:
                break
        assert len({c for _, c in seen}) >= 2, f"the reader's block never moved: {seen}"
        shot = fresh_dir("shot") / "page.png"
        chromium(addr, f"--screenshot={shot}", "--window-size=1000,700", "--hide-scrollbars")
    finally:
        streaming.clear()
        reader.join(timeout=30)
    found = {rgb: n for n, rgb in Image.open(shot).convert("RGB").getcolors(1 << 24)}
    colours = {(0x2e, 0x7d, 0x32): "cached", (0x8e, 0x24, 0xaa): "evicted",
               (0x15, 0x65, 0xc0): "served throughput"}
    counts = {name: found.get(rgb, 0) for rgb, name in colours.items()}
    assert all(n > 20 for n in counts.values()), f"pixels of each colour in the screenshot: {counts}"


def test_grafana_dashboard_names_only_served_metrics(mount, metrics_source):
    """Every metric the Grafana dashboard (docs/grafana/tierfs.json) queries is in a scrape."""
    from conftest import REPO
    dashboard = json.loads((REPO / "docs" / "grafana" / "tierfs.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set(re.findall(r"\btierfs_[a-z_]+", " ".join(exprs)))
    assert len(used) >= 10, used
    m = mount(metrics_source, "256MiB", ("--no-passthrough",))
    read_all(m.mnt / MODEL_REL)
    served = {s.name for f in text_string_to_metric_families(read_metrics(m)) for s in f.samples}
    assert used <= served, f"queried but not served: {sorted(used - served)}"
