#!/usr/bin/env python3
"""A fault-injecting HTTP/1.1 reverse proxy on loopback: an object store that misbehaves on cue.

    fault_proxy.py --listen PORT --target PORT --control FILE --stats FILE
                   [--max-conns N] [--timeout-s S] [--max-seconds S]

Listens on 127.0.0.1:PORT (only ever the loopback address) and forwards every HTTP/1.1 request
to 127.0.0.1:TARGET (an S3 gateway, or tests/bench/delay_proxy.py in front of one).  Requests
pass byte for byte: the request line and the headers exactly as the client sent them (SigV4
signs the Host header and others), the body as it came, Content-Length or chunked.  A client
may send many requests on one connection (keep-alive); each client connection has its own
upstream connection, reused while both sides keep it open.  Responses pass byte for byte too:
a Content-Length body, a chunked body, no body for HEAD, 1xx, 204 and 304, or a body up to the
upstream's close.

Faults come from the JSON control file (--control), read again whenever it changes (a writer
replaces it by renaming a temporary file; a file that is missing means no rules, one that does
not parse keeps the rules in force and is counted in `control_errors`).  It holds a list of
rules:

    [{"method": "GET", "path_contains": "dit", "kind": "slowdown", "count": 3}, ...]

`method` (any if absent) and `path_contains` (a substring of the request target, path and
query; any if absent) select requests; the first rule that matches a request and has count left
applies to it, and its count goes down by one (`count` -1: until the file changes).  Changing
the file starts every rule afresh with its count.  Kinds:

* `slowdown`: answers `503` with S3's `SlowDown` error (XML body, `Content-Type:
  application/xml`, its Content-Length) without contacting the upstream; the connection stays
  open for the next request.
* `expired_token`: answers `400` with S3's `ExpiredToken` error the same way.
* `cut`: forwards the request, sends the upstream's status line and headers, then
  `after_bytes` bytes of the body (as on the wire), then closes both connections: a connection
  cut in the middle of an object.  A body whose Content-Length is no longer than `after_bytes`
  passes whole and leaves the rule's count as it was (counted in `cut_too_short`); a chunked or
  close-delimited body is cut once it runs past `after_bytes`.
* `stall`: forwards the request, sends the status line and headers, then nothing for `stall_s`
  seconds (at most 60; less if the client closes first), then closes both connections.

Counters, written as JSON to --stats (a temporary name, then renamed) every 20 ms while they
change: `requests` (request heads read), `forwarded`, `injected` (per kind: answers given,
bodies cut short, stalls), `cut_too_short` (bodies a cut rule met that were no longer than its
`after_bytes`, passed whole), `up_bytes` and `down_bytes` (client -> upstream and back,
heads included, local answers included), `connections`, `open`, `refused`, `upstream_errors`,
`control_loads`, `control_errors`, and `rules_left` (each rule's count left).

Bounded: at most --max-conns client connections at once (more are closed at once); a request
head of at most 64 KiB (else `431` and the connection closed); each wait (a request from an
idle client, the upstream's connection and response head, every piece of a body, a write)
bounded by --timeout-s (the idle wait by twice that), after which the connection is closed; a
stall at most 60 s; the proxy exits by itself after --max-seconds (default one hour).  SIGTERM
and SIGINT exit.  Each injection is logged as one line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

LOOPBACK = "127.0.0.1"
MAX_HEAD = 64 << 10
READ_SIZE = 1 << 20
MAX_STALL_S = 60.0
KINDS = ("slowdown", "expired_token", "cut", "stall")
# The S3 errors the proxy answers itself: (status, reason, code, message).
LOCAL_ANSWERS = {
    "slowdown": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "expired_token": (400, "Bad Request", "ExpiredToken", "The provided token has expired."),
}


class Counters:
    def __init__(self):
        self.requests = 0
        self.forwarded = 0
        self.injected = {k: 0 for k in KINDS}
        self.cut_too_short = 0
        self.up = 0
        self.down = 0
        self.connections = 0
        self.open = 0
        self.refused = 0
        self.upstream_errors = 0
        self.control_loads = 0
        self.control_errors = 0
        self.version = 0

    def bump(self) -> None:
        self.version += 1

    def doc(self, rules: "Rules") -> dict:
        return {"requests": self.requests, "forwarded": self.forwarded, "injected": dict(self.injected),
                "cut_too_short": self.cut_too_short, "up_bytes": self.up, "down_bytes": self.down,
                "connections": self.connections, "open": self.open, "refused": self.refused,
                "upstream_errors": self.upstream_errors, "control_loads": self.control_loads,
                "control_errors": self.control_errors, "rules_left": [r["count"] for r in rules.rules]}


class Rules:
    """The control file's rules, read again when the file changes (by identity, size, time)."""

    def __init__(self, path: str, counters: Counters):
        self.path, self.counters = path, counters
        self.seen: tuple | None = None
        self.rules: list[dict] = []

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            sig = None
        if sig == self.seen:
            return
        self.seen = sig
        if sig is None:
            self.rules = []
        else:
            try:
                with open(self.path) as f:
                    self.rules = parse_rules(json.load(f))
            except (OSError, ValueError) as e:
                self.counters.control_errors += 1
                self.counters.bump()
                print(f"fault_proxy: control file {self.path} not used ({e}); rules unchanged", flush=True)
                return
        self.counters.control_loads += 1
        self.counters.bump()
        print(f"fault_proxy: rules {json.dumps(self.rules)}", flush=True)

    def take(self, method: str, target: str) -> dict | None:
        """The rule that applies to this request, its count taken down (a `cut` rule's only
        once its cut is made, `consume`); None: pass it."""
        self.refresh()
        for rule in self.rules:
            if rule["count"] == 0:
                continue
            if rule.get("method") and rule["method"].upper() != method:
                continue
            if rule.get("path_contains", "") not in target:
                continue
            if rule["kind"] != "cut":
                self.consume(rule)
            return rule
        return None

    def consume(self, rule: dict) -> bool:
        """Takes `rule`'s count down; False if it has none left (another request took it)."""
        if rule["count"] == 0:
            return False
        if rule["count"] > 0:
            rule["count"] -= 1
            self.counters.bump()
        return True


