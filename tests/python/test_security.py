"""A shared mount never lets a user read what they could not read themselves.

A root daemon serves SOURCE with ``--allow-other``; a real unprivileged user (``users.py``:
``tierfs-user``, member of ``tierfs-extra``, not of ``tierfs-outsider``) tries every way
around the rule: links out of SOURCE (to files and directories, relative with ``..`` and
absolute), targets behind 0700 and 0750 directories, group-only files, hard links, a
``.tierfs`` inside SOURCE, the ``user.tierfs.source`` attribute, every write path, and a link
swapped between a readable and a secret target while it opens the file again and again.

Every read row is tried twice by the user: through the mount, and by the same path through
SOURCE itself. The rule is that both give the same answer (same bytes, or a refusal), and each
row also states the answer expected. The table (tried / expected / through SOURCE / through
the mount) is written to ``security-table.md`` in the test session directory and printed;
docs/SECURITY.md carries a copy.
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


def write_table(name: str, tried: str, rows: list[tuple[str, str, str, str]]) -> str:
    """Writes `rows` (tried, expected, through SOURCE, through the mount) as a markdown table to
    `name` in the test session directory, prints it and returns it."""
    table = [f"| tried ({tried}) | expected | same path through SOURCE | through the mount |", "|---|---|---|---|"]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    text = "\n".join(table) + "\n"
    (conftest.SESSION_ROOT / name).write_text(text)
    print("\n" + text)
    return text


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
    rows.append(("`.tierfs` dir inside SOURCE: list MNT/.tierfs", "ok:control,metrics,stats", "n/a", t_list))
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

    text = write_table("security-table.md", "as `tierfs-user`, root daemon, `--allow-other`", rows)
    assert m.alive(), m.log_tail()

    # The checks, after the table is written so a failure still shows every row.
    failures = []
    for (tried, op, rel, _, expected), m_res, s_res in zip(reads, via_mount, via_source):
        if m_res != expected:
            failures.append(f"{tried}: expected {expected}, got {m_res}")
        if op not in ("xattr", "listxattr", "lstat", "list") and m_res != s_res:
            failures.append(f"{tried}: mount gave {m_res} but SOURCE gives {s_res}")
    if t_list != "ok:control,metrics,stats" or t_read != "ENOENT":
        failures.append(f".tierfs in SOURCE: list {t_list}, read {t_read}")
    for (tried, *_), res in zip(writes, results):
        if res not in refused:
            failures.append(f"{tried}: {res}")
    if secret_reads or public_reads == 0:
        failures.append(f"swap race: {seen}")
    assert not failures, "\n".join(failures) + "\n\n" + text


# ----------------------------------------------------------------------------- links, /proc, shards

# Runs as the test user: reads each path (bounded: a hang is a failure of the row, the child is
# killed by run_as's timeout), prints one result per path.
READS_CHILD = r"""
import errno, hashlib, json, sys
out = []
for p in json.load(sys.stdin):
    try:
        with open(p, "rb") as f:
            b = f.read()
        out.append("bytes:%d:%s" % (len(b), hashlib.sha256(b).hexdigest()[:16]))
    except OSError as e:
        out.append(errno.errorcode.get(e.errno, str(e.errno)))
