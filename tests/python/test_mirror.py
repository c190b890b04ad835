"""Mirror correctness: the mount presents SOURCE (symlinks to files/dirs followed)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import gen


def _walk_followed(root: Path) -> dict[str, os.stat_result]:
    """rel path -> stat (following links), skipping .tierfs."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = [d for d in dirnames if d != ".tierfs" or Path(dirpath) != root]
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = os.stat(p)
    return out


def test_diff_r_big_tree_small_budget(mount, tree, big_file):
    """diff -r SOURCE MNT is clean with a 1 GiB checkpoint through a 64 MiB cache."""
    root, paths = tree
    m = mount(root, "64MiB")
    assert ".tierfs" in os.listdir(m.mnt), "virtual .tierfs directory must be listed in the root"
    r = subprocess.run(["diff", "-r", "-x", ".tierfs", str(root), str(m.mnt)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"diff -r reported differences (rc={r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    assert r.stdout == "" and r.stderr == ""

    st = m.stats()
    budget = 64 << 20
    assert st["cache"]["budget_bytes"] == budget, st["cache"]
    assert st["cache"]["used_bytes"] <= budget, f"cache used {st['cache']['used_bytes']} > budget {budget}"
    size = big_file.stat().st_size
    assert st["disk"]["read_bytes"] >= size * 0.95, (
        f"a cold read of the {size} B checkpoint must come from disk through the cache; "
        f"disk.read_bytes={st['disk']['read_bytes']}")
    assert m.alive()


def test_metadata_presentation(mount, tree):
    """Sizes, mtimes (ns), modes and types match; symlinks to files/dirs are presented followed."""
    root, _ = tree
    m = mount(root, "64MiB")
    src, dst = _walk_followed(root), _walk_followed(m.mnt)
    assert sorted(src) == sorted(dst), f"listing differs: only src {set(src) - set(dst)}, only mnt {set(dst) - set(src)}"
    bad = []
    for rel, s in src.items():
        d = dst[rel]
        if stat.S_IFMT(s.st_mode) != stat.S_IFMT(d.st_mode) or stat.S_IMODE(s.st_mode) != stat.S_IMODE(d.st_mode):
            bad.append(f"{rel}: mode {oct(s.st_mode)} vs {oct(d.st_mode)}")
        if stat.S_ISREG(s.st_mode) and s.st_size != d.st_size:
            bad.append(f"{rel}: size {s.st_size} vs {d.st_size}")
        if s.st_mtime_ns != d.st_mtime_ns:
            bad.append(f"{rel}: mtime_ns {s.st_mtime_ns} vs {d.st_mtime_ns}")
    assert not bad, "metadata mismatches:\n" + "\n".join(bad)
    # Presentation of symlinks: lstat through the mount shows the target type.
    assert stat.S_ISREG(os.lstat(m.mnt / "link_file").st_mode), "symlink to a file must be presented as a regular file"
    assert stat.S_ISREG(os.lstat(m.mnt / "link_model").st_mode)
    assert stat.S_ISDIR(os.lstat(m.mnt / "link_dir").st_mode), "symlink to a dir must be presented as a directory"
    assert (m.mnt / "link_model").read_bytes() == (root / "unet.safetensors").read_bytes()
    assert os.lstat(m.mnt / "old.txt").st_mtime_ns == 978_307_200_123_456_789


def _poll(pred, deadline_s: float = 1.5) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def test_live_mirror(mount, workdir):
    """Adds, removals and replacements in SOURCE show up within ~1 s (1.5 s deadline)."""
    src = workdir / "src"
    src.mkdir()
    (src / "keep.txt").write_text("keep\n")
    (src / "gone.txt").write_text("bye\n")
    (src / "swap.txt").write_text("old contents\n")
    gen.write_small(src / "m.safetensors", gen.dit_specs(64, 128, 1), seed=1)
    m = mount(src, "64MiB")
    mnt = m.mnt
    # Prime the kernel's dentry/attr caches so staleness would show.
    assert sorted(os.listdir(mnt)) == sorted(["keep.txt", "gone.txt", "swap.txt", "m.safetensors", ".tierfs"])
    assert (mnt / "swap.txt").read_text() == "old contents\n"
    _ = (mnt / "m.safetensors").read_bytes()
    # ...including negative entries for the names about to appear.
    assert (mnt / "gone.txt").exists()
    assert not (mnt / "new.txt").exists() and not (mnt / "newdir").exists()

    (src / "new.txt").write_text("fresh file\n")
    (src / "newdir").mkdir()
    (src / "newdir" / "inner.bin").write_bytes(b"\x01" * 5000)
    (src / "gone.txt").unlink()
    tmp = src / ".swap.tmp"
    tmp.write_text("new contents, longer than before\n")
    os.replace(tmp, src / "swap.txt")
    gen.write_small(workdir / "m2.safetensors", gen.dit_specs(64, 256, 2), seed=2)
    os.replace(workdir / "m2.safetensors", src / "m.safetensors")

    checks = {
        "new file listed": lambda: "new.txt" in os.listdir(mnt),
        "new file content": lambda: (mnt / "new.txt").read_text() == "fresh file\n",
        "new dir listed": lambda: "newdir" in os.listdir(mnt),
        "file in new dir": lambda: (mnt / "newdir" / "inner.bin").read_bytes() == b"\x01" * 5000,
        "removed file unlisted": lambda: "gone.txt" not in os.listdir(mnt),
        "removed file gone": lambda: not os.path.exists(mnt / "gone.txt"),
        "replaced size": lambda: os.stat(mnt / "swap.txt").st_size == os.stat(src / "swap.txt").st_size,
        "replaced content": lambda: (mnt / "swap.txt").read_text() == "new contents, longer than before\n",
        "replaced model size": lambda: os.stat(mnt / "m.safetensors").st_size == os.stat(src / "m.safetensors").st_size,
        "replaced model content": lambda: (mnt / "m.safetensors").read_bytes() == (src / "m.safetensors").read_bytes(),
    }
    late = [name for name, pred in checks.items() if _poll(pred) is None]
    assert not late, f"not visible through the mount within 1.5 s: {late}"
    assert m.alive()


def test_tierfs_name_in_source_is_hidden(mount, workdir):
    """A `.tierfs` entry in SOURCE is shadowed by the virtual directory."""
    src = workdir / "src"
    (src / ".tierfs").mkdir(parents=True)
    (src / ".tierfs" / "stats").write_text("not json")
    (src / "a.txt").write_text("a")
    m = mount(src)
    assert os.listdir(m.mnt).count(".tierfs") == 1
    st = m.stats()  # parses as JSON, i.e. the virtual file
    assert "cache" in st and "files" in st
