"""Load a safetensors file into torch tensors on a GPU through ``libtierfs_gpu.so``.

    from tierfs_gpu import load_file
    state_dict = load_file("/mnt/models/flux1-dev.safetensors", device="cuda:0")

Like ``safetensors.torch.load_file``, but a path on a tierfs mount is read from the source file
behind the mount, with GPUDirect Storage where it is usable and pinned bounce buffers otherwise
(``gds="auto"``; ``"on"`` fails if GDS is not usable, ``"off"`` never tries it). ``tensors=`` or
``blocks=`` load a subset. ``device="cpu"`` fills CPU tensors through the same pipeline.

All tensors of one call are views of one allocation (as with fastsafetensors): memory is freed
when the last of them is, and ``safetensors.torch.save_file`` will call them shared — clone the
ones you keep alone. ``last_report()`` says which route the last load took and how fast it was.

Pure ctypes, no compiled extension. The library is ``$TIERFS_GPU_LIB``, or ``libtierfs_gpu.so``
beside this file, or the repository's ``target/release/libtierfs_gpu.so``. ``libcufile`` is
looked for in this interpreter's ``site-packages/nvidia/*/lib`` (the ``nvidia-cufile`` wheel)
unless ``$TIERFS_CUFILE_LIB`` names it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import sys
import tempfile
from pathlib import Path

__all__ = ["load_file", "load_file_numpy", "last_report", "TierfsGpuError"]

ALIGN = 4096  # arena alignment the library requires (cuFile and O_DIRECT want 4 KiB)
_MSG_LEN = 8192
_LIB_ENV = "TIERFS_GPU_LIB"
_CUFILE_ENV = "TIERFS_CUFILE_LIB"

# safetensors dtype -> torch attribute / numpy-or-ml_dtypes name
_TORCH_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}
_NUMPY_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
    "F32": "float32", "F64": "float64", "C64": "complex64",
    "BF16": "ml_dtypes.bfloat16", "F8_E4M3": "ml_dtypes.float8_e4m3fn",
    "F8_E5M2": "ml_dtypes.float8_e5m2",
}

_lib = None
_last_report: dict | None = None


class TierfsGpuError(RuntimeError):
    """A load failed; the message is the library's one sentence."""


def last_report() -> dict | None:
    """The report of the last successful load: route, gb_per_s, fallback reason, ..."""
    return _last_report


def _find_cufile() -> str | None:
    for entry in sys.path:
        nvidia = Path(entry or ".") / "nvidia"
        if not nvidia.is_dir():
            continue
        for lib in sorted(nvidia.glob("*/lib/libcufile.so*")):
            name = lib.name
            if name == "libcufile.so" or name[len("libcufile.so."):].replace(".", "").isdigit():
                return str(lib)
    return None


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    # Before the library reads them (on first use of cuFile).
    if _CUFILE_ENV not in os.environ and (found := _find_cufile()):
        os.environ[_CUFILE_ENV] = found
    os.environ.setdefault("CUFILE_LOGFILE_PATH", os.path.join(tempfile.gettempdir(), "tierfs-gpu-cufile.log"))
    here = Path(__file__).resolve().parent
    files = [here / "libtierfs_gpu.so", here.parents[1] / "target" / "release" / "libtierfs_gpu.so"]
    path = (os.environ.get(_LIB_ENV)
            or next((str(f) for f in files if f.exists()), None)
            or ctypes.util.find_library("tierfs_gpu"))
    if path is None:
        raise TierfsGpuError(f"libtierfs_gpu.so not found: build it (cargo build --release -p tierfs-gpu) "
                             f"or set {_LIB_ENV}")
    lib = ctypes.CDLL(path)
    lib.tierfs_gpu_open.restype = ctypes.c_void_p
    lib.tierfs_gpu_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
                                    ctypes.c_char_p, ctypes.c_size_t]
    lib.tierfs_gpu_plan.restype = ctypes.c_char_p
    lib.tierfs_gpu_plan.argtypes = [ctypes.c_void_p]
    lib.tierfs_gpu_check_device.restype = ctypes.c_int
    lib.tierfs_gpu_check_device.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.tierfs_gpu_load.restype = ctypes.c_int
    lib.tierfs_gpu_load.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int,
                                    ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint64,
                                    ctypes.c_char_p, ctypes.c_size_t]
    lib.tierfs_gpu_close.restype = None
    lib.tierfs_gpu_close.argtypes = [ctypes.c_void_p]
    _lib = lib
    return lib


def _selection(tensors, blocks) -> bytes | None:
    if tensors is not None and blocks is not None:
        raise ValueError("give tensors= or blocks=, not both")
    if tensors is not None:
        return json.dumps({"tensors": list(tensors)}).encode()
    if blocks is not None:
        return json.dumps({"blocks": list(blocks)}).encode()
    return None


