"""A shared mount never lets a user read what they could not read themselves (issue 13).

A root daemon serves SOURCE with ``--allow-other``; a real unprivileged user (``users.py``:
``tierfs-user``, member of ``tierfs-extra``, not of ``tierfs-outsider``) tries every way
around the rule: links out of SOURCE (to files and directories, relative with ``..`` and
absolute), targets behind 0700 and 0750 directories, group-only files, hard links, a
``.tierfs`` inside SOURCE, the ``user.tierfs.source`` attribute, every write path, and a link
swapped between a readable and a secret target while it opens the file again and again.

Every read row is tried twice by the user: through the mount, and by the same path through
SOURCE itself. The rule is that both give the same answer (same bytes, or a refusal), and each
row also states the answer expected. The table (tried / expected / through SOURCE / through
the mount) is written to ``security-table.md`` in the test session directory and printed; the
README's Reliability section carries a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import conftest
import gen
import users

USER_PY = "/usr/bin/python3"

# Runs as the test user: performs each operation, prints one JSON result per operation.
# A result is "bytes:<len>:<first 16 bytes hex>:<sha256>" for a successful read, "ok[:detail]"
# for other successes, or the errno name.
CHILD = r"""
import errno, hashlib, json, os, sys

def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))

def read(p):
    with open(p, "rb") as f:
        b = f.read()
    return "bytes:%d:%s" % (len(b), hashlib.sha256(b).hexdigest()[:16])

def run(op, p, arg):
    if op == "read":
        return read(p)
    if op == "list":
        return "ok:" + ",".join(sorted(os.listdir(p)))
    if op == "lstat":
        st = os.lstat(p)
        kind = "link" if (st.st_mode & 0o170000) == 0o120000 else "dir" if (st.st_mode & 0o170000) == 0o040000 else "file"
        return "ok:%s:%d" % (kind, st.st_size if kind == "file" else 0)
    if op == "xattr":
        return "ok:" + os.getxattr(p, "user.tierfs.source").decode()
    if op == "listxattr":
        return "ok:" + ",".join(os.listxattr(p))
    if op == "write":
        fd = os.open(p, os.O_WRONLY)
        try:
            os.write(fd, arg.encode())
        finally:
            os.close(fd)
        return "ok"
    if op == "create":
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)); return "ok"
    if op == "truncate":
        os.truncate(p, 0); return "ok"
    if op == "mkdir":
        os.mkdir(p); return "ok"
    if op == "unlink":
        os.unlink(p); return "ok"
    if op == "rmdir":
        os.rmdir(p); return "ok"
    if op == "rename":
        os.rename(p, arg); return "ok"
    if op == "symlink":
        os.symlink(arg, p); return "ok"
    if op == "link":
        os.link(arg, p); return "ok"
    if op == "chmod":
        os.chmod(p, 0o777); return "ok"
    if op == "chown":
        os.chown(p, os.getuid(), os.getgid()); return "ok"
    if op == "utime":
        os.utime(p, (0, 0)); return "ok"
    if op == "setxattr":
        os.setxattr(p, "user.x", b"1"); return "ok"
    raise ValueError(op)

out = []
for op, p, arg in json.load(sys.stdin):
    try:
        out.append(run(op, p, arg))
    except OSError as e:
        out.append(err(e))
print(json.dumps(out))
"""

# A user loop for the race row: opens and reads the path until the deadline, prints what it saw.
RACE_CHILD = r"""
import errno, sys, time
path, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
seen = {}
while time.monotonic() < deadline:
    try:
        with open(path, "rb") as f:
            k = f.read().decode(errors="replace")
    except OSError as e:
        k = errno.errorcode.get(e.errno, str(e.errno))
    seen[k] = seen.get(k, 0) + 1
