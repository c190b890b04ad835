#!/usr/bin/env bash
# The system side of the test suite, as root: the apt packages it needs (installed only if
# missing), a configured fuse3 and a /dev/fuse, the Rust target of the Windows checks, and
# cargo-deb (the Debian package).
# tests/run.sh calls it on every run (it changes nothing when everything is there); so does
# .ci/run. The Python side is tests/setup-venv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "== tests/setup-system.sh: $*" >&2; }

# --- system packages (only if something is missing) -------------------------
need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v fincore >/dev/null || need_apt+=(util-linux)
command -v diff >/dev/null || need_apt+=(diffutils)
command -v cc >/dev/null || need_apt+=(build-essential)
[ -e /dev/fuse ] && command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v setpriv >/dev/null || need_apt+=(util-linux)
# POSIX ACL rows of the adversarial suite (tests/python/test_security.py).
command -v setfacl >/dev/null || need_apt+=(acl)
# A real terminal for `tierfs top` (tests/python/test_top.py).
command -v tmux >/dev/null || need_apt+=(tmux)
# A real browser for the metrics endpoint's dashboard page (tests/python/test_metrics.py).
command -v chromium >/dev/null || need_apt+=(chromium)
# The slow sources (tests/python/test_slow_sources.py, tests/bench/slow_sources.py): network
# namespaces and tc (iproute2), nsenter (util-linux), ss (iproute2).
command -v ip >/dev/null && command -v tc >/dev/null && command -v ss >/dev/null || need_apt+=(iproute2)
command -v nsenter >/dev/null || need_apt+=(util-linux)
# The Debian package of tests/python/test_packages.py: cargo-deb reads the binary's library
# dependencies with dpkg-shlibdeps.
command -v dpkg-shlibdeps >/dev/null || need_apt+=(dpkg-dev)
# Windows checks (tests/windows/check.sh): mingw-w64 links, wine64 runs the core's tests.
command -v x86_64-w64-mingw32-gcc >/dev/null || need_apt+=(gcc-mingw-w64-x86-64)
command -v wine >/dev/null || need_apt+=(wine64)
if [ ${#need_apt[@]} -gt 0 ] && [ "$(id -u)" != 0 ]; then
    log "missing: ${need_apt[*]}; run as root (or install these apt packages) and try again"
    exit 1
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    log "installing apt packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Keep existing configuration files without asking (a prompt would leave fuse3 unconfigured:
    # fusermount3 without its setuid bit, and users' mounts fail with EPERM).
    apt-get install -y -qq -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${need_apt[@]}"
fi
# A fuse3 unpacked but never configured (an earlier interrupted install) has a fusermount3
# without its setuid bit: configure it now.
if command -v fusermount3 >/dev/null && [ ! -u "$(command -v fusermount3)" ]; then
    log "fusermount3 has no setuid bit: configuring pending packages"
    DEBIAN_FRONTEND=noninteractive dpkg --configure -a --force-confdef --force-confold || true
fi
if [ ! -e /dev/fuse ]; then
    modprobe fuse 2>/dev/null || true
    [ -e /dev/fuse ] || mknod -m 666 /dev/fuse c 10 229 || true
fi

# --- Rust toolchain ----------------------------------------------------------
if ! command -v cargo >/dev/null; then
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null; then
    # CI machines come with the Rust toolchain (rustup); nothing can be fetched from elsewhere.
    log "cargo not found: this machine needs a Rust toolchain (rustup) installed"
    exit 1
fi
rustup target list --installed 2>/dev/null | grep -qx x86_64-pc-windows-gnu ||
    rustup target add x86_64-pc-windows-gnu
# cargo-deb, which packaging/build.sh builds the Debian package with (tests/python/test_packages.py):
# from the crate registry, compiled once (about a minute).
if ! cargo deb --version >/dev/null 2>&1; then
    log "installing cargo-deb: cargo install cargo-deb --version ^3.8 --locked"
    cargo install cargo-deb --version '^3.8' --locked
fi
