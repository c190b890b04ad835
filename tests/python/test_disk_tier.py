"""The local disk tier through real mounts (`--disk-cache DIR --disk-cache-size SIZE`).

A model larger than the RAM budget is read through a mount whose disk tier takes its chunks;
the mount is stopped and started again on the same folder: every byte must be the source's,
and the chunks must come from the tier, not the source (the stats' source reads, and the
source device's own read counter where the source is a loop device). A damaged tier file is
never served; a full disk shrinks the tier and reads go on; a second mount naming the same
folder is refused with the process holding it; a folder inside SOURCE is refused. A model that
fits the budget is passed through from its whole copy in the tier after a restart, and a
mapping of it that outlives its handle reads its bytes even after the tier gave its room away.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import subprocess
import time
from pathlib import Path

import pytest

import gen
from conftest import MiB, TIERFS_BIN, FaultFs, drop_caches, fresh_dir

# Smaller than the models: served through the chunk cache, which fills the tier.
BUDGET = "8MiB"
TIER = "tierfs-disk-tier-v1"
WHOLE_YET = "the local disk tier does not hold it whole yet: read through the cache, which keeps its chunks there"
FROM_COPY = "fits what the budget has left: read from its whole copy in the local disk tier"


def _model(src: Path, name: str = "m.safetensors", blocks: int = 12, seed: int = 3) -> Path:
    path = src / name
    gen.write_small(path, gen.dit_specs(512, 1024, blocks), seed=seed)
    return path


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 * MiB + 4093):  # odd reads: chunk edges fall mid-request
            h.update(chunk)
    return h.hexdigest()


def _settled_tier(m, timeout: float = 30) -> dict:
    """The disk tier's figures once nothing is waiting to be written."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        t = m.stats()["disk_tier"]
        now = (t["used_bytes"], t["written"], t["not_kept"], t["skipped_busy"], t["write_errors"])
        if now == last:
            return t
        last = now
        time.sleep(0.3)
    raise AssertionError(f"the disk tier did not settle: {last}")


def _args(tier_dir: Path, size: str = "256MiB") -> tuple[str, ...]:
    return ("--disk-cache", str(tier_dir), "--disk-cache-size", size)


