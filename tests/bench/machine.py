"""The machine and the time of a benchmark run, for the top of its results file.

Every results file starts with the date and the machine it was measured on (tests/bench/README.md):
figures compare only within one file.
"""

from __future__ import annotations

import datetime
import os
import platform


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
