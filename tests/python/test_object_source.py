"""tierfs mounting an object store's prefix itself: `tierfs mount s3://BUCKET/PREFIX`.

Stack: SeaweedFS (`weed server -filer -s3`) in a network namespace of its own, its S3 gateway
behind the delay proxy on a shaped loopback link (tests/bench/netstore.py); objects are put
with `rclone copyto`; tierfs runs in the namespace (`nsenter --net`) and reads the gateway
itself, its mount visible to the test as any mount.  The proxy counts the bytes that cross
the link: the network bytes of the checks below.

What is checked, against the original files' bytes: the prefix is a read-only tree of
directories and files; a model larger than the budget is served from the chunk cache, exact,
twice; another file reads exactly; a replaced object is a new file, and a handle open on the
old version never gets the new version's bytes; with a disk tier, a second mount after a
restart reads the model without the network; wrong credentials and a missing bucket stop the
mount with an error that says so, in bounded time, leaving no mount.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gen
import gen_gguf
from conftest import TIERFS_BIN, drop_caches, fresh_dir, is_mounted, weed_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import netstore  # noqa: E402

pytestmark = pytest.mark.timeout(300)

MiB = 1 << 20
# 66 MiB of model through a 56 MiB budget: served from the chunk cache, with evictions.
BUDGET_BELOW = "56MiB"
# A budget the model fits in (for the disk tier's whole copy).
BUDGET_ABOVE = "160MiB"
# The link: 1 Gbit/s, 1 ms per request through the proxy.
LINK_BPS = 1_000_000_000
# The longest a failing mount may take to say why: the client's retries of a refused request.
FAIL_BOUND_S = 90.0
# The stem of the sharded model's files (`STEM-0000N-of-00003.safetensors`, `STEM.safetensors.index.json`).
SHARD_STEM = "diffusion_pytorch_model"
# Network bytes a second mount may move when everything is in its disk tier: listings, HEADs
# and the headers of a few requests, never the model.
QUIET_NETWORK_BYTES = 2 * MiB


def _model(path: Path, seed: int) -> bytes:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        gen.write_small(path, gen.dit_specs(512, 2048, 8, ("BF16",)), seed=seed)
    return path.read_bytes()


@pytest.fixture(scope="module")
def files(data_dir) -> dict[str, Path]:
    """The files put in the store: a ~66 MiB DiT, a second version of it (same size, other
    bytes), a small config in a subfolder; a ~100 MiB DiT of real proportions (2 MiB attention
    weights, 8 MiB feed-forward ones) laid out in name order, as writers do."""
    d = data_dir / "object_source"
    _model(d / "dit.safetensors", 71)
    _model(d / "dit.v2.safetensors", 72)
    wide = d / "dit_wide.safetensors"
    if not wide.exists():
        gen.write_small(wide, sorted(gen.dit_specs(1024, 4096, 3), key=lambda s: s[0]), seed=74)
    cfg = d / "config.json"
    cfg.write_text('{"_class_name": "WanTransformer3DModel", "num_layers": 8}\n')
    gen_gguf.make_sharded(d / "sharded", SHARD_STEM, gen.dit_specs(256, 512, 4), 3, seed=73)
    gguf = d / "flux.gguf"
    if not gguf.exists():
        gen_gguf.make_dit_gguf(gguf, dim=256, n_double=2, n_single=3)
    return {"model": d / "dit.safetensors", "model_v2": d / "dit.v2.safetensors", "config": cfg,
            "sharded": d / "sharded", "gguf": gguf, "wide": wide}


@pytest.fixture(scope="module")
def s3(files):
    """A SeaweedFS with its S3 gateway, the files under `models/` of its bucket."""
    with weed_store("s3store", delay_ms=1.0, rate_bps=LINK_BPS, client="rclone") as store:
        store.put(files["model"], "models/unet/dit.safetensors")
        store.put(files["config"], "models/unet/config.json")
        store.put(files["model"], "replaced/dit.safetensors")
        for f in sorted(files["sharded"].iterdir()):
            store.put(f, f"formats/sharded/{f.name}")
        store.put(files["gguf"], "formats/flux.gguf")
        store.put(files["wide"], "wide/dit.safetensors")
        yield store


def _env(key: str = netstore.S3_KEY, secret: str = netstore.S3_SECRET) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret)
    return env


def _mount_s3(mount, store, prefix: str, budget: str, extra: tuple[str, ...] = ()):
    return mount(f"s3://{netstore.S3_BUCKET}/{prefix}", budget=budget,
                 extra=("--endpoint", store._s3_endpoint(), *extra),
                 wrap=tuple(store.ns.cmd()), env=_env())


def _network(store) -> int:
    return store.stats.total()


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_a_prefix_is_a_read_only_tree_and_a_model_larger_than_the_budget_reads_bit_exact(s3, files, mount):
    m = _mount_s3(mount, s3, "models", BUDGET_BELOW)
    assert sorted(n for n in os.listdir(m.mnt) if n != ".tierfs") == ["unet"]
    assert sorted(os.listdir(m.mnt / "unet")) == ["config.json", "dit.safetensors"]
    st = os.stat(m.mnt / "unet" / "dit.safetensors")
    want = files["model"].read_bytes()
    assert st.st_size == len(want)
    assert st.st_mode & 0o777 == 0o444 and os.stat(m.mnt / "unet").st_mode & 0o777 == 0o555
    assert _read(m.mnt / "unet" / "config.json") == files["config"].read_bytes()
    with pytest.raises(OSError) as e:
        open(m.mnt / "unet" / "new.txt", "wb")
    assert e.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)

    before = _network(s3)
    drop_caches()
    t0 = time.monotonic()
    assert _read(m.mnt / "unet" / "dit.safetensors") == want, "first pass differs"
    first_s = time.monotonic() - t0
    moved = _network(s3) - before
    drop_caches()
    assert _read(m.mnt / "unet" / "dit.safetensors") == want, "second pass differs"
    row = m.file_stats("unet/dit.safetensors")
    assert row is not None and row["mode"] == "cache", row
    kinds = [d.get("storage") for d in m.stats().get("sources", [])]
    print(f"\nfirst pass {first_s:.2f} s, {moved / len(want):.2f} of the model over the network; "
          f"mode reason: {row.get('mode_reason')}; sources {kinds}")
    assert moved >= len(want), "the model did not come over the network"
    assert os.getxattr(m.mnt / "unet" / "dit.safetensors", "user.tierfs.source") == \
        f"s3://{netstore.S3_BUCKET}/models/unet/dit.safetensors".encode()


def test_a_replaced_object_is_a_new_file_never_a_mix_of_versions(s3, files, mount):
    old, new = files["model"].read_bytes(), files["model_v2"].read_bytes()
    assert len(old) == len(new) and old != new
    m = _mount_s3(mount, s3, "replaced", BUDGET_BELOW, extra=("--listing-ttl", "1s"))
    path = m.mnt / "dit.safetensors"
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, 4 * MiB, 0)
        assert head == old[:len(head)]
        s3.put(files["model_v2"], "replaced/dit.safetensors")
        # The handle of the old version: the old bytes or an error, never the new version's.
        at, failed = len(head), None
        while at < len(old):
            try:
                got = os.pread(fd, 8 * MiB, at)
            except OSError as e:
                failed = e
                break
            if not got:
                break
            assert got == old[at:at + len(got)], f"the old handle got other bytes at {at}"
            at += len(got)
        print(f"\nthe old handle read {at / MiB:.1f} MiB of the old version, then {failed!r}")
    finally:
        os.close(fd)
    # Once the listing is older than its lifetime, the path is the new version, read exactly.
    deadline = time.monotonic() + 30
    while True:
        try:
            got = _read(path)
        except OSError as e:  # the kernel's entry of the old object, looked up again
            if time.monotonic() > deadline:
                raise
            print(f"reading the new version: {e!r}, again")
            time.sleep(1)
            continue
        if got == new:
            break
        assert got == old, "a read of the path mixed two versions"
        assert time.monotonic() < deadline, "the new version never appeared"
        time.sleep(1)


def test_with_a_disk_tier_a_second_mount_reads_the_model_without_the_network(s3, files, mount):
    want = files["model"].read_bytes()
    tier = fresh_dir("object_tier")
    extra = ("--disk-cache", str(tier), "--disk-cache-size", "200MiB")
    m = _mount_s3(mount, s3, "models", BUDGET_ABOVE, extra=extra)
    assert _read(m.mnt / "unet" / "dit.safetensors") == want
    assert m.close() == 0
    drop_caches()
    m = _mount_s3(mount, s3, "models", BUDGET_ABOVE, extra=extra)
    before = _network(s3)
    t0 = time.monotonic()
    assert _read(m.mnt / "unet" / "dit.safetensors") == want, "the model read from the tier differs"
    took = time.monotonic() - t0
    moved = _network(s3) - before
    row = m.file_stats("unet/dit.safetensors")
    print(f"\nsecond mount: {took:.2f} s, {moved} network bytes; mode {row and row['mode']}, "
          f"{row and row.get('mode_reason')}; disk tier {m.stats().get('disk_tier')}")
    assert moved < QUIET_NETWORK_BYTES, f"the second mount moved {moved} bytes over the network"


@pytest.mark.parametrize("case", ["wrong_credentials", "missing_bucket"])
def test_wrong_credentials_or_a_missing_bucket_stop_the_mount_with_a_clear_error(s3, case):
    mnt = fresh_dir("mnt_refused")
    if case == "wrong_credentials":
        url, env, says = f"s3://{netstore.S3_BUCKET}/models", _env(secret="not-the-secret"), "credential"
    else:
        url, env, says = "s3://no-such-bucket/models", _env(), "no-such-bucket"
    cmd = [*s3.ns.cmd(), str(TIERFS_BIN), "mount", url, str(mnt), "--ram-cache", BUDGET_BELOW,
           "--endpoint", s3._s3_endpoint(), "--no-state"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=FAIL_BOUND_S + 30)
    took = time.monotonic() - t0
    text = out.stdout + out.stderr
    print(f"\n{case}: exit {out.returncode} after {took:.1f} s: {text.strip()[-400:]}")
    assert out.returncode != 0
    assert says in text.lower(), text
    assert "panicked" not in text
    assert took < FAIL_BOUND_S
    assert not is_mounted(mnt)


def test_a_sharded_model_and_a_gguf_file_in_the_bucket_are_served_as_from_a_folder(s3, files, mount):
    """The shards of a model with its index.json, found in the bucket's listing and read by
    ranged requests, are one model; a GGUF file is indexed by its own header; bytes exact."""
    m = _mount_s3(mount, s3, "formats", BUDGET_BELOW)
    names = sorted(p.name for p in files["sharded"].iterdir())
    assert sorted(os.listdir(m.mnt / "sharded")) == names
    for name in names:
        assert _read(m.mnt / "sharded" / name) == (files["sharded"] / name).read_bytes(), name
    assert _read(m.mnt / "flux.gguf") == files["gguf"].read_bytes()
    st = m.stats()
    index = f"sharded/{SHARD_STEM}.safetensors.index.json"
    models = [x for x in st["models"] if x["name"] == index]
    assert len(models) == 1, st["models"]
    model = models[0]
    assert model["found_by"] == "index_json", model
    shard_files = [n for n in names if n.endswith(".safetensors")]
    assert [x["path"] for x in model["shards"]] == [f"sharded/{n}" for n in shard_files], model
    rows = {f["path"]: f for f in st["files"]}
    for n in shard_files:
        assert rows[f"sharded/{n}"]["model"] == index and not rows[f"sharded/{n}"]["malformed"], rows[f"sharded/{n}"]
    gguf = rows["flux.gguf"]
    assert not gguf["malformed"] and gguf["tensors"] > 0 and gguf["blocks"] > 1, gguf


def test_comfyuis_touches_of_a_model_larger_than_the_budget_are_read_ahead_in_parallel(s3, files, mount):
    """ComfyUI's load of a model larger than the budget, through `s3://`: its touches stay
    exact (the model cannot be warmed), and each one that reaches the store reads the next
    touches ahead, in parallel, so that most are served from those ranges instead of a round
    trip each. Bit-exact; what was read ahead and not asked for is bounded."""
    import torch
    from safetensors import safe_open
    want = files["wide"].read_bytes()
    assert len(want) > 1.5 * 56 * MiB
    m = _mount_s3(mount, s3, "wide", BUDGET_BELOW)
    path = m.mnt / "dit.safetensors"
    drop_caches()
    n0 = _network(s3)
    with safe_open(str(path), framework="pt") as f:
        sd = {k: f.get_tensor(k) for k in sorted(f.keys())}
    touches = m.stats()["disk"]
    touched = _network(s3) - n0
    starts = {name: start for name, start, _ in gen.tensor_ranges(files["wide"])}
    out = b"".join(bytes(sd[k].reshape(-1).view(torch.uint8).numpy()) for k in sorted(sd, key=lambda k: starts[k]))
    moved = _network(s3) - n0
    assert out == want[len(want) - len(out):], "the tensors' bytes differ from the object's"
    print(f"\ntouches {touched / len(want):.3f}x, load {moved / len(want):.3f}x the model over the network; {touches}")
    served, exact, ahead = (touches["touch_ahead_served_bytes"], touches["probe_bytes"], touches["touch_ahead_bytes"])
    assert served >= 3 * exact, f"most touches served from ranges read ahead: {touches}"
    assert ahead <= 1.5 * served, f"what was read ahead is what the touches asked for: {touches}"
    assert moved <= 1.25 * len(want), f"{moved / len(want):.2f}x the model over the network"


def test_comfyuis_touches_of_a_model_that_fits_warm_it_and_the_copies_fetch_nothing_more(s3, files, mount):
    """ComfyUI's load (torch `safe_open`: a view of every tensor in name order, each touching
    its first pages; then the copies) of a model that fits the budget, through `s3://`: after
    its first touches the model is warmed into the cache, the later touches are served from
    it, and the copies that follow fetch nothing more. Bit-exact; the network bytes are the
    proxy's count."""
    import torch
    from safetensors import safe_open
    want = files["model"].read_bytes()
    m = _mount_s3(mount, s3, "models", BUDGET_ABOVE)
    path = m.mnt / "unet" / "dit.safetensors"
    drop_caches()
    n0 = _network(s3)
    with safe_open(str(path), framework="pt") as f:
        sd = {k: f.get_tensor(k) for k in sorted(f.keys())}
    touched = _network(s3) - n0
    starts = {name: start for name, start, _ in gen.tensor_ranges(files["model"])}
    out = b"".join(bytes(sd[k].reshape(-1).view(torch.uint8).numpy()) for k in sorted(sd, key=lambda k: starts[k]))
    moved = _network(s3) - n0
    assert out == want[len(want) - len(out):], "the tensors' bytes differ from the object's"
    disk = m.stats()["disk"]
    print(f"\ntouches {touched / len(want):.3f}x, load {moved / len(want):.3f}x the model over the network; {disk}")
    assert disk["probe_cached_bytes"] > 0, disk
    assert moved <= 1.10 * len(want), f"{moved / len(want):.2f}x the model over the network"