class _Opened:
    """An open, planned file (closed on exit)."""

    def __init__(self, path, tensors, blocks, chunk_bytes):
        self.lib = _library()
        err = ctypes.create_string_buffer(_MSG_LEN)
        self.handle = self.lib.tierfs_gpu_open(os.fsencode(path), _selection(tensors, blocks),
                                               chunk_bytes, err, _MSG_LEN)
        if not self.handle:
            raise TierfsGpuError(err.value.decode(errors="replace"))
        self.plan = json.loads(self.lib.tierfs_gpu_plan(self.handle))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lib.tierfs_gpu_close(self.handle)

    def load(self, ptr: int, ordinal: int, gds: str, threads: int, stream: int) -> dict:
        global _last_report
        out = ctypes.create_string_buffer(_MSG_LEN)
        rc = self.lib.tierfs_gpu_load(self.handle, ptr, self.plan["arena_bytes"], ordinal,
                                      gds.encode(), threads, stream, out, _MSG_LEN)
        text = out.value.decode(errors="replace")
        if rc != 0:
            raise TierfsGpuError(text)
        _last_report = json.loads(text)
        return _last_report


def _check_device(lib, ordinal: int) -> None:
    err = ctypes.create_string_buffer(_MSG_LEN)
    if lib.tierfs_gpu_check_device(ordinal, err, _MSG_LEN) != 0:
        raise TierfsGpuError(err.value.decode(errors="replace"))


def load_file(path, device="cuda:0", *, tensors=None, blocks=None, gds: str = "auto",
              threads: int = 0, chunk_bytes: int = 0) -> dict:
    """``{name: torch.Tensor}`` of the file's tensors (or the ``tensors``/``blocks`` given) on
    ``device`` ("cuda", "cuda:N" or "cpu")."""
    import torch

    dev = torch.device(device)
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda[:N] or cpu, not {device!r}")
    with _Opened(path, tensors, blocks, chunk_bytes) as f:
        n = f.plan["arena_bytes"]
        if dev.type == "cuda":
            # Plain "cuda" is torch's current device (0 until the program chose another).
            ordinal = dev.index if dev.index is not None else (
                torch.cuda.current_device() if torch.cuda.is_initialized() else 0)
            _check_device(f.lib, ordinal)  # one sentence when there is no GPU, before torch tries
            dev = torch.device("cuda", ordinal)
            raw = torch.empty(n + ALIGN, dtype=torch.uint8, device=dev)
            stream = torch.cuda.current_stream(dev).cuda_stream
        else:
            ordinal, stream = -1, 0
            raw = torch.empty(n + ALIGN, dtype=torch.uint8)
        pad = (-raw.data_ptr()) % ALIGN
        arena = raw[pad:pad + n]
        f.load(raw.data_ptr() + pad, ordinal, gds, threads, stream)
        out = {}
        for t in f.plan["tensors"]:
            name = _TORCH_DTYPES.get(t["dtype"])
            dtype = getattr(torch, name, None) if name else None
            if dtype is None:
                raise TierfsGpuError(f"tensor {t['name']!r} has dtype {t['dtype']}, which this torch cannot hold")
            view = arena[t["offset"]:t["offset"] + t["len"]]
            out[t["name"]] = view.view(dtype).reshape(t["shape"])
        return out


def load_file_numpy(path, *, tensors=None, blocks=None, threads: int = 0, chunk_bytes: int = 0) -> dict:
    """``{name: numpy.ndarray}`` in host memory, through the same pipeline (BF16 and FP8 need
    ``ml_dtypes``)."""
    import numpy as np

    with _Opened(path, tensors, blocks, chunk_bytes) as f:
        n = f.plan["arena_bytes"]
        raw = np.empty(n + ALIGN, dtype=np.uint8)
        pad = (-raw.ctypes.data) % ALIGN
        arena = raw[pad:pad + n]
        f.load(raw.ctypes.data + pad, -1, "off", threads, 0)
        out = {}
        for t in f.plan["tensors"]:
            out[t["name"]] = arena[t["offset"]:t["offset"] + t["len"]].view(_numpy_dtype(t)).reshape(t["shape"])
        return out


def _numpy_dtype(t):
    import numpy as np

    name = _NUMPY_DTYPES.get(t["dtype"])
    if name is None:
        raise TierfsGpuError(f"tensor {t['name']!r} has dtype {t['dtype']}, which numpy cannot hold")
    if name.startswith("ml_dtypes."):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name.split(".", 1)[1]))
    return np.dtype(name)
