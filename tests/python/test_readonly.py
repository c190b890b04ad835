"""Every write path returns EROFS, and nothing in SOURCE changes."""

from __future__ import annotations

import errno
import os

import pytest


@pytest.fixture
def ro(mount, workdir):
    src = workdir / "src"
    (src / "d").mkdir(parents=True)
    (src / "f.txt").write_text("hello\n")
    (src / "m.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (src / "d" / "inner.txt").write_text("x")
    os.symlink("f.txt", src / "lnk")
    return src, mount(src)


def _snapshot(root):
    out = {}
    for dp, dns, fns in os.walk(root):
        for n in dns + fns:
            p = os.path.join(dp, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_uid)
    return out


def _ops(mnt):
    f, d, m = str(mnt / "f.txt"), str(mnt / "d"), str(mnt / "m.safetensors")
    stats = str(mnt / ".tierfs" / "stats")
    metrics = str(mnt / ".tierfs" / "metrics")
    return {
        "open O_WRONLY": lambda: os.open(f, os.O_WRONLY),
        "open O_RDWR": lambda: os.open(f, os.O_RDWR),
        "open O_RDWR safetensors": lambda: os.open(m, os.O_RDWR),
        "open O_TRUNC": lambda: os.open(f, os.O_WRONLY | os.O_TRUNC),
        "open O_APPEND": lambda: os.open(f, os.O_WRONLY | os.O_APPEND),
        "create": lambda: os.open(str(mnt / "new.txt"), os.O_WRONLY | os.O_CREAT, 0o644),
        "create in subdir": lambda: os.open(str(mnt / "d" / "new.txt"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644),
        "mkdir": lambda: os.mkdir(str(mnt / "newdir")),
        "mknod fifo": lambda: os.mkfifo(str(mnt / "fifo")),
        "unlink": lambda: os.unlink(f),
        "unlink safetensors": lambda: os.unlink(m),
        "rmdir": lambda: os.rmdir(d),
        "rename": lambda: os.rename(f, str(mnt / "g.txt")),
        "rename into dir": lambda: os.rename(f, str(mnt / "d" / "f.txt")),
        "rename over existing": lambda: os.rename(f, m),
        "chmod": lambda: os.chmod(f, 0o777),
        "chmod dir": lambda: os.chmod(d, 0o700),
        "chown": lambda: os.chown(f, 1234, 1234),
        "truncate": lambda: os.truncate(f, 0),
        "truncate safetensors": lambda: os.truncate(m, 1),
        "utime": lambda: os.utime(f, (0, 0)),
        "utime now": lambda: os.utime(f, None),
        "symlink": lambda: os.symlink("f.txt", str(mnt / "lnk2")),
        "link": lambda: os.link(f, str(mnt / "hard")),
        "setxattr": lambda: os.setxattr(f, "user.test", b"1"),
        "removexattr": lambda: os.removexattr(f, "user.test"),
        "write .tierfs/stats": lambda: os.open(stats, os.O_WRONLY),
        "truncate .tierfs/stats": lambda: os.truncate(stats, 0),
        "write .tierfs/metrics": lambda: os.open(metrics, os.O_WRONLY),
        "truncate .tierfs/metrics": lambda: os.truncate(metrics, 0),
        "create in .tierfs": lambda: os.open(str(mnt / ".tierfs" / "x"), os.O_WRONLY | os.O_CREAT, 0o644),
        "rmdir .tierfs": lambda: os.rmdir(str(mnt / ".tierfs")),
    }


def erofs_failures(ops: dict) -> list[str]:
    """Runs each write operation; returns a line for each that did not fail with EROFS."""
    wrong = []
    for name, op in ops.items():
        try:
            r = op()
        except OSError as e:
            if e.errno != errno.EROFS:
                wrong.append(f"{name}: errno {errno.errorcode.get(e.errno, e.errno)} ({e.strerror}), want EROFS")
            continue
        if isinstance(r, int):
            os.close(r)
        wrong.append(f"{name}: succeeded, want EROFS")
    return wrong


def test_every_write_path_is_erofs(ro):
    src, m = ro
    before = _snapshot(src)
    wrong = erofs_failures(_ops(m.mnt))
    assert not wrong, "write paths not returning EROFS:\n" + "\n".join(wrong)
    assert _snapshot(src) == before, "SOURCE changed through a read-only mount"
    assert (m.mnt / "f.txt").read_text() == "hello\n"
    assert m.alive()
