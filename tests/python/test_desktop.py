"""A desktop user's day one: tierfs as an ordinary (non-root) user, `--daemon`, per-op stats.

The unprivileged tests run every tierfs command as the real test user of ``users.py``
(``setpriv`` with its uid, gid and groups), mounting through ``fusermount3`` as on a desktop.
``/dev/fuse`` is made usable by the user for those tests (``chmod 0666``, the mode the fuse3
package installs; some machines, this one included, keep it 0600) and restored afterwards.
The user cannot enter root's 0700 test directories nor run a binary from a root-only checkout,
so each test works in its own directory owned by the user, with a copy of the binary and the
mount script. Root cannot look inside a user's FUSE mount (no ``allow_other``), so all reads of
the mount are done as the user too; root only checks /proc/mounts and cleans up (``umount -l``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

import gen
import users
from conftest import REPO, SESSION_ROOT, fresh_dir, is_mounted

DEV_FUSE = Path("/dev/fuse")
MiB = 1 << 20
PANIC = re.compile(r"panicked|RUST_BACKTRACE")

pytestmark = pytest.mark.timeout(120)


# ----------------------------------------------------------------------------- helpers

def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pid_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid: int) -> None:
    """SIGKILL a daemon and wait until it is gone (so its mount is dead, not still answering)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _pid_alive(pid), f"daemon {pid} survived SIGKILL"


def _set_dev_fuse_mode(mode: int) -> None:
    os.chmod(DEV_FUSE, mode)


@pytest.fixture
def dev_fuse_mode():
    """Set /dev/fuse's mode for the test (`dev_fuse_mode(0o666)`); the old mode is restored."""
    if not DEV_FUSE.exists():
        pytest.fail("/dev/fuse is missing (.ci/run loads the fuse module)")
    old = stat.S_IMODE(DEV_FUSE.stat().st_mode)
    yield _set_dev_fuse_mode
    os.chmod(DEV_FUSE, old)


