"""A real unprivileged user for the end-to-end tests.

Tests that check what a non-root user may do (a shared ``--allow-other`` mount, a desktop
user mounting through ``fusermount3``) need an account that is not root and whose
credentials the kernel really checks.  :func:`ensure_user` creates it once, idempotently
(CI runs on fresh machines): ``tierfs-user`` with primary group ``tierfs-group`` and the
supplementary group ``tierfs-extra``; ``tierfs-outsider`` is a group the user is *not* in.
:func:`run_as` runs a command with that user's uid, gid and supplementary groups
(``setpriv``, util-linux), with a bounded timeout so a hung mount cannot hang the suite.
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
from dataclasses import dataclass

USER = "tierfs-user"
GROUP = "tierfs-group"
EXTRA_GROUP = "tierfs-extra"
OUTSIDER_GROUP = "tierfs-outsider"


@dataclass(frozen=True)
class TestUser:
    name: str
    uid: int
    gid: int
    home: str
    extra_gid: int
    outsider_gid: int


def _ensure_group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", name], check=True, timeout=30)
        return grp.getgrnam(name).gr_gid


def ensure_user() -> TestUser:
    """Create (once) and return the unprivileged test user."""
    gid = _ensure_group(GROUP)
    extra = _ensure_group(EXTRA_GROUP)
    outsider = _ensure_group(OUTSIDER_GROUP)
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--gid", GROUP, "--groups", EXTRA_GROUP,
                        "--shell", "/bin/sh", USER], check=True, timeout=30)
        pw = pwd.getpwnam(USER)
    return TestUser(USER, pw.pw_uid, pw.pw_gid, pw.pw_dir, extra, outsider)


def run_as(args: list[str], *, timeout: float = 60, check: bool = False,
           env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run ``args`` as the test user (uid, gid and supplementary groups), text mode."""
    user = ensure_user()
    return subprocess.run(_as_user(user) + list(args), capture_output=True, text=True, timeout=timeout,
                          check=check, env=_env(user, env), **kwargs)


def popen_as(args: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """Start ``args`` as the test user, pipes for stdin, stdout and stderr (text mode); the
    caller bounds the wait (``communicate(timeout=...)``)."""
    user = ensure_user()
    return subprocess.Popen(_as_user(user) + list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(user, env), **kwargs)


def _as_user(user: TestUser) -> list[str]:
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--"]


def _env(user: TestUser, env: dict[str, str] | None) -> dict[str, str]:
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": user.home,
                "USER": user.name, "LANG": "C.UTF-8"}
    if env:
        base_env.update(env)
    return base_env
