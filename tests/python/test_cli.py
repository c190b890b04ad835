"""The `tierfs` command line: inspect, stats, demo, mount/unmount, signals, bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

import gen
from conftest import Mount, fresh_dir, is_mounted

PANIC = re.compile(r"panicked at|RUST_BACKTRACE|stack backtrace", re.I)


def run(tierfs_bin, *args, timeout=120):
    return subprocess.run([str(tierfs_bin), *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("key", ["flux", "unet", "dit_small_sft", "nested_model"])
def test_inspect_json_matches_header(tierfs_bin, tree, key):
    _, paths = tree
    p = paths[key]
    r = run(tierfs_bin, "inspect", p, "--json")
    assert r.returncode == 0, f"inspect failed rc={r.returncode}: {r.stderr[-2000:]}"
    j = json.loads(r.stdout)
    n, h = gen.read_header(p)
    size = p.stat().st_size
    assert j["file_size"] == size
    # header_bytes = the 8-byte length prefix + the JSON header = absolute offset of the data section
    assert j["header_bytes"] == 8 + n, f"header_bytes {j['header_bytes']} != 8 + {n}"
    want = {k: v for k, v in h.items() if k != "__metadata__"}
    got = {t["name"]: t for t in j["tensors"]}
    assert sorted(got) == sorted(want), f"tensor names differ: {set(got) ^ set(want)}"
    for name, v in want.items():
        t = got[name]
        assert t["dtype"] == v["dtype"], (name, t["dtype"], v["dtype"])
        assert list(t["shape"]) == v["shape"], (name, t["shape"], v["shape"])
        assert (t["start"], t["end"]) == (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]), (
            f"{name}: offsets {t['start']}..{t['end']}, want absolute {8 + n + v['data_offsets'][0]}..")
    assert j["data_end"] == 8 + n + max(v["data_offsets"][1] for v in want.values())
    check_block_grouping(j, want)


def _block_entry(j: dict, ref):
    """The j["blocks"] entry a tensor's `block` field refers to (by index or by name)."""
    if isinstance(ref, int) and not isinstance(ref, bool):
        return j["blocks"][ref]
    matches = [b for b in j["blocks"] if b.get("name") == ref]
    assert len(matches) == 1, f"tensor block ref {ref!r} matches {len(matches)} entries of blocks"
    return matches[0]


def check_block_grouping(j: dict, header: dict) -> None:
    """blocks.N.* (and double_blocks.N.*, single_blocks.N.*) -> one block per N, with right counts/bytes."""
    by_name = {t["name"]: t for t in j["tensors"]}
    for prefix in ("blocks", "double_blocks", "single_blocks"):
        groups: dict[int, list[str]] = {}
        for k in header:
            if (mm := re.match(rf"{prefix}\.(\d+)\.", k)):
                groups.setdefault(int(mm.group(1)), []).append(k)
        if not groups:
            continue
        refs = {}
        for num, members in groups.items():
            ids = {json.dumps(by_name[k]["block"]) for k in members}
            assert len(ids) == 1 and by_name[members[0]]["block"] is not None, (
                f"{prefix}.{num}.*: tensors are in blocks {ids}, want exactly one block")
            refs[num] = by_name[members[0]]["block"]
            b = _block_entry(j, refs[num])
            assert b["tensors"] == len(members), f"{prefix}.{num}: block says {b['tensors']} tensors, want {len(members)}"
            want_bytes = sum(header[k]["data_offsets"][1] - header[k]["data_offsets"][0] for k in members)
            assert b["bytes"] == want_bytes, f"{prefix}.{num}: block says {b['bytes']} B, want {want_bytes}"
            assert b["number"] == num, f"{prefix}.{num}: block number {b['number']}"
        assert len({json.dumps(r) for r in refs.values()}) == len(groups), (
            f"{prefix}: {len(groups)} distinct N but {len(set(map(json.dumps, refs.values())))} distinct blocks")


