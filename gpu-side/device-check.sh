#!/usr/bin/env bash
# Device check of tierfs-gpu: one run, under 5 minutes on one H200 with 16 cores.
#
#   bash gpu-side/device-check.sh            # on a machine with an NVIDIA GPU
#   bash gpu-side/device-check.sh --dry-run  # anywhere: everything that needs no GPU
#
# Builds tierfs-gpu (or uses prebuilt binaries), writes an 8 GiB checkpoint, and prints a table:
# bit-exactness against safetensors.torch.load_file(device="cuda"), GB/s of each route (gds=auto,
# off, compat, on; and `tierfs-gpu bench`'s transfer-only figures and disk O_DIRECT speed), cold
# and warm, as ratios of that baseline and of the pinned host-to-device ceiling, and the
# goals as PASS/FAIL. Exit status: 0 all bit-exact, 1 a difference or failure, 2 no GPU.
#
# Environment:
#   TIERFS_GPU_CHECK_GIB   checkpoint size in GiB (default 8; 1/16 for --dry-run)
#   TIERFS_GPU_CHECK_DIR   where it is written (default /var/tmp/tierfs-gpu-check; needs 2x space)
#   TIERFS_GPU_BIN, TIERFS_GPU_LIB  prebuilt tierfs-gpu and libtierfs_gpu.so (for machines
#                          without cargo); else `cargo build --release -p tierfs-gpu` here
#   PYTHON                 a python with torch and safetensors (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

mode=full
case "${1:-}" in
    --dry-run) mode=dry-run ;;
    "") ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 64 ;;
esac

PY=${PYTHON:-python3}
DIR=${TIERFS_GPU_CHECK_DIR:-/var/tmp/tierfs-gpu-check}
if [ "$mode" = dry-run ]; then GIB=${TIERFS_GPU_CHECK_GIB:-0.0625}; else GIB=${TIERFS_GPU_CHECK_GIB:-8}; fi

if [ -n "${TIERFS_GPU_BIN:-}" ] && [ -n "${TIERFS_GPU_LIB:-}" ]; then
    BIN=$TIERFS_GPU_BIN
    export TIERFS_GPU_LIB
else
    if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
    if ! command -v cargo >/dev/null; then
        echo "device-check: no cargo here and TIERFS_GPU_BIN/TIERFS_GPU_LIB not set: build elsewhere and pass both" >&2
        exit 1
    fi
    echo "== cargo build --release -p tierfs-gpu"
    cargo build --release -p tierfs-gpu
    TARGET=${CARGO_TARGET_DIR:-$REPO/target}
    BIN=$TARGET/release/tierfs-gpu
    export TIERFS_GPU_LIB=$TARGET/release/libtierfs_gpu.so
fi
for f in "$BIN" "$TIERFS_GPU_LIB"; do
    [ -e "$f" ] || { echo "device-check: $f does not exist" >&2; exit 1; }
done

if ! "$PY" -c 'import torch, safetensors' 2>/dev/null; then
    echo "device-check: $PY lacks torch or safetensors" >&2
    exit 1
fi
if [ "$mode" = full ]; then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    [ -e /proc/driver/nvidia-fs/version ] && echo "nvidia-fs: $(cat /proc/driver/nvidia-fs/version | head -1)" || echo "nvidia-fs: not loaded (expect cuFile compat mode only)"
fi
mkdir -p "$DIR"
echo "== $mode: $GIB GiB in $DIR ($(findmnt -n -o FSTYPE,SOURCE -T "$DIR" 2>/dev/null || echo 'filesystem unknown'))"
exec "$PY" gpu-side/device_check.py "$mode" --dir "$DIR" --gib "$GIB" --bin "$BIN"
