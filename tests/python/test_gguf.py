"""GGUF index against an independent reader: ``tierfs inspect --json`` vs gguf-py's ``GGUFReader``.

Differential check: a few hundred small files, half written by gguf-py's
``GGUFWriter`` with random key/values (scalars, strings, arrays, nested arrays), alignments, ggml
types and shapes (:func:`gen_gguf.random_gguf`), half hostile variants of those (bytes
overwritten in the header, counts and lengths replaced by 0 / 2^31 / 2^63 / 2^64-1, cut-short
files: :func:`gen_gguf.mutate`).  For each file:

* if tierfs accepts it, gguf-py must accept it with exactly the same tensors: names, ggml types,
  dimensions, absolute start offsets and byte sizes;
* if gguf-py accepts it and tierfs does not, the reason tierfs gives must be one of its
  documented stricter rules (``core/src/index/gguf.rs``): overlapping tensors, an (empty) tensor
  outside the file, a shape whose element count overflows 64 bits, big-endian, deep nesting, or
  a header cut short by end of file when gguf-py sees no tensors (gguf-py reads past end of file
  as empty arrays and so accepts a file cut inside its key/values).

Both accepting and both rejecting are counted and printed; the test fails if either outcome
never happened (a differential check that never compares is no check).

gguf-py itself is not safe on hostile input: an array whose count says 2^63 but whose elements
lie past end of file makes it loop without end (a read past the end of its memory map returns
an empty array, so its offset stops advancing).  Each reference read therefore runs under a
:data:`REFERENCE_LIMIT_S` alarm; a file it does not finish counts as rejected by gguf-py (tierfs
must then reject it too, which it does in microseconds: every element it skips consumes bytes).  The seed is fixed
(``TIERFS_GGUF_SEED`` overrides it) so a failure reproduces.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gen_gguf
from conftest import TIERFS_BIN, fresh_dir

N_VALID = 150
N_MUTATED = 450
REFERENCE_LIMIT_S = 2.0
STRICTER = ("overlap", "past end of file", "overflows", "big-endian", "nests arrays deeper")


class ReferenceHung(Exception):
    pass


def _alarm(_sig, _frame):
    raise ReferenceHung(f"gguf-py did not finish in {REFERENCE_LIMIT_S} s")


def reference(path: Path):
    """gguf-py's view: sorted [(name, type, dims, start, end)], or the exception it raised."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, REFERENCE_LIMIT_S)
    try:
        return sorted(gen_gguf.gguf_tensors(path))
    except Exception as e:  # noqa: BLE001 - any failure of the reference reader is a rejection
        return e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def ours(path: Path):
    """tierfs' view: sorted [(name, type, dims, start, end)], or the error it printed."""
    r = subprocess.run([str(TIERFS_BIN), "inspect", "--json", str(path)],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return r.stderr.strip() or f"exit {r.returncode}"
    idx = json.loads(r.stdout)
    assert idx["format"] == "gguf", idx["format"]
    return sorted((t["name"], t["dtype"], tuple(t["shape"]), t["start"], t["end"]) for t in idx["tensors"])


@pytest.mark.timeout(120)
def test_inspect_matches_gguf_py_on_random_and_hostile_files(tierfs_bin):
    seed = int(os.environ.get("TIERFS_GGUF_SEED", "12"))
    rng = np.random.default_rng(seed)
    d = fresh_dir("gguf-diff")
    files = []
    for i in range(N_VALID):
        p = d / f"valid{i}.gguf"
        gen_gguf.random_gguf(p, rng)
        files.append(p)
    for i in range(N_MUTATED):
        p = d / f"mutated{i}.gguf"
        p.write_bytes(gen_gguf.mutate(files[i % N_VALID].read_bytes(), rng))
        files.append(p)

    outcome = {"both accept": 0, "both reject": 0, "only gguf-py accepts": 0, "gguf-py hung": 0}
    problems = []
    for p in files:
        want, got = reference(p), ours(p)
        if isinstance(got, list):
            if isinstance(want, Exception):
                problems.append(f"{p.name}: tierfs accepts, gguf-py rejects ({want!r})")
            elif got != want:
                problems.append(f"{p.name}: tensors differ: tierfs {got[:3]} gguf-py {want[:3]}")
            else:
                outcome["both accept"] += 1
        elif isinstance(want, list):
            outcome["only gguf-py accepts"] += 1
            cut = want == [] and "truncated" in got
            if not cut and not any(reason in got for reason in STRICTER):
                problems.append(f"{p.name}: tierfs rejects ({got}), gguf-py accepts")
        else:
            outcome["both reject"] += 1
            outcome["gguf-py hung"] += isinstance(want, ReferenceHung)
    print(f"\n{len(files)} files (seed {seed}): {outcome}")
    assert not problems, f"{len(problems)} differences: {problems[:8]}"
    assert outcome["both accept"] >= N_VALID, outcome  # every generated valid file, at least
    assert outcome["both reject"] >= N_MUTATED // 4, outcome


@pytest.mark.timeout(60)
def test_inspect_shows_blocks_of_llama_and_dit_files(tierfs_bin):
    d = fresh_dir("gguf-inspect")
    llama = gen_gguf.make_llama_gguf(d / "llama.gguf", dim=256, ffn=512, n_blocks=3, vocab=1000)
    dit = gen_gguf.make_dit_gguf(d / "flux.gguf", dim=256, n_double=2, n_single=3)
    out = subprocess.run([str(tierfs_bin), "inspect", str(llama)], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    for block in ("(other)", "blk.0", "blk.1", "blk.2"):
        assert f"  {block} " in out, out[:2000]
    idx = json.loads(subprocess.run([str(tierfs_bin), "inspect", "--json", str(dit)], capture_output=True,
                                    text=True, timeout=30, check=True).stdout)
    names = [b["name"] for b in idx["blocks"]]
    assert names == ["(other)", "double_blocks.0", "double_blocks.1", "single_blocks.0",
                     "single_blocks.1", "single_blocks.2"], names
    assert idx["metadata"]["general.architecture"] == "flux"
    assert idx["header_bytes"] % 32 == 0
    # A file that is not GGUF inside is refused with the reason.
    bad = d / "bad.gguf"
    bad.write_bytes(b"GGML" + llama.read_bytes()[4:4096])
    r = subprocess.run([str(tierfs_bin), "inspect", str(bad)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "not a GGUF file" in r.stderr, r.stderr