def test_inspect_big_dit_blocks(tierfs_bin, big_file):
    r = run(tierfs_bin, "inspect", big_file, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    j = json.loads(r.stdout)
    _, h = gen.read_header(big_file)
    want = {k: v for k, v in h.items() if k != "__metadata__"}
    assert len(j["tensors"]) == len(want)
    check_block_grouping(j, want)


def test_inspect_human(tierfs_bin, tree):
    _, paths = tree
    r = run(tierfs_bin, "inspect", paths["flux"])
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert "double_blocks" in r.stdout


@pytest.mark.parametrize("case", ["bad_json", "past_eof", "tiny", "missing"])
def test_inspect_malformed_clear_error(tierfs_bin, workdir, case):
    import test_malformed
    _, cases = test_malformed.make_cases(workdir)
    p = {"bad_json": workdir / "bad_json.safetensors", "past_eof": workdir / "past_eof.safetensors",
         "tiny": workdir / "tiny.safetensors", "missing": workdir / "does-not-exist.safetensors"}[case]
    r = run(tierfs_bin, "inspect", p, "--json")
    assert r.returncode != 0, f"inspect on {case} must fail; stdout: {r.stdout[:500]}"
    err = r.stderr.strip()
    assert err, "no error message on stderr"
    assert not PANIC.search(r.stderr), f"panic/backtrace on {case}:\n{r.stderr[-2000:]}"
    assert len(err.splitlines()) == 1, f"error should be one line, got:\n{err}"
    assert r.returncode != 101, "exit code 101 is Rust's panic code"


def test_stats_cli_json_and_human(tierfs_bin, mount, tree):
    root, paths = tree
    # The chunk cache's figures: a file that fits the budget is otherwise served by passthrough.
    m = mount(root, "128MiB", ("--no-model-passthrough",))
    _ = (m.mnt / "flux.safetensors").read_bytes()
    r = run(tierfs_bin, "stats", m.mnt, "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    for sect, keys in {"cache": ["budget_bytes", "used_bytes", "hits", "misses", "hit_bytes", "miss_bytes",
                                 "evicted_bytes"],
                       "disk": ["read_bytes"], "prefetch": ["issued_bytes", "used_bytes", "wasted_bytes"]}.items():
        for k in keys:
            assert isinstance(j[sect][k], int), f"stats {sect}.{k} missing or not an integer: {j.get(sect)}"
    assert j["cache"]["budget_bytes"] == 128 << 20
    fl = [f for f in j["files"] if f["path"] == "flux.safetensors"]
    assert fl, j["files"]
    f = fl[0]
    assert f["size"] == paths["flux"].stat().st_size
    assert f["tensors"] == len(gen.tensor_ranges(paths["flux"]))
    assert f["blocks"] >= 7 and f["malformed"] is False and f["malformed_reason"] is None, f
    assert 0 < f["cached_bytes"] <= f["size"], f
    assert f["mode"] == "cache", f
    assert j["passthrough"]["open_files"] == 0 and j["passthrough"]["admitted"] == 0, j["passthrough"]
    assert j["cache"]["misses"] > 0 and j["disk"]["read_bytes"] > 0, j
    h = run(tierfs_bin, "stats", m.mnt)
    assert h.returncode == 0 and h.stdout.strip(), h.stderr
    assert "flux.safetensors" in h.stdout


def test_demo(tierfs_bin):
    r = run(tierfs_bin, "demo", timeout=300)
    assert r.returncode == 0, f"demo rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    out = (r.stdout + r.stderr).lower()
    assert "hit" in out and "budget" in out, f"demo should print the cache stats:\n{r.stdout[-2000:]}"
    assert not PANIC.search(r.stderr)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts_cleanly(tierfs_bin, tree, sig):
    root, _ = tree
    m = Mount(root, "64MiB")
    try:
        assert is_mounted(m.mnt)
        m.proc.send_signal(sig)
        rc = m.proc.wait(timeout=15)
        assert rc == 0, f"exit code after {sig.name}: {rc}\n{m.log_tail()}"
        assert not is_mounted(m.mnt), f"{m.mnt} still mounted after {sig.name}"
    finally:
        m.close()


