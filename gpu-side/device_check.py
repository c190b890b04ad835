"""The device check of tierfs-gpu (run by device-check.sh; see there for the environment).

Parent: writes the checkpoint, measures the pinned host-to-device ceiling and the baseline
``safetensors.torch.load_file(device="cuda")`` cold and warm, runs each tierfs-gpu route cold and
warm in a child process (one cuFile mode per process), runs ``tierfs-gpu bench --json`` for the
transfer-only figures and the disk's O_DIRECT speed, and prints the table.

Bit-exactness: the gds=auto route is compared with the baseline tensor by tensor (torch.equal
on the bytes); every child compares two position-weighted checksums per tensor, computed on the
GPU, with the baseline's.

``--dry-run`` (no GPU needed): a small file, loads into host memory through the same pipeline,
compared byte for byte with ``safetensors.torch.load_file(device="cpu")``; checks that the GPU
commands fail with one sentence; prints the table it would fill.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "python"))

GiB = 1 << 30
MiB = 1 << 20
DEADLINE_S = float(os.environ.get("TIERFS_GPU_CHECK_DEADLINE_S", "270"))  # of the 5-minute budget
T0 = time.monotonic()
ROUTES = ["auto", "off", "compat", "on"]
ROUTE_LABEL = {"auto": "tierfs-gpu gds=auto", "off": "tierfs-gpu gds=off (bounce buffers)",
               "compat": "tierfs-gpu gds=compat (cuFile compat)", "on": "tierfs-gpu gds=on (GDS)"}


def time_left() -> float:
    """Seconds a child may still take: the deadline plus a margin, at least 10."""
    return max(10.0, DEADLINE_S + 20 - (time.monotonic() - T0))


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- the checkpoint

def specs_for(target: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """A Wan-14B-like DiT (dim 5120, ffn 13824, bf16) of about `target` bytes, with fp32 norms and,
    per block, a 3-element bf16 tensor followed by a 1-element fp32 one (misaligned: relocated)."""
    dim, ffn = (5120, 13824) if target >= GiB else (512, 1536)
    out = [("patch_embedding.weight", "BF16", (dim, 64)), ("head.weight", "BF16", (64, dim))]
    size, n = 0, 0
    while size < target:
        p = f"blocks.{n}"
        block = [(f"{p}.attn.{x}.weight", "BF16", (dim, dim)) for x in "qkvo"]
        block += [(f"{p}.ffn.0.weight", "BF16", (ffn, dim)), (f"{p}.ffn.2.weight", "BF16", (dim, ffn)),
                  (f"{p}.norm.weight", "F32", (dim,)), (f"{p}.norm.bias", "BF16", (dim,)),
                  (f"{p}.odd", "BF16", (3,)), (f"{p}.scale", "F32", (1,))]
        out += block
        size += sum(nbytes(s) for s in block)
        n += 1
    return out


def nbytes(spec) -> int:
    n = {"BF16": 2, "F32": 4}[spec[1]]
    for d in spec[2]:
        n *= d
    return n


def write_checkpoint(path: Path, target: int) -> None:
    """Tensor data are slices of a random pool at varying offsets, so misplaced bytes show."""
    import numpy as np

    specs = specs_for(target)
    header, off = {"__metadata__": {"format": "pt", "generator": "tierfs-gpu device check"}}, 0
    for name, dt, shape in specs:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nbytes((name, dt, shape))]}
        off += nbytes((name, dt, shape))
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    done = path.with_suffix(".done")
    if path.exists() and done.exists() and done.read_text() == str(8 + len(hj) + off):
        log(f"reusing {path} ({(8 + len(hj) + off) / GiB:.2f} GiB)")
        return
    pool = memoryview(np.random.default_rng(5).bytes(256 * MiB + 4096))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        for i, spec in enumerate(specs):
            left, start = nbytes(spec), (i * 7919 * 8) % 4096
            while left:
                k = min(left, 256 * MiB)
                f.write(pool[start:start + k])
                left -= k
        f.flush()
        os.fsync(f.fileno())
    done.write_text(str(8 + len(hj) + off))
    log(f"wrote {path} ({path.stat().st_size / GiB:.2f} GiB, {len(specs)} tensors)")


def evict(path: Path, everything: bool = True) -> None:
    """Drops `path` from the page cache (and, as root with `everything`, the whole clean cache)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if not everything:
        return
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        pass  # not root: the per-file advice above is what counts


