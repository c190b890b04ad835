"""Guest memory held steady for a benchmark run: free page reporting off, free memory faulted in.

On a virtual machine with *free page reporting* (virtio-balloon), the kernel hands blocks of free
memory back to the host, and the next allocation that gets such a block pays a host-side fault for
each of its pages.  This machine's kernel reports every free block of order 9 (2 MiB) and up
(`/sys/module/page_reporting/parameters/page_reporting_order` = 9), within moments of it being
freed.  Measured here (2026-12-02), filling a new 1.5 GiB numpy array ten times, 1 s apart: 3.48
0.25 2.08 0.24 2.02 0.24 1.96 1.75 0.23 1.65 s, against 0.23 s every time with reporting off; a
`numpy.memmap` whole-file copy of the same plain file took 0.73-2.77 s from pass to pass, all of
it system time in the loader, with the same page-fault count.  A pass that allocates a file-sized
buffer (numpy's destination array, the page cache a cold read fills) is then as fast as the
blocks it happens to get, on either side of a comparison: the acceptance benchmark's numpy.memmap rows passed
or failed by chance (cold fast 0.43-0.48 in two runs; 1.00 with reporting off).

:class:`SteadyMemory` undoes that for the run and puts it back afterwards:

1. `page_reporting_order` is set one above the largest buddy order (the number of orders in
   `/proc/buddyinfo`), so that no free block qualifies.  This VM's kernel accepts it (11, as
   its boot command line also sets; checked: `reported_kib` stopped growing and the 1.5 GiB
   fills above took 0.23 s every time).  A kernel that refuses it (EINVAL; mainline takes at
   most its largest order) gets its largest order instead: fewer, larger blocks reported, and
   the results say so.
2. All free memory but :data:`RESERVE` is faulted in once (anonymous `MAP_POPULATE` maps of
   :data:`PIECE` each) and freed, so that every page the run allocates later is backed by the
   host.  ~20 GiB took 47 s here; memory that is already backed takes a few seconds.
3. On exit the old order is written back (also from `atexit`, for an exception that escapes the
   `with`; SIGTERM and SIGHUP are exceptions in acceptance.py, SIGKILL leaves it as set).

Where no device reports free pages (no `page_reporting` parameter, or an order that reads
negative: nothing registered, as on bare metal) it does nothing and says so.
"""

from __future__ import annotations

import atexit
import errno
import mmap
import time
from pathlib import Path

GiB = 1 << 30
REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
BUDDYINFO = Path("/proc/buddyinfo")
MEMINFO = Path("/proc/meminfo")
# Free memory left untouched by the pre-faulting: room for the kernel and the benchmark's own
# processes while the maps are held (they are freed right after).
RESERVE = 2 * GiB
# One MAP_POPULATE map: small enough that MemFree is re-checked often, large enough that the
# number of maps (~20 on 24 GiB) does not matter.
PIECE = 1 * GiB


def orders_in(buddyinfo: str) -> int:
    """The number of buddy orders the kernel has (MAX_PAGE_ORDER + 1): the count columns of
    /proc/buddyinfo, e.g. 11 on x86-64 (orders 0-10)."""
    counts = [len(line.split()) - 4 for line in buddyinfo.splitlines() if line.startswith("Node")]
    if not counts or min(counts) < 1:
        raise ValueError(f"unexpected /proc/buddyinfo: {buddyinfo[:200]!r}")
    return max(counts)


def mem_free(meminfo: str) -> int:
    """MemFree of a /proc/meminfo text, in bytes."""
    for line in meminfo.splitlines():
        if line.startswith("MemFree:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no MemFree in /proc/meminfo")


def pieces_to_fault(free: int, reserve: int = RESERVE, piece: int = PIECE) -> int:
    """How many maps of `piece` bytes fit in `free` bytes while leaving `reserve` untouched."""
    return max(0, (free - reserve) // piece)


class SteadyMemory:
    """Free page reporting off and free memory backed, for the life of the context."""

    def __init__(self) -> None:
        self.old_order: str | None = None
        self.note = ""

    def __enter__(self) -> "SteadyMemory":
        current = REPORTING_ORDER.read_text().strip() if REPORTING_ORDER.exists() else ""
        if not current.isdigit():
            self.note = "no free page reporting on this machine: nothing to hold steady"
            return self
        self.old_order = current
        atexit.register(self.close)
        try:
            what = self._reporting_off(orders_in(BUDDYINFO.read_text()))
            faulted, seconds = self._fault_in_free_memory()
        except BaseException:
            self.close()
            raise
        self.note = f"{what}; {faulted / GiB:.1f} GiB of free memory faulted in first ({seconds:.0f} s)"
        return self

    def _reporting_off(self, off: int) -> str:
        try:
            REPORTING_ORDER.write_text(f"{off}\n")
            return f"free page reporting off for the run (page_reporting_order {self.old_order} → {off})"
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
        REPORTING_ORDER.write_text(f"{off - 1}\n")
        return (f"free page reporting reduced for the run (page_reporting_order {self.old_order} → {off - 1}: "
                f"the kernel refused {off}, so blocks of order {off - 1} are still reported)")

    @staticmethod
    def _fault_in_free_memory() -> tuple[int, float]:
        """Maps and populates PIECE-sized anonymous maps while MemFree allows, at most as many as
        fitted at the start (a MemFree that did not fall would otherwise never end the loop)."""
        t0 = time.monotonic()
        maps = []
        most = pieces_to_fault(mem_free(MEMINFO.read_text()))
        try:
            while len(maps) < most and pieces_to_fault(mem_free(MEMINFO.read_text())) > 0:
                maps.append(mmap.mmap(-1, PIECE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE))
        finally:
            for m in maps:
                m.close()
        return len(maps) * PIECE, time.monotonic() - t0

    def close(self) -> None:
        old, self.old_order = self.old_order, None
        if old is None:
            return
        try:
            REPORTING_ORDER.write_text(f"{old}\n")
        except OSError as e:  # never lose a run's results over it; say what to do instead
            print(f"warning: could not restore page_reporting_order to {old} ({e}); "
                  f"write it to {REPORTING_ORDER} by hand")

    def __exit__(self, *exc) -> None:
        self.close()