def test_sigterm_right_after_ready_repeated(tierfs_bin, workdir):
    """SIGTERM as soon as the mount is ready, 50 times: always exit 0, never a mount left.
    (Catches signal handling installed after the mount is already serving.)"""
    src = workdir / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    bad = []
    for i in range(50):
        m = Mount(src, "16MiB")
        try:
            m.proc.send_signal(signal.SIGTERM)
            rc = m.proc.wait(timeout=15)
            left = is_mounted(m.mnt)
            if rc != 0 or left:
                bad.append(f"try {i}: rc={rc}, mount left={left}")
        finally:
            m.close()
    assert not bad, f"{len(bad)} immediate SIGTERMs (of 50) went wrong: {bad}"


def test_signal_while_file_open(tierfs_bin, tree):
    """SIGTERM with a file open: the mount disappears at once (lazy detach is fine), the open
    file may keep working, and the daemon exits 0 once the file is closed."""
    root, _ = tree
    m = Mount(root, "64MiB")
    f = open(m.mnt / "flux.safetensors", "rb")
    try:
        head = f.read(1000)
        m.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while is_mounted(m.mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_mounted(m.mnt), "mount still in /proc/mounts 5 s after SIGTERM with an open file"
        f.close()
        try:
            rc = m.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"daemon still running 15 s after SIGTERM and closing the last file\n{m.log_tail()}")
        assert rc == 0, f"exit code {rc}\n{m.log_tail()}"
        assert len(head) == 1000
    finally:
        f.close()
        m.close()


def test_unmount_command(tierfs_bin, tree):
    root, _ = tree
    m = Mount(root, "64MiB")
    try:
        r = run(tierfs_bin, "unmount", m.mnt, timeout=30)
        assert r.returncode == 0, r.stderr
        rc = m.proc.wait(timeout=15)
        assert rc == 0, f"daemon exit code after `tierfs unmount`: {rc}\n{m.log_tail()}"
        assert not is_mounted(m.mnt)
    finally:
        m.close()


def test_daemon_mode(tierfs_bin, tree):
    root, _ = tree
    mnt = fresh_dir("mnt")
    r = subprocess.run([str(tierfs_bin), "mount", str(root), str(mnt), "--ram-cache", "64MiB", "--daemon"],
                       capture_output=True, text=True, timeout=30)
    try:
        assert r.returncode == 0, f"--daemon parent rc={r.returncode}: {r.stderr[-2000:]}"
        assert is_mounted(mnt), "--daemon returned before the mount was up"
        assert json.loads((mnt / ".tierfs" / "stats").read_bytes())["cache"]["budget_bytes"] == 64 << 20
        u = run(tierfs_bin, "unmount", mnt, timeout=30)
        assert u.returncode == 0, u.stderr
        deadline = time.monotonic() + 10
        while is_mounted(mnt) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("size,budget", [("512MiB", 512 << 20), ("8GiB", 8 << 30), ("8G", 8 << 30),
                                         ("1048576", 1 << 20)])
def test_size_forms(mount, tree, size, budget):
    root, _ = tree
    m = mount(root, size)
    assert m.stats()["cache"]["budget_bytes"] == budget


@pytest.mark.parametrize("bad", ["12XB", "lots", "-5MiB", ""])
def test_mount_bad_size(tierfs_bin, tree, bad):
    root, _ = tree
    mnt = fresh_dir("mnt")
    try:
        r = subprocess.run([str(tierfs_bin), "mount", str(root), str(mnt), f"--ram-cache={bad}"],
                           capture_output=True, text=True, timeout=20)
        assert r.returncode != 0, f"--ram-cache {bad!r} accepted"
        assert r.stderr.strip(), "no error message"
        assert not PANIC.search(r.stderr), r.stderr
        assert len([l for l in r.stderr.splitlines() if l.strip()]) <= 3, f"error should be short:\n{r.stderr}"
    except subprocess.TimeoutExpired:
        pytest.fail(f"--ram-cache {bad!r}: tierfs kept running (mounted?) instead of failing")
    finally:
        if is_mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_mount_missing_source(tierfs_bin, workdir):
    mnt = fresh_dir("mnt")
    try:
        r = subprocess.run([str(tierfs_bin), "mount", str(workdir / "nope"), str(mnt)],
                           capture_output=True, text=True, timeout=20)
        assert r.returncode != 0 and r.stderr.strip() and not PANIC.search(r.stderr), r.stderr
    finally:
        if is_mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