def warm(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(64 * MiB):
            pass


def prepare(path: Path, cache: str) -> None:
    (evict if cache == "cold" else warm)(path)


# ----------------------------------------------------------------------------- checks

def checksums(sd: dict) -> dict:
    """Two position-weighted sums of each tensor's bytes, on the tensor's device."""
    import torch

    out = {}
    for k, t in sd.items():
        b = t.reshape(-1).view(torch.uint8)
        if b.numel() == 0:
            out[k] = [0, 0]
            continue
        x = b.to(torch.int64)
        w = torch.arange(b.numel(), device=b.device, dtype=torch.int64) % 65521 + 1
        out[k] = [int(x.sum()), int((x * w).sum())]
    return out


def same_bytes(a: dict, b: dict) -> bool:
    import torch

    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            return False
    return True


def aligned(sd: dict) -> bool:
    return all(t.data_ptr() % t.element_size() == 0 for t in sd.values())


def timed(fn):
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t


def h2d_ceiling() -> float:
    import torch

    src = torch.empty(GiB, dtype=torch.uint8).pin_memory()
    dst = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    _, s = timed(lambda: [dst.copy_(src, non_blocking=True) for _ in range(4)])
    return 4 * GiB / s / 1e9


# ----------------------------------------------------------------------------- child: one route

def child(args) -> None:
    """One tierfs-gpu load in this fresh process; prints one JSON line."""
    import torch
    import tierfs_gpu

    path = Path(args.path)
    res = {"route": args.route, "cache": args.cache}
    try:
        # Warm-up on a cold tiny file: CUDA context, pinned buffers and (auto/on/compat) the
        # cuFile driver are set up outside the timed load, as in a long-running program.
        evict(Path(args.tiny), everything=False)
        tierfs_gpu.load_file(args.tiny, device="cuda:0", gds=args.route)
        prepare(path, args.cache)
        sd, s = timed(lambda: tierfs_gpu.load_file(path, device="cuda:0", gds=args.route))
        rep = tierfs_gpu.last_report()
        ref = json.loads(Path(args.ref).read_text())
        res.update(gbps=path.stat().st_size / s / 1e9, seconds=s, used=rep["route"],
                   fallback=rep.get("fallback"), read_mode=rep.get("read_mode"),
                   transfer_gbps=rep["gb_per_s"], aligned=aligned(sd),
                   bit_exact=checksums(sd) == ref)
    except Exception as e:  # noqa: BLE001 - reported in the table
        res["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    print(json.dumps(res), flush=True)


def run_child(args, route: str, cache: str, ref: Path, tiny: Path) -> dict:
    cmd = [sys.executable, __file__, "child", "--path", str(args.path), "--route", route, "--cache", cache,
           "--ref", str(ref), "--tiny", str(tiny)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=time_left())
    except subprocess.TimeoutExpired:
        return {"route": route, "cache": cache, "error": "timed out (time budget)"}
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"route": route, "cache": cache, "error": (p.stderr.strip().splitlines() or ["child failed"])[-1]}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- the table

def fmt(v):
    return "-" if v is None else f"{v:.2f}"


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}×"


def table(rows: list[dict], h2d: float | None, base: dict, disk: dict) -> str:
    out = [f"{'route':<42} {'cold GB/s':>9} {'warm GB/s':>9} {'cold ×st':>9} {'warm ×st':>9} "
           f"{'warm÷H2D':>9} {'bit-exact':>9}  path used / note"]
    for r in rows:
        c, w = r.get("cold"), r.get("warm")
        out.append(f"{r['label']:<42} {fmt(c):>9} {fmt(w):>9} {ratio(c, base.get('cold')):>9} "
                   f"{ratio(w, base.get('warm')):>9} {ratio(w, h2d):>9} {r.get('exact', '-'):>9}  {r.get('note', '')}")
    out.append(f"{'pinned host→device ceiling (torch)':<42} {'-':>9} {fmt(h2d):>9}")
    auto = next((r for r in rows if r.get("key") == "auto"), {})
    goals = [("cold ≥ 0.9× disk O_DIRECT", auto.get("cold"), disk.get("cold"), 0.9),
             ("warm ≥ 0.7× pinned H2D", auto.get("warm"), h2d, 0.7),
             ("cold ≥ 3× safetensors", auto.get("cold"), base.get("cold"), 3.0),
             ("warm ≥ 3× safetensors", auto.get("warm"), base.get("warm"), 3.0)]
    out.append("")
    for name, a, b, want in goals:
        verdict = "n/a" if a is None or not b else ("PASS" if a / b >= want else "FAIL")
        out.append(f"goal (gds=auto) {name:<28} {ratio(a, b):>8}  {verdict}")
    return "\n".join(out)