def parse_rules(doc) -> list[dict]:
    """The rules of a control document; ValueError names what is wrong."""
    if not isinstance(doc, list):
        raise ValueError("the control file must hold a list of rules")
    rules = []
    for i, r in enumerate(doc):
        if not isinstance(r, dict):
            raise ValueError(f"rule {i} is not an object")
        kind = r.get("kind")
        if kind not in KINDS:
            raise ValueError(f"rule {i}: kind {kind!r} is not one of {KINDS}")
        count = int(r.get("count", -1))
        if count < -1:
            raise ValueError(f"rule {i}: count {count} (-1: until removed)")
        rule = {"kind": kind, "count": count, "method": str(r.get("method", "")),
                "path_contains": str(r.get("path_contains", ""))}
        if kind == "cut":
            rule["after_bytes"] = max(0, int(r.get("after_bytes", 0)))
        if kind == "stall":
            rule["stall_s"] = min(MAX_STALL_S, max(0.0, float(r.get("stall_s", 10.0))))
        rules.append(rule)
    return rules


class Closed(Exception):
    """The connection is to be closed (a peer went away, a wait ran out, a fault ended it)."""


class Head:
    """A request or response head: its raw bytes (passed on unchanged) and what it says."""

    def __init__(self, raw: bytes):
        self.raw = raw
        lines = raw[:-4].decode("latin-1").split("\r\n")
        self.start = lines[0].split(" ", 2)
        self.headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"malformed header line {line!r}")
            key = name.strip().lower()
            value = value.strip()
            # Repeated headers: the framing ones must not be repeated; others are joined.
            self.headers[key] = f"{self.headers[key]}, {value}" if key in self.headers else value

    def header(self, name: str) -> str:
        return self.headers.get(name, "")

    def chunked(self) -> bool:
        return "chunked" in self.header("transfer-encoding").lower()

    def length(self) -> int | None:
        v = self.header("content-length")
        if not v:
            return None
        n = int(v.split(",")[0].strip())
        if n < 0:
            raise ValueError("negative Content-Length")
        return n

    def wants_close(self) -> bool:
        return "close" in self.header("connection").lower()


