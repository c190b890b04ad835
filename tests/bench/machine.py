"""The machine and the time of a benchmark run, for the top of its results file.

Every results file starts with the date and the machine it was measured on (tests/bench/README.md):
figures compare only within one file.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import time
from pathlib import Path


def date() -> str:
    """Now, UTC, to the second (ISO 8601)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def describe() -> str:
    """CPUs, their model, RAM and kernel: `2 CPUs (AMD EPYC), 23.5 GiB RAM, kernel 6.18.44`."""
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    ram = "?"
    try:
        with open("/proc/meminfo") as f:
            kib = next((int(ln.split()[1]) for ln in f if ln.startswith("MemTotal:")), None)
        if kib is not None:
            ram = f"{kib / (1 << 20):.1f}"
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), {ram} GiB RAM, kernel {platform.release()}"


def run_lines(script: str, argv: list[str], load0: tuple[float, float, float], t0: float) -> list[str]:
    """The command, date, machine and load lines of a results file for `script` (under
    tests/bench/) run with `argv`, started at `time.monotonic()` `t0` with load average `load0`."""
    cmd = f"sudo .venv/bin/python tests/bench/{script} " + " ".join(shlex.quote(x) for x in argv)
    load = " ".join(f"{x:.2f}" for x in load0)
    return [
        f"- command: `{cmd.strip()}` ({(time.monotonic() - t0) / 60:.1f} min)",
        f"- date: {date()}",
        f"- machine: {describe()}",
        f"- load average at the start {load}, at the end "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (shared machine: compare figures of the same run only)",
    ]


def write_results(out: Path | str, text: str, data: dict | None = None, *, echo: bool = False) -> None:
    """Writes a results file `out` (its folder made if need be) and, with `data`, the same
    figures as JSON beside it (`out` with `.json`); says where on stdout, after the text itself
    with `echo`."""
    if echo:
        print("\n" + text)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if data is None:
        print(f"wrote {out}")
        return
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