# ----------------------------------------------------------------------------- main runs

def route_rows(args, ref: Path, tiny: Path) -> list[dict]:
    rows = []
    for route in ROUTES:
        row = {"key": route, "label": ROUTE_LABEL[route]}
        notes, exact = [], []
        for cache in ("cold", "warm"):
            if time.monotonic() - T0 > DEADLINE_S:
                notes.append(f"{cache}: skipped (time budget)")
                continue
            r = run_child(args, route, cache, ref, tiny)
            log(f"{route} {cache}: {json.dumps(r)}")
            if "error" in r:
                notes.append(f"{cache}: {r['error']}")
                continue
            row[cache] = r["gbps"]
            exact.append(bool(r["bit_exact"]) and bool(r["aligned"]))
            used = r["used"] + (f"/{r['read_mode']}" if r.get("read_mode") else "")
            notes.append(f"{cache}: {used}" + (f" ({r['fallback']})" if r.get("fallback") else ""))
        row["exact"] = ("yes" if all(exact) else "NO") if exact else "-"
        row["note"] = "; ".join(notes)
        rows.append(row)
    return rows


def disk_speed(args) -> dict:
    """`tierfs-gpu measure --probe disk`: the pipeline into a discarding sink, cold (O_DIRECT)
    and warm (page cache): the read speed every route is bounded by."""
    out: dict = {}
    for cache in ("cold", "warm"):
        if cache == "warm":
            warm(args.path)
        p = subprocess.run([args.bin, "measure", str(args.path), "--probe", "disk", "--cache", cache],
                           capture_output=True, text=True, timeout=time_left())
        if p.returncode == 0:
            out[cache] = json.loads(p.stdout)["gb_per_s"]
        else:
            out["note"] = (p.stderr.strip().splitlines() or ["failed"])[-1]
        log(f"disk {cache}: {out.get(cache)}")
    return out


def bench_rows(args) -> list[dict]:
    """`tierfs-gpu bench --json`: transfer-only figures of each route and the disk's speed."""
    if time.monotonic() - T0 > DEADLINE_S:
        return [{"label": "rust bench", "note": "skipped (time budget)"}]
    try:
        p = subprocess.run([args.bin, "bench", str(args.path), "--json"], capture_output=True, text=True,
                           timeout=time_left())
    except subprocess.TimeoutExpired:
        return [{"label": "rust bench", "note": "timed out (time budget)"}]
    if p.returncode != 0:
        return [{"label": "rust bench", "note": (p.stderr.strip().splitlines() or ["failed"])[-1]}]
    got: dict = {}
    for m in json.loads(p.stdout):
        res = m["result"]
        cell = got.setdefault(m["probe"], {})
        if "Ok" in res:
            cell[m["cache"]] = res["Ok"]["gb_per_s"]
        else:
            cell.setdefault("errors", []).append(f"{m['cache']}: {res['Err']}")
    labels = {"disk": "bench: disk O_DIRECT, no copy (transfer)", "gds": "bench: GDS (transfer)",
              "compat": "bench: cuFile compat (transfer)", "bounce": "bench: bounce buffers (transfer)",
              "plain": "bench: plain read + copy (transfer)"}
    return [{"label": labels[k], "cold": got.get(k, {}).get("cold"), "warm": got.get(k, {}).get("warm"),
             "note": "; ".join(got.get(k, {}).get("errors", []))} for k in labels]


def write_tiny(path: Path) -> None:
    from safetensors.torch import save_file
    import torch

    save_file({"x": torch.arange(1 << 18, dtype=torch.float32)}, str(path))


