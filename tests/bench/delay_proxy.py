#!/usr/bin/env python3
"""A delaying TCP proxy on loopback: a network's round trip in front of a server's port.

    delay_proxy.py --pair LISTEN_PORT:TARGET_PORT [--pair ...] --delay-ms MS --stats FILE
                   [--max-conns N] [--max-seconds S]

Listens on 127.0.0.1:LISTEN_PORT (only ever the loopback address) and forwards every connection
to 127.0.0.1:TARGET_PORT.  Each piece of data a client sends reaches the server `--delay-ms`
after it arrived (a delay line: pieces keep their order and are not slowed by one another, so
the delay adds latency, not a bandwidth cap), and the answers come back at once: every request /
response round trip takes `--delay-ms` more, and a stream's throughput is unchanged.  The
bandwidth of the link is the business of tc (tests/bench/netstore.py shapes the namespace's
loopback).

Bounded: at most --max-conns connections at once (more are closed at once), at most 4 MiB
queued in one direction of a connection (the proxy stops reading that side until the queue
drains), and the proxy exits by itself after --max-seconds (default one hour).  SIGTERM exits.

Counters: bytes client -> server and server -> client, per pair and in all, connections; written
as JSON to --stats (a temporary name, then renamed) every 20 ms while they change.  A reader that
needs the final count waits until the file has not changed for a while
(netstore.ProxyStats.settled).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import time

LOOPBACK = "127.0.0.1"
QUEUE_LIMIT = 4 << 20
READ_SIZE = 1 << 20


class Counters:
    def __init__(self, pairs: list[tuple[int, int]]):
        self.up = {lp: 0 for lp, _ in pairs}      # client -> server
        self.down = {lp: 0 for lp, _ in pairs}    # server -> client
        self.conns = {lp: 0 for lp, _ in pairs}   # accepted in all
        self.open = 0
        self.refused = 0
        self.version = 0

    def doc(self) -> dict:
        return {"up_bytes": sum(self.up.values()), "down_bytes": sum(self.down.values()),
                "connections": sum(self.conns.values()), "open": self.open, "refused": self.refused,
                "pairs": {str(lp): {"up_bytes": self.up[lp], "down_bytes": self.down[lp],
                                    "connections": self.conns[lp]} for lp in self.up}}


async def pump_delayed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float,
                       count) -> None:
    """Copies reader -> writer, each piece written `delay` s after it was read (a delay line)."""
    queue: collections.deque = collections.deque()
    queued = 0
    more = asyncio.Event()
    room = asyncio.Event()
    room.set()
    done = False

    async def feed() -> None:
        nonlocal queued, done
        try:
            while True:
                await room.wait()
                data = await reader.read(READ_SIZE)
                if not data:
                    break
                queue.append((time.monotonic() + delay, data))
                queued += len(data)
                if queued >= QUEUE_LIMIT:
                    room.clear()
                more.set()
        except (ConnectionError, OSError):
            pass
        finally:
            done = True
            more.set()

    task = asyncio.ensure_future(feed())
    try:
        while True:
            if not queue:
                if done:
                    break
                more.clear()
                await more.wait()
                continue
            due, data = queue[0]
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            queue.popleft()
            queued -= len(data)
            if queued < QUEUE_LIMIT:
                room.set()
            writer.write(data)
            count(len(data))
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        task.cancel()
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count) -> None:
    try:
        while True:
            data = await reader.read(READ_SIZE)
            if not data:
                break
            writer.write(data)
            count(len(data))
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass


async def serve(args, counters: Counters, stop: asyncio.Event) -> None:
    delay = args.delay_ms / 1000.0

    def handler(lp: int, tp: int):
        async def on_conn(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            if counters.open >= args.max_conns:
                counters.refused += 1
                counters.version += 1
                cw.close()
                return
            counters.open += 1
            counters.conns[lp] += 1
            counters.version += 1
            try:
                sr, sw = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, tp), timeout=10)
            except (OSError, asyncio.TimeoutError):
                counters.open -= 1
                cw.close()
                return

            def up(n: int) -> None:
                counters.up[lp] += n
                counters.version += 1

            def down(n: int) -> None:
                counters.down[lp] += n
                counters.version += 1

            try:
                await asyncio.gather(pump_delayed(cr, sw, delay, up), pump(sr, cw, down))
            finally:
                counters.open -= 1
                counters.version += 1
                for w in (sw, cw):
                    w.close()
        return on_conn

    servers = []
    for lp, tp in args.pairs:
        servers.append(await asyncio.start_server(handler(lp, tp), LOOPBACK, lp, reuse_address=True))
    print(f"delay_proxy: listening on {', '.join(f'{LOOPBACK}:{lp}->{tp}' for lp, tp in args.pairs)}, "
          f"delay {args.delay_ms} ms", flush=True)

    async def writer_loop() -> None:
        seen = -1
        while not stop.is_set():
            if counters.version != seen:
                seen = counters.version
                tmp = args.stats + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(counters.doc(), f)
                os.replace(tmp, args.stats)
            await asyncio.sleep(0.02)

    w = asyncio.ensure_future(writer_loop())
    try:
        await asyncio.wait_for(stop.wait(), timeout=args.max_seconds)
    except asyncio.TimeoutError:
        print("delay_proxy: --max-seconds reached, exiting", flush=True)
    stop.set()
    for s in servers:
        s.close()
    await w


def parse_pair(s: str) -> tuple[int, int]:
    a, b = s.split(":")
    return int(a), int(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", dest="pairs", type=parse_pair, action="append", required=True,
                    help="LISTEN_PORT:TARGET_PORT on 127.0.0.1")
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--max-conns", type=int, default=512)
    ap.add_argument("--max-seconds", type=float, default=3600.0)
    args = ap.parse_args()
    counters = Counters(args.pairs)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.run_until_complete(serve(args, counters, stop))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
