"""Hostile: clients that send requests and never read the answers.

    python -m loadtest.hostile_unread [--root DIR] [--connections 3] [--requests 100]
        [--every-s 0.3] [--body-timeout-s 5] [--gateways 1 2]

For each shape (one process; a cell of `--gateways K`), runs `batchgate serve` from this
checkout or `--root`, with one `sim` worker (it answers an input reversed, so a megabyte
request gets a megabyte answer) and `--max-input-chars` raised so that such a request is one
input. It warms each of the server's HTTP processes with rounds of such requests read whole
(so that the figure before holds the allocator's own growth), then opens `--connections` raw
sockets that each send `--requests` anonymous requests `--every-s` apart (as much of each as
the kernel takes) and read nothing. It prints the resident memory of the server's HTTP
processes (the single process; the gateways and the core), before and at its peak while the
clients send, how many requests the server answered, and when it let go of each connection
(None: it still held it at the end).

Every wait is bounded: a shape ends `--body-timeout-s` plus a few seconds after its clients
have sent everything.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import select
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from loadtest.server import RunningServer, fetch_metrics, running_server

ADMIN = {"Authorization": "Bearer admin-demo-key"}
CHARS = 1_000_000  # one input: a 1 MB body, within the default body limit
TICK_S = 0.05  # how often memory is sampled and sockets are served while clients send
MIB = 1024 * 1024
WARM_ROUNDS = 5


def unread_request(chars: int = CHARS) -> bytes:
    """An anonymous request for the hot route's direct way, of about `chars` bytes."""
    body = json.dumps({"input": "a" * chars}).encode()
    return (b"POST /v1/batchstring HTTP/1.1\r\nHost: batchgate\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


def server_args(body_timeout_s: float, root: Path, gateways: int | None = None) -> list[str]:
    """The example keys (its admin key names the gateways), a 1 MB input, the body timeout;
    the shape, unless the environment says it (BATCHGATE_GATEWAYS)."""
    shape = [] if gateways is None else ["--gateways", str(gateways)]
    return ["--keys", str(root / "examples" / "keys.toml"), "--max-input-chars", str(CHARS),
            "--body-timeout-s", f"{body_timeout_s:g}", *shape]


def http_pids(srv: RunningServer) -> list[int]:
    """The server's HTTP processes: the process itself (the core, in a cell) and its gateways."""
    req = urllib.request.Request(srv.url + "/admin/workers", headers=ADMIN)
    with urllib.request.urlopen(req, timeout=10) as resp:
        gateways = json.loads(resp.read())["gateways"]
    return [srv.pid, *(g["pid"] for g in gateways if g["pid"] is not None)]


def rss_mib(pids: Sequence[int]) -> list[float]:
    """Each process's resident memory (0 once gone)."""
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid).memory_info().rss / MIB)
        except psutil.NoSuchProcess:
            out.append(0.0)
    return out


def held(pids: Sequence[int], port: int, client_ports: set[int]) -> set[int]:
    """Which of `client_ports` the server's processes still hold a connection from."""
    out: set[int] = set()
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            for c in psutil.Process(pid).net_connections(kind="tcp"):
                if c.laddr and c.laddr.port == port and c.raddr and c.raddr.port in client_ports:
                    out.add(c.raddr.port)
    return out


def answered(url: str) -> float:
    """Requests the server has answered, every status (gateways' and core's together)."""
    return sum(v for k, v in fetch_metrics(url).items()
               if k.startswith("batchgate_requests_total{"))


def warm(port: int, slots: int, per_slot: int, rounds: int) -> None:
    """`rounds` of `per_slot` 1 MB requests at once on each of the server's `slots` HTTP
    processes (its gateways, or itself), read whole: each heap grows to what answering them
    takes, so the figure before holds what the allocator keeps of that. A connection's
    process is the one whose `/healthz` answered on it."""
    pinned: dict[object, list[http.client.HTTPConnection]] = {}
    try:
        for _ in range(100 * slots * per_slot):  # the kernel picks each one's process
            if len(pinned) == slots and all(len(c) == per_slot for c in pinned.values()):
                break
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/healthz")
            slot = json.loads(conn.getresponse().read()).get("gateway")
            if len(pinned.setdefault(slot, [])) < per_slot:
                pinned[slot].append(conn)
            else:
                conn.close()
        else:
            raise RuntimeError(f"could not reach each of {slots} processes {per_slot} times")
        body = unread_request().split(b"\r\n\r\n", 1)[1]
        conns = [c for group in pinned.values() for c in group]
        for _ in range(rounds):
            for c in conns:
                c.request("POST", "/v1/batchstring", body, {"Content-Type": "application/json"})
            for c in conns:
                r = c.getresponse()
                r.read()
                if r.status != 200:
                    raise RuntimeError(f"a warm-up request was answered {r.status}")
    finally:
        for group in pinned.values():
            for c in group:
                c.close()


