"""The release packages: `packaging/build.sh` builds the Debian package and the Python wheel
from this checkout, each is installed on this machine the way a user installs it (`apt-get
install ./tierfs_….deb`; `pip install` of the wheel into a fresh venv), and the INSTALLED
binary mounts a models folder whose bytes read back through the mount bit-exact; then the
package is removed again.

The deb is installed system-wide, so its test needs root (the suite runs as root,
tests/run.sh) and a machine without a tierfs package or /usr/bin/tierfs of its own (it would
replace and then remove them); it is skipped, saying why, otherwise. The wheel's test changes
nothing outside the session root. Mounts are made by daemons (`tierfs-mount`, `tierfs mount
--daemon`): `DaemonMounts` unmounts them and ends their daemons after each test, whatever happened,
and conftest's session safety net sweeps the session root as well.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

import gen
from conftest import REPO, fresh_dir, is_mounted
from test_scripts import DaemonMounts, _pid_alive

BUILD_SH = REPO / "packaging" / "build.sh"
# Both artifacts: seconds after the release build of tests/run.sh, which both tools reuse; two to
# three minutes on 2 CPUs from nothing.
BUILD_TIMEOUT_S = int(os.environ.get("TIERFS_PACKAGES_BUILD_TIMEOUT", "420"))
BUDGET = "16MiB"
VERSION = tomllib.loads((REPO / "fs" / "Cargo.toml").read_text())["package"]["version"]
# Where the deb puts things (fs/Cargo.toml, [package.metadata.deb]; docs/INSTALL.md).
DEB_FILES = ("/usr/bin/tierfs", "/usr/bin/tierfs-mount", "/usr/lib/systemd/system/tierfs@.service",
             "/usr/share/doc/tierfs/README.md", "/usr/share/doc/tierfs/docs/INSTALL.md")
APT = ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=120", "--no-install-recommends"]


def _run(cmd, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


def _clean_env(path: str) -> dict[str, str]:
    """The environment of a user's shell: no TIERFS_BIN (tests/run.sh sets it to the checkout's
    binary), PATH as given."""
    env = {k: v for k, v in os.environ.items() if k not in ("TIERFS_BIN", "VIRTUAL_ENV")}
    env["PATH"] = path
    return env


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def packages() -> tuple[Path, Path]:
    """(deb, wheel): packaging/build.sh run once for this module, into the session root."""
    out = fresh_dir("dist")
    env = dict(os.environ)
    suite_maturin = Path(sys.executable).parent / "maturin"  # tests/setup-venv.sh installs it
    if "MATURIN" not in env and suite_maturin.exists():
        env["MATURIN"] = str(suite_maturin)
    # Own process group: on a timeout the cargo and rustc processes under the script go too.
    proc = subprocess.Popen(["bash", str(BUILD_SH), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"packaging/build.sh did not finish in {BUILD_TIMEOUT_S} s\n{stderr[-4000:]}")
    assert proc.returncode == 0, f"packaging/build.sh failed (rc={proc.returncode}):\n{stderr[-6000:]}"
    paths = [Path(line) for line in stdout.splitlines() if line.strip()]
    assert len(paths) == 2, f"packaging/build.sh printed {paths}, not the deb's and the wheel's paths"
    deb, wheel = paths
    assert deb.suffix == ".deb" and wheel.suffix == ".whl", paths
    for p in paths:
        assert p.is_file() and p.parent == out, f"{p}: not a file in --out {out}"
    return deb, wheel


@pytest.fixture(scope="module")
def models() -> tuple[Path, dict[str, bytes]]:
    """A small models folder: a DiT three times the budget (streamed through the chunk cache,
    evicting as it goes), a Flux checkpoint, a text file; with every file's bytes."""
    src = fresh_dir("pkg-models") / "models"
    (src / "diffusion_models").mkdir(parents=True)
    (src / "checkpoints").mkdir()
    gen.write_small(src / "diffusion_models" / "dit.safetensors", gen.dit_specs(512, 2048, 6), seed=11)
    gen.write_small(src / "checkpoints" / "flux.safetensors", gen.flux_specs(dim=256, n_double=2, n_single=2),
                    seed=12)
    (src / "notes.txt").write_text("not a model\n")
    want = {str(p.relative_to(src)): p.read_bytes() for p in sorted(src.rglob("*")) if p.is_file()}
    assert len(want["diffusion_models/dit.safetensors"]) > 3 * (16 << 20)
    return src, want



def _daemon_pid(mnt: Path) -> int:
    text = (mnt / ".tierfs" / "stats").read_text()
    m = re.search(r'"mount"\s*:\s*\{[^}]*"pid"\s*:\s*(\d+)', text)
    assert m, f"no mount.pid in {mnt}/.tierfs/stats"
    return int(m.group(1))


@pytest.fixture
def daemons():
    # The package may be removed by then: its mounts are undone with fusermount3.
    d = DaemonMounts(None, unmount=["fusermount3", "-u"])
    yield d
    left = d.cleanup()
    assert not left, f"mount(s) left behind: {left}"


# ----------------------------------------------------------------------------- the checks

