"""Open-loop HTTP load generator: requests leave at their scheduled times whether or not
earlier ones were answered, and every latency runs from the *scheduled* time, so neither a
slow server nor a slow generator can hide queueing (no coordinated omission).

A minimal HTTP/1.1 keep-alive client on asyncio Protocols (status line, Content-Length,
body; no chunked encoding), with no task or future per request, lets one core offer
~2,000 RPS. Every answer is checked: each input is unique and must come back reversed.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import math
import os
import random
import sys
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import cast
from urllib.parse import urlsplit

import orjson

from loadtest.probe_results import (
    ClassResult,
    Latency,
    ProbeResult,
    format_result,
)

IDLE_CLOSE_S = 4.0  # below uvicorn's 5 s keep-alive, so we never write into a closing socket


@dataclass(frozen=True, slots=True)
class TrafficClass:
    """One kind of caller in the mix: its share of the requests and the headers it sends."""

    name: str
    weight: float = 1.0
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def bearer(cls, name: str, key: str | None, weight: float = 1.0) -> TrafficClass:
        auth = (("Authorization", f"Bearer {key}"),) if key else ()
        return cls(name, weight, auth)


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    """What to offer. `connections=None` opens rps x expected latency x 2 connections at the
    start and more whenever a request finds none free, up to `max_connections`: answers
    slower than expected must not turn the open-loop load into a queue in the client. A
    number given is the pool, fixed."""

    url: str = "http://127.0.0.1:8000"
    rps: float = 100.0
    duration_s: float = 10.0
    arrival: str = "poisson"  # or "fixed"
    path: str = "/v1/batchstring"
    classes: tuple[TrafficClass, ...] = (TrafficClass("default"),)
    timeout_s: float = 15.0
    expected_latency_s: float = 0.15
    connections: int | None = None
    max_connections: int = 1024
    max_in_flight: int = 50_000
    input_chars: int = 16
    idempotency: bool = False  # an Idempotency-Key of its own on every request
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.rps <= 0 or self.duration_s <= 0 or self.timeout_s <= 0:
            raise ValueError("rps, duration_s and timeout_s must be > 0")
        if self.arrival not in ("poisson", "fixed"):
            raise ValueError(f"arrival must be poisson or fixed, got {self.arrival!r}")
        if not self.classes or any(c.weight <= 0 for c in self.classes):
            raise ValueError("give at least one traffic class, each with a weight > 0")
        if self.max_in_flight < 1 or (self.connections is not None and self.connections < 1):
            raise ValueError("connections and max_in_flight must be >= 1")

    def pool_size(self) -> int:
        """The connections opened before the first send."""
        if self.connections is not None:
            return self.connections
        need = math.ceil(self.rps * self.expected_latency_s * 2)
        return max(8, min(need, self.max_connections))

    def pool_cap(self) -> int:
        """The most connections open at once."""
        return self.connections if self.connections is not None else max(
            self.pool_size(), self.max_connections)


class _Req:
    __slots__ = ("cls", "conn", "done", "payload", "scheduled", "text", "timer")

    def __init__(self, text: str, scheduled: float, cls: int, payload: bytes) -> None:
        self.text, self.scheduled, self.cls, self.payload = text, scheduled, cls, payload
        self.conn: _Conn | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.done = False


class _Tally:
    __slots__ = ("latencies", "lost", "ok", "refusals", "sent", "statuses", "wrong")

    def __init__(self) -> None:
        self.sent = self.ok = self.wrong = self.lost = 0
        self.statuses: Counter[int] = Counter()
        self.latencies: list[float] = []
        self.refusals: list[float] = []

    def freeze(self) -> ClassResult:
        return ClassResult(self.sent, self.ok, self.wrong, self.lost, dict(self.statuses),
                           Latency.of(self.latencies), Latency.of(self.refusals))


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time (no pipelining)."""

    def __init__(self, probe: _Probe) -> None:
        self.probe = probe
        self.transport = cast(asyncio.Transport, None)
        self.buf = bytearray()
        self.req: _Req | None = None
        self.closed = False
        self.idle_since = 0.0
        self._start = self._end = -1
        self._status = 0
        self._close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.probe.conn_lost(self, exc)

    def send(self, req: _Req) -> None:
        self.req, req.conn = req, self
        self.transport.write(req.payload)

    def data_received(self, data: bytes) -> None:
        if self.req is None:  # bytes nobody asked for: this connection cannot be trusted
            self.transport.abort()
            return
        buf = self.buf
        buf += data
        if self._end < 0:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = bytes(buf[:head_end]).lower()
            try:
                self._status = int(head[9:12])
                self._start = head_end + 4
                self._end = self._start + _content_length(head)
            except ValueError:
                self.probe.settle(self.req, 0, b"", "protocol")
                self.transport.abort()
                return
            self._close_after = b"\r\nconnection: close" in head
        if len(buf) < self._end:
            return
        body = bytes(buf[self._start:self._end])
        extra = len(buf) > self._end
        buf.clear()
        self._start = self._end = -1
        req, self.req = self.req, None
        self.probe.settle(req, self._status, body, "protocol" if extra else None)
        if extra or self._close_after:
            self.transport.close()
        else:
            self.probe.release(self)


