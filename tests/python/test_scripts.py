"""mount-scripts/: tierfs-mount.sh (end to end, stale-mount recovery), the systemd unit, and
`tierfs comfyui-config`.

Mounts made by tierfs-mount.sh are daemons, not children of the test: the `daemon_mounts`
fixture records each mountpoint (and its daemon pid, read from .tierfs/stats) and, after the
test, unmounts it (`tierfs unmount`, then `umount -l`) and ends the daemon, whatever happened.
Everything lives under the session root, so conftest's session safety net sweeps it as well.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import gen
from conftest import REPO, fresh_dir, is_mounted

SCRIPTS = REPO / "mount-scripts"
MOUNT_SH = SCRIPTS / "tierfs-mount.sh"
UNIT = SCRIPTS / "tierfs@.service"
COMFY_KEYS = ("checkpoints", "diffusion_models", "unet", "loras", "vae", "clip", "text_encoders",
              "clip_vision", "controlnet", "upscale_models", "embeddings")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _stats(mnt: Path) -> dict:
    return json.loads((mnt / ".tierfs" / "stats").read_bytes())


class DaemonMounts:
    """Mounts made by background daemons; `cleanup` unmounts them (`unmount` MNT, by default
    `tierfs unmount`, then `umount -l`) and SIGKILLs any daemon still alive 10 s later."""

    def __init__(self, tierfs_bin: Path | None, unmount: list[str] | None = None):
        self.unmount = unmount or [str(tierfs_bin), "unmount"]
        self.mounts: list[Path] = []
        self.pids: set[int] = set()

    def track(self, mnt: Path) -> int | None:
        """Register `mnt` for cleanup; returns the daemon pid serving it (if it answers)."""
        if mnt not in self.mounts:
            self.mounts.append(mnt)
        try:
            pid = int(_stats(mnt)["mount"]["pid"])
        except (OSError, ValueError, KeyError):
            return None
        self.pids.add(pid)
        return pid

    def cleanup(self) -> list[str]:
        for mnt in reversed(self.mounts):
            if is_mounted(mnt):
                subprocess.run([*self.unmount, str(mnt)], capture_output=True, timeout=30)
            if is_mounted(mnt):
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
        deadline = time.monotonic() + 10
        while any(_pid_alive(p) for p in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in self.pids:
            if _pid_alive(p):
                os.kill(p, signal.SIGKILL)
        return [str(m) for m in self.mounts if is_mounted(m)]


@pytest.fixture
def daemon_mounts(tierfs_bin):
    d = DaemonMounts(tierfs_bin)
    yield d
    left = d.cleanup()
    assert not left, f"mount(s) left behind: {left}"


def run_mount_sh(tierfs_bin, *args, env_extra=None, timeout=60):
    env = dict(os.environ, TIERFS_BIN=str(tierfs_bin))
    env.update(env_extra or {})
    return subprocess.run(["bash", str(MOUNT_SH), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def small_source(workdir: Path) -> tuple[Path, dict[str, bytes]]:
    """A small models folder: two checkpoints and a text file, with their bytes."""
    src = workdir / "models"
    (src / "checkpoints").mkdir(parents=True)
    (src / "unet").mkdir()
    gen.write_small(src / "checkpoints" / "flux.safetensors", gen.flux_specs(dim=256, n_double=2, n_single=2), seed=3)
    gen.write_small(src / "unet" / "dit.safetensors", gen.dit_specs(256, 1024, 6), seed=4)
    (src / "notes.txt").write_text("not a model\n")
    want = {str(p.relative_to(src)): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    return src, want


def mount_sh_args(workdir: Path) -> tuple[list[str], dict[str, str]]:
    """Extra tierfs options and environment that keep a script mount inside the test root."""
    return (["--", "--state-dir", str(fresh_dir("state"))],
            {"TIERFS_LOG_FILE": str(workdir / "tierfs-mount.log")})


# ----------------------------------------------------------------------------- static checks

@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = (SCRIPTS / script).read_text()
    assert text.startswith("#!/usr/bin/env bash\n"), "missing bash shebang"
    assert "set -euo pipefail" in text
    assert os.access(SCRIPTS / script, os.X_OK), f"{script} is not executable"


def test_systemd_unit(tmp_path, tierfs_bin):
    text = UNIT.read_text()
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("#", ";")):
            continue
        if m := re.fullmatch(r"\[(\w+)\]", s):
            current = sections.setdefault(m.group(1), {})
            continue
        assert current is not None and "=" in s, f"unit line outside a section or not KEY=VALUE: {line!r}"
        k, v = s.split("=", 1)
        current.setdefault(k.strip(), []).append(v.strip())
    svc = sections.get("Service", {})
    assert sections.keys() >= {"Unit", "Service", "Install"}, sections.keys()
    assert svc.get("Type") == ["simple"]
    assert any("%i" in v for v in svc.get("EnvironmentFile", [])), "instances must read their own config"
    start = svc["ExecStart"][0]
    # A bare `tierfs`: systemd's own search path finds the deb's /usr/bin/tierfs and a
    # hand-installed /usr/local/bin/tierfs alike (tests/python/test_packages.py runs the deb's).
    assert start.split()[0] == "tierfs" and " mount " in start, start
    for var in ("${SOURCE}", "${MOUNTPOINT}", "${SIZE}"):
        assert var in start, f"ExecStart lacks {var}: {start}"
    assert any("umount -l" in v for v in svc.get("ExecStopPost", [])), "no dead-mount cleanup"
    assert sections["Install"].get("WantedBy"), "cannot be enabled at boot"
    if shutil.which("systemd-analyze") is None:
        return
    # verify needs an instance name and an executable ExecStart: point it at the built binary.
    unit = tmp_path / "tierfs@check.service"
    unit.write_text(text.replace("ExecStart=tierfs ", f"ExecStart={tierfs_bin} "))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [l for l in (r.stdout + r.stderr).splitlines()
                if str(unit.name) in l or "Unknown" in l or "Invalid" in l or "Failed" in l]
    assert r.returncode == 0 and not problems, f"systemd-analyze verify:\n{r.stdout}{r.stderr}"


# ----------------------------------------------------------------------------- tierfs-mount.sh

def test_mount_sh_usage_and_errors(tierfs_bin, workdir):
    r = run_mount_sh(tierfs_bin)
    assert r.returncode != 0 and "usage:" in r.stderr
    mnt = fresh_dir("mnt")
    r = run_mount_sh(tierfs_bin, workdir / "nope", mnt, "64MiB")
    assert r.returncode != 0 and "not a directory" in r.stderr, r.stderr
    assert not is_mounted(mnt)
    r = run_mount_sh(tierfs_bin, workdir, mnt, "64MiB", env_extra={"TIERFS_BIN": str(workdir / "no-tierfs")})
    assert r.returncode != 0 and "TIERFS_BIN" in r.stderr, r.stderr
    assert not is_mounted(mnt)


def test_mount_sh_end_to_end(tierfs_bin, workdir, daemon_mounts):
    src, want = small_source(workdir)
    mnt = fresh_dir("mnt") / "models"  # created by the script
    extra, env = mount_sh_args(workdir)
    daemon_mounts.track(mnt)
    r = run_mount_sh(tierfs_bin, src, mnt, "64MiB", *extra, env_extra=env)
    pid = daemon_mounts.track(mnt)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert is_mounted(mnt)
    assert str(mnt / ".tierfs" / "stats") in r.stdout, f"script does not say where the stats are:\n{r.stdout}"
    assert pid is not None and f"pid {pid}" in r.stdout, r.stdout
    doc = _stats(mnt)
    assert doc["cache"]["budget_bytes"] == 64 << 20
    assert Path(doc["mount"]["source"]) == src.resolve()
    for rel, data in want.items():
        assert (mnt / rel).read_bytes() == data, f"{rel}: bytes differ through the mount"
    assert Path(env["TIERFS_LOG_FILE"]).exists(), "no daemon log written"

    # Running it again on a live mount changes nothing and succeeds.
    again = run_mount_sh(tierfs_bin, src, mnt, "64MiB", *extra, env_extra=env)
    assert again.returncode == 0 and "already" in again.stdout, again.stdout + again.stderr
    assert _stats(mnt)["mount"]["pid"] == pid

    u = subprocess.run([str(tierfs_bin), "unmount", str(mnt)], capture_output=True, text=True, timeout=30)
    assert u.returncode == 0, u.stderr
    deadline = time.monotonic() + 10
    while (is_mounted(mnt) or _pid_alive(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_mounted(mnt) and not _pid_alive(pid), "daemon or mount still there after tierfs unmount"


def test_mount_sh_recovers_stale_mount(tierfs_bin, workdir, daemon_mounts):
    src, want = small_source(workdir)
    mnt = fresh_dir("mnt")
    extra, env = mount_sh_args(workdir)
    daemon_mounts.track(mnt)
    r = run_mount_sh(tierfs_bin, src, mnt, "32MiB", *extra, env_extra=env)
    assert r.returncode == 0, r.stderr
    pid = daemon_mounts.track(mnt)
    assert pid is not None

    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(pid)
    # The root's attributes may still be cached for the attribute timeout (0.5 s).
    err = None
    deadline = time.monotonic() + 5
    while err is None and time.monotonic() < deadline:
        try:
            os.stat(mnt)
            time.sleep(0.1)
        except OSError as e:
            err = e
    assert err is not None and err.errno == errno.ENOTCONN, f"expected ENOTCONN from the dead mount, got {err!r}"

    r = run_mount_sh(tierfs_bin, src, mnt, "32MiB", *extra, env_extra=env)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "dead mount" in r.stderr, r.stderr
    new_pid = daemon_mounts.track(mnt)
    assert new_pid is not None and new_pid != pid
    assert _stats(mnt)["cache"]["budget_bytes"] == 32 << 20
    for rel, data in want.items():
        assert (mnt / rel).read_bytes() == data, f"{rel}: bytes differ through the new mount"
    # Exactly one tierfs mount is left on the path (the dead one was detached, not shadowed).
    with open("/proc/mounts") as f:
        here = [l for l in f if l.split()[1] == str(mnt.resolve())]
    assert len(here) == 1, here


# ----------------------------------------------------------------------------- comfyui-config

def parse_section(text: str) -> tuple[str, dict[str, str]]:
    """The one `name:` section with `    key: "value"` lines that comfyui-config prints.
    (A strict line parser: PyYAML is not a test dependency.)"""
    name, entries = None, {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            assert name is None and line.endswith(":"), f"unexpected top-level line {line!r}"
            name = line[:-1]
            name = json.loads(name) if name.startswith('"') else name
            continue
        m = re.fullmatch(r" {4}([a-z_]+): (\".*\")", line)
        assert m and name is not None, f"not a '    key: \"value\"' line: {line!r}"
        assert m.group(1) not in entries, f"duplicate key {m.group(1)}"
        entries[m.group(1)] = json.loads(m.group(2))  # YAML double-quoted == JSON string here
    assert name is not None, "no section"
    return name, entries


def test_comfyui_config_maps_every_folder(tierfs_bin, workdir, mount):
    src = workdir / "models"
    for d in ("checkpoints", "unet", "clip", "loras", "vae"):
        (src / d).mkdir(parents=True)
    m = mount(src, "32MiB")
    r = subprocess.run([str(tierfs_bin), "comfyui-config", str(m.mnt)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr
    name, e = parse_section(r.stdout)
    assert name == "tierfs"
    assert e["base_path"] == str(m.mnt.resolve())
    for key in COMFY_KEYS:
        assert key in e, f"{key} missing:\n{r.stdout}"
        full = Path(e["base_path"], e[key]).resolve(strict=False)
        assert full.is_relative_to(m.mnt.resolve()), f"{key} -> {full} is not under the mount"
    # Existing folders are used (diffusion_models falls back to unet, text_encoders to clip);
    # absent ones keep ComfyUI's conventional names.
    assert (e["checkpoints"], e["diffusion_models"], e["unet"]) == ("checkpoints", "unet", "unet")
    assert (e["text_encoders"], e["clip"], e["loras"], e["vae"]) == ("clip", "clip", "loras", "vae")
    assert (e["clip_vision"], e["controlnet"], e["upscale_models"], e["embeddings"]) == (
        "clip_vision", "controlnet", "upscale_models", "embeddings")
    for key in ("checkpoints", "diffusion_models", "text_encoders", "loras", "vae"):
        assert (m.mnt / e[key]).is_dir(), key

    named = subprocess.run([str(tierfs_bin), "comfyui-config", str(m.mnt), "--name", "fast models"],
                           capture_output=True, text=True, timeout=30)
    assert named.returncode == 0 and parse_section(named.stdout)[0] == "fast models", named.stdout


def test_comfyui_config_quotes_paths(tierfs_bin, workdir):
    odd = workdir / 'a dir: with "quotes" #and\\slashes'
    (odd / "models" / "diffusion_models").mkdir(parents=True)
    r = subprocess.run([str(tierfs_bin), "comfyui-config", str(odd)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "not a live tierfs mount" in r.stderr  # it says so, and still prints the section
    _, e = parse_section(r.stdout)
    assert e["base_path"] == str(odd.resolve())
    assert e["diffusion_models"] == "models/diffusion_models" and e["unet"] == "models/diffusion_models"