print(json.dumps(out))
"""


def bounded(proc: subprocess.Popen, stdin: str | None, mnt: Path, timeout: float) -> str:
    """The output of `proc`, which reads through the mount at `mnt`; a hang is a failure: after
    `timeout` the mount's FUSE connection is aborted (which frees a reader stuck in `D` state,
    unkillable otherwise) and the test fails with what hung."""
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        conftest.abort_fuse_connection(mnt)
        proc.kill()
        proc.communicate(timeout=30)
        pytest.fail(f"a reader through {mnt} hung for {timeout} s (connection aborted)")
    assert proc.returncode == 0, f"child failed: {err[-2000:]}"
    return out


def read_as_user(paths: list[Path], mnt: Path, timeout: float = 60) -> list[str]:
    proc = users.popen_as([USER_PY, "-c", READS_CHILD], cwd="/")
    return json.loads(bounded(proc, json.dumps([str(p) for p in paths]), mnt, timeout))


def read_as_capless_root(paths: list[Path], mnt: Path, timeout: float = 60) -> list[str]:
    """Reads as uid 0 with every capability dropped (a hardened service, a container)."""
    proc = subprocess.Popen(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", USER_PY, "-c", READS_CHILD],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    return json.loads(bounded(proc, json.dumps([str(p) for p in paths]), mnt, timeout))


def daemon_fds(pid: int) -> list[int]:
    return sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.timeout(180)
def test_links_into_proc_and_the_mount_and_planted_shards(world, mount):
    """Magic links to the daemon's descriptors and other processes, `/proc` files of the daemon,
    links into the mount (single, chained, more readers at once than the daemon has threads),
    planted shard sets and a root caller without capabilities: every row through the mount
    gives what the same path through SOURCE gives the same user, never a secret, never a hang."""
    base, src, mnt = world
    user = users.ensure_user()
    eve = src / "eve"                        # a folder of SOURCE the user may write in
    eve.mkdir(mode=0o755)
    os.chown(eve, user.uid, user.gid)
    secret_model = (base / "private" / "secret.safetensors").read_bytes()
    m = mount(src, "64MiB", ("--allow-other", "--threads", "2"), mnt=mnt)
    # Root holds the private model open: the daemon then holds descriptors of it.
    held = open(mnt / "secret.safetensors", "rb")
    assert held.read(64) == secret_model[:64]
    pid = m.pid
    fds = daemon_fds(pid)
    # Another process whose cwd is the 0700 directory.
    sleeper = subprocess.Popen(["sleep", "120"], cwd=base / "private")
    # A root-only file and a root-only real model, each planted as shard 2 of the user's model.
    root_only = base / "root-only"
    root_only.mkdir(mode=0o700)
    (root_only / "shard-secret.bin").write_bytes(b"TOPSECRET shard bytes\n")
    os.chmod(root_only / "shard-secret.bin", 0o600)
    gen.write_small(root_only / "private.safetensors", gen.dit_specs(64, 128, 2), seed=9)
    os.chmod(root_only, 0o755)
    os.chmod(root_only / "private.safetensors", 0o600)
    planted = []
    for name, target in (("x", root_only / "shard-secret.bin"), ("y", root_only / "private.safetensors")):
        one = eve / f"{name}-00001-of-00002.safetensors"
        gen.write_small(one, gen.dit_specs(64, 128, 2), seed=11)
        os.chown(one, user.uid, user.gid)
        os.symlink(target, eve / f"{name}-00002-of-00002.safetensors")
        os.lchown(eve / f"{name}-00002-of-00002.safetensors", user.uid, user.gid)
        planted.append(one.name)
    try:
        rows = []   # (tried, rel, expected or None: same as SOURCE and never a secret)

        def link(name: str, target: str | Path) -> str:
            os.symlink(target, eve / name)
            os.lchown(eve / name, user.uid, user.gid)
            return f"eve/{name}"

        for fd in fds:
            rows.append((f"link to /proc/self/fd/{fd} (a descriptor of the daemon)",
                         link(f"fd{fd}.bin", f"/proc/self/fd/{fd}"), None))
        rows.append(("link to /proc/PID/cwd/secret.txt of a root process in the 0700 dir",
                     link("cwd", f"/proc/{sleeper.pid}/cwd") + "/secret.txt", DENIED))
        rows.append(("link to the daemon's /proc/PID/environ", link("environ", f"/proc/{pid}/environ"), DENIED))
        rows.append(("link to the daemon's /proc/PID/mem", link("mem", f"/proc/{pid}/mem"), DENIED))
        rows.append(("link to /proc/self/environ", link("self-environ", "/proc/self/environ"), None))
        rows.append(("link into the mount (MNT/public.txt)", link("into.txt", mnt / "public.txt"),
                     bytes_result(PUBLIC)))
        link("c3", mnt / "public.txt")
        link("c2", mnt / "eve" / "c3")
        rows.append(("chain of 3 links into the mount", link("c1", mnt / "eve" / "c2"), bytes_result(PUBLIC)))
        rows.append(("link into the mount to a link out to the 0700 dir", link("into-secret.txt", mnt / "notes.txt"),
                     DENIED))
        rel_paths = [rel for _, rel, _ in rows]
        drop = lambda: Path("/proc/sys/vm/drop_caches").write_text("3\n")  # noqa: E731
        drop()
        via_mount = read_as_user([mnt / r for r in rel_paths], mnt)
        via_source = read_as_user([src / r for r in rel_paths], mnt)

        # More readers of the chain at once than the daemon has threads (--threads 2), after the
        # kernel forgot every entry: each must finish, none may hang.
        drop()
        burst = [users.popen_as([USER_PY, "-c", READS_CHILD], cwd="/") for _ in range(3)]
        for p in burst:
            p.stdin.write(json.dumps([str(mnt / "eve" / "c1")] * 3))
            p.stdin.close()
            p.stdin = None
        burst_out = []
        for p in burst:
            burst_out += json.loads(bounded(p, None, mnt, 60))

        # The planted shard sets: the user reads shard 1 of each through the mount.
        shard_reads = read_as_user([eve / n for n in planted], mnt)
        shard_through_mount = read_as_user([mnt / "eve" / n for n in planted], mnt)
        # Root without any capability: a 0600 file of another user, and a 0644 file in root's
        # 0700 directory (root owns it: readable without capabilities too).
        mine = eve / "mine-0600.txt"
        mine.write_bytes(b"the user's own private file\n")
        os.chown(mine, user.uid, user.gid)
        os.chmod(mine, 0o600)
        capless = read_as_capless_root([mnt / "eve" / "mine-0600.txt", mnt / "notes.txt"], mnt)
        capless_src = read_as_capless_root([eve / "mine-0600.txt", src / "notes.txt"], mnt)
        stats_text = (mnt / ".tierfs" / "stats").read_text()
    finally:
        sleeper.kill()
        held.close()

    table_rows = []
    failures = []
    secrets = {bytes_result(SECRET), bytes_result(secret_model)}
    for (tried, rel, expected), got, through_source in zip(rows, via_mount, via_source):
        table_rows.append((tried, expected or "as SOURCE", through_source, got))
        if got in secrets:
            failures.append(f"{tried}: the secret came back through the mount")
        if got != through_source:
            failures.append(f"{tried}: mount gave {got}, SOURCE gives {through_source}")
        if expected is not None and got != expected:
            failures.append(f"{tried}: expected {expected}, got {got}")
    want = bytes_result(PUBLIC)
    table_rows.append(("3 readers x 3 reads of the chain at once, `--threads 2`, caches dropped",
                       f"9 x {want}", "n/a", f"{burst_out.count(want)} x {want}"))
    if burst_out.count(want) != 9:
        failures.append(f"readers of the chain: {burst_out}")
    for name, got, through_source in zip(planted, shard_through_mount, shard_reads):
        table_rows.append((f"planted shard set {name.split('-')[0]}-*: shard 2 a link to a root-only file; read shard 1",
                           "as SOURCE", through_source, got))
        if got != through_source:
            failures.append(f"planted {name}: mount gave {got}, SOURCE gives {through_source}")
    leaked = [w for w in ("TOPSECRE", "4995128901736877908", "private.safetensors") if w in stats_text]
    stats = json.loads(stats_text)
    formed = [mdl["name"] for mdl in stats.get("models", [])]
    table_rows.append(("  ... the stats (root's view): secret bytes, its size or a formed model",
                       "none", "n/a", f"leaked {leaked}, models {formed}"))
    if leaked or formed:
        failures.append(f"planted shards: leaked {leaked}, models formed {formed}")
    for tried, got, through_source, expected in (
        ("root without capabilities: a 0600 file of another user", capless[0], capless_src[0], DENIED),
        ("root without capabilities: a 0644 file in root's 0700 dir (its own)", capless[1], capless_src[1],
         bytes_result(SECRET)),
    ):
        table_rows.append((tried, expected, through_source, got))
        if got != expected or got != through_source:
            failures.append(f"{tried}: expected {expected}, SOURCE {through_source}, mount {got}")
    text = write_table("security-links-table.md",
                       "as `tierfs-user` unless said; root daemon, `--allow-other`, `--threads 2`", table_rows)
    assert m.alive(), m.log_tail()
    assert not failures, "\n".join(failures) + "\n\n" + text


# ----------------------------------------------------------------------------- a user's shared mount

# Runs as `nobody` (another user than the mount's): for `seconds`, lists and reads each path
# again and again; prints every distinct answer seen per path.
OTHER_LOOP = r"""
import errno, json, os, sys, time
paths, seconds = json.loads(sys.argv[1]), float(sys.argv[2])
seen = {p: set() for p in paths}
deadline = time.monotonic() + seconds
while True:
    for p in paths:
        try:
            if os.path.isdir(p):
                r = "list:" + ",".join(sorted(os.listdir(p)))
            else:
                with open(p, "rb") as f:
                    r = "read:" + f.read().decode(errors="replace").strip()
        except OSError as e:
            r = errno.errorcode.get(e.errno, str(e.errno))
        seen[p].add(r)
    if time.monotonic() > deadline:
        break
