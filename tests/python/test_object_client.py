"""tierfs's object-store client against a real S3 server: `tierfs object-check`.

Stack: SeaweedFS (`weed server -filer -s3`) in a network namespace of its own, its S3 gateway
behind the delay proxy on a shaped loopback link (tests/bench/netstore.py; its rclone client puts
the objects with `rclone copyto`) -> `tierfs object-check s3://models/ckpt/` run inside the
namespace (`nsenter --net`), the store's keys in its environment, nothing of the machine's AWS
configuration (the shared files point at nothing).

What is checked, with real bytes and every wait bounded:

* a ~40 MiB random object read whole through the parallel ranged reads equals its file bit for
  bit (`--compare`), and a file that differs in one byte is reported, with its offset (exit 1);
* the listing is a tree: the objects, bytes and directories of nested keys under the prefix,
  a key outside the prefix left out, a nested object read by its path;
* wrong credentials (a wrong secret, an unknown key id) fail at once with exit 2 and a message
  naming the credentials; a missing bucket with exit 2 naming the bucket; an endpoint nobody
  listens on with exit 2 after the bounded retries;
* credentials and the endpoint come from the AWS shared files too: a profile chosen with
  `--profile` or `AWS_PROFILE` gives the keys (credentials file) and the region and endpoint
  (config file), and the default profile's wrong keys are refused;
* an object replaced between its listing and its read is refused (exit 2, "changed"): the
  hidden `--hold PATH` stops object-check after it has the object's version, the test replaces
  the object with other bytes of the same size, and every ranged GET, conditional on the listed
  ETag, fails; the next check reads the new bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TIERFS_BIN, fresh_dir, weed_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import netstore  # noqa: E402

pytestmark = pytest.mark.timeout(420)

MiB = 1 << 20
# The large object: ~40 MiB, not a multiple of any part size.
BIG_BYTES = 40 * MiB + 12345
# Per request on the link: a nearby store's round trip.
DELAY_MS = 2.0
BUCKET = netstore.S3_BUCKET
PREFIX = "ckpt"
# The objects under the prefix (path relative to it -> size), and one outside it.
NESTED = {
    "nested/a/one.bin": MiB + 7,
    "nested/a/b/two.bin": 300 << 10,
    "nested/c/three.bin": 5,
    "swap.bin": 3 * MiB,
}
OUTSIDE = "other/outside.bin"
# Directories of the tree under the prefix: the root, nested, nested/a, nested/a/b, nested/c.
DIRS = 5
# A healthy object-check of ~40 MiB on a loaded 2-core machine that also runs the store.
CHECK_BOUND_S = 120.0
# What a refused request may take: one round trip, the client's start, a loaded machine.
REFUSED_BOUND_S = 15.0
# An endpoint nobody listens on: refused connections are retried (5 retries, backoff 0.25 s
# doubling, jitter), about 10 s, then reported.
UNREACHABLE_BOUND_S = 40.0
# How long the test waits for `--hold` to say object-check has the version.
HOLD_BOUND_S = 60.0


def _env(**override: str) -> dict[str, str]:
    """object-check's environment: the store's keys, no AWS configuration of the machine's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({
        "AWS_ACCESS_KEY_ID": netstore.S3_KEY,
        "AWS_SECRET_ACCESS_KEY": netstore.S3_SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
        "TIERFS_LOG": "warn",
        "RUST_BACKTRACE": "0",
    })
    env.update(override)
    return env


def _argv(store: netstore.WeedStore, url: str, *args: str) -> list[str]:
    return store.ns.cmd(str(TIERFS_BIN), "object-check", url, "--endpoint", store._s3_endpoint(), *args)


