"""tierfs-gpu (gpu-side/): resolving mounted paths to their source on a real mount, loading
through the C ABI and the Python wrapper into host memory (bit-exact against safetensors), and
the one-sentence failure of every GPU command on a machine without one.

Binaries: $TIERFS_GPU_BIN (default target/release/tierfs-gpu) and $TIERFS_GPU_LIB (default
target/release/libtierfs_gpu.so, which gpu-side/python/tierfs_gpu.py also finds by itself).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gen
from conftest import REPO

GPU_BIN = Path(os.environ.get("TIERFS_GPU_BIN", REPO / "target" / "release" / "tierfs-gpu"))
GPU_LIB = Path(os.environ.get("TIERFS_GPU_LIB", REPO / "target" / "release" / "libtierfs_gpu.so"))
XATTR = "user.tierfs.source"

sys.path.insert(0, str(REPO / "gpu-side" / "python"))
os.environ.setdefault("TIERFS_GPU_LIB", str(GPU_LIB))
import tierfs_gpu  # noqa: E402


def has_gpu_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


no_gpu_only = pytest.mark.skipif(has_gpu_driver(), reason="an NVIDIA driver is present: the no-GPU path cannot be observed here")


@pytest.fixture(scope="module")
def gpu_bin() -> Path:
    if not os.access(GPU_BIN, os.X_OK) or not GPU_LIB.exists():
        pytest.fail(f"{GPU_BIN} / {GPU_LIB} missing (run `cargo build --release --workspace`)")
    return GPU_BIN


def run(*args, env=None) -> subprocess.CompletedProcess:
    e = dict(os.environ, RUST_BACKTRACE="1")  # a panic would print a backtrace: it must not happen
    e.update(env or {})
    return subprocess.run([str(GPU_BIN), *map(str, args)], capture_output=True, text=True, env=e, timeout=120)


def one_sentence(p: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed command, after checking there is exactly one."""
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{p.stderr}"
    assert "panicked" not in p.stderr and "backtrace" not in p.stderr.lower(), p.stderr
    assert lines[0].startswith("tierfs-gpu: "), lines[0]
    return lines[0]


def file_bytes(path: Path) -> dict[str, bytes]:
    data = path.read_bytes()
    return {name: data[a:b] for name, a, b in gen.tensor_ranges(path)}


@pytest.fixture
def model_tree(workdir):
    """src/ with a model, a subdirectory, a non-model file and a model linked in from outside."""
    src = workdir / "src"
    (src / "sub").mkdir(parents=True)
    gen.write_small(src / "dit.safetensors", gen.dit_specs(256, 512, 4, ("BF16", "F8_E4M3")), seed=51)
    (src / "notes.txt").write_text("not a model\n")
    outside = workdir / "elsewhere.safetensors"
    gen.write_small(outside, gen.flux_specs(128, 2, 2), seed=52)
    os.symlink(outside, src / "linked.safetensors")
    return src


def test_mounted_files_name_their_source_in_an_xattr(mount, model_tree):
    m = mount(model_tree)
    src = model_tree.resolve()
    for name in ("dit.safetensors", "notes.txt", "linked.safetensors"):
        assert os.getxattr(m.mnt / name, XATTR) == os.fsencode(src / name), name
        assert os.listxattr(m.mnt / name) == [XATTR], name
    for path in (m.mnt, m.mnt / "sub", m.mnt / ".tierfs" / "stats"):
        assert os.listxattr(path) == [], path
        with pytest.raises(OSError) as e:
            os.getxattr(path, XATTR)
        assert e.value.errno == errno.ENODATA, path
    with pytest.raises(OSError) as e:
        os.getxattr(m.mnt / "dit.safetensors", "user.other")
    assert e.value.errno == errno.ENODATA
    # A buffer too small for the value is ERANGE, as getxattr(2) says.
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    buf = ctypes.create_string_buffer(4)
    n = libc.getxattr(os.fsencode(m.mnt / "dit.safetensors"), XATTR.encode(), buf, ctypes.c_size_t(4))
    assert n == -1 and ctypes.get_errno() == errno.ERANGE


