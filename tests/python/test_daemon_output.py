"""A mount whose own output cannot be written keeps serving.

The daemon's standard error is where its log and status lines go. When it cannot be written (a
log file on a full disk, here `/dev/full`; a pipe whose reader went away, `tierfs mount ... |
logger` after the logger exits), the lines are lost and nothing else: the mount comes up, serves
every byte of a plain file and of a model exactly, unmounts at SIGTERM and exits 0. A daemon that
panicked on a failed write (Rust's `eprintln!`, or tracing's report of its own write errors,
which goes through `eprintln!`) would exit 101 before its mount was ready.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import gen  # noqa: E402
from conftest import TIERFS_BIN, _PROCS, abort_fuse_connection, fresh_dir, is_mounted  # noqa: E402


def _output(kind: str) -> int:
    """A descriptor the daemon's stdout and stderr go to, that fails every write."""
    if kind == "full-disk":
        return os.open("/dev/full", os.O_WRONLY)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the daemon writes its first line
    return write_end


def _wait_ready(proc: subprocess.Popen, mnt: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"tierfs exited with {proc.returncode} before the mount was ready")
        if is_mounted(mnt) and (mnt / ".tierfs" / "stats").exists():
            return
        time.sleep(0.05)
    pytest.fail(f"mount not ready after {timeout} s")


@pytest.mark.parametrize("kind", ["full-disk", "closed-pipe"])
def test_a_mount_whose_output_cannot_be_written_serves_and_exits_cleanly(kind):
    src, mnt = fresh_dir("outsrc"), fresh_dir("outmnt")
    (src / "notes.txt").write_bytes(b"plain bytes\n" * 1000)
    gen.write_small(src / "m.safetensors", gen.dit_specs(64, 256, 4), seed=5)
    out = _output(kind)
    try:
        proc = subprocess.Popen([str(TIERFS_BIN), "mount", str(src), str(mnt), "--ram-cache", "64MiB",
                                 "--no-state"], stdout=out, stderr=out)
    finally:
        os.close(out)
    _PROCS.append(proc)
    try:
        _wait_ready(proc, mnt)
        for name in ("notes.txt", "m.safetensors"):
            assert (mnt / name).read_bytes() == (src / name).read_bytes(), name
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert not is_mounted(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
            abort_fuse_connection(mnt)
            proc.wait(timeout=10)
        if is_mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