print(json.dumps({p: sorted(v) for p, v in seen.items()}))
"""

NOBODY = 65534


def nobody_loop(paths: list[Path], seconds: float) -> subprocess.Popen:
    return subprocess.Popen([USER_PY, "-c", OTHER_LOOP, json.dumps([str(p) for p in paths]), str(seconds)],
                            user=NOBODY, group=NOBODY, extra_groups=[], cwd="/", stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def as_nobody(paths: list[Path], seconds: float, mnt: Path) -> dict[str, list[str]]:
    return json.loads(bounded(nobody_loop(paths, seconds), None, mnt, seconds + 60))


@pytest.fixture
def user_shared_world(tierfs_bin):
    """A user's own mount shared with `--allow-other` (`user_allow_other` in /etc/fuse.conf,
    /dev/fuse 0666, both restored after), from test_desktop's world of that user."""
    from test_desktop import UserWorld
    if shutil.which("setfacl") is None:
        pytest.fail("setfacl is not installed (.ci/run installs the acl package)")
    conf = Path("/etc/fuse.conf")
    old_conf = conf.read_text() if conf.exists() else None
    conf.write_text((old_conf or "") + "\nuser_allow_other\n")
    dev = Path("/dev/fuse")
    old_mode = stat.S_IMODE(dev.stat().st_mode)
    os.chmod(dev, 0o666)
    w = None
    try:
        w = UserWorld(tierfs_bin)
        yield w
    finally:
        if w is not None:
            w.cleanup()
        os.chmod(dev, old_mode)
        if old_conf is None:
            conf.unlink()
        else:
            conf.write_text(old_conf)


