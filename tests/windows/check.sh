#!/usr/bin/env bash
# The Windows checks (docs/WINDOWS.md), run by tests/run.sh on every CI run:
#  1. tierfs-core's unit tests built for x86_64-pc-windows-gnu (mingw-w64) and run under wine64
#     (tests/windows/wine-runner.sh is cargo's runner for that target, .cargo/config.toml);
#  2. the WinFsp front end (winfs/) type-checked and clippy-clean for that target, against
#     winfsp-sys's pre-generated bindings (nothing can link WinFsp here: that needs MSVC);
#  3. winfs's platform-neutral unit tests (name resolution, NTSTATUS mapping, CLI, and the
#     translation onto the core filesystem type, winfs/src/tree.rs) on Linux.
# Needs: rustup target x86_64-pc-windows-gnu, Debian packages gcc-mingw-w64-x86-64 and wine64
# (.ci/run installs all three). Every step is bounded; the whole takes about 3-5 minutes cold.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=x86_64-pc-windows-gnu

step() { echo "== windows: $*"; }

missing=()
command -v x86_64-w64-mingw32-gcc >/dev/null || missing+=("gcc-mingw-w64-x86-64 (apt)")
command -v wine >/dev/null || missing+=("wine64 (apt)")
rustup target list --installed 2>/dev/null | grep -qx "$T" || missing+=("rustup target add $T")
if [ ${#missing[@]} -gt 0 ]; then
    if [ -n "${TIERFS_SKIP_WINDOWS:-}" ]; then
        echo "== windows: SKIPPED (TIERFS_SKIP_WINDOWS set; missing: ${missing[*]})"
        exit 0
    fi
    echo "== windows: missing ${missing[*]} (.ci/run installs them; TIERFS_SKIP_WINDOWS=1 skips)" >&2
    exit 1
fi
TARGET_DIR=${CARGO_TARGET_DIR:-target}
# mingw-w64's linker leaves empty cc* files in the temporary directory (42 per link of the core
# tests): give the builds a directory of their own and remove it when the checks end.
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-windows.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

step "cargo test -p tierfs-core --target $T --no-run"
timeout 900 cargo test -p tierfs-core --target "$T" --no-run

step "cargo test -p tierfs-core --target $T (under wine64)"
started=$(date +%s)
timeout --kill-after=20 300 cargo test -p tierfs-core --target "$T"
echo "== windows: core tests under wine took $(( $(date +%s) - started )) s"
# Wine leaves a wineserver running for a few seconds after the last process; stop it now.
WINEPREFIX=${TIERFS_WINEPREFIX:-$PWD/target/wine-prefix} timeout 30 wineserver -k 2>/dev/null || true

# winfsp's `docsrs` feature uses #![feature(doc_cfg)]; RUSTC_BOOTSTRAP names only that crate.
step "cargo clippy winfs --target $T (type check against winfsp-sys bindings)"
RUSTC_BOOTSTRAP=winfsp timeout 900 cargo clippy --manifest-path winfs/Cargo.toml \
    --target "$T" --no-default-features --features check --target-dir "$TARGET_DIR" -- -D warnings

step "cargo test winfs (Linux: the platform-neutral parts)"
timeout 600 cargo test --manifest-path winfs/Cargo.toml --target-dir "$TARGET_DIR"
