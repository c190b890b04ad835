"""Stable source devices for tests/bench/acceptance.py: a fast one and the same one throttled.

The machine's virtual disk is cached by its host and reads at anything from 0.4 to 2.5 GB/s
from one minute to the next, so ratios measured on it drift.  acceptance.py puts its models on:

* **fast**: an ext4 file system on a RAM-backed block device: a zram device (`hot_add`; one
  of our own, never an existing one) or, where zram is missing, a loop device over a file in
  a tmpfs mounted for the purpose (`losetup --direct-io=off`: the loop device itself supports
  O_DIRECT opens of its files).  Mounted with `-o discard`, so a deleted file gives its RAM back.
  A stand-in for a 3-7 GB/s NVMe (zram measured here: ~3 GB/s for one `dd bs=1M` reader).
* **slow**: the same device, read-throttled with the cgroup v1 blkio controller
  (`blkio.throttle.read_bps_device` on the device's MAJ:MIN; `Throttle.set_iops` adds
  `read_iops_device`, a cap on read requests per second, for tests/bench/slow_sources.py's
  disk class).  The benchmark process joins the
  cgroup at the start, so every process it starts (loaders, the tierfs daemon, readers)
  inherits it: every reader is throttled, the daemon included.  blk-throttle acts where a bio
  is submitted, so it applies to bio-based devices like zram and loop too (measured: a 200 MB/s
  limit gave 202 MB/s buffered and 208 MB/s with O_DIRECT on zram); :func:`verify` measures it
  on every run anyway and refuses to go on when it does not hold.

Everything is undone by the context managers and, for a run killed between them, by an
`atexit` hook: unmount, zram reset + `hot_remove` (or `losetup -d` + tmpfs unmount), the cgroup
removed after its processes are moved back to the root cgroup.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

MiB, GiB = 1 << 20, 1 << 30
BLKIO = Path("/sys/fs/cgroup/blkio")
ZRAM_CONTROL = Path("/sys/class/zram-control")
CG_NAME = "tierfs-bench-"

_UNDO: list = []  # objects with .close(), most recent last


def _run(*cmd: str) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return p.stdout


def _undo_all() -> None:
    for obj in list(reversed(_UNDO)):
        try:
            obj.close()
        except Exception as e:  # noqa: BLE001 - keep undoing the rest
            print(f"warning: cleanup of {obj!r} failed: {e}")


atexit.register(_undo_all)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


class RamDisk:
    """An ext4 file system on a RAM-backed block device, mounted at `self.mnt`."""

    def __init__(self, size: int, root: Path, prefer_loop: bool = False):
        """`prefer_loop`: a loop device over tmpfs even where zram exists.  zram takes requests
        of at most 124 KiB (`max_sectors_kb`), so the kernel's readahead reaches it in pieces that
        small; a loop device takes 1.25 MiB like a SATA disk, which matters where requests are
        counted (an IOPS cap)."""
        self.size, self.root = size, root
        self.prefer_loop = prefer_loop
        self.kind = ""
        self.dev = ""
        self.zram_id: int | None = None
        self.tmpfs: Path | None = None
        self.mnt = Path(tempfile.mkdtemp(prefix="src.", dir=root))
        _UNDO.append(self)
        try:
            self._attach()
            _run("mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0", "-m", "0", self.dev)
            _run("mount", "-o", "discard,noatime", self.dev, str(self.mnt))
        except BaseException:
            self.close()
            raise
        st = os.stat(self.dev)
        self.majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"

    def put(self, src: Path, rel: str | None = None) -> Path:
        """Copies `src` to `rel` (default: its name) on the device, written out; returns the copy."""
        dst = self.mnt / (rel or src.name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        os.sync()
        return dst

    def _attach(self) -> None:
        if not self.prefer_loop and (ZRAM_CONTROL / "hot_add").exists():
            try:
                self.zram_id = int((ZRAM_CONTROL / "hot_add").read_text())
                Path(f"/sys/block/zram{self.zram_id}/disksize").write_text(f"{self.size}\n")
                self.kind, self.dev = "zram", f"/dev/zram{self.zram_id}"
                return
            except OSError as e:
                print(f"zram unavailable ({e}); using a loop device over tmpfs")
                self._zram_remove()
        self.tmpfs = Path(tempfile.mkdtemp(prefix="tmpfs.", dir=self.root))
        _run("mount", "-t", "tmpfs", "-o", f"size={self.size + 64 * MiB}", "tmpfs", str(self.tmpfs))
        img = self.tmpfs / "disk.img"
        with open(img, "wb") as f:
            f.truncate(self.size)
        self.dev = _run("losetup", "--find", "--show", str(img)).strip()
        self.kind = "loop over tmpfs"

    def _zram_remove(self) -> None:
        if self.zram_id is None:
            return
        try:
            Path(f"/sys/block/zram{self.zram_id}/reset").write_text("1\n")
        except OSError:
            pass
        for _ in range(50):
            try:
                (ZRAM_CONTROL / "hot_remove").write_text(f"{self.zram_id}\n")
                break
            except OSError:  # busy for a moment after the unmount
                time.sleep(0.1)
        self.zram_id = None

    def __repr__(self) -> str:
        return f"RamDisk({self.kind} {self.dev} at {self.mnt})"

    def __enter__(self) -> "RamDisk":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", str(self.mnt)], capture_output=True, timeout=120)
            if os.path.ismount(self.mnt):
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True, timeout=120)
        shutil.rmtree(self.mnt, ignore_errors=True)
        if self.zram_id is not None:
            self._zram_remove()
        elif self.dev.startswith("/dev/loop"):
            subprocess.run(["losetup", "-d", self.dev], capture_output=True, timeout=60)
            self.dev = ""
        if self.tmpfs is not None:
            subprocess.run(["umount", "-l", str(self.tmpfs)], capture_output=True, timeout=60)
            shutil.rmtree(self.tmpfs, ignore_errors=True)
            self.tmpfs = None
        if self in _UNDO:
            _UNDO.remove(self)


class Throttle:
    """A cgroup v1 blkio cgroup holding this process (and so all its children) whose read rate
    on one device can be limited (`set(bps)`) or left free (`set(0)`)."""

    def __init__(self, majmin: str):
        if not (BLKIO / "cgroup.procs").exists():
            raise RuntimeError(f"no cgroup v1 blkio controller at {BLKIO}: the slow source needs it")
        self.majmin = majmin
        self.path = BLKIO / f"{CG_NAME}{os.getpid()}"
        self.path.mkdir(exist_ok=True)
        _UNDO.append(self)
        (self.path / "cgroup.procs").write_text(f"{os.getpid()}\n")
        self.bps = 0
        self.iops = 0

    def set(self, bps: int) -> None:
        (self.path / "blkio.throttle.read_bps_device").write_text(f"{self.majmin} {bps}\n")
        self.bps = bps

    def set_iops(self, iops: int) -> None:
        """Limits read requests per second on the device (`blkio.throttle.read_iops_device`;
        0: no limit).  With `set(bps)` too, a request waits for whichever limit it hits first:
        a hard disk's ~200 random IOPS beside its ~200 MB/s."""
        (self.path / "blkio.throttle.read_iops_device").write_text(f"{self.majmin} {iops}\n")
        self.iops = iops

    def read_bytes(self) -> int:
        """Bytes the cgroup's processes read from the device (block layer, throttled or not)."""
        return parse_service_bytes((self.path / "blkio.throttle.io_service_bytes").read_text(), self.majmin)

    def read_ios(self) -> int:
        """Read requests the cgroup's processes sent to the device (block layer)."""
        return parse_service_bytes((self.path / "blkio.throttle.io_serviced").read_text(), self.majmin)

    def __repr__(self) -> str:
        return f"Throttle({self.path})"

    def close(self) -> None:
        for _ in range(50):
            if not self.path.exists():
                break
            try:
                pids = (self.path / "cgroup.procs").read_text().split()
            except OSError:
                pids = []
            for pid in pids:  # only our processes are there; back to the root cgroup
                try:
                    (BLKIO / "cgroup.procs").write_text(pid + "\n")
                except OSError:
                    pass
            try:
                self.path.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        else:
            print(f"warning: could not remove {self.path}")
        if self in _UNDO:
            _UNDO.remove(self)