class Link:
    """One side of a connection with bounded waits."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float):
        self.reader, self.writer, self.timeout = reader, writer, timeout

    async def head(self, idle_timeout: float | None = None) -> Head | None:
        """The next head; None if the peer closed before sending any of it."""
        try:
            raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), idle_timeout or self.timeout)
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                return None
            raise Closed("the peer closed in the middle of a head") from e
        except asyncio.LimitOverrunError as e:
            raise HeadTooLarge() from e
        except (asyncio.TimeoutError, ConnectionError, OSError) as e:
            raise Closed(f"reading a head: {e!r}") from e
        try:
            return Head(raw)
        except (ValueError, IndexError) as e:
            raise Closed(f"malformed head: {e}") from e

    async def read(self, n: int) -> bytes:
        try:
            data = await asyncio.wait_for(self.reader.read(n), self.timeout)
        except (asyncio.TimeoutError, ConnectionError, OSError) as e:
            raise Closed(f"reading: {e!r}") from e
        return data

    async def readexactly(self, n: int) -> bytes:
        try:
            return await asyncio.wait_for(self.reader.readexactly(n), self.timeout)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, OSError) as e:
            raise Closed(f"reading: {e!r}") from e

    async def readline(self) -> bytes:
        try:
            line = await asyncio.wait_for(self.reader.readuntil(b"\r\n"), self.timeout)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError,
                OSError) as e:
            raise Closed(f"reading a line: {e!r}") from e
        return line

    async def write(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), self.timeout)
        except (asyncio.TimeoutError, ConnectionError, OSError, RuntimeError) as e:
            raise Closed(f"writing: {e!r}") from e

    def close(self) -> None:
        try:
            self.writer.close()
        except (OSError, RuntimeError):
            pass


class HeadTooLarge(Exception):
    pass


class Cut(Exception):
    """A body was cut at its rule's byte count."""


class Sink:
    """Where a body goes: a link (or nowhere, to discard it), at most `limit` bytes of it."""

    def __init__(self, link: Link | None, count, limit: int | None = None):
        self.link, self.count, self.limit, self.sent = link, count, limit, 0

    async def put(self, data: bytes) -> None:
        if self.limit is not None and self.sent + len(data) > self.limit:
            data = data[:self.limit - self.sent]
            await self._send(data)
            raise Cut()
        await self._send(data)

    async def _send(self, data: bytes) -> None:
        if data and self.link is not None:
            await self.link.write(data)
            self.count(len(data))
        self.sent += len(data)


async def relay_exact(src: Link, sink: Sink, length: int, what: str) -> None:
    """Copies exactly `length` bytes from `src` to `sink`; `what` ended early otherwise."""
    left = length
    while left > 0:
        data = await src.read(min(READ_SIZE, left))
        if not data:
            raise Closed(f"{what} ended early")
        left -= len(data)
        await sink.put(data)


async def relay_body(src: Link, sink: Sink, framing: str, length: int = 0) -> None:
    """Copies one body from `src` to `sink` as on the wire. `framing`: "none", "length"
    (`length` bytes), "chunked" (chunks, the last one and its trailers), "eof" (to the close)."""
    if framing == "length":
        await relay_exact(src, sink, length, "the body")
    elif framing == "chunked":
        while True:
            line = await src.readline()
            await sink.put(line)
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = await src.readline()
                    await sink.put(trailer)
                    if trailer == b"\r\n":
                        return
            await relay_exact(src, sink, size + 2, "a chunk")  # the chunk and its CRLF
    elif framing == "eof":
        while data := await src.read(READ_SIZE):
            await sink.put(data)