print(repr(seen))
"""

SECRET = b"the secret behind a 0700 directory\n"
OUTSIDER = b"group tierfs-outsider only\n"
EXTRA = b"group tierfs-extra only\n"
PUBLIC = b"anyone may read this\n"


def bytes_result(data: bytes) -> str:
    import hashlib
    return "bytes:%d:%s" % (len(data), hashlib.sha256(data).hexdigest()[:16])


def run_user(ops: list[tuple[str, str, str]]) -> list[str]:
    r = users.run_as([USER_PY, "-c", CHILD], input=json.dumps(ops), timeout=60, cwd="/")
    assert r.returncode == 0, f"user child failed: {r.stderr[-2000:]}"
    return json.loads(r.stdout)


@pytest.fixture
def world():
    """The tree the rows use, in a 0755 directory of its own (the session dirs are 0700)."""
    user = users.ensure_user()
    base = Path(tempfile.mkdtemp(prefix="tierfs-security.", dir="/var/tmp"))
    os.chmod(base, 0o755)
    src, mnt = base / "src", base / "mnt"
    for d in (src, mnt):
        d.mkdir(mode=0o755)
    private = base / "private"                    # 0700 root
    (private / "pub").mkdir(parents=True)
    (private / "secret.txt").write_bytes(SECRET)
    (private / "pub" / "inner.txt").write_bytes(SECRET)
    gen.write_small(private / "secret.safetensors", gen.dit_specs(64, 128, 2), seed=5)
    os.chmod(private / "pub", 0o755)
    os.chmod(private, 0o700)
    for name, group, data in (("extra", users.EXTRA_GROUP, EXTRA), ("outsider", users.OUTSIDER_GROUP, OUTSIDER)):
        d = base / f"{name}-0750"                 # 0750 root:GROUP, holding a 0644 file
        d.mkdir()
        (d / "f.txt").write_bytes(data)
        os.chown(d, 0, users._ensure_group(group))
        os.chmod(d, 0o750)
    outside = base / "outside"                    # 0755: readable outside SOURCE
    outside.mkdir(mode=0o755)
    (outside / "public.txt").write_bytes(PUBLIC)
    (outside / "group-outsider.txt").write_bytes(OUTSIDER)
    os.chown(outside / "group-outsider.txt", 0, user.outsider_gid)
    os.chmod(outside / "group-outsider.txt", 0o640)
    gen.write_small(outside / "shared.safetensors", gen.dit_specs(64, 128, 2), seed=6)
    os.chmod(outside / "shared.safetensors", 0o644)

    # Inside SOURCE.
    os.symlink(private / "secret.txt", src / "notes.txt")                 # absolute, 0700 on the way
    os.symlink(private / "secret.safetensors", src / "secret.safetensors")
    os.symlink(private / "pub", src / "pubdir")                           # dir link, 0700 above it
    os.symlink(os.path.relpath(private / "secret.txt", src), src / "dotdot.txt")
    os.symlink("../outside/public.txt", src / "dotdot-public.txt")
    os.symlink(outside / "shared.safetensors", src / "shared.safetensors")
    os.symlink(base / "extra-0750" / "f.txt", src / "extra-link.txt")
    os.symlink(base / "outsider-0750" / "f.txt", src / "outsider-link.txt")
    os.symlink(outside / "group-outsider.txt", src / "group-link.txt")
    os.symlink("/etc/shadow", src / "shadow")
    for name, gid, data in (("g-extra.txt", user.extra_gid, EXTRA), ("g-outsider.txt", user.outsider_gid, OUTSIDER)):
        (src / name).write_bytes(data)
        os.chown(src / name, 0, gid)
        os.chmod(src / name, 0o640)
    os.link(private / "secret.txt", src / "hard.txt")                     # 0644 file, other name hidden
    (private / "mine.txt").write_bytes(SECRET)
    os.chmod(private / "mine.txt", 0o600)
    os.link(private / "mine.txt", src / "hard-0600.txt")
    (src / "closed").mkdir(mode=0o700)
    (src / "closed" / "in.txt").write_bytes(SECRET)
    (src / ".tierfs").mkdir()
    (src / ".tierfs" / "hidden.txt").write_bytes(SECRET)
    (src / "public.txt").write_bytes(PUBLIC)
    (src / "swap.txt").symlink_to(outside / "public.txt")
    yield base, src, mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    for log in base.glob("*.log"):   # the daemon's log, kept with the session's
        shutil.copy(log, conftest.SESSION_ROOT / f"security-{log.name}")
    shutil.rmtree(base, ignore_errors=True)


def source_state(src: Path) -> list[tuple[str, int, int]]:
    out = []
    for root, dirs, files in os.walk(src):
        for n in sorted(dirs + files):
            st = os.lstat(os.path.join(root, n))
            out.append((os.path.relpath(os.path.join(root, n), src), st.st_mode, st.st_mtime_ns))
    return sorted(out)


DENIED = "EACCES"


@pytest.mark.timeout(120)
def test_shared_mount_rule_table(world, mount):
    base, src, mnt = world
    shared = (base / "outside" / "shared.safetensors").read_bytes()
    m = mount(src, "64MiB", ("--allow-other",), mnt=mnt)
    # Root reads everything first: the cache and the kernel's entry cache are warm with what
    # root may see, so the user's rows also check that nothing cached is shared wrongly.
    assert (mnt / "secret.safetensors").read_bytes() == (base / "private" / "secret.safetensors").read_bytes()
    assert (mnt / "notes.txt").read_bytes() == SECRET
    assert (mnt / "pubdir" / "inner.txt").read_bytes() == SECRET
    assert (mnt / "shared.safetensors").read_bytes() == shared

    # (tried, op, relative path, arg, expected through the mount)
    reads = [
        ("file link out of SOURCE to a 0644 file in a 0700 dir (absolute)", "read", "notes.txt", "", DENIED),
        ("  ... what the user sees there (lstat)", "lstat", "notes.txt", "", "ok:link:0"),
        ("model link to a file in a 0700 dir, after root read it (cached)", "read", "secret.safetensors", "", DENIED),
        ("directory link to a 0755 dir under a 0700 dir: list", "list", "pubdir", "", DENIED),
        ("  ... read a file inside it", "read", "pubdir/inner.txt", "", DENIED),
        ("relative link with `..` out of SOURCE to the 0700 dir", "read", "dotdot.txt", "", DENIED),
        ("relative link with `..` to a public file outside SOURCE", "read", "dotdot-public.txt", "", bytes_result(PUBLIC)),
        ("model link to a public model outside SOURCE (cached by root)", "read", "shared.safetensors", "", bytes_result(shared)),
        ("link to a file in a 0750 dir of a group the user is in", "read", "extra-link.txt", "", bytes_result(EXTRA)),
        ("link to a file in a 0750 dir of a group the user is not in", "read", "outsider-link.txt", "", DENIED),
        ("link to a 0640 file of a group the user is not in", "read", "group-link.txt", "", DENIED),
        ("absolute link to /etc/shadow", "read", "shadow", "", DENIED),
        ("0640 file in SOURCE, group the user is in (supplementary)", "read", "g-extra.txt", "", bytes_result(EXTRA)),
        ("0640 file in SOURCE, group the user is not in", "read", "g-outsider.txt", "", DENIED),
        ("hard link in SOURCE to a 0644 file whose other name is in a 0700 dir", "read", "hard.txt", "", bytes_result(SECRET)),
        ("hard link in SOURCE to a 0600 root file", "read", "hard-0600.txt", "", DENIED),
        ("0700 directory inside SOURCE: read a file in it", "read", "closed/in.txt", "", DENIED),
        ("`user.tierfs.source` of a public model", "xattr", "shared.safetensors", "", "ok:" + str(src / "shared.safetensors")),
        ("`user.tierfs.source` of a link into a 0700 dir", "xattr", "secret.safetensors", "", DENIED),
        ("`user.tierfs.source` of a 0600 file (hard link)", "xattr", "hard-0600.txt", "", DENIED),
        ("list `user.*` attributes of a 0600 file", "listxattr", "hard-0600.txt", "", "ok:"),
    ]
    ops = [(op, str(mnt / rel), arg) for _, op, rel, arg, _ in reads]
    ops += [(op, str(src / rel), arg) for _, op, rel, arg, _ in reads]
    got = run_user(ops)
    via_mount, via_source = got[:len(reads)], got[len(reads):]
    rows = []
    for (tried, op, rel, _, expected), m_res, s_res in zip(reads, via_mount, via_source):
        if op in ("xattr", "listxattr"):
            s_res = "n/a"   # SOURCE has no such attribute
        rows.append((tried, expected, s_res, m_res))

    # `.tierfs` inside SOURCE: hidden by the control directory.
    tierfs_ops = [("list", str(mnt / ".tierfs"), ""), ("read", str(mnt / ".tierfs" / "hidden.txt"), "")]
    t_list, t_read = run_user(tierfs_ops)
    rows.append(("`.tierfs` dir inside SOURCE: list MNT/.tierfs", "ok:control,stats", "n/a", t_list))
    rows.append(("  ... read MNT/.tierfs/hidden.txt (SOURCE's)", "ENOENT", "n/a", t_read))

    # Every write path, by the other user: refused, SOURCE unchanged, budget unchanged.
    before = source_state(src)
    budget = m.stats()["cache"]["budget_bytes"]
    writes = [
        ("write `ram-cache 1MiB` to .tierfs/control", "write", ".tierfs/control", "ram-cache 1MiB"),
        ("write `drop` to .tierfs/control", "write", ".tierfs/control", "drop"),
        ("open a readable file for writing", "write", "public.txt", "x"),
        ("create a file", "create", "new.txt", ""),
        ("truncate a file", "truncate", "public.txt", ""),
        ("mkdir", "mkdir", "newdir", ""),
        ("unlink", "unlink", "public.txt", ""),
        ("rmdir", "rmdir", "closed", ""),
        ("rename", "rename", "public.txt", str(mnt / "moved.txt")),
        ("symlink", "symlink", "newlink", "/etc/shadow"),
        ("hard link", "link", "newhard", str(mnt / "public.txt")),
        ("chmod", "chmod", "public.txt", ""),
        ("chown", "chown", "public.txt", ""),
        ("utime", "utime", "public.txt", ""),
        ("setxattr", "setxattr", "public.txt", ""),
    ]
    results = run_user([(op, str(mnt / rel), arg) for _, op, rel, arg in writes])
    refused = {"EROFS", "EACCES", "EPERM"}
    for (tried, *_), res in zip(writes, results):
        rows.append((tried + " (other user)", "refused (EROFS/EACCES/EPERM)", "n/a", res))
    assert source_state(src) == before, "a write by another user changed SOURCE"
    assert m.stats()["cache"]["budget_bytes"] == budget, "another user changed the budget"

    # A link swapped between a public and a secret target while the user opens it.
    stop = threading.Event()

    def swapper():
        tmp = src / ".swap.tmp"
        targets = [base / "private" / "secret.txt", base / "outside" / "public.txt"]
        i = 0
        while not stop.is_set():
            if tmp.is_symlink():
                tmp.unlink()
            tmp.symlink_to(targets[i % 2])
            os.replace(tmp, src / "swap.txt")
            i += 1
            # Root reads the secret through the mount now and then, so that cached entries
            # and attributes are root's when the user comes.
            if i % 50 == 0:
                try:
                    (mnt / "swap.txt").read_bytes()
                except OSError:
                    pass
        return i

    t = threading.Thread(target=swapper, daemon=True)
    t.start()
    try:
        r = users.run_as([USER_PY, "-c", RACE_CHILD, str(mnt / "swap.txt"), "5"], timeout=30, cwd="/")
    finally:
        stop.set()
        t.join(timeout=10)
    assert r.returncode == 0, r.stderr[-2000:]
    seen = eval(r.stdout.strip(), {})  # noqa: S307 - our own child's repr of a dict
    secret_reads = seen.get(SECRET.decode(), 0)
    public_reads = seen.get(PUBLIC.decode(), 0)
    rows.append((f"link swapped public/secret during open, 5 s loop ({sum(seen.values())} opens)",
                 "never the secret", "n/a",
                 f"public {public_reads}, secret {secret_reads}, errors "
                 f"{ {k: v for k, v in seen.items() if k not in (SECRET.decode(), PUBLIC.decode())} }"))

    table = ["| tried (as `tierfs-user`, root daemon, `--allow-other`) | expected | same path through SOURCE | through the mount |",
             "|---|---|---|---|"]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    text = "\n".join(table) + "\n"
    out = conftest.SESSION_ROOT / "security-table.md"
    out.write_text(text)
    print("\n" + text)
    assert m.alive(), m.log_tail()

    # The checks, after the table is written so a failure still shows every row.
    failures = []
    for (tried, op, rel, _, expected), m_res, s_res in zip(reads, via_mount, via_source):
        if m_res != expected:
            failures.append(f"{tried}: expected {expected}, got {m_res}")
        if op not in ("xattr", "listxattr", "lstat", "list") and m_res != s_res:
            failures.append(f"{tried}: mount gave {m_res} but SOURCE gives {s_res}")
    if t_list != "ok:control,stats" or t_read != "ENOENT":
        failures.append(f".tierfs in SOURCE: list {t_list}, read {t_read}")
    for (tried, *_), res in zip(writes, results):
        if res not in refused:
            failures.append(f"{tried}: {res}")
    if secret_reads or public_reads == 0:
        failures.append(f"swap race: {seen}")
    assert not failures, "\n".join(failures) + "\n\n" + text