def check_mount(daemons: DaemonMounts, mnt: Path, src: Path, want: dict[str, bytes], binary: Path) -> int:
    """The mount at `mnt` is served by a daemon running `binary`, with the budget asked for, and
    every file reads back through it byte for byte; returns the daemon's pid."""
    assert is_mounted(mnt), f"{mnt} is not mounted"
    pid = _daemon_pid(mnt)
    daemons.pids.add(pid)
    exe = Path(os.readlink(f"/proc/{pid}/exe"))
    assert exe == binary, f"the daemon runs {exe}, not the installed {binary}"
    stats = json.loads((mnt / ".tierfs" / "stats").read_bytes())
    assert stats["cache"]["budget_bytes"] == 16 << 20, stats["cache"]
    assert Path(stats["mount"]["source"]) == src.resolve()
    got = sorted(rel for p in mnt.rglob("*") if p.is_file()
                 and not (rel := str(p.relative_to(mnt))).startswith(".tierfs/"))
    assert got == sorted(want), f"files through the mount: {got}, in the source: {sorted(want)}"
    for rel, data in want.items():
        # Streamed in 1 MiB reads, as a loader reading tensor by tensor would.
        read = bytearray()
        with open(mnt / rel, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                read += chunk
        if bytes(read) != data:
            first = next((i for i, (a, b) in enumerate(zip(read, data)) if a != b), min(len(read), len(data)))
            pytest.fail(f"{rel}: {len(read)} bytes read through the mount, {len(data)} in the source; "
                        f"first difference at byte {first}")
    return pid


def unmount(binary: Path, mnt: Path, pid: int) -> None:
    """`tierfs unmount` with the installed binary: the mount goes and its daemon exits."""
    r = _run([binary, "unmount", mnt], timeout=30)
    assert r.returncode == 0, f"{binary} unmount {mnt}: rc={r.returncode}\n{r.stderr}"
    deadline = time.monotonic() + 10
    while (is_mounted(mnt) or _pid_alive(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_mounted(mnt) and not _pid_alive(pid), "mount or daemon still there after tierfs unmount"


def mount_with_script(script: Path, src: Path, mnt: Path, env: dict[str, str], daemons: DaemonMounts,
                      log: Path) -> subprocess.CompletedProcess:
    daemons.track(mnt)
    env = dict(env, TIERFS_LOG_FILE=str(log))
    return _run([script, src, mnt, BUDGET, "--", "--state-dir", fresh_dir("state")], timeout=90, env=env)


def test_build_prints_both_artifacts(packages):
    """The file names carry the crate's version; the wheel's tag is a manylinux one for this
    machine's architecture (pip and PyPI accept it), never a plain `linux` tag."""
    deb, wheel = packages
    arch = _run(["dpkg", "--print-architecture"]).stdout.strip()
    assert deb.name == f"tierfs_{VERSION}-1_{arch}.deb", deb.name
    m = re.fullmatch(rf"tierfs-{re.escape(VERSION)}-py3-none-(.+)\.whl", wheel.name)
    assert m, f"{wheel.name}: not tierfs-{VERSION}-py3-none-PLATFORM.whl"
    assert re.fullmatch(rf"manylinux_2_\d+_{re.escape(platform.machine())}", m.group(1)), m.group(1)
    # The install commands of the README and docs/INSTALL.md name these files (the wheel's
    # glibc level may differ on another build machine; its name up to there may not).
    for doc in (REPO / "README.md", REPO / "docs" / "INSTALL.md"):
        text = doc.read_text()
        assert f"apt-get install ./{deb.name}" in text, f"{doc.name} does not install {deb.name}"
        assert f"pip install tierfs-{VERSION}-py3-none-manylinux_" in text, f"{doc.name}: no pip install of the wheel"


def test_deb_installs_and_mounts(packages, models, daemons):
    deb, _ = packages
    src, want = models
    fields = _run(["dpkg-deb", "--field", deb, "Package", "Version", "Depends"]).stdout
    info = dict(line.split(": ", 1) for line in fields.splitlines() if ": " in line)
    assert info.get("Package") == "tierfs" and info.get("Version") == f"{VERSION}-1", fields
    depends = [d.strip().split()[0] for d in info.get("Depends", "").split(",")]
    assert "fuse3" in depends and "libc6" in depends, f"Depends: {info.get('Depends')}"
    listing = _run(["dpkg-deb", "--contents", deb]).stdout
    packed = {line.split()[5].lstrip(".") for line in listing.splitlines() if len(line.split()) >= 6}
    missing = [f for f in DEB_FILES if f not in packed]
    assert not missing, f"the deb lacks {missing}:\n{listing}"

    if os.geteuid() != 0:
        pytest.skip("installing the deb needs root (tests/run.sh runs the suite as root)")
    if _run(["dpkg-query", "-W", "-f=${Status}", "tierfs"]).stdout.endswith("installed") \
            or Path("/usr/bin/tierfs").exists():
        pytest.skip("this machine has a tierfs package or /usr/bin/tierfs of its own, which "
                    "installing and then removing the built deb would replace and delete")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    installed = False
    try:
        r = _run([*APT, "install", deb.resolve()], timeout=180, env=env)
        installed = True
        assert r.returncode == 0, f"apt-get install {deb}: rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        owned = set(_run(["dpkg-query", "-L", "tierfs"]).stdout.split())
        assert not [f for f in DEB_FILES if f not in owned], owned
        binary = Path("/usr/bin/tierfs")
        v = _run([binary, "--version"])
        assert v.returncode == 0 and v.stdout.split() == ["tierfs", VERSION], v.stdout + v.stderr

        # The unit's ExecStart names `tierfs` bare: systemd finds it in its own search path,
        # which must reach the package's binary (a hand-installed /usr/local/bin one would win).
        unit = Path("/usr/lib/systemd/system/tierfs@.service").read_text()
        start = re.search(r"^ExecStart=(\S+) mount ", unit, re.M)
        assert start and start.group(1) == "tierfs", "ExecStart is not `tierfs mount ...`"
        if shutil.which("systemd-path"):
            search = _run(["systemd-path", "search-binaries-default"]).stdout.strip()
            found = shutil.which("tierfs", path=search)
            if not Path("/usr/local/bin/tierfs").exists():
                assert found == str(binary), f"systemd's search path {search} finds {found}"
        if shutil.which("systemd-analyze"):
            check = fresh_dir("unit") / "tierfs@pkgcheck.service"
            check.write_text(unit)
            r = _run(["systemd-analyze", "verify", check], timeout=60)
            problems = [l for l in (r.stdout + r.stderr).splitlines()
                        if check.name in l or "Unknown" in l or "Invalid" in l or "not executable" in l]
            assert r.returncode == 0 and not problems, f"systemd-analyze verify:\n{r.stdout}{r.stderr}"

        # The installed mount script, as a user runs it: no TIERFS_BIN, a plain PATH.
        mnt = fresh_dir("pkg-mnt") / "models"
        log = mnt.parent / "tierfs-mount.log"
        r = mount_with_script(Path("/usr/bin/tierfs-mount"), src, mnt,
                              _clean_env("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
                              daemons, log)
        assert r.returncode == 0, f"tierfs-mount: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
        pid = check_mount(daemons, mnt, src, want, binary)
        unmount(binary, mnt, pid)

        r = _run([*APT, "purge", "tierfs"], timeout=180, env=env)
        assert r.returncode == 0, f"apt-get purge tierfs: rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        installed = False
        left = [f for f in DEB_FILES if Path(f).exists()]
        assert not left, f"left behind by apt-get purge tierfs: {left}"
    finally:
        daemons.cleanup()  # before the binary goes
        if installed:
            subprocess.run([*APT, "purge", "tierfs"], capture_output=True, timeout=180, env=env)


def test_wheel_installs_and_mounts(packages, models, daemons):
    _, wheel = packages
    src, want = models
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    data = f"tierfs-{VERSION}.data/scripts/"
    assert {data + "tierfs", data + "tierfs-mount"} <= set(names), names
    stray = [n for n in names if not n.startswith((data, f"tierfs-{VERSION}.dist-info/"))]
    assert not stray, f"the wheel holds more than the two commands: {stray}"

    venv = fresh_dir("wheel-venv")
    r = _run([sys.executable, "-m", "venv", venv], timeout=120)
    assert r.returncode == 0, r.stderr
    # --no-index: the wheel needs nothing else; pip refuses it if its tag does not fit here.
    r = _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", wheel], timeout=120)
    assert r.returncode == 0, f"pip install {wheel.name}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    binary, script = venv / "bin" / "tierfs", venv / "bin" / "tierfs-mount"
    assert os.access(binary, os.X_OK) and os.access(script, os.X_OK), sorted(os.listdir(venv / "bin"))
    system_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    # In the activated venv `tierfs` is the wheel's.
    assert shutil.which("tierfs", path=f"{venv / 'bin'}:{system_path}") == str(binary)
    v = _run([binary, "--version"])
    assert v.returncode == 0 and v.stdout.split() == ["tierfs", VERSION], v.stdout + v.stderr

    # The command itself, as ComfyUI's Python environment would run it.
    mnt = fresh_dir("whl-mnt") / "models"
    mnt.mkdir()
    daemons.track(mnt)
    r = _run([binary, "mount", src, mnt, "--ram-cache", BUDGET, "--daemon", "--log-file",
              mnt.parent / "daemon.log", "--state-dir", fresh_dir("state")],
             timeout=60, env=_clean_env(system_path))
    assert r.returncode == 0, f"tierfs mount --daemon: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    pid = check_mount(daemons, mnt, src, want, binary)
    unmount(binary, mnt, pid)

    # The venv's mount script with the venv not on PATH: it runs the binary beside it.
    mnt2 = fresh_dir("whl-mnt") / "models"
    r = mount_with_script(script, src, mnt2, _clean_env(system_path), daemons, mnt2.parent / "tierfs-mount.log")
    assert r.returncode == 0, f"{script}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    pid = check_mount(daemons, mnt2, src, want, binary)
    unmount(binary, mnt2, pid)

    r = _run([venv / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q", "tierfs"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert not binary.exists() and not script.exists(), "pip uninstall left the commands behind"
