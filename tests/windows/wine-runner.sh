#!/usr/bin/env bash
# Cargo's runner for x86_64-pc-windows-gnu (.cargo/config.toml): runs a Windows test binary
# under wine64 in a wine prefix of its own (target/wine-prefix, or $TIERFS_WINEPREFIX), which
# it creates on first use with the ProcessPrng shim (process_prng.c) in its system32.
# Needs the Debian packages wine64 and gcc-mingw-w64-x86-64 (.ci/run installs them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export WINEPREFIX=${TIERFS_WINEPREFIX:-$repo/target/wine-prefix}
export WINEDEBUG=${WINEDEBUG:--all}
# No Mono or Gecko: nothing here needs .NET or HTML, and their installers would prompt.
export WINEDLLOVERRIDES=${WINEDLLOVERRIDES:-mscoree,mshtml=}
wine=$(command -v wine64 || command -v wine || true)
[ -n "$wine" ] || { echo "wine-runner: wine64 is not installed" >&2; exit 127; }

setup() {
    local dll="$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll"
    [ -f "$dll" ] && return
    echo "wine-runner: creating wine prefix $WINEPREFIX" >&2
    mkdir -p "$WINEPREFIX"
    timeout 300 "$wine" wineboot --init >/dev/null 2>&1
    timeout 120 wineserver --wait 2>/dev/null || true
    local tmp
    tmp=$(mktemp -d)
    x86_64-w64-mingw32-gcc -O2 -shared -o "$tmp/bcryptprimitives.dll" \
        "$here/process_prng.c" -ladvapi32
    mv "$tmp/bcryptprimitives.dll" "$dll"
    rmdir "$tmp"
}

mkdir -p "$(dirname "$WINEPREFIX")"
# One setup at a time (several test binaries, or worktrees sharing $TIERFS_WINEPREFIX).
exec 9>"$WINEPREFIX.lock"
flock 9
setup
flock -u 9
exec "$wine" "$@"
