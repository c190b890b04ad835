#!/usr/bin/env bash
# packaging/build.sh [--out DIR]
#
# Builds the release artifacts of tierfs from this checkout, into DIR (default: dist/ at the
# top of the repository):
#   tierfs_VERSION-1_ARCH.deb                    the Debian package (cargo-deb; its metadata and
#                                                file list: [package.metadata.deb] in fs/Cargo.toml)
#   tierfs-VERSION-py3-none-PLATFORM.whl         the Python wheel of the `tierfs` command
#                                                (maturin; fs/pyproject.toml)
# and prints their paths on stdout, the deb's first, one a line (progress goes to stderr).
# What each holds and where its files land: docs/INSTALL.md.
#
# The wheel's platform tag is the oldest manylinux tag the binary qualifies for (maturin reads
# the glibc symbol versions it uses), so it follows the glibc of the machine that builds it:
# manylinux_2_34 on Debian 12. `--compatibility pypi` refuses a plain `linux` tag and
# `--auditwheel check` fails the build if the binary needs a shared library outside the
# manylinux set, rather than copying one into the wheel.
#
# Tools: cargo (rustup); cargo-deb and maturin, installed when missing:
#   cargo-deb  `cargo deb` if it runs, else `cargo install cargo-deb --locked`
#   maturin    $MATURIN, else `maturin` on PATH, else .venv/bin/maturin (tests/setup-venv.sh
#              installs it), else target/packaging-venv/bin/maturin, made with pip
# Environment: CARGO_TARGET_DIR as for cargo (both tools build there).
set -euo pipefail

prog=packaging/build.sh
die() { echo "$prog: error: $*" >&2; exit 1; }
say() { echo "== $prog: $*" >&2; }
usage() { echo "usage: $prog [--out DIR]" >&2; exit 2; }

cd "$(dirname "$0")/.."
REPO=$PWD

out=$REPO/dist
while [ $# -gt 0 ]; do
    case $1 in
        --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        -h | --help) usage ;;
        *) echo "$prog: unknown argument '$1'" >&2; usage ;;
    esac
done
mkdir -p -- "$out" || die "cannot create the output folder $out"
out=$(cd -- "$out" && pwd)

if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || die "cargo not found: building the packages needs a Rust toolchain (rustup)"

# --- the tools -----------------------------------------------------------------------------
if ! cargo deb --version >/dev/null 2>&1; then
    say "cargo-deb not found: cargo install cargo-deb --locked"
    cargo install cargo-deb --locked >&2 || die "could not install cargo-deb (cargo install cargo-deb --locked)"
fi

find_maturin() {
    local candidate
    for candidate in "${MATURIN:-}" "$(command -v maturin 2>/dev/null || true)" \
        "$REPO/.venv/bin/maturin" "$REPO/target/packaging-venv/bin/maturin"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then
            printf '%s\n' "$candidate"
            return
        fi
    done
    [ -z "${MATURIN:-}" ] || die "MATURIN=$MATURIN is not an executable file"
    return 1
}
if ! maturin=$(find_maturin); then
    say "maturin not found: installing it into target/packaging-venv"
    python3 -m venv "$REPO/target/packaging-venv" >&2 ||
        die "could not make a venv for maturin (Debian/Ubuntu: apt-get install python3-venv)"
    "$REPO/target/packaging-venv/bin/python" -m pip install -q "maturin>=1.9,<2.0" >&2 ||
        die "could not install maturin into target/packaging-venv"
    maturin=$REPO/target/packaging-venv/bin/maturin
fi

# --- build ---------------------------------------------------------------------------------
# Each tool writes into a fresh folder of its own, so that what is printed is what this run
# built (never an older file left in DIR); the results then replace their namesakes in DIR.
stage=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf -- "$stage"' EXIT
mkdir "$stage/deb" "$stage/wheel"

say "Debian package: cargo deb -p tierfs --locked"
cargo deb -p tierfs --output "$stage/deb" -- --locked >&2 || die "cargo deb failed"

say "Python wheel: $maturin build --release (fs/pyproject.toml)"
"$maturin" build --release --manifest-path "$REPO/fs/Cargo.toml" --out "$stage/wheel" \
    --compatibility pypi --auditwheel check >&2 || die "maturin build failed"

shopt -s nullglob
debs=("$stage"/deb/*.deb)
wheels=("$stage"/wheel/*.whl)
[ ${#debs[@]} -eq 1 ] || die "expected one .deb from cargo deb, found ${#debs[@]}"
[ ${#wheels[@]} -eq 1 ] || die "expected one .whl from maturin, found ${#wheels[@]}"
deb=$out/$(basename -- "${debs[0]}")
wheel=$out/$(basename -- "${wheels[0]}")
mv -f -- "${debs[0]}" "$deb"
mv -f -- "${wheels[0]}" "$wheel"

say "built $(du -h -- "$deb" | cut -f1) $deb"
say "built $(du -h -- "$wheel" | cut -f1) $wheel"
printf '%s\n' "$deb" "$wheel"