@pytest.mark.timeout(120)
def test_a_users_shared_mount_follows_no_swapped_link_and_no_acl(user_shared_world):
    """A non-root daemon with `--allow-other` cannot act as other users: for them it follows no
    link (a directory swapped for one included, even while the kernel still holds the old entry)
    and refuses objects under a POSIX ACL, which the kernel's mode-bit check would not see."""
    w = user_shared_world
    uid, gid = w.user.uid, w.user.gid
    d = w.src / "d"
    d.mkdir(mode=0o755)
    (d / "f.txt").write_text("listed\n")
    private = w.root / "private-of-the-user"
    private.mkdir(mode=0o700)
    (private / "private.txt").write_text("the user's private file\n")
    (w.src / "acl.txt").write_text("denied by an ACL\n")
    acldir = w.src / "acldir"
    acldir.mkdir(mode=0o755)
    (acldir / "f.txt").write_text("behind an ACL\n")
    for p in (d, d / "f.txt", private, private / "private.txt", w.src / "acl.txt", acldir, acldir / "f.txt"):
        os.chown(p, uid, gid)
    for p in (w.src / "acl.txt", acldir):
        subprocess.run(["setfacl", "-m", f"u:{NOBODY}:-", str(p)], check=True, timeout=10)
    os.chmod(w.src / "acl.txt", 0o644)
    r = w.tierfs("mount", w.src, w.mnt, "--ram-cache", "64MiB", "--daemon", "--allow-other",
                 "--log-file", w.root / "daemon.log", "--state-dir", w.state)
    assert r.returncode == 0, f"user mount failed: {r.stderr}\nlog:\n{w.log()}"
    w.daemon_pid()
    rows, failures = [], []
    watched = [w.mnt / "d", w.mnt / "d" / "f.txt", w.mnt / "d" / "private.txt"]
    before = as_nobody(watched[:2], 0.3, w.mnt)
    if before != {str(w.mnt / "d"): ["list:f.txt"], str(w.mnt / "d" / "f.txt"): ["read:listed"]}:
        failures.append(f"before the swap: {before}")
    # The user swaps the directory for a link to their private one while `nobody` keeps going:
    # for half a second the kernel may still hold the directory's entry, and asks the daemon
    # about that inode.
    swapped = nobody_loop(watched, 3)
    time.sleep(0.2)
    users.run_as(["sh", "-c", f"mv {d} {w.src / 'd.old'} && ln -s {private} {d}"], timeout=10, check=True)
    during = json.loads(bounded(swapped, None, w.mnt, 60))
    source = as_nobody([w.src / "d", w.src / "d" / "private.txt"], 0.2, w.mnt)
    private_seen = [v for vs in during.values() for v in vs if "private" in v]
    rows.append(("directory swapped for a link to the mounting user's 0700 dir: list, read (3 s loop)",
                 "never the private dir", " / ".join(map(str, source.values())), " / ".join(map(str, during.values()))))
    if private_seen:
        failures.append(f"another user saw the private directory: {during}")
    acl_paths = [w.mnt / "acl.txt", w.mnt / "acldir", w.mnt / "acldir" / "f.txt"]
    through_mount = as_nobody(acl_paths, 0.2, w.mnt)
    through_source = as_nobody([w.src / "acl.txt", w.src / "acldir", w.src / "acldir" / "f.txt"], 0.2, w.mnt)
    for (tried, p), sp in zip([("0644 file with an ACL denying the reader", acl_paths[0]),
                               ("0755 directory with an ACL denying the reader: list", acl_paths[1]),
                               ("  ... read a 0644 file inside it", acl_paths[2])],
                              through_source):
        got, want = through_mount[str(p)], through_source[sp]
        rows.append((tried, "EACCES", str(want), str(got)))
        if got != ["EACCES"] or want != ["EACCES"]:
            failures.append(f"{tried}: SOURCE {want}, mount {got}")
    # The mounting user still reads everything of theirs, ACL or not.
    mine = w.run("cat", w.mnt / "acl.txt", w.mnt / "acldir" / "f.txt", w.mnt / "d" / "private.txt", timeout=20)
    rows.append(("the mounting user reads the ACL'd files and follows the link", "all three", "n/a",
                 "ok" if mine.returncode == 0 else mine.stderr.strip()))
    if mine.returncode != 0 or "the user's private file" not in mine.stdout:
        failures.append(f"the mounting user: {mine.stdout} {mine.stderr}")
    text = write_table("security-user-table.md", "as `nobody`; non-root daemon of `tierfs-user`, `--allow-other`", rows)
    assert not failures, "\n".join(failures) + "\n\n" + text