def _content_length(head: bytes) -> int:
    k = head.find(b"\r\ncontent-length:")
    if k < 0:
        raise ValueError("no Content-Length")
    stop = head.find(b"\r\n", k + 2)
    return int(head[k + 17:stop if stop >= 0 else None])


class _Probe:
    """One run: schedule, connection pool and tallies. Callbacks only; no task per request."""

    def __init__(self, cfg: ProbeConfig) -> None:
        self.cfg = cfg
        self.loop = asyncio.get_running_loop()
        parts = urlsplit(cfg.url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.heads = [_head(self.host, self.port, cfg.path, c) for c in cfg.classes]
        self.cum = list(itertools.accumulate(c.weight for c in cfg.classes))
        self.rng = random.Random(cfg.seed)
        self.tag = os.urandom(4).hex()
        self.tallies = [_Tally() for _ in cfg.classes]
        self.errors: Counter[str] = Counter()
        self.lags: list[float] = []
        self.free: list[_Conn] = []
        self.waiters: deque[_Req] = deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self.all_conns: set[_Conn] = set()
        self.cap, self.open, self.peak = cfg.pool_cap(), 0, 0
        self.outstanding = self.shed = self.conn_waits = 0
        self.first_ok = self.last_ok = 0.0
        self.scheduled_all = self.finished = False
        self.idle = asyncio.Event()
        self.t0 = 0.0

    async def run(self) -> ProbeResult:
        await self._preconnect()
        self.t0 = self.loop.time() + 0.005
        try:
            n = await self._schedule()
            self.scheduled_all = True
            if self.outstanding:  # every request's own timer fires before this one
                with contextlib.suppress(TimeoutError):  # _close_all counts any left
                    await asyncio.wait_for(self.idle.wait(), self.cfg.timeout_s + 1.0)
        finally:
            await self._close_all()
        return self._result(n, self.loop.time() - self.t0)

    async def _preconnect(self) -> None:
        for _ in range(self.cfg.pool_size()):
            self._spawn_open()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=min(5.0, self.cfg.timeout_s))

    async def _schedule(self) -> int:
        n = 0
        for n, offset in enumerate(self._offsets(), start=1):
            at = self.t0 + offset
            now = self.loop.time()
            if at > now:
                await asyncio.sleep(at - now)
                now = self.loop.time()
            elif n % 64 == 0:
                await asyncio.sleep(0)  # behind schedule: still let the answers in
            self._fire(n, at, now)
        return n

    def _offsets(self) -> Iterator[float]:
        cfg, t = self.cfg, 0.0
        for i in itertools.count():
            t = t + self.rng.expovariate(cfg.rps) if cfg.arrival == "poisson" else i / cfg.rps
            if t >= cfg.duration_s:
                return
            yield t

    def _fire(self, n: int, at: float, now: float) -> None:
        self.lags.append(max(0.0, now - at))
        if self.outstanding >= self.cfg.max_in_flight:
            self.shed += 1
            self.errors["shed"] += 1
            return
        cls = bisect.bisect_right(self.cum, self.rng.random() * self.cum[-1])
        cls = min(cls, len(self.cum) - 1)
        text = f"r{n}-{self.tag}".ljust(self.cfg.input_chars, "x")
        body = orjson.dumps({"input": text})
        key = b"Idempotency-Key: %s\r\n" % text.encode() if self.cfg.idempotency else b""
        req = _Req(text, at, cls, b"%s%sContent-Length: %d\r\n\r\n%s"
                   % (self.heads[cls], key, len(body), body))
        req.timer = self.loop.call_at(at + self.cfg.timeout_s, self._timeout, req)
        self.outstanding += 1
        self.tallies[cls].sent += 1
        self._dispatch(req, now)

    def _dispatch(self, req: _Req, now: float) -> None:
        while self.free:
            conn = self.free.pop()  # LIFO: hot connections stay hot, cold ones age out
            if conn.closed:
                continue
            if now - conn.idle_since > IDLE_CLOSE_S:
                conn.transport.close()
                continue
            conn.send(req)
            return
        self.waiters.append(req)
        self.conn_waits += 1
        if self.open < self.cap:
            self._spawn_open()

    def _spawn_open(self) -> None:
        self.open += 1
        self.peak = max(self.peak, self.open)
        task = self.loop.create_task(self._open())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _open(self) -> None:
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Conn(self), self.host, self.port),
                self.cfg.timeout_s,
            )
        except OSError:  # includes TimeoutError
            self.open -= 1
            while self.waiters:  # one failed connection fails one waiting request
                req = self.waiters.popleft()
                if not req.done:
                    self.settle(req, 0, b"", "connect")
                    break
            return
        self.all_conns.add(conn)
        self.release(conn)

    def release(self, conn: _Conn) -> None:
        while self.waiters:
            req = self.waiters.popleft()
            if not req.done:
                conn.send(req)
                return
        conn.idle_since = self.loop.time()
        self.free.append(conn)

    def conn_lost(self, conn: _Conn, exc: Exception | None) -> None:
        self.open -= 1
        self.all_conns.discard(conn)
        if self.finished:
            return
        if conn.req is not None:
            self.settle(conn.req, 0, b"", "reset" if exc else "closed")
            conn.req = None
        if self.waiters and self.open < self.cap:
            self._spawn_open()

    def _timeout(self, req: _Req) -> None:
        conn = req.conn
        self.settle(req, 0, b"", "timeout")
        if conn is not None and conn.req is req:
            conn.req = None
            conn.transport.abort()  # HTTP/1.1 cannot cancel one request: drop the connection

    def settle(self, req: _Req | None, status: int, body: bytes, error: str | None) -> None:
        """Count one request's outcome, exactly once."""
        if req is None or req.done:
            return
        req.done = True
        if req.timer is not None:
            req.timer.cancel()
        self.outstanding -= 1
        tally = self.tallies[req.cls]
        if error is not None:
            tally.lost += 1
            self.errors[error] += 1
        else:
            tally.statuses[status] += 1
            if status == 200:
                self._check(req, tally, body)
            else:
                tally.refusals.append(self.loop.time() - req.scheduled)
        if self.outstanding == 0 and self.scheduled_all:
            self.idle.set()

    def _check(self, req: _Req, tally: _Tally, body: bytes) -> None:
        try:
            right = orjson.loads(body)["output"] == req.text[::-1]
        except (ValueError, KeyError, TypeError):
            right = False
        if not right:
            tally.wrong += 1
            return
        now = self.loop.time()
        tally.ok += 1
        tally.latencies.append(now - req.scheduled)
        self.first_ok = self.first_ok or now
        self.last_ok = now

    async def _close_all(self) -> None:
        for conn in list(self.all_conns):
            if conn.req is not None:
                self.settle(conn.req, 0, b"", "unfinished")
        for req in self.waiters:
            self.settle(req, 0, b"", "unfinished")
        self.finished = True
        for task in self.tasks:
            task.cancel()
        for conn in list(self.all_conns):
            conn.transport.abort()
        await asyncio.sleep(0)  # let the transports run connection_lost before the loop ends

    def _result(self, n: int, wall: float) -> ProbeResult:
        classes = {c.name: t.freeze() for c, t in zip(self.cfg.classes, self.tallies, strict=True)}
        ok = sum(c.ok for c in classes.values())
        span = self.last_ok - self.first_ok
        return ProbeResult(
            offered_rps=self.cfg.rps, duration_s=self.cfg.duration_s, wall_s=wall,
            scheduled=n, sent=n - self.shed, ok=ok,
            wrong=sum(c.wrong for c in classes.values()),
            lost=sum(c.lost for c in classes.values()), shed=self.shed,
            statuses=dict(sum((Counter(c.statuses) for c in classes.values()), Counter())),
            errors=dict(self.errors),
            latency=Latency.of([x for t in self.tallies for x in t.latencies]),
            lag=Latency.of(self.lags), achieved_rps=(ok - 1) / span if span > 0 else 0.0,
            conn_waits=self.conn_waits, connections=self.peak, classes=classes,
            refusal_latency=Latency.of([x for t in self.tallies for x in t.refusals]),
        )