def test_resolve_finds_the_source_behind_a_mounted_path(gpu_bin, mount, model_tree):
    m = mount(model_tree)
    p = run("resolve", m.mnt / "dit.safetensors", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    _, header = gen.read_header(model_tree / "dit.safetensors")
    assert doc["source"] == str(model_tree.resolve() / "dit.safetensors")
    assert doc["via_mount"] is True
    assert doc["tensors"] == len([k for k in header if k != "__metadata__"])
    plain = json.loads(run("resolve", model_tree / "dit.safetensors", "--json").stdout)
    assert plain["via_mount"] is False and plain["source"] == str(model_tree / "dit.safetensors")
    linked = json.loads(run("resolve", m.mnt / "linked.safetensors", "--json").stdout)
    assert linked["source"] == str(model_tree.resolve() / "linked.safetensors")
    msg = one_sentence(run("load", m.mnt / "notes.txt", "--device", "cpu"))
    assert "is not a usable safetensors file" in msg, msg


def test_loading_a_mounted_path_reads_the_source_not_the_mount(gpu_bin, mount, model_tree):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file as st_load

    m = mount(model_tree)
    before = m.stats()
    got = tierfs_gpu.load_file(m.mnt / "dit.safetensors", device="cpu")
    report = tierfs_gpu.last_report()
    after = m.stats()
    assert report["source"] == str(model_tree.resolve() / "dit.safetensors")
    assert report["destination"] == "cpu" and report["route"] == "bounce"
    ref = st_load(model_tree / "dit.safetensors")
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape, k
        assert torch.equal(got[k].reshape(-1).view(torch.uint8), ref[k].reshape(-1).view(torch.uint8)), k
        assert got[k].data_ptr() % got[k].element_size() == 0, k
    # No tensor byte went through the daemon: it never opened the file or read its disk.
    assert after["disk"]["read_bytes"] == before["disk"]["read_bytes"]
    assert m.file_stats("dit.safetensors") is None


def test_wrapper_selections_and_numpy_front_end_are_bit_exact(gpu_bin, model_tree):
    torch = pytest.importorskip("torch")
    path = model_tree / "dit.safetensors"
    want = file_bytes(path)
    block = tierfs_gpu.load_file(path, device="cpu", blocks=["blocks.2"], threads=3, chunk_bytes=64 << 10)
    assert sorted(block) == sorted(k for k in want if k.startswith("blocks.2."))
    names = ["blocks.0.ffn.0.weight", "head.head.weight"]
    picked = tierfs_gpu.load_file(path, device="cpu", tensors=names)
    assert sorted(picked) == sorted(names)
    for sd in (block, picked):
        for k, t in sd.items():
            assert t.contiguous().view(torch.uint8).numpy().tobytes() == want[k], k
    arrays = tierfs_gpu.load_file_numpy(path, tensors=names)
    for k, a in arrays.items():
        assert a.tobytes() == want[k], k
    with pytest.raises(tierfs_gpu.TierfsGpuError, match="no block named 'blocks.99'"):
        tierfs_gpu.load_file(path, device="cpu", blocks=["blocks.99"])


def write_misaligned(path: Path) -> dict[str, bytes]:
    """A file whose F32 and I64 tensors start at offsets not aligned for them."""
    rng = np.random.default_rng(53)
    tensors = [("odd", "BF16", [3], 6), ("f", "F32", [1000], 4000), ("l", "I64", [5], 40), ("z", "F32", [0], 0)]
    header, off, data = {}, 0, b""
    for name, dt, shape, n in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        data += rng.bytes(n)
        off += n
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    path.write_bytes(struct.pack("<Q", len(hj)) + hj + data)
    return file_bytes(path)


def test_misaligned_tensors_come_out_aligned_and_exact(gpu_bin, workdir):
    torch = pytest.importorskip("torch")
    path = workdir / "misaligned.safetensors"
    want = write_misaligned(path)
    assert gen.tensor_ranges(path)[1][1] % 4 != 0, "the layout must misalign 'f'"
    got = tierfs_gpu.load_file(path, device="cpu")
    for k, t in got.items():
        assert t.data_ptr() % t.element_size() == 0, k
        assert t.contiguous().view(torch.uint8).numpy().tobytes() == want[k], k
    assert got["z"].shape == (0,)


def test_cli_loads_into_host_memory_and_verifies(gpu_bin, model_tree):
    path = model_tree / "dit.safetensors"
    p = run("load", path, "--device", "cpu", "--verify", "--threads", "3", "--chunk", "64KiB")
    assert p.returncode == 0, p.stderr
    n = len(gen.tensor_ranges(path))
    assert f"loaded {n} tensors" in p.stdout and "GB/s via bounce buffers" in p.stdout, p.stdout
    assert f"verified: {n} tensors bit-exact" in p.stdout, p.stdout
    p = run("load", path, "--device", "cpu", "--blocks", "blocks.1,blocks.3", "--json")
    doc = json.loads(p.stdout)
    assert doc["tensors"] == len([k for k, _, _ in gen.tensor_ranges(path) if k.startswith(("blocks.1.", "blocks.3."))])
    assert "no tensor named 'x'" in one_sentence(run("load", path, "--device", "cpu", "--tensors", "x"))
    assert "cannot open" in one_sentence(run("load", model_tree / "missing.safetensors", "--device", "cpu"))


@no_gpu_only
def test_every_gpu_command_fails_in_one_sentence_without_a_gpu(gpu_bin, model_tree):
    path = model_tree / "dit.safetensors"
    commands = [
        ("load", path), ("load", path, "--gds", "on"), ("load", path, "--gds", "off"),
        ("load", path, "--gds", "compat"), ("load", path, "--blocks", "blocks.1", "--device", "1"),
        ("load", path, "--verify", "--json"), ("bench", path), ("bench", path, "--json"),
        ("measure", path, "--probe", "h2d", "--cache", "warm"),
        ("measure", path, "--probe", "bounce", "--cache", "cold"),
    ]
    for cmd in commands:
        msg = one_sentence(run(*cmd))
        assert "no NVIDIA driver found" in msg and "GPU" in msg, (cmd, msg)
    # The C ABI and the wrapper say the same, before torch tries to allocate anything.
    with pytest.raises(tierfs_gpu.TierfsGpuError, match="^no NVIDIA driver found") as e:
        tierfs_gpu.load_file(path, device="cuda:0")
    assert "\n" not in str(e.value)


@no_gpu_only
def test_device_check_dry_runs_and_reports_no_gpu(gpu_bin, workdir):
    env = dict(os.environ, TIERFS_GPU_BIN=str(GPU_BIN), TIERFS_GPU_LIB=str(GPU_LIB),
               PYTHON=sys.executable, TIERFS_GPU_CHECK_DIR=str(workdir / "check"), TIERFS_GPU_CHECK_GIB="0.03")
    script = REPO / "gpu-side" / "device-check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    dry = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "host load cold:" in dry.stdout and "bit-exact" in dry.stdout and "dry run: ok" in dry.stdout
    assert "goal (gds=auto) warm ≥ 0.7× pinned H2D" in dry.stdout
    full = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert full.returncode == 2, full.stdout + full.stderr
    assert "device-check: no GPU here (no NVIDIA driver found" in full.stdout