def parse_service_bytes(text: str, majmin: str) -> int:
    """The `MAJ:MIN Read N` figure of a blkio `io_service_bytes` (or `io_serviced`) file (0 when
    absent)."""
    for line in text.splitlines():
        f = line.split()
        if len(f) == 3 and f[0] == majmin and f[1] == "Read":
            return int(f[2])
    return 0


def throttle_verdict(got: float, want: float, tolerance: float = 0.25) -> str:
    """"fast" when a throttled read ran above `want` + `tolerance` (the throttle does not apply),
    "starved" when well below it (a busy machine), "ok" otherwise."""
    if got > (1 + tolerance) * want:
        return "fast"
    if got < (1 - tolerance) * want:
        return "starved"
    return "ok"


def cold_read_gbs(path: Path, limit: int | None = None, bs: int = MiB) -> float:
    """Cold sequential read rate of `path` (GB/s): caches dropped, `bs` read() calls."""
    drop_caches()
    buf = memoryview(bytearray(bs))
    total = 0
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while limit is None or total < limit:
            n = os.readv(fd, [buf])
            if n == 0:
                break
            total += n
    finally:
        os.close(fd)
    return total / (time.perf_counter() - t0) / 1e9


def verify(throttle: Throttle, path: Path, bps: int, tolerance: float = 0.25) -> tuple[float, str]:
    """Measures the throttled rate on `path`: (GB/s, warning).  Fails when the throttle does not
    apply (reads faster than `bps` + `tolerance`); a rate well below `bps` means the machine is
    busy (CPU-starved reader), which is worth a warning but is still a throttled source."""
    got = cold_read_gbs(path, limit=min(os.path.getsize(path), 512 * MiB))
    want = bps / 1e9
    verdict = throttle_verdict(got, want, tolerance)
    if verdict == "fast":
        raise RuntimeError(f"blkio throttle on {throttle.majmin} does not hold: {got:.2f} GB/s read, "
                           f"{want:.2f} GB/s set")
    warn = ""
    if verdict == "starved":
        warn = f"slow source read {got:.2f} GB/s, below the {want:.2f} GB/s throttle: the machine is busy"
    return got, warn


def clean_stale() -> None:
    """Cgroups of killed earlier runs (SIGKILL skips every cleanup)."""
    if BLKIO.is_dir():
        for p in BLKIO.glob(CG_NAME + "*"):
            pid = p.name[len(CG_NAME):]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                t = Throttle.__new__(Throttle)
                t.path = p
                t.close()