def _head(host: str, port: int, path: str, cls: TrafficClass) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in cls.headers]
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


async def run_probe(config: ProbeConfig) -> ProbeResult:
    """Offer `config`'s load once; returns within duration + timeout + ~1 s."""
    return await _Probe(config).run()


def _mix(spec: str) -> TrafficClass:
    name, _, rest = spec.partition(":")
    weight, _, key = rest.partition(":")
    return TrafficClass.bearer(name, key or None, float(weight or 1))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.probe", description=__doc__)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--rps", type=float, default=100.0)
    p.add_argument("--duration", type=float, default=10.0, help="seconds of offered load")
    p.add_argument("--arrival", choices=["poisson", "fixed"], default="poisson")
    p.add_argument("--timeout", type=float, default=15.0, help="per request, seconds")
    p.add_argument("--connections", type=int, default=None, help="pool size (default: auto)")
    p.add_argument("--max-in-flight", type=int, default=50_000)
    p.add_argument("--input-chars", type=int, default=16)
    p.add_argument("--idempotency", action="store_true",
                   help="send a unique Idempotency-Key with every request")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--mix", action="append", type=_mix, metavar="NAME:WEIGHT[:BEARER_KEY]",
                   help="a traffic class; repeat to mix, e.g. paid:3:paid-demo-key")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    cfg = ProbeConfig(
        url=a.url, rps=a.rps, duration_s=a.duration, arrival=a.arrival, timeout_s=a.timeout,
        connections=a.connections, max_in_flight=a.max_in_flight, input_chars=a.input_chars,
        seed=a.seed, classes=tuple(a.mix or [TrafficClass("default")]),
        idempotency=a.idempotency,
    )
    result = asyncio.run(run_probe(cfg))
    as_json = orjson.dumps(asdict(result), option=orjson.OPT_NON_STR_KEYS).decode()
    print(as_json if a.json else format_result(result))
    return 0 if result.wrong == 0 and result.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
