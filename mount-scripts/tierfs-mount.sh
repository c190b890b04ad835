#!/usr/bin/env bash
# tierfs-mount.sh SOURCE MOUNTPOINT [SIZE] [-- EXTRA tierfs mount OPTIONS...]
#
# Mounts SOURCE at MOUNTPOINT with tierfs in the background and returns once the mount
# answers (MOUNTPOINT/.tierfs/stats readable). A dead mount left at MOUNTPOINT by a crashed
# daemon ("Transport endpoint is not connected") is detached first; a live tierfs mount there
# is left alone (exit 0). SIZE is the RAM cache budget (512MiB, 16GiB, ...; default: tierfs's
# own, a quarter of RAM). Exits non-zero with a message on stderr if anything fails.
#
# Environment:
#   TIERFS_BIN        the tierfs binary (default: the `tierfs` installed beside this script,
#                     as the deb and the wheel install them; else `tierfs` on PATH; else this
#                     repository's target/release/tierfs)
#   TIERFS_LOG_FILE   daemon log (default: /var/log/tierfs/NAME.log as root, else
#                     ${XDG_STATE_HOME:-~/.local/state}/tierfs/NAME.log; NAME from MOUNTPOINT)
#   TIERFS_WAIT       seconds to wait for the mount to answer (default 30)
set -euo pipefail

prog=${0##*/}
die() { echo "$prog: error: $*" >&2; exit 1; }
say() { echo "$prog: $*" >&2; }
usage() {
    echo "usage: $prog SOURCE MOUNTPOINT [SIZE] [-- EXTRA tierfs mount OPTIONS...]" >&2
    exit 2
}

[ $# -ge 2 ] || usage
case "$1" in -h|--help) usage ;; esac
source_dir=$1
mnt=$2
shift 2
size=
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    size=$1
    shift
fi
if [ $# -gt 0 ]; then
    [ "$1" = "--" ] || usage
    shift
fi
extra=("$@")
wait_s=${TIERFS_WAIT:-30}
case "$wait_s" in ''|*[!0-9]*) die "TIERFS_WAIT must be a whole number of seconds, got '$wait_s'" ;; esac

# --- the binary ----------------------------------------------------------------------------
find_tierfs() {
    if [ -n "${TIERFS_BIN:-}" ]; then
        [ -x "$TIERFS_BIN" ] || die "TIERFS_BIN=$TIERFS_BIN is not an executable file"
        printf '%s\n' "$TIERFS_BIN"
        return
    fi
    local here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    # Installed (/usr/bin/tierfs-mount from the deb, VENV/bin/tierfs-mount from the wheel): the
    # binary of the same package, even where that bin/ is not on PATH.
    if [ -x "$here/tierfs" ] && [ ! -d "$here/tierfs" ]; then
        printf '%s\n' "$here/tierfs"
        return
    fi
    if command -v tierfs >/dev/null 2>&1; then
        command -v tierfs
        return
    fi
    if [ -x "$here/../target/release/tierfs" ]; then
        printf '%s\n' "$here/../target/release/tierfs"
        return
    fi
    die "tierfs not found beside $here or on PATH: install the package, set TIERFS_BIN, or build it (cargo build --release -p tierfs)"
}
tierfs=$(find_tierfs)

# --- the paths -----------------------------------------------------------------------------
[ -d "$source_dir" ] || die "source $source_dir is not a directory"
case "$mnt" in /*) ;; *) mnt=$PWD/$mnt ;; esac
mnt=${mnt%/}
[ -n "$mnt" ] || die "refusing to mount on /"

stats=$mnt/.tierfs/stats

# Reads the stats file with a time limit, so a hung mount cannot hang this script.
stats_readable() { timeout 5 cat -- "$stats" >/dev/null 2>&1; }

# A stale mount: stat(MOUNTPOINT) fails with ENOTCONN once the daemon behind it is gone.
stat_error=$(LC_ALL=C timeout 5 stat -- "$mnt" 2>&1 >/dev/null) || true
if [[ "$stat_error" == *"Transport endpoint is not connected"* ]]; then
    say "$mnt is a dead mount (its daemon is gone): detaching it"
    "$tierfs" unmount --lazy "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null ||
        fusermount3 -uz "$mnt" 2>/dev/null || fusermount -uz "$mnt" 2>/dev/null ||
        die "cannot detach the dead mount at $mnt (try: sudo umount -l $mnt)"
    stat_error=$(LC_ALL=C timeout 5 stat -- "$mnt" 2>&1 >/dev/null) || true
    [[ "$stat_error" != *"Transport endpoint is not connected"* ]] ||
        die "$mnt is still a dead mount after detaching it"
elif [ -n "$stat_error" ] && [ -e "$mnt" ]; then
    die "cannot use $mnt: $stat_error"
fi

daemon_pid() {
    # The "pid" of the "mount" object in the stats document (the daemon's pid).
    timeout 5 cat -- "$stats" 2>/dev/null | tr -d '\n' |
        sed -n 's/.*"mount"[^}]*"pid"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p'
}

report() {
    local pid
    pid=$(daemon_pid || true)
    echo "$prog: $1 $mnt (daemon pid ${pid:-?})"
    echo "$prog: stats: $stats  (tierfs stats $mnt)"
    [ -z "${2:-}" ] || echo "$prog: log: $2"
}

if stats_readable; then
    report "a tierfs mount is already serving" ""
    exit 0
fi
if mountpoint -q -- "$mnt" 2>/dev/null; then
    die "$mnt is already a mount point, and not a live tierfs mount"
fi
mkdir -p -- "$mnt" || die "cannot create mountpoint $mnt"

# --- the log -------------------------------------------------------------------------------
name=$(printf '%s' "${mnt#/}" | tr -c 'A-Za-z0-9._\n-' '-')
if [ -n "${TIERFS_LOG_FILE:-}" ]; then
    log=$TIERFS_LOG_FILE
elif [ "$(id -u)" -eq 0 ]; then
    log=/var/log/tierfs/$name.log
else
    log=${XDG_STATE_HOME:-$HOME/.local/state}/tierfs/$name.log
fi
mkdir -p -- "$(dirname -- "$log")" || die "cannot create the log directory for $log"

# --- mount ---------------------------------------------------------------------------------
args=(mount "$source_dir" "$mnt" --daemon --log-file "$log")
[ -z "$size" ] || args+=(--ram-cache "$size")
args+=("${extra[@]}")
if ! "$tierfs" "${args[@]}"; then
    die "tierfs mount failed (command: $tierfs ${args[*]}); log: $log"
fi

deadline=$((SECONDS + wait_s))
until stats_readable; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        die "$mnt did not answer within ${wait_s}s (no readable $stats); log: $log"
    fi
    sleep 0.1
done
report "mounted $source_dir at" "$log"