def _source_reads(stats_path: Path) -> int:
    """Bytes the test source filesystem served so far (its `--disk-stats` file)."""
    for _ in range(100):
        try:
            return int(json.loads(stats_path.read_text())["bytes"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.02)
    raise AssertionError(f"no source counters in {stats_path}")


def _counted_source(src: Path) -> tuple[FaultFs, Path]:
    """`src` seen through the test source filesystem, which counts what it serves (its
    `--disk-stats` file, returned with it)."""
    stats = fresh_dir("tier-counted") / "stats.json"
    fs = FaultFs(src, ("--disk", "--seek-ms", "0", "--disk-mbps", "100000", "--disk-stats", str(stats)))
    return fs, stats


def test_a_restart_reads_the_model_from_the_disk_tier_not_the_source(mount, faultfs_bin):
    src = fresh_dir("tier-src")
    path = _model(src)
    want = _sha(path)
    tier_dir = fresh_dir("tier-dir")
    fs, counted = _counted_source(src)
    try:
        m = mount(fs.mnt, BUDGET, _args(tier_dir))
        assert _sha(m.mnt / path.name) == want
        first = m.stats()
        tier = _settled_tier(m)
        data_bytes = path.stat().st_size
        assert tier["written_bytes"] >= 0.9 * data_bytes, tier
        assert tier["used_bytes"] == tier["written_bytes"], tier
        assert first["files"][0]["mode_reason"] == "larger than what the budget had left", first["files"][0]
        m.close()
        assert _source_reads(counted) >= data_bytes

        drop_caches()
        before = _source_reads(counted)
        m = mount(fs.mnt, BUDGET, _args(tier_dir))
        assert _sha(m.mnt / path.name) == want
        assert _sha(m.mnt / path.name) == want
        again = m.stats()
        tier = again["disk_tier"]
        # Every byte of both passes, the header included, came from the tier.
        assert _source_reads(counted) == before
        assert again["disk"]["read_bytes"] == 0, again["disk"]
        assert tier["hit_bytes"] >= 2 * 0.9 * data_bytes, tier
        assert tier["damaged"] == 0 and tier["write_errors"] == 0, tier
        # The views say the same: `tierfs stats` and the metrics.
        shown = subprocess.run([str(TIERFS_BIN), "stats", str(m.mnt)], capture_output=True, text=True,
                               timeout=30, check=True).stdout
        line = next((x for x in shown.splitlines() if x.startswith("disk tier ")), "")
        assert f"in {tier_dir}" in line and "0 damaged, 0 write errors" in line, shown
        metrics = (m.mnt / ".tierfs" / "metrics").read_text()
        hit = next(x for x in metrics.splitlines() if x.startswith("tierfs_disk_tier_hit_bytes_total "))
        assert float(hit.split()[1]) >= 2 * 0.9 * data_bytes, hit
        m.close()
    finally:
        fs.close()


def test_a_model_that_fits_is_passed_through_from_its_copy_in_the_tier_after_a_restart(mount, faultfs_bin):
    """The first mount serves the model through the cache (the tier does not hold it whole
    yet) and fills the tier; after a restart the kernel reads it by passthrough from the
    tier's copy: every byte the source's, through `read()` and a mapping, nothing from the
    source."""
    src = fresh_dir("tier-src")
    path = _model(src)
    want = _sha(path)
    tier_dir = fresh_dir("tier-dir")
    fs, counted = _counted_source(src)
    fits = "256MiB"
    try:
        m = mount(fs.mnt, fits, _args(tier_dir))
        if not m.stats()["passthrough"]["available"]:
            m.close()
            pytest.skip("FUSE passthrough unavailable (needs Linux >= 6.9 and root)")
        assert _sha(m.mnt / path.name) == want
        f = m.stats()["files"][0]
        assert (f["mode"], f["mode_reason"]) == ("cache", WHOLE_YET), f
        _settled_tier(m)
        m.close()

        drop_caches()
        before = _source_reads(counted)
        m = mount(fs.mnt, fits, _args(tier_dir))
        with open(m.mnt / path.name, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as mm:
            assert hashlib.sha256(mm[:]).hexdigest() == want
        assert _sha(m.mnt / path.name) == want
        stats = m.stats()
        f = stats["files"][0]
        assert (f["mode"], f["mode_reason"]) == ("passthrough", FROM_COPY), f
        assert _source_reads(counted) == before, "nothing from the source"
        assert stats["disk"]["read_bytes"] == 0, stats["disk"]
        assert stats["disk_tier"]["whole_copies"] >= 1, stats["disk_tier"]
        assert stats["disk_tier"]["damaged"] == 0, stats["disk_tier"]
        m.close()
    finally:
        fs.close()


class _Mapping:
    """A whole-file mapping whose descriptor is closed at once (as torch's `safe_open` does):
    the mount sees the file released while the mapping still reads it. (Python's own `mmap`
    keeps a duplicate of the descriptor open, hence libc.)"""

    def __init__(self, path: Path):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_long]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.size = path.stat().st_size
        fd = os.open(path, os.O_RDONLY)
        try:
            self.addr = self.libc.mmap(None, self.size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)
        assert self.addr not in (None, ctypes.c_void_p(-1).value), f"mmap: errno {ctypes.get_errno()}"

    def read(self, start: int, end: int) -> bytes:
        return ctypes.string_at(self.addr + start, end - start)

    def close(self) -> None:
        self.libc.munmap(self.addr, self.size)


def test_a_copy_mapped_past_its_close_keeps_its_bytes_when_the_tier_makes_room(mount):
    """A model passed through from its copy in the tier is mapped and its descriptor closed;
    the tier then needs the copy's room for another model: the copy goes whole (its files
    deleted), never punched, so the pages the mapping had not read yet, and those the kernel
    dropped, still come back as the source's bytes."""
    src = fresh_dir("tier-src")
    a, b = _model(src, "a.safetensors", seed=6), _model(src, "b.safetensors", seed=7)
    want_a = a.read_bytes()
    tier_dir = fresh_dir("tier-dir")
    tier_size = f"{a.stat().st_size + 16 * MiB}"  # one model, not two
    fits = "512MiB"
    m = mount(src, fits, _args(tier_dir, tier_size))
    if not m.stats()["passthrough"]["available"]:
        m.close()
        pytest.skip("FUSE passthrough unavailable (needs Linux >= 6.9 and root)")
    assert _sha(m.mnt / a.name) == _sha(a)
    _settled_tier(m)
    m.close()

    m = mount(src, fits, _args(tier_dir, tier_size))
    mapped = _Mapping(m.mnt / a.name)
    try:
        half = len(want_a) // 2
        assert mapped.read(0, half) == want_a[:half]
        f = next(x for x in m.stats()["files"] if x["path"] == a.name)
        assert (f["mode"], f["mode_reason"]) == ("passthrough", FROM_COPY), f
        copies = list((tier_dir / TIER).glob("*.data"))
        assert len(copies) == 1, copies
        # b needs the room: a's copy, no longer open, goes whole.
        assert _sha(m.mnt / b.name) == _sha(b)
        tier = _settled_tier(m)
        assert not copies[0].exists(), "a's copy deleted"
        assert tier["evicted"] >= 1 and tier["damaged"] == 0, tier
        drop_caches()
        assert mapped.read(0, len(want_a)) == want_a, "the mapping reads a's bytes, never a hole"
    finally:
        mapped.close()
    m.close()


def test_a_damaged_or_truncated_tier_file_is_never_served(mount):
    src = fresh_dir("tier-src")
    a, b = _model(src, "a.safetensors", seed=4), _model(src, "b.safetensors", seed=5)
    want = {p.name: _sha(p) for p in (a, b)}
    tier_dir = fresh_dir("tier-dir")
    m = mount(src, BUDGET, _args(tier_dir))
    for p in (a, b):
        assert _sha(m.mnt / p.name) == want[p.name]
    _settled_tier(m)
    m.close()
    datas = sorted((tier_dir / TIER).glob("*.data"))
    assert len(datas) == 2
    # One version's file gets bytes flipped every 3 MiB; the other is cut short.
    with open(datas[0], "r+b") as f:
        size = datas[0].stat().st_size
        for at in range(4096, size, 3 * MiB):
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
    with open(datas[1], "r+b") as f:
        f.truncate(datas[1].stat().st_size // 2)

    m = mount(src, BUDGET, _args(tier_dir))
    for p in (a, b):
        assert _sha(m.mnt / p.name) == want[p.name]
    s = m.stats()
    assert s["disk_tier"]["damaged"] >= 1, s["disk_tier"]
    assert s["disk"]["read_bytes"] > 0
    # What was read from the source again was written again: a third mount reads none.
    _settled_tier(m)
    m.close()
    m = mount(src, BUDGET, _args(tier_dir))
    for p in (a, b):
        assert _sha(m.mnt / p.name) == want[p.name]
    assert m.stats()["disk"]["read_bytes"] == 0


def test_a_full_disk_shrinks_the_tier_and_reads_go_on(mount):
    src = fresh_dir("tier-src")
    path = _model(src)
    want = _sha(path)
    tier_dir = fresh_dir("tier-dir")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tierfs-test-full", str(tier_dir)], check=True)
    try:
        m = mount(src, BUDGET, _args(tier_dir, "1GiB"))
        assert _sha(m.mnt / path.name) == want
        tier = _settled_tier(m)
        assert tier["write_errors"] >= 1, tier
        assert tier["capacity_bytes"] < 6 * MiB, tier
        assert tier["used_bytes"] <= tier["capacity_bytes"], tier
        assert _sha(m.mnt / path.name) == want
        assert m.stats()["disk_tier"]["hit_bytes"] > 0
        m.close()
    finally:
        subprocess.run(["umount", "-l", str(tier_dir)], check=False)


def test_repeated_passes_larger_than_the_budget_read_the_source_once(mount):
    src = fresh_dir("tier-src")
    path = _model(src, blocks=16)
    want = _sha(path)
    m = mount(src, BUDGET, _args(fresh_dir("tier-dir")))
    assert _sha(m.mnt / path.name) == want
    _settled_tier(m)
    after_first = m.stats()["disk"]["read_bytes"]
    assert after_first >= 0.9 * path.stat().st_size
    for _ in range(3):
        assert _sha(m.mnt / path.name) == want
    assert m.stats()["disk"]["read_bytes"] == after_first


def test_a_second_mount_on_the_same_folder_is_refused(mount):
    src = fresh_dir("tier-src")
    _model(src, blocks=2)
    tier_dir = fresh_dir("tier-dir")
    m = mount(src, BUDGET, _args(tier_dir))
    second = subprocess.run(
        [str(TIERFS_BIN), "mount", str(src), str(fresh_dir("mnt")), "--ram-cache", BUDGET,
         "--no-state", *_args(tier_dir)],
        capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert "in use by another tierfs mount" in second.stderr, second.stderr
    assert f"process {m.pid}" in second.stderr, second.stderr


@pytest.mark.parametrize("where", ["source", "size"])
def test_bad_disk_cache_options_are_clear_errors(where):
    src = fresh_dir("tier-src")
    _model(src, blocks=2)
    args = (["--disk-cache", str(src / "cache"), "--disk-cache-size", "1GiB"] if where == "source"
            else ["--disk-cache", str(fresh_dir("tier-dir"))])
    got = subprocess.run(
        [str(TIERFS_BIN), "mount", str(src), str(fresh_dir("mnt")), "--ram-cache", BUDGET,
         "--no-state", *args],
        capture_output=True, text=True, timeout=60)
    assert got.returncode != 0
    expected = "is inside SOURCE" if where == "source" else "--disk-cache-size"
    assert expected in got.stderr, got.stderr
    assert not (src / "cache").exists(), "nothing is created in SOURCE"


def test_concurrent_readers_through_a_full_tier_get_the_source_bytes(mount):
    """Readers at random offsets in two models at once, through a RAM budget and a tier both
    smaller than the models (the tier evicting as it writes), then again after a restart: every
    byte is the source's."""
    import random
    import threading

    src = fresh_dir("tier-src")
    paths = [_model(src, f"m{i}.safetensors", blocks=10, seed=20 + i) for i in range(2)]
    want = {p.name: p.read_bytes() for p in paths}
    tier_dir = fresh_dir("tier-dir")
    for round_ in range(2):
        m = mount(src, BUDGET, _args(tier_dir, "12MiB"))
        errors: list[str] = []

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            deadline = time.monotonic() + 60
            for _ in range(150):
                if time.monotonic() > deadline:
                    break
                name = rng.choice(sorted(want))
                data = want[name]
                off = rng.randrange(0, len(data))
                n = rng.choice((1, 4093, 128 << 10, 1 << 20, 3 << 20))
                with open(m.mnt / name, "rb", buffering=0) as f:
                    f.seek(off)
                    got = f.read(n)
                if got != data[off:off + n]:
                    errors.append(f"{name} at {off} (+{n}): wrong bytes")
                    return

        threads = [threading.Thread(target=reader, args=(round_ * 100 + i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a reader hung"
        assert not errors, errors
        tier = _settled_tier(m)
        assert tier["used_bytes"] <= tier["capacity_bytes"] == 12 * MiB, tier
        assert tier["damaged"] == 0 and tier["write_errors"] == 0, tier
        assert tier["evicted"] + tier["not_kept"] > 0, f"the tier never filled: {tier}"
        if round_ == 1:
            assert tier["hits"] > 0, tier
        m.close()