def request_framing(head: Head) -> tuple[str, int]:
    if head.chunked():
        return "chunked", 0
    n = head.length()
    return ("length", n) if n else ("none", 0)


def response_framing(method: str, head: Head) -> tuple[str, int]:
    status = int(head.start[1])
    if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
        return "none", 0
    if head.chunked():
        return "chunked", 0
    n = head.length()
    if n is not None:
        return ("length", n) if n else ("none", 0)
    return "eof", 0


def local_answer(kind: str, method: str, target: str, seq: int) -> bytes:
    status, reason, code, message = LOCAL_ANSWERS[kind]
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<Resource>{xml_escape(target.split('?')[0])}</Resource><RequestId>fault-{seq}</RequestId></Error>"
            ).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            f"x-amz-request-id: fault-{seq}\r\nConnection: keep-alive\r\n\r\n").encode()
    return head if method == "HEAD" else head + body


def xml_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Proxy:
    def __init__(self, args, counters: Counters, rules: Rules):
        self.args, self.counters, self.rules = args, counters, rules
        self.seq = 0

    def up(self, n: int) -> None:
        self.counters.up += n
        self.counters.bump()

    def down(self, n: int) -> None:
        self.counters.down += n
        self.counters.bump()

    async def connect(self) -> Link:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, self.args.target, limit=MAX_HEAD),
                                          self.args.timeout_s)
        except (asyncio.TimeoutError, OSError) as e:
            self.counters.upstream_errors += 1
            self.counters.bump()
            raise Closed(f"cannot reach the upstream: {e!r}") from e
        return Link(r, w, self.args.timeout_s)

    async def on_conn(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        c = self.counters
        if c.open >= self.args.max_conns:
            c.refused += 1
            c.bump()
            cw.close()
            return
        c.open += 1
        c.connections += 1
        c.bump()
        client = Link(cr, cw, self.args.timeout_s)
        upstream: Link | None = None
        try:
            while True:
                try:
                    head = await client.head(idle_timeout=2 * self.args.timeout_s)
                except HeadTooLarge:
                    await client.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
                                       b"Connection: close\r\n\r\n")
                    break
                if head is None:
                    break
                keep, upstream = await self.exchange(client, upstream, head)
                if not keep:
                    break
        except (Closed, ValueError, IndexError) as e:  # a malformed status line or length
            if not isinstance(e, Closed):
                print(f"fault_proxy: connection closed: {e}", flush=True)
        finally:
            c.open -= 1
            c.bump()
            client.close()
            if upstream is not None:
                upstream.close()

    async def exchange(self, client: Link, upstream: Link | None, req: Head) -> tuple[bool, Link | None]:
        """One request and its response; (whether the client connection goes on, the upstream
        connection to reuse)."""
        c = self.counters
        c.requests += 1
        c.bump()
        self.seq += 1
        method, target = req.start[0].upper(), req.start[1] if len(req.start) > 1 else ""
        rule = self.rules.take(method, target)
        framing, length = request_framing(req)

        if rule is not None and rule["kind"] in LOCAL_ANSWERS:
            await relay_body(client, Sink(None, self.up), framing, length)  # read, not sent
            answer = local_answer(rule["kind"], method, target, self.seq)
            await client.write(answer)
            self.down(len(answer))
            c.injected[rule["kind"]] += 1
            c.bump()
            print(f"fault_proxy: {rule['kind']} for {method} {target}", flush=True)
            return not req.wants_close(), upstream

        # Forward. A reused upstream connection may have been closed by the upstream while
        # idle: a request without a body is sent again once on a fresh one if nothing came back.
        resp = None
        for attempt in range(2):
            reused = upstream is not None
            if upstream is None:
                upstream = await self.connect()
            try:
                await upstream.write(req.raw)
                self.up(len(req.raw))
                await relay_body(client, Sink(upstream, self.up), framing, length)
                resp = await upstream.head()
                while resp is not None and 100 <= int(resp.start[1]) < 200 and resp.start[1] != "101":
                    await client.write(resp.raw)  # 100 Continue and the like: passed, then the real one
                    self.down(len(resp.raw))
                    resp = await upstream.head()
            except (Closed, HeadTooLarge) as e:
                upstream.close()
                upstream = None
                if reused and framing == "none" and attempt == 0:
                    continue
                c.upstream_errors += 1
                c.bump()
                raise Closed(f"upstream: {e!r}") from e
            if resp is None:
                upstream.close()
                upstream = None
                if reused and framing == "none" and attempt == 0:
                    continue
                c.upstream_errors += 1
                c.bump()
                raise Closed("the upstream closed without an answer")
            break
        c.forwarded += 1
        c.bump()

        await client.write(resp.raw)
        self.down(len(resp.raw))
        body_framing, body_length = response_framing(method, resp)
        kind = rule["kind"] if rule is not None else None

        if kind == "stall":
            c.injected["stall"] += 1
            c.bump()
            print(f"fault_proxy: stall {rule['stall_s']:g} s for {method} {target}", flush=True)
            upstream.close()
            await self.stall(client, rule["stall_s"])
            return False, None

        limit = None
        if kind == "cut":
            if body_framing in ("none", "length") and body_length <= rule["after_bytes"]:
                c.cut_too_short += 1
                c.bump()
            elif self.rules.consume(rule):
                limit = rule["after_bytes"]
        sink = Sink(client, self.down, limit)
        try:
            await relay_body(upstream, sink, body_framing, body_length)
        except Cut:
            c.injected["cut"] += 1
            c.bump()
            print(f"fault_proxy: cut after {sink.sent} body bytes of {method} {target}", flush=True)
            upstream.close()
            return False, None
        if body_framing == "eof" or resp.wants_close():
            upstream.close()
            upstream = None
            return False, None
        return not req.wants_close(), upstream

    async def stall(self, client: Link, seconds: float) -> None:
        """Sends nothing for `seconds`, or until the client closes."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                data = await asyncio.wait_for(client.reader.read(READ_SIZE), left)
            except (asyncio.TimeoutError, ConnectionError, OSError):
                return
            if not data:
                return


async def serve(args, stop: asyncio.Event) -> None:
    counters = Counters()
    rules = Rules(args.control, counters)
    rules.refresh()
    proxy = Proxy(args, counters, rules)
    server = await asyncio.start_server(proxy.on_conn, LOOPBACK, args.listen, reuse_address=True, limit=MAX_HEAD)
    print(f"fault_proxy: listening on {LOOPBACK}:{args.listen} -> {LOOPBACK}:{args.target}, "
          f"control {args.control}", flush=True)

    async def write_stats() -> None:
        seen = -1
        while True:
            if counters.version != seen:
                seen = counters.version
                tmp = args.stats + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(counters.doc(rules), f)
                os.replace(tmp, args.stats)
            if stop.is_set():
                return
            await asyncio.sleep(0.02)

    writer = asyncio.ensure_future(write_stats())
    try:
        await asyncio.wait_for(stop.wait(), timeout=args.max_seconds)
    except asyncio.TimeoutError:
        print("fault_proxy: --max-seconds reached, exiting", flush=True)
    stop.set()
    server.close()
    await writer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1 to listen on")
    ap.add_argument("--target", type=int, required=True, help="port on 127.0.0.1 to forward to")
    ap.add_argument("--control", required=True, help="JSON file of fault rules (read again when it changes)")
    ap.add_argument("--stats", required=True, help="JSON file the counters are written to")
    ap.add_argument("--max-conns", type=int, default=256)
    ap.add_argument("--timeout-s", type=float, default=60.0, help="bound of each wait of a connection")
    ap.add_argument("--max-seconds", type=float, default=3600.0)
    args = ap.parse_args()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.run_until_complete(serve(args, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