@dataclass(slots=True)
class Unread:
    """One client that sends and never reads; non-blocking, served by `send_unread`."""

    sock: socket.socket
    port: int  # its own, as the server sees it
    sent: int = 0  # whole requests the kernel took
    offset: int = 0  # into the request being sent
    reset_after_s: float | None = None  # a send failed: the server closed it
    released_after_s: float | None = None  # the server no longer holds it

    @classmethod
    def connect(cls, port: int) -> Unread:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setblocking(False)
        return cls(sock, sock.getsockname()[1])


def send_unread(clients: list[Unread], request: bytes, requests: int, every_s: float,
                until: float, sample: Callable[[], None]) -> None:
    """Each client sends `requests` copies of `request`, the i-th due `every_s` x i after the
    start, as much as the kernel takes, until all are sent or a send fails, or `until`
    (monotonic). `sample()` runs every tick."""
    view, t0 = memoryview(request), time.monotonic()
    while time.monotonic() < until:
        due = min(requests, int((time.monotonic() - t0) / every_s) + 1 if every_s else requests)
        busy = [c for c in clients if c.reset_after_s is None and c.sent < due]
        if not busy and all(c.reset_after_s is not None or c.sent == requests for c in clients):
            return
        _, writable, _ = select.select([], [c.sock for c in busy], [], TICK_S)
        for c in busy:
            if c.sock not in writable:
                continue
            try:
                c.offset += c.sock.send(view[c.offset:])
            except BlockingIOError:
                continue
            except OSError:  # reset by the server
                c.reset_after_s = time.monotonic() - t0
                continue
            if c.offset == len(request):
                c.sent, c.offset = c.sent + 1, 0
        sample()


@dataclass(frozen=True, slots=True)
class Figures:
    processes: int  # measured: the single process, or the core and its gateways
    rss_before_mib: float  # all of them
    rss_peak_mib: float  # all of them, at the moment their sum peaked
    growth_mib: float
    core_growth_mib: float  # the process itself (the core, in a cell), at its own peak
    gateways_growth_mib: float  # the gateways together, at their own peak
    sent: list[int] = field(default_factory=list)  # whole requests each client got out
    answered: float = 0.0  # by the server while they sent
    released_after_s: list[float | None] = field(default_factory=list)  # None: still held


def unread_scenario(srv: RunningServer, connections: int, requests: int, every_s: float,
                    body_timeout_s: float) -> Figures:
    """Warm `srv`, then run the unread clients and measure its HTTP processes."""
    pids = http_pids(srv)
    warm(srv.port, max(1, len(pids) - 1), connections, WARM_ROUNDS)
    before, answered0 = rss_mib(pids), answered(srv.url)
    peak, core_peak, gateways_peak = sum(before), before[0], sum(before[1:])
    clients = [Unread.connect(srv.port) for _ in range(connections)]
    t0 = time.monotonic()
    until = t0 + requests * every_s + body_timeout_s + 5.0

    def sample() -> None:
        nonlocal peak, core_peak, gateways_peak
        now = rss_mib(pids)
        peak = max(peak, sum(now))
        core_peak, gateways_peak = max(core_peak, now[0]), max(gateways_peak, sum(now[1:]))

    try:
        send_unread(clients, unread_request(), requests, every_s, until, sample)
        waiting = {c.port: c for c in clients}
        while waiting and time.monotonic() < until:  # another process: poll it, bounded
            sample()
            for port in set(waiting) - held(pids, srv.port, set(waiting)):
                waiting.pop(port).released_after_s = time.monotonic() - t0
            time.sleep(TICK_S)
        done = answered(srv.url) - answered0
    finally:
        for c in clients:
            c.sock.close()
    return Figures(len(pids), round(sum(before), 1), round(peak, 1),
                   round(peak - sum(before), 1), round(core_peak - before[0], 1),
                   round(gateways_peak - sum(before[1:]), 1), [c.sent for c in clients], done,
                   [None if c.released_after_s is None else round(c.released_after_s, 1)
                    for c in clients])


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the checkout to run the server from (default: this one)")
    p.add_argument("--connections", type=int, default=3)
    p.add_argument("--requests", type=int, default=100, help="1 MB requests per connection")
    p.add_argument("--every-s", type=float, default=0.3, help="between a client's requests")
    p.add_argument("--body-timeout-s", type=float, default=5.0)
    p.add_argument("--gateways", type=int, nargs="+", default=[1, 2],
                   help="the shapes to run: 1 is a single process")
    args = p.parse_args(argv)
    root = args.root.resolve()
    print(f"server from {root}: {args.connections} connections x {args.requests} x 1 MB, "
          f"{args.every_s:g} s apart, unread; --body-timeout-s {args.body_timeout_s:g}")
    for gateways in args.gateways:
        with running_server(1, "sim", server_args(args.body_timeout_s, root, gateways),
                            cwd=root) as srv:
            figures = unread_scenario(srv, args.connections, args.requests, args.every_s,
                                      args.body_timeout_s)
        print(json.dumps({"gateways": gateways, **asdict(figures)}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