class UserWorld:
    """A directory owned by the test user with a source tree, a mountpoint, the binary and the
    mount script; every mount made in it is unmounted (and its daemon killed) at teardown."""

    def __init__(self, tierfs_bin: Path):
        if shutil.which("fusermount3") is None:
            pytest.fail("fusermount3 is not installed (.ci/run installs the fuse3 package)")
        self.user = users.ensure_user()
        # The session root is mkdtemp's 0700: let the user pass through it (not list it).
        os.chmod(SESSION_ROOT, stat.S_IMODE(SESSION_ROOT.stat().st_mode) | 0o111)
        self.root = fresh_dir("desktop")
        os.chmod(self.root, 0o755)
        self.src = self.root / "models"
        self.src.mkdir()
        gen.write_small(self.src / "dit.safetensors", gen.dit_specs(256, 1024, 4), seed=16)
        (self.src / "notes.txt").write_text("not a model\n")
        self.bin = self.root / "tierfs"
        shutil.copy2(tierfs_bin, self.bin)
        self.script = self.root / "tierfs-mount.sh"
        shutil.copy2(REPO / "mount-scripts" / "tierfs-mount.sh", self.script)
        self.mnt = self.root / "mnt"
        self.mnt.mkdir()
        self.state = self.root / "state"
        self.state.mkdir()
        for p in [self.root, *self.root.rglob("*")]:
            os.chown(p, self.user.uid, self.user.gid)
        self.pids: set[int] = set()

    def run(self, *args, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
        return users.run_as([str(a) for a in args], timeout=timeout, env=env, cwd=self.root)

    def tierfs(self, *args, timeout: float = 60) -> subprocess.CompletedProcess:
        return self.run(self.bin, *args, timeout=timeout)

    def mount_daemon(self) -> int:
        r = self.tierfs("mount", self.src, self.mnt, "--ram-cache", "64MiB", "--daemon",
                        "--log-file", self.root / "daemon.log", "--state-dir", self.state)
        assert r.returncode == 0, f"user mount failed: {r.stderr}\nlog:\n{self.log()}"
        assert is_mounted(self.mnt), "--daemon returned before the mount was up"
        return self.daemon_pid()

    def stats(self) -> dict:
        r = self.run("cat", self.mnt / ".tierfs" / "stats", timeout=20)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def daemon_pid(self) -> int:
        pid = int(self.stats()["mount"]["pid"])
        self.pids.add(pid)
        return pid

    def user_sha(self, rel: str) -> str:
        r = self.run("sha256sum", self.mnt / rel, timeout=30)
        assert r.returncode == 0, f"reading {rel} as the user: {r.stderr}"
        return r.stdout.split()[0]

    def check_bytes(self) -> None:
        for rel in ("dit.safetensors", "notes.txt"):
            assert self.user_sha(rel) == _sha(self.src / rel), f"{rel} differs through the user's mount"

    def is_dead_mount(self) -> bool:
        """Whether stat(MOUNTPOINT), as the user, fails with ENOTCONN (its daemon is gone). The
        kernel answers from attributes it cached (for the mount's 0.5 s TTL) until they expire,
        so this waits up to 5 s for the failure."""
        deadline = time.monotonic() + 5
        while True:
            r = self.run("stat", "-c", "%i", self.mnt, timeout=20, env={"LC_ALL": "C"})
            if r.returncode != 0 or time.monotonic() > deadline:
                return r.returncode != 0 and os.strerror(errno.ENOTCONN) in r.stderr
            time.sleep(0.1)

    def log(self) -> str:
        try:
            return (self.root / "daemon.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def cleanup(self) -> None:
        if is_mounted(self.mnt):
            self.tierfs("unmount", "--lazy", self.mnt, timeout=20)
        if is_mounted(self.mnt):
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True, timeout=20)
        for pid in self.pids:
            if _pid_alive(pid):
                _kill(pid)


@pytest.fixture
def world(tierfs_bin, dev_fuse_mode):
    dev_fuse_mode(0o666)
    w = UserWorld(tierfs_bin)
    try:
        yield w
    finally:
        w.cleanup()
    assert not is_mounted(w.mnt), "the user's mount was left behind"


# ----------------------------------------------------------------------------- unprivileged

def test_user_mounts_reads_and_unmounts(world):
    """As a user: mount (fusermount3), bit-exact reads, root-only modes reported as fallen back
    in the log, the stats and `tierfs stats`, then `tierfs unmount` (fusermount3 -u)."""
    pid = world.mount_daemon()
    mount_line = next(l for l in Path("/proc/mounts").read_text().splitlines() if f" {world.mnt} " in l)
    assert f"user_id={world.user.uid}" in mount_line, mount_line
    world.check_bytes()

    doc = world.stats()
    modes = doc["modes"]
    assert modes["root"] is False and modes["passthrough"] is False, modes
    assert doc["mount"]["passthrough"] is False
    assert "root" in modes["passthrough_note"], modes
    assert "root" in modes["readahead_note"], modes
    assert modes["readahead_bytes"] > 0, modes
    assert doc["ops"]["read"]["count"] > 0 and doc["ops"]["open"]["count"] >= 2, doc["ops"]
    log = world.log()
    assert "passthrough needs root" in log and "readahead needs root" in log, log

    human = world.tierfs("stats", world.mnt, timeout=20)
    assert human.returncode == 0 and "not root" in human.stdout, human.stdout + human.stderr
    ctl = world.tierfs("ctl", world.mnt, "drop", timeout=20)
    assert ctl.returncode == 0, ctl.stderr
    bad = world.tierfs("ctl", world.mnt, "ram-cache", "lots", timeout=20)
    assert bad.returncode != 0 and "refused" in bad.stderr, bad.stderr  # reached the daemon
    world.check_bytes()  # served again after the drop

    r = world.tierfs("unmount", world.mnt, timeout=30)
    assert r.returncode == 0, f"user unmount: {r.stderr}"
    assert not is_mounted(world.mnt)
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(pid), "daemon still running after the user unmounted"
    again = world.tierfs("unmount", world.mnt, timeout=30)
    assert again.returncode != 0 and "not a mount point" in again.stderr, again.stderr


def test_user_recovers_a_dead_mount(world):
    """Daemon SIGKILLed: the user's `tierfs unmount` clears the dead mount, and a later
    `tierfs mount` over a dead mount replaces it."""
    pid = world.mount_daemon()
    _kill(pid)
    assert world.is_dead_mount(), "expected a dead mount after SIGKILL"
    r = world.tierfs("unmount", world.mnt, timeout=30)
    assert r.returncode == 0, f"user unmount of a dead mount: {r.stderr}"
    assert not is_mounted(world.mnt)

    pid = world.mount_daemon()
    _kill(pid)
    assert world.is_dead_mount()
    new_pid = world.mount_daemon()  # `tierfs mount` detaches the dead mount first
    assert new_pid != pid
    world.check_bytes()
    assert world.tierfs("unmount", world.mnt, timeout=30).returncode == 0
    assert not is_mounted(world.mnt)


def test_user_mount_script_and_its_recovery(world):
    """mount-scripts/tierfs-mount.sh as the user: mounts, and replaces a dead mount."""
    env = {"TIERFS_BIN": str(world.bin), "TIERFS_LOG_FILE": str(world.root / "daemon.log")}
    args = ("bash", world.script, world.src, world.mnt, "64MiB", "--", "--state-dir", world.state)
    r = world.run(*args, env=env, timeout=60)
    assert r.returncode == 0, f"tierfs-mount.sh as the user: {r.stdout}{r.stderr}"
    assert "mounted" in r.stdout, r.stdout
    pid = world.daemon_pid()
    world.check_bytes()

    _kill(pid)
    assert world.is_dead_mount()
    r = world.run(*args, env=env, timeout=60)
    assert r.returncode == 0, f"tierfs-mount.sh over a dead mount: {r.stdout}{r.stderr}"
    assert "dead mount" in r.stderr, r.stderr
    assert world.daemon_pid() != pid
    world.check_bytes()
    assert world.tierfs("unmount", world.mnt, timeout=30).returncode == 0


@pytest.mark.parametrize("daemon", [False, True], ids=["foreground", "daemon"])
def test_dev_fuse_not_accessible_says_what_to_do(world, dev_fuse_mode, daemon):
    """/dev/fuse 0600: one clear sentence (why, and what to do), nothing mounted, no hang."""
    dev_fuse_mode(0o600)
    r = world.tierfs("mount", world.src, world.mnt, "--ram-cache", "64MiB", "--state-dir", world.state,
                     *(["--daemon"] if daemon else []), timeout=30)
    assert r.returncode != 0, "mounted without access to /dev/fuse?"
    err = r.stderr.strip().splitlines()[-1]
    assert "/dev/fuse" in err and "chmod 0666 /dev/fuse" in err and "root" in err, r.stderr
    assert "os error" not in err and not PANIC.search(r.stderr), r.stderr
    assert not is_mounted(world.mnt)


# ----------------------------------------------------------------------------- --daemon

def test_daemon_reports_the_childs_error(tierfs_bin, workdir):
    """A mount that fails in the daemon child: its own error comes back through the pipe."""
    mnt = fresh_dir("mnt")
    started = time.monotonic()
    r = subprocess.run([str(tierfs_bin), "mount", str(workdir / "nope"), str(mnt), "--ram-cache", "64MiB",
                        "--daemon", "--no-state"], capture_output=True, text=True, timeout=30)
    elapsed = time.monotonic() - started
    assert r.returncode != 0 and not is_mounted(mnt)
    assert "source" in r.stderr and "nope" in r.stderr and "not accessible" in r.stderr, r.stderr
    assert elapsed < 10, f"--daemon took {elapsed:.1f} s to report a failure"


def test_daemon_child_serves_the_parsed_arguments(tierfs_bin, workdir):
    """Every option reaches the daemon child as parsed (no second command line to drift)."""
    src = workdir / "src"
    src.mkdir()
    gen.write_small(src / "m.safetensors", gen.dit_specs(128, 512, 2), seed=5)
    mnt = fresh_dir("mnt")
    log = workdir / "daemon.log"
    r = subprocess.run([str(tierfs_bin), "mount", str(src), str(mnt), "--ram-cache", "96MiB", "--daemon",
                        "--log-file", str(log), "--no-passthrough", "--readahead", "1MiB", "--threads", "3",
                        "--no-state"], capture_output=True, text=True, timeout=30)
    try:
        assert r.returncode == 0, r.stderr
        doc = json.loads((mnt / ".tierfs" / "stats").read_bytes())
        assert doc["cache"]["budget_bytes"] == 96 * MiB
        assert doc["mount"]["passthrough"] is False
        assert doc["modes"]["passthrough_note"] == "off: --no-passthrough", doc["modes"]
        assert doc["modes"]["readahead_bytes"] == 1 * MiB, doc["modes"]
        assert (mnt / "m.safetensors").read_bytes() == (src / "m.safetensors").read_bytes()
        assert "mounted" in log.read_text(), log.read_text()
        assert subprocess.run([str(tierfs_bin), "unmount", str(mnt)], capture_output=True, timeout=30).returncode == 0
    finally:
        if is_mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ----------------------------------------------------------------------------- per-op stats

def test_per_operation_stats(tierfs_bin, mount, workdir):
    src = workdir / "src"
    (src / "sub").mkdir(parents=True)
    gen.write_small(src / "m.safetensors", gen.dit_specs(256, 1024, 4), seed=6)
    m = mount(src, "64MiB", ("--no-model-passthrough",))  # reads must reach the daemon
    before = m.stats()["ops"]
    for name in ("missing-1", "missing-2", "missing-3"):
        assert not (m.mnt / name).exists()
    os.listdir(m.mnt / "sub")
    assert (m.mnt / "m.safetensors").read_bytes() == (src / "m.safetensors").read_bytes()
    ops = m.stats()["ops"]
    assert ops["lookup"]["errors"] - before["lookup"]["errors"] >= 3, ops["lookup"]
    assert ops["lookup"]["count"] - before["lookup"]["count"] >= 4, ops["lookup"]
    assert ops["readdir"]["count"] > before["readdir"]["count"], ops["readdir"]
    assert ops["open"]["count"] > before["open"]["count"] and ops["open"]["errors"] == 0, ops["open"]
    assert ops["read"]["count"] > before["read"]["count"] and ops["read"]["errors"] == 0, ops["read"]
    for name, op in ops.items():
        if op["count"]:
            assert 0 < op["p50_us"] <= op["p99_us"], (name, op)
            assert op["mean_us"] > 0, (name, op)
    human = subprocess.run([str(tierfs_bin), "stats", str(m.mnt)], capture_output=True, text=True, timeout=20)
    assert human.returncode == 0, human.stderr
    row = next(l for l in human.stdout.splitlines() if l.split()[:1] == ["read"])
    assert int(row.split()[1]) >= ops["read"]["count"], row
