"""Descriptors and file versions over the life of a mount (see
core/src/source/slot.rs, core/src/models/open.rs).

- A folder of 20 000 small `.safetensors`, each opened once through the mount, its header read
  and closed (ComfyUI's LoRA scan): no open ever fails (a daemon keeping three source
  descriptors per file ever opened would run out at its limit and answer EMFILE), every header is
  bit-exact, and the daemon's descriptor count stays far below its limit, also with the
  daemon's limit lowered to 1024.
- A model deleted or replaced in SOURCE while it is read and after it was read, in chunk-cache
  and in passthrough mode: open handles keep reading the old bytes; once the last one closes
  the daemon holds no descriptor of the old file and `df` of the source filesystem (a small
  ext4 on a loop device) shows its space freed.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import gen  # noqa: E402
from conftest import MiB, fresh_dir  # noqa: E402

N_SMALL = 20_000


def _fd_targets(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return out


def _nofile_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


@pytest.fixture(scope="module")
def lora_dir():
    root = fresh_dir("loras")
    for i in range(N_SMALL):
        (root / f"lora_{i:05d}.safetensors").write_bytes(gen.small_safetensors(i))
    return root


@pytest.mark.timeout(240)
@pytest.mark.parametrize("limit", [None, 1024], ids=["own-limit", "limit-1024"])
def test_header_scan_of_20000_files_never_runs_out_of_descriptors(mount, lora_dir, limit):
    m = mount(lora_dir, "256MiB")
    if limit is not None:
        subprocess.run(["prlimit", "--pid", str(m.pid), f"--nofile={limit}:{limit}"],
                       check=True, timeout=30)
    fd_limit = _nofile_limit(m.pid)
    assert limit is None or fd_limit == limit
    names = sorted(os.listdir(m.mnt))
    assert len([n for n in names if n.endswith(".safetensors")]) == N_SMALL
    most_fds = len(_fd_targets(m.pid))
    started = time.monotonic()
    for i in range(N_SMALL):
        name = f"lora_{i:05d}.safetensors"
        want = gen.small_safetensors(i)
        # What a safetensors header reader does: 8 bytes of length, then the JSON. Any
        # OSError (EMFILE from the daemon) fails the test right here.
        with open(m.mnt / name, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            got = f.read(n)
            if i % 500 == 0:
                got += f.read()  # the data too, through the chunk path, now and then
        assert want[: 8 + len(got)][8:] == got and len(got) >= n, f"{name}: wrong header bytes"
        if i % 250 == 0:
            most_fds = max(most_fds, len(_fd_targets(m.pid)))
    elapsed = time.monotonic() - started
    most_fds = max(most_fds, len(_fd_targets(m.pid)))
    st = m.stats()
    print(f"\n{N_SMALL} header reads in {elapsed:.1f} s; daemon descriptors at most {most_fds} "
          f"of a limit of {fd_limit}; index entries {st['cache']['index_entries']}")
    assert most_fds < 100, f"the daemon held {most_fds} descriptors (limit {fd_limit})"
    assert m.alive()


# ---------------------------------------------------------------------- deleted and replaced


@pytest.fixture
def small_fs():
    """A 256 MiB ext4 on a loop device over a file in /var/tmp; unmounted, detached and removed
    afterwards whatever happened."""
    base = Path(tempfile.mkdtemp(prefix="tierfs-lifecycle.", dir="/var/tmp"))
    image, mnt = base / "fs.img", base / "fs"
    mnt.mkdir()
    loop = None
    try:
        with open(image, "wb") as f:
            f.truncate(256 * MiB)
        loop = subprocess.run(["losetup", "--find", "--show", str(image)], check=True,
                              capture_output=True, text=True, timeout=30).stdout.strip()
        subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True, capture_output=True, timeout=60)
        subprocess.run(["mount", loop, str(mnt)], check=True, capture_output=True, timeout=30)
        yield mnt
    finally:
        if os.path.ismount(mnt):
            if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True, timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def _free(path: Path) -> int:
    s = os.statvfs(path)
    return s.f_bavail * s.f_frsize


def _model(path: Path, seed: int) -> bytes:
    gen.write_small(path, gen.dit_specs(1024, 2048, 2, ("F32",)), seed=seed)  # ~64 MiB
    return path.read_bytes()


def _wait_released(m, src_fs: Path, free_wanted: int) -> tuple[list[str], int]:
    """Waits (up to 10 s: the kernel sends RELEASE after close() returns) until the daemon holds
    no descriptor of a file in SOURCE (`src_fs/src`; the folder itself it keeps open) and the
    free space reaches `free_wanted`; returns both."""
    deadline = time.monotonic() + 10
    inside = str(src_fs / "src") + "/"
    while True:
        held = [t for t in _fd_targets(m.pid) if t.startswith(inside)]
        free = _free(src_fs)
        if (not held and free >= free_wanted) or time.monotonic() > deadline:
            return held, free
        time.sleep(0.05)


def _mount_mode(mount, src: Path, mode: str):
    if mode == "cache":
        m = mount(src, "256MiB", ("--no-model-passthrough",))
    else:
        m = mount(src, "512MiB")
        if not m.stats()["passthrough"]["available"]:
            pytest.fail("this kernel/daemon offers no FUSE passthrough: the mode cannot be tested here")
    return m


def _served_mode(m, rel: str) -> str:
    for f in m.stats()["files"]:
        if f["path"] == rel:
            return f["mode"]
    raise AssertionError(f"{rel} not in stats")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["cache", "passthrough"])
@pytest.mark.parametrize("change", ["delete", "replace"])
def test_a_model_deleted_or_replaced_in_source_leaves_nothing_open(small_fs, mount, mode, change):
    # small_fs first: the mount is torn down before the filesystem under it.
    src = small_fs / "src"
    src.mkdir()
    empty = _free(small_fs)
    path = src / "model.safetensors"
    old = _model(path, seed=1)
    assert len(old) > 60 * MiB
    m = _mount_mode(mount, src, mode)
    tolerance = 4 * MiB  # ext4 metadata

    def change_source() -> bytes | None:
        if change == "delete":
            path.unlink()
            return None
        new = _model(src / "new.tmp", seed=2)
        os.replace(src / "new.tmp", path)
        return new

    # While it is read: the open handle keeps reading the old bytes after the change.
    with open(m.mnt / "model.safetensors", "rb") as f:
        assert _served_mode(m, "model.safetensors") == mode
        first = f.read(len(old) // 3)
        new = change_source()
        rest = f.read()
    assert first + rest == old, "the open handle did not read the version it opened"
    want_free = empty - tolerance - (len(new) if new else 0)
    held, free = _wait_released(m, small_fs, want_free)
    assert not held, f"the daemon still holds {held} after the last close ({mode}, {change})"
    assert free >= want_free, f"{(want_free - free) / MiB:.1f} MiB more used than one copy: old file not freed"
    if new is not None:
        with open(m.mnt / "model.safetensors", "rb") as f:
            assert f.read() == new
    st = m.stats()
    if mode == "cache":
        # The old version's cached chunks left the budget with it (8 MiB: chunks a prefetch
        # worker was reading at the close may still land).
        assert st["cache"]["used_bytes"] <= (len(new) if new else 0) + 8 * MiB, st["cache"]
    else:
        assert st["passthrough"]["parked_bytes"] <= (len(new) + MiB if new else 0), st["passthrough"]

    # After it was read: read whole, closed, then changed in SOURCE.
    current = new if new is not None else _model(path, seed=3)
    with open(m.mnt / "model.safetensors", "rb") as f:
        assert f.read() == current
    before = _free(small_fs)
    newer = change_source()
    want_free = before + len(current) - tolerance - (len(newer) if newer else 0)
    held, free = _wait_released(m, small_fs, want_free)
    assert not held, f"the daemon holds {held} of a file it closed ({mode}, {change})"
    assert free >= want_free, f"{(want_free - free) / MiB:.1f} MiB not freed after the change"
    if newer is not None:
        with open(m.mnt / "model.safetensors", "rb") as f:
            assert f.read() == newer
    assert m.alive()