def full(args) -> int:
    import torch
    import tierfs_gpu
    from safetensors.torch import load_file as st_load

    if not torch.cuda.is_available():
        reason = "torch sees no CUDA device"
        try:
            tierfs_gpu._check_device(tierfs_gpu._library(), 0)
        except tierfs_gpu.TierfsGpuError as e:
            reason = str(e)
        print(f"device-check: no GPU here ({reason}); nothing measured. "
              f"Run with --dry-run to check the parts that need none.")
        return 2
    write_checkpoint(args.path, int(args.gib * GiB))
    tiny = args.dir / "tiny.safetensors"
    write_tiny(tiny)
    torch.zeros(1, device="cuda")
    h2d = h2d_ceiling()
    log(f"pinned H2D ceiling {h2d:.2f} GB/s")
    size = args.path.stat().st_size
    base, ref_sd = {}, None
    for cache in ("cold", "warm"):
        prepare(args.path, cache)
        ref_sd, s = timed(lambda: st_load(str(args.path), device="cuda"))
        base[cache] = size / s / 1e9
        log(f"safetensors {cache}: {base[cache]:.2f} GB/s")
    ref = args.dir / "ref-checksums.json"
    ref.write_text(json.dumps(checksums(ref_sd)))
    ours = tierfs_gpu.load_file(args.path, device="cuda:0", gds="auto")
    strict = same_bytes(ours, ref_sd) and aligned(ours)
    log(f"gds=auto vs safetensors, tensor by tensor: {'bit-exact' if strict else 'DIFFERENT'}")
    del ours, ref_sd
    torch.cuda.empty_cache()
    disk = disk_speed(args)
    rows = [{"label": "safetensors.torch.load_file(device='cuda')", "cold": base["cold"],
             "warm": base["warm"], "exact": "reference", "note": "mmap + per-tensor copies"},
            {"label": "disk read only (8 threads, no copy)", "cold": disk.get("cold"),
             "warm": disk.get("warm"), "note": disk.get("note", "cold: O_DIRECT; warm: page cache")}]
    rows += route_rows(args, ref, tiny)
    rows[2]["exact"] += " (full)" if strict else " (full compare: NO)"
    rows += bench_rows(args)
    print()
    print(f"tierfs-gpu device check: {args.path} ({size / GiB:.2f} GiB), {torch.cuda.get_device_name(0)}; "
          f"GB/s = file bytes / wall seconds (python rows), tensor bytes / transfer seconds (bench rows)")
    print(table(rows, h2d, base, disk))
    ok = strict and all(r.get("exact", "-") in ("-", "reference") or r["exact"].startswith("yes") for r in rows)
    return 0 if ok else 1


def dry_run(args) -> int:
    import torch
    import tierfs_gpu
    from safetensors.torch import load_file as st_load

    write_checkpoint(args.path, int(args.gib * GiB))
    ref = st_load(str(args.path), device="cpu")
    problems = []
    for cache in ("cold", "warm"):
        prepare(args.path, cache)
        sd, s = timed(lambda: tierfs_gpu.load_file(args.path, device="cpu", gds="off"))
        rep = tierfs_gpu.last_report()
        ok = same_bytes(sd, ref) and aligned(sd)
        log(f"host load {cache}: {args.path.stat().st_size / s / 1e9:.2f} GB/s, read {rep['read_mode']}, "
            f"{'bit-exact' if ok else 'DIFFERENT'}")
        if not ok:
            problems.append(f"host load {cache} differs from safetensors")
    for cmd in (["load", str(args.path)], ["bench", str(args.path)]):
        p = subprocess.run([args.bin, *cmd], capture_output=True, text=True)
        lines = p.stderr.strip().splitlines()
        log(f"tierfs-gpu {cmd[0]} without a GPU: exit {p.returncode}: {lines[-1] if lines else ''}")
        if p.returncode == 0 or len(lines) != 1 or "panicked" in p.stderr:
            problems.append(f"tierfs-gpu {cmd[0]} did not fail in one sentence")
    print()
    print("dry run (no GPU): the table the device check fills")
    print(table([{"label": ROUTE_LABEL[r], "key": r} for r in ROUTES], None, {}, {}))
    for p in problems:
        print(f"PROBLEM: {p}")
    print("dry run: " + ("ok" if not problems else "FAILED"))
    return 0 if not problems else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["full", "dry-run", "child"])
    ap.add_argument("--path", type=Path)
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--bin", default="tierfs-gpu")
    ap.add_argument("--route")
    ap.add_argument("--cache")
    ap.add_argument("--ref")
    ap.add_argument("--tiny")
    args = ap.parse_args()
    if args.mode == "child":
        child(args)
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    args.path = args.dir / ("check.safetensors" if args.mode == "full" else "dry.safetensors")
    return full(args) if args.mode == "full" else dry_run(args)


if __name__ == "__main__":
    sys.exit(main())