def _check(store: netstore.WeedStore, *args: str, url: str = f"s3://{BUCKET}/{PREFIX}/",
           bound: float = CHECK_BOUND_S, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """Runs object-check in the store's namespace; (the process, seconds). A run past `bound`
    is killed (subprocess.run) and fails the test."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(_argv(store, url, *args), capture_output=True, text=True, timeout=bound,
                           env=_env(**env))
    except subprocess.TimeoutExpired:
        pytest.fail(f"object-check {' '.join(args)} ran past {bound} s")
    took = time.monotonic() - t0
    print(f"\n$ object-check {url} {' '.join(args)}  ->  exit {p.returncode} in {took:.2f} s\n"
          f"{p.stdout}{p.stderr}", end="")
    assert "panicked" not in p.stderr and "RUST_BACKTRACE" not in p.stderr, p.stderr
    return p, took


def _json(p: subprocess.CompletedProcess) -> dict:
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"--json prints one line: {p.stdout!r}"
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    """The local files whose copies are put into the store, by key."""
    d = fresh_dir("objfiles")
    out: dict[str, Path] = {}
    for i, (rel, size) in enumerate({"big.bin": BIG_BYTES, **NESTED, OUTSIDE: 4096}.items()):
        p = d / f"{i}.bin"
        p.write_bytes(os.urandom(size))
        key = rel if rel == OUTSIDE else f"{PREFIX}/{rel}"
        out[key] = p
    return out


@pytest.fixture(scope="module")
def store(files):
    """SeaweedFS with its S3 gateway behind a 1 Gbit/s link, DELAY_MS per request, the objects
    put in with rclone."""
    with weed_store("objstore", delay_ms=DELAY_MS, client="rclone") as s:
        for key, path in files.items():
            s.put(path, key)
        yield s


# ----------------------------------------------------------------------------- tests

def test_reads_large_object_bit_for_bit(store, files):
    big = files[f"{PREFIX}/big.bin"]
    p, _ = _check(store, "--compare", str(big), "--json")
    assert p.returncode == 0, p.stderr
    r = _json(p)
    assert r["object"] == f"{PREFIX}/big.bin" and r["object_bytes"] == BIG_BYTES, r
    assert r["compare"] == "equal" and r["first_difference"] is None, r
    assert r["mb_per_s"] > 0 and r["read_secs"] > 0, r
    assert 0 < r["latency_min_ms"] <= r["latency_median_ms"], r
    assert r["latency_min_ms"] >= DELAY_MS, f"a GET through the proxy takes its delay at least: {r}"
    # 40 MiB in parts of 1..16 MiB, at most 16 at a time: more than one GET, each counted.
    assert r["requests"] >= 3 + r["latency_probes"], r
    print(f"\nobject-check figures: {r['mb_per_s']:.1f} MB/s for {BIG_BYTES} bytes in {r['read_secs']:.3f} s, "
          f"latency min {r['latency_min_ms']:.2f} ms median {r['latency_median_ms']:.2f} ms, "
          f"{r['requests']} GETs, parts {r['part_size']} B")
    # The human form says the same.
    p, _ = _check(store, "--compare", str(big))
    assert p.returncode == 0, p.stderr
    assert "bytes equal to" in p.stdout and "MB/s" in p.stdout and "latency" in p.stdout, p.stdout


def test_difference_is_reported_with_its_offset(store, files):
    big = files[f"{PREFIX}/big.bin"]
    wrong = fresh_dir("objwrong") / "big.bin"
    data = bytearray(big.read_bytes())
    at = 33 * MiB + 4321  # in a later part, not the first
    data[at] ^= 0x5A
    wrong.write_bytes(bytes(data))
    p, _ = _check(store, "--compare", str(wrong), "--json")
    assert p.returncode == 1, p.stderr
    assert f"first difference at byte {at}" in p.stderr, p.stderr
    r = _json(p)
    assert r["compare"] == "different" and r["first_difference"] == at, r


def test_listing_is_a_tree(store, files):
    p, _ = _check(store, "--json", "--object", "nested/a/b/two.bin",
                  "--compare", str(files[f"{PREFIX}/nested/a/b/two.bin"]))
    assert p.returncode == 0, p.stderr
    r = _json(p)
    want_bytes = BIG_BYTES + sum(NESTED.values())
    assert r["objects"] == 1 + len(NESTED), r
    assert r["bytes"] == want_bytes, r
    assert r["dirs"] == DIRS, r
    assert r["object"] == f"{PREFIX}/nested/a/b/two.bin" and r["compare"] == "equal", r
    # The whole bucket: the object outside the prefix too, and the prefix as a directory.
    p, _ = _check(store, "--json", "--object", f"{PREFIX}/nested/c/three.bin", url=f"s3://{BUCKET}")
    assert p.returncode == 0, p.stderr
    r = _json(p)
    assert r["objects"] == 2 + len(NESTED) and r["bytes"] == want_bytes + 4096, r
    assert r["dirs"] == DIRS + 2, r  # + the prefix and other/
    # A deeper prefix lists only what is under it.
    p, _ = _check(store, "--json", url=f"s3://{BUCKET}/{PREFIX}/nested/a")
    assert p.returncode == 0, p.stderr
    r = _json(p)
    assert r["objects"] == 2 and r["bytes"] == NESTED["nested/a/one.bin"] + NESTED["nested/a/b/two.bin"], r
    assert r["object"] == f"{PREFIX}/nested/a/one.bin", "the largest object is read by default"
    # An object that is not there: exit 2, naming it.
    p, _ = _check(store, "--object", "nested/missing.bin")
    assert p.returncode == 2 and "nested/missing.bin" in p.stderr, p.stderr


def test_wrong_credentials_fail_fast(store):
    for override in ({"AWS_SECRET_ACCESS_KEY": "not-the-secret"},
                     {"AWS_ACCESS_KEY_ID": "nobody", "AWS_SECRET_ACCESS_KEY": "nothing"}):
        p, took = _check(store, "--json", bound=REFUSED_BOUND_S * 2, **override)
        assert p.returncode == 2, (override, p.stderr)
        assert "credentials" in p.stderr and "access denied" in p.stderr, p.stderr
        assert p.stdout == "", "no figures for a failed check"
        assert took <= REFUSED_BOUND_S, f"refused after {took:.2f} s (bound {REFUSED_BOUND_S} s)"


def test_missing_bucket_is_named(store):
    p, took = _check(store, url="s3://no-such-bucket/x/", bound=REFUSED_BOUND_S * 2)
    assert p.returncode == 2, p.stderr
    assert "bucket no-such-bucket does not exist" in p.stderr, p.stderr
    assert took <= REFUSED_BOUND_S, f"answered after {took:.2f} s"


def test_unreachable_endpoint_fails_in_bounded_time(store):
    t0 = time.monotonic()
    argv = store.ns.cmd(str(TIERFS_BIN), "object-check", f"s3://{BUCKET}/", "--endpoint", "http://127.0.0.1:9")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=UNREACHABLE_BOUND_S * 2, env=_env())
    took = time.monotonic() - t0
    print(f"\nunreachable endpoint: exit {p.returncode} after {took:.2f} s: {p.stderr.strip()}")
    assert p.returncode == 2, p.stderr
    assert "cannot reach the object store at http://127.0.0.1:9" in p.stderr, p.stderr
    assert took <= UNREACHABLE_BOUND_S, f"answered after {took:.2f} s"


def test_replaced_object_is_refused_then_read_anew(store, files):
    key = f"{PREFIX}/swap.bin"
    old = files[key]
    new = fresh_dir("objswap") / "swap.bin"
    new.write_bytes(os.urandom(NESTED["swap.bin"]))  # the same size: only the ETag tells
    hold = fresh_dir("objhold") / "hold"
    proc = subprocess.Popen(_argv(store, f"s3://{BUCKET}/{PREFIX}/", "--object", "swap.bin", "--compare",
                                  str(old), "--hold", str(hold)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + HOLD_BOUND_S
        while not hold.exists():
            assert proc.poll() is None, f"object-check ended before holding: {proc.communicate()}"
            assert time.monotonic() < deadline, f"object-check did not hold within {HOLD_BOUND_S} s"
            time.sleep(0.05)
        store.put(new, key)  # rclone copyto: a new version of the object under the same key
        hold.unlink()
        out, err = proc.communicate(timeout=CHECK_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    print(f"\nreplaced while held: exit {proc.returncode}: {err.strip()}")
    assert proc.returncode == 2, (out, err)
    assert "changed since it was listed" in err and key in err, err
    # The next check lists the new version and reads its bytes.
    p, _ = _check(store, "--object", "swap.bin", "--compare", str(new), "--json")
    assert p.returncode == 0, p.stderr
    assert _json(p)["compare"] == "equal"
    files[key] = new


def test_profiles_of_the_shared_files(store, files):
    d = fresh_dir("objaws")
    creds, config = d / "credentials", d / "config"
    creds.write_text("[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n\n"
                     f"[store]\naws_access_key_id = {netstore.S3_KEY}\n"
                     f"aws_secret_access_key = {netstore.S3_SECRET}\n")
    config.write_text("[default]\nregion = us-east-1\n"
                      f"endpoint_url = {store._s3_endpoint()}\n\n"
                      f"[profile store]\nregion = us-east-1\nendpoint_url = {store._s3_endpoint()}\n")
    env = _env(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(config))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        env.pop(name)
    want = files[f"{PREFIX}/nested/a/one.bin"]

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess:
        argv = store.ns.cmd(str(TIERFS_BIN), "object-check", f"s3://{BUCKET}/{PREFIX}/", "--object",
                            "nested/a/one.bin", "--compare", str(want), *args)  # no --endpoint
        p = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_BOUND_S, env={**env, **extra})
        print(f"\n$ object-check {' '.join(args)} {extra}  ->  exit {p.returncode}\n{p.stdout}{p.stderr}", end="")
        return p

    for p in (run("--profile", "store"), run(AWS_PROFILE="store")):
        assert p.returncode == 0, p.stderr
        assert f"at {store._s3_endpoint()}" in p.stdout and "bytes equal to" in p.stdout, p.stdout
    p = run()  # the default profile: its wrong keys
    assert p.returncode == 2 and "credentials" in p.stderr and "InvalidAccessKeyId" in p.stderr, p.stderr
