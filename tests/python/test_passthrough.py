"""Model files that fit the budget are served by FUSE passthrough (core/src/passthrough).

What is checked, each through a real mount against the source bytes:
- the mode each file is served in (`files[].mode`, `tierfs stats`), and the fallback with
  `--no-model-passthrough` and for a file larger than the budget;
- bytes through `read()` and `mmap`, with several processes opening the same model at once
  (the kernel wants one backing id per inode: a second one failed such opens with EIO);
- the budget holds for the source page cache passthrough fills: a second model that needs the
  room drops the first one's page cache once it is closed, and `drop` drops it too;
- a SOURCE held in RAM (tmpfs): every model passed through, outside the budget;
- a model replaced while a passthrough handle is open: the old handle keeps the old bytes, a
  new open gets the new ones;
- `O_DIRECT` opens (runai-model-streamer's, with io_uring, and plain aligned `pread`s) are
  served by passthrough too, bit-exact, and bypass the page cache as on the plain file; with
  the chunk cache serving the file, runai's parallel O_DIRECT requests are bit-exact and a
  reload reads nothing from disk; through a budget below the file they are served exactly
  (`disk.direct_bytes`), the file read once, nothing prefetched.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import gen  # noqa: E402
from conftest import MiB, TIERFS_BIN, drop_caches, page_cache_bytes  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def _model(path: Path, blocks: int, seed: int) -> bytes:
    gen.write_small(path, gen.dit_specs(1024, 2048, blocks, ("F32",)), seed=seed)
    return path.read_bytes()


@pytest.fixture
def src(workdir):
    root = workdir / "src"
    root.mkdir()
    return root


def _file_stats(m, rel: str) -> dict:
    for f in m.stats()["files"]:
        if f["path"] == rel:
            return f
    raise AssertionError(f"{rel} not in stats: {m.stats()['files']}")


def _passthrough_available(m) -> bool:
    return m.stats()["passthrough"]["available"]


def test_fitting_model_is_served_by_passthrough_bit_exact(mount, src):
    want = _model(src / "a.safetensors", 6, 1)  # ~300 MiB
    m = mount(src, "512MiB")
    if not _passthrough_available(m):
        pytest.fail("this kernel/daemon offers no FUSE passthrough: the mode cannot be tested here")
    with open(m.mnt / "a.safetensors", "rb") as f:
        st = m.stats()
        assert st["passthrough"]["open_files"] == 1, st["passthrough"]
        assert st["passthrough"]["open_bytes"] == len(want), st["passthrough"]
        # the chunk cache gets the rest of the budget, and never less than the floor
        floor = st["budget"]["floor_bytes"]
        assert st["cache"]["chunk_budget_bytes"] == max(512 * MiB - len(want), floor), (st["cache"], floor)
        assert f.read() == want
    with open(m.mnt / "a.safetensors", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        assert mm[:] == want
    info = _file_stats(m, "a.safetensors")
    assert info["mode"] == "passthrough", info
    st = m.stats()
    assert st["passthrough"]["open_files"] == 0 and st["passthrough"]["parked_files"] == 1, st["passthrough"]
    assert 0 < st["passthrough"]["parked_bytes"] <= len(want) + 4096, st["passthrough"]
    assert st["cache"]["used_bytes"] == 0, "nothing went through the chunk cache"
    human = subprocess.run([str(TIERFS_BIN), "stats", str(m.mnt)], capture_output=True, text=True, timeout=30)
    assert human.returncode == 0 and "passthrough" in human.stdout, human.stdout + human.stderr


def test_concurrent_opens_of_one_model_share_the_backing_file(mount, src):
    want = _model(src / "a.safetensors", 4, 2)
    (src / "notes.bin").write_bytes(os.urandom(5 * MiB))
    m = mount(src, "512MiB")
    code = (
        "import mmap, sys\n"
        "f = open(sys.argv[1], 'rb')\n"
        "mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "sys.stdout.buffer.write(mm[:])\n"
    )
    for rel in ("a.safetensors", "notes.bin"):
        held = [open(m.mnt / rel, "rb") for _ in range(3)]  # opens stay concurrent
        try:
            procs = [subprocess.Popen([sys.executable, "-c", code, str(m.mnt / rel)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
            outs = [p.communicate(timeout=120) for p in procs]
            expected = (src / rel).read_bytes()
            for (out, err), p in zip(outs, procs):
                assert p.returncode == 0, err.decode()[-2000:]
                assert out == expected, f"{rel}: a concurrent mmap reader got wrong bytes"
            for h in held:
                assert h.read() == expected, f"{rel}: a concurrent read() got wrong bytes"
        finally:
            for h in held:
                h.close()
    assert _file_stats(m, "a.safetensors")["mode"] == "passthrough"
    assert len(want) > 0


def test_larger_than_budget_and_opt_out_use_the_cache(mount, src):
    want = _model(src / "a.safetensors", 6, 3)
    m = mount(src, "64MiB")
    assert (m.mnt / "a.safetensors").read_bytes() == want
    assert _file_stats(m, "a.safetensors")["mode"] == "cache"
    assert m.stats()["passthrough"]["refused"] >= 1
    m2 = mount(src, "512MiB", ("--no-model-passthrough",))
    assert (m2.mnt / "a.safetensors").read_bytes() == want
    assert _file_stats(m2, "a.safetensors")["mode"] == "cache"
    assert m2.stats()["passthrough"]["admitted"] == 0


def _two_models_taking_turns(mount, src, seed: int):
    """Two ~200 MiB models that each fit a 256 MiB budget but not together, caches dropped, and
    a mount of them with that budget: (mount, a's bytes, b's bytes, budget)."""
    a = _model(src / "a.safetensors", 4, seed)
    b = _model(src / "b.safetensors", 4, seed + 1)
    budget = 256 * MiB
    assert len(a) + len(b) > budget and max(len(a), len(b)) < budget
    drop_caches()
    return mount(src, f"{budget // MiB}MiB"), a, b, budget


def test_page_cache_of_passthrough_files_stays_within_the_budget(mount, src):
    m, a, b, budget = _two_models_taking_turns(mount, src, 4)
    assert (m.mnt / "a.safetensors").read_bytes() == a
    assert page_cache_bytes(src / "a.safetensors") > len(a) // 2, "a's page cache was kept for a reload"
    assert (m.mnt / "b.safetensors").read_bytes() == b
    total = page_cache_bytes(src / "a.safetensors") + page_cache_bytes(src / "b.safetensors")
    st = m.stats()
    assert total <= budget, f"source page cache {total / MiB:.1f} MiB > budget; {st['passthrough']}"
    assert st["passthrough"]["dropped_bytes"] > 0, st["passthrough"]
    assert _file_stats(m, "b.safetensors")["mode"] == "passthrough"
    # drop gives back the page cache of closed files
    with open(m.mnt / ".tierfs/control", "w") as ctl:
        ctl.write("drop\n")
    assert page_cache_bytes(src / "b.safetensors") < 4 * MiB
    assert m.stats()["passthrough"]["parked_bytes"] == 0


def _map_close_then_copy(path: Path) -> bytes:
    """A torch `safe_open` load: the file mapped, its descriptor closed, then every byte copied
    out of the mapping, so the mount sees the close before the reads. (Python's own `mmap`
    keeps a duplicate of the descriptor open, hence libc.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
    finally:
        os.close(fd)
    assert addr not in (None, ctypes.c_void_p(-1).value), f"mmap: errno {ctypes.get_errno()}"
    try:
        return ctypes.string_at(addr, size)
    finally:
        libc.munmap(addr, size)


def test_a_model_read_through_a_mapping_after_its_close_gives_its_page_cache_back(mount, src):
    """The reads of a mapping made while the file was open go to the source file after the
    close the mount sees: the next model's admission measures what the first one holds by then
    and gives it back, so the two models' page cache stays within the budget."""
    m, a, b, budget = _two_models_taking_turns(mount, src, 24)
    if not _passthrough_available(m):
        pytest.skip("FUSE passthrough unavailable (needs Linux >= 6.9 and root)")
    assert _map_close_then_copy(m.mnt / "a.safetensors") == a
    assert _file_stats(m, "a.safetensors")["mode"] == "passthrough"
    assert page_cache_bytes(src / "a.safetensors") > len(a) // 2, "a read by passthrough after its close"
    assert _map_close_then_copy(m.mnt / "b.safetensors") == b
    total = page_cache_bytes(src / "a.safetensors") + page_cache_bytes(src / "b.safetensors")
    st = m.stats()["passthrough"]
    assert total <= budget, f"source page cache {total / MiB:.1f} MiB > budget; {st}"
    assert st["dropped_bytes"] > len(a) // 2, st
    assert st["competing_files"] >= 1, st
    # b too was read after its close: the next open that needs room counts and drops it
    assert _map_close_then_copy(m.mnt / "a.safetensors") == a
    f = _file_stats(m, "a.safetensors")
    assert (f["mode"], f["mode_reason"]) == ("cache", "competes with other models for the budget"), f
    assert page_cache_bytes(src / "b.safetensors") < 4 * MiB
    assert m.stats()["cache"]["used_bytes"] <= m.stats()["cache"]["chunk_budget_bytes"] <= budget


@pytest.fixture
def ram_src(workdir):
    """A tmpfs of its own as SOURCE (root mounts it), unmounted after the test."""
    root = workdir / "ramsrc"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1G", "tierfs-test", str(root)], check=True)
    yield root
    subprocess.run(["umount", "-l", str(root)], capture_output=True)


def test_models_held_in_ram_are_passed_through_outside_the_budget(ram_src, mount):
    """A SOURCE on tmpfs is in RAM already, always resident: every model is passed through,
    whatever its size and however many take turns, none is counted against the budget (its
    pages could never be given back), and the chunk cache keeps its whole share."""
    a = _model(ram_src / "a.safetensors", 4, 31)
    b = _model(ram_src / "b.safetensors", 4, 32)
    big = _model(ram_src / "big.safetensors", 7, 33)
    budget = 256 * MiB
    assert len(a) + len(b) > budget and len(big) > budget
    m = mount(ram_src, f"{budget // MiB}MiB")
    if not _passthrough_available(m):
        pytest.skip("FUSE passthrough unavailable (needs Linux >= 6.9 and root)")
    for _ in range(2):
        assert (m.mnt / "a.safetensors").read_bytes() == a
        assert _map_close_then_copy(m.mnt / "b.safetensors") == b
    assert (m.mnt / "big.safetensors").read_bytes() == big
    for name in ("a.safetensors", "b.safetensors", "big.safetensors"):
        f = _file_stats(m, name)
        assert (f["mode"], f["mode_reason"]) == ("passthrough", "its source is held in RAM (tmpfs)"), f
    st = m.stats()
    tier = st["passthrough"]
    assert (tier["open_bytes"], tier["parked_bytes"], tier["competing_files"]) == (0, 0, 0), tier
    assert st["cache"]["chunk_budget_bytes"] == budget, st["cache"]


def test_models_taking_turns_share_the_chunk_cache_and_the_next_one_is_warmed(mount, src):
    """Two models that each fit the budget but not together, loaded in turn: the first switch
    is passthrough's; the model dropped to make room competes and comes back through the chunk
    cache, and so does the other once dropped in turn (the stats say why); each cycle then
    reads less than both models from disk, and closing one model warms the first blocks of
    the one that followed it."""
    m, a, b, budget = _two_models_taking_turns(mount, src, 14)
    if not _passthrough_available(m):
        pytest.skip("FUSE passthrough unavailable (needs Linux >= 6.9 and root)")
    disk = []
    # cycle 0 is passthrough's; in cycle 1 both models come to the chunk cache (where tierfs
    # sees them streamed, which is how it learns which follows which); from cycle 2 each is
    # warmed by the other's close
    for cycle in range(4):
        for name, want in (("a.safetensors", a), ("b.safetensors", b)):
            d0 = m.stats()["disk"]["read_bytes"]
            if cycle >= 2:
                assert _file_stats(m, name)["cached_bytes"] > 0, f"cycle {cycle}: {name} not warmed"
            assert (m.mnt / name).read_bytes() == want, f"cycle {cycle}: {name}"
            disk.append(m.stats()["disk"]["read_bytes"] - d0)
    st = m.stats()
    for name in ("a.safetensors", "b.safetensors"):
        f = _file_stats(m, name)
        assert f["mode"] == "cache", f
        assert f["mode_reason"] == "competes with other models for the budget", f
    assert st["passthrough"]["competing_files"] == 2, st["passthrough"]
    later = disk[4] + disk[5]  # cycle 3, read by the daemon (the chunk cache serves both)
    assert 0 < later < len(a) + len(b) - budget // 2, f"per-load disk bytes {disk}"
    assert st["cache"]["used_bytes"] <= st["cache"]["chunk_budget_bytes"] <= budget


def test_replaced_model_old_handle_old_bytes_new_open_new_bytes(mount, src):
    old = _model(src / "a.safetensors", 3, 6)
    m = mount(src, "512MiB")
    with open(m.mnt / "a.safetensors", "rb") as held:
        assert held.read(4096) == old[:4096]
        assert _file_stats(m, "a.safetensors")["mode"] == "passthrough"
        tmp = src / "a.safetensors.tmp"
        new = _model(tmp, 4, 7)
        os.replace(tmp, src / "a.safetensors")
        time.sleep(1.1)  # past the attribute timeout (ATTR_TTL 0.5 s)
        assert os.pread(held.fileno(), len(old), 0) == old, "the old handle must keep the old bytes"
        assert (m.mnt / "a.safetensors").read_bytes() == new, "a new open must see the new file"
        assert os.pread(held.fileno(), len(old), 0) == old


def _direct_read_all(path: Path, bs: int = MiB) -> bytes:
    """The whole file read with O_DIRECT: `bs`-byte reads at aligned offsets into a page-aligned
    buffer (an anonymous mapping), until a short read (the end of the file)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, bs)
    out = bytearray()
    try:
        while True:
            n = os.preadv(fd, [buf], len(out))
            out += buf[:n]
            if n < bs:
                return bytes(out)
    finally:
        os.close(fd)
        buf.close()


def test_o_direct_reads_of_a_passthrough_model_bypass_the_page_cache(mount, src):
    """An O_DIRECT open of a model that fits is passed through like any other open: the bytes are
    the source's, and the reads go to the source device as they do on the plain file, leaving
    nothing in its page cache (core/src/passthrough: O_DIRECT readers)."""
    want = _model(src / "a.safetensors", 4, 8)  # ~200 MiB
    drop_caches()
    m = mount(src, "512MiB")
    if not _passthrough_available(m):
        pytest.fail("this kernel/daemon offers no FUSE passthrough: the mode cannot be tested here")
    assert _direct_read_all(m.mnt / "a.safetensors") == want
    assert _file_stats(m, "a.safetensors")["mode"] == "passthrough"
    cached = page_cache_bytes(src / "a.safetensors")
    assert cached < len(want) // 8, f"O_DIRECT reads left {cached / MiB:.1f} MiB in the source's page cache"
    pt = m.stats()["passthrough"]
    assert pt["open_files"] == 0 and pt["parked_bytes"] < len(want) // 8, pt  # closed: nothing resident, nothing parked
    # a buffered open of the same inode afterwards: passthrough too, same bytes
    assert (m.mnt / "a.safetensors").read_bytes() == want
    assert _file_stats(m, "a.safetensors")["mode"] == "passthrough"


def _runai_load_bit_exact(path: Path, src_path: Path, want: bytes) -> None:
    """Every tensor of `path` through runai-model-streamer, compared with `want`'s bytes."""
    torch = pytest.importorskip("torch", reason="torch is not installed (.ci/run installs it)")
    streamer = pytest.importorskip("runai_model_streamer",
                                   reason="runai-model-streamer is not installed (.ci/run installs it)")
    ranges = gen.tensor_ranges(src_path)
    got = {}
    with streamer.SafetensorsStreamer() as s:
        s.stream_file(str(path))
        for name, t in s.get_tensors():
            got[name] = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    assert sorted(got) == sorted(name for name, _, _ in ranges)
    bad = [name for name, start, end in ranges if got[name] != want[start:end]]
    assert not bad, f"{len(bad)} tensors differ from the source: {bad[:5]}"


def test_runai_streamer_through_passthrough_bit_exact(mount, src):
    """runai-model-streamer opens with O_DIRECT and reads with io_uring (asynchronous direct
    reads, which the kernel hands to the backing file as direct reads): every tensor bit-exact."""
    torch = pytest.importorskip("torch", reason="torch is not installed (.ci/run installs it)")
    streamer = pytest.importorskip("runai_model_streamer",
                                   reason="runai-model-streamer is not installed (.ci/run installs it)")
    want = _model(src / "a.safetensors", 4, 9)
    m = mount(src, "512MiB")
    if not _passthrough_available(m):
        pytest.fail("this kernel/daemon offers no FUSE passthrough: the mode cannot be tested here")
    got = {}
    with streamer.SafetensorsStreamer() as s:
        s.stream_file(str(m.mnt / "a.safetensors"))
        for name, t in s.get_tensors():
            got[name] = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    ranges = gen.tensor_ranges(src / "a.safetensors")
    assert sorted(got) == sorted(name for name, _, _ in ranges)
    bad = [name for name, start, end in ranges if got[name] != want[start:end]]
    assert not bad, f"{len(bad)} tensors differ from the source: {bad[:5]}"
    row = _file_stats(m, "a.safetensors")
    assert row["mode"] == "passthrough", row["mode_reason"]


def test_runai_streamer_from_the_chunk_cache_bit_exact_and_reloaded_from_ram(mount, src):
    """The same loader with the chunk cache serving the file (`--no-model-passthrough`): its
    asynchronous O_DIRECT reads reach the daemon as parallel requests (FUSE_ASYNC_DIO, in any
    order), every tensor bit-exact, and a reload reads nothing from disk."""
    want = _model(src / "a.safetensors", 4, 11)
    m = mount(src, "512MiB", ("--no-model-passthrough",))

    def load() -> None:
        _runai_load_bit_exact(m.mnt / "a.safetensors", src / "a.safetensors", want)

    load()
    assert _file_stats(m, "a.safetensors")["mode"] == "cache"
    disk0 = m.stats()["disk"]["read_bytes"]
    assert disk0 >= len(want) - 64 * 1024, "the first load read the file from disk"
    load()
    assert m.stats()["disk"]["read_bytes"] == disk0, "the reload read the disk"


def test_runai_streamer_through_a_budget_below_the_file_reads_it_once(mount, src):
    """runai through a budget a quarter of the file (the chunk cache serves it, and cannot hold
    it): its O_DIRECT reads get exactly the bytes they ask for, so the file is read from disk
    once, with no prefetch (runai reads the head of each worker's range last; served through
    chunks, those were loaded, evicted and loaded again: 1.1x the file). Every tensor
    bit-exact; the pieces runai asked for as plain `pread`s with O_DIRECT too."""
    want = _model(src / "a.safetensors", 8, 12)  # ~400 MiB
    m = mount(src, f"{len(want) // 4 // MiB}MiB")
    ranges = gen.tensor_ranges(src / "a.safetensors")
    _runai_load_bit_exact(m.mnt / "a.safetensors", src / "a.safetensors", want)
    st = m.stats()
    assert _file_stats(m, "a.safetensors")["mode"] == "cache"
    data = len(want) - ranges[0][1]
    disk = st["disk"]
    assert disk["direct_bytes"] >= data - 8 * MiB, disk
    assert disk["read_bytes"] <= len(want) + 8 * MiB, f"read {disk['read_bytes'] / len(want):.2f}x the file: {disk}"
    assert st["prefetch"]["issued_bytes"] == 0, st["prefetch"]
    assert _direct_read_all(m.mnt / "a.safetensors") == want
