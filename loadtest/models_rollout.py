"""A bounded load generator for the models' end-to-end tests: it records, for every request,
when it was due, sent and answered, its status and the version that ran it (the body's
"model"), so a test can check which version answered what, in which order, and how long
each waited.

`offer` is open loop (requests leave at their scheduled times whether or not earlier ones
were answered, and latency runs from the scheduled time, so a slow server cannot hide a
wait); `send_all` is closed loop, as fast as its connections allow. Both are bounded in
count and time. A small HTTP/1.1 keep-alive client on asyncio streams (Content-Length
bodies only) keeps the generator's CPU low beside the server on a small machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson

Request = tuple[Mapping[str, object], Mapping[str, str]]  # JSON body, headers
PATH = "/v1/batchstring"
IDLE_CLOSE_S = 4.0  # below uvicorn's 5 s keep-alive: an idle connection older is not reused


@dataclass(frozen=True, slots=True)
class Shot:
    """One request's outcome (times: `time.monotonic()`; status 0: no answer)."""

    index: int
    scheduled: float
    sent: float
    done: float
    status: int
    body: dict[str, object]
    headers: dict[str, str]
    error: str = ""  # why there is no answer (status 0)

    @property
    def latency(self) -> float:
        return self.done - self.scheduled

    @property
    def model(self) -> str | None:
        model = self.body.get("model")
        return model if isinstance(model, str) else None

    @property
    def error_code(self) -> str | None:
        """The error tree's code of a refusal ("model_loading")."""
        error = self.body.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        return code if isinstance(code, str) else None

    @property
    def output(self) -> str | None:
        outputs = self.body.get("outputs")
        if isinstance(outputs, list) and outputs and isinstance(outputs[0], str):
            return outputs[0]
        output = self.body.get("output")
        return output if isinstance(output, str) else None


class _Conn:
    """One keep-alive connection, one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.reusable = True
        self.idle_since = time.monotonic()

    async def call(self, head: bytes, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(head + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        data = await self.reader.readexactly(int(headers.get("content-length", "0")))
        self.reusable = headers.get("connection", "").lower() != "close"
        self.idle_since = time.monotonic()
        return status, headers, data

    def close(self) -> None:
        self.writer.close()


class _Pool:
    """Up to `size` connections, opened as needed and reused."""

    def __init__(self, url: str, size: int, timeout_s: float) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.size, self.timeout_s = size, timeout_s
        self.idle: list[_Conn] = []
        self.opened = 0
        self.freed = asyncio.Condition()
        self.all: set[_Conn] = set()

    async def _take(self) -> _Conn:
        async with self.freed:
            while not self.idle and self.opened >= self.size:
                await self.freed.wait()
            while self.idle:
                conn = self.idle.pop()
                if time.monotonic() - conn.idle_since < IDLE_CLOSE_S:
                    return conn
                self.opened -= 1  # the server may be closing it: never write into that
                conn.close()
                self.all.discard(conn)
            self.opened += 1
        try:
            conn = _Conn(*await asyncio.open_connection(self.host, self.port))
        except BaseException:
            await self._give(None)
            raise
        self.all.add(conn)
        return conn

    async def _give(self, conn: _Conn | None) -> None:
        async with self.freed:
            if conn is not None and conn.reusable:
                self.idle.append(conn)
            else:
                self.opened -= 1
                if conn is not None:
                    conn.close()
                    self.all.discard(conn)
            self.freed.notify()

    async def shoot(self, index: int, scheduled: float, request: Request) -> Shot:
        body, headers = request
        payload = orjson.dumps(dict(body))
        head = (f"POST {PATH} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
        conn: _Conn | None = None
        sent = math.nan
        status, answer, error = 0, b"", ""
        got: dict[str, str] = {}
        try:
            async with asyncio.timeout(self.timeout_s):
                conn = await self._take()
                sent = time.monotonic()
                status, got, answer = await conn.call(head, payload)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            error = repr(exc)
            if conn is not None:
                conn.reusable = False
        done = time.monotonic()
        if conn is not None:
            await self._give(conn)
        parsed: object = None
        with contextlib.suppress(orjson.JSONDecodeError):
            parsed = orjson.loads(answer) if answer else None
        return Shot(index, scheduled, sent, done, status,
                    parsed if isinstance(parsed, dict) else {}, got, error)

    def close(self) -> None:
        for conn in self.all:
            conn.close()


async def offer(
    url: str, rps: float, make: Callable[[int], Request], *, max_s: float,
    stop: asyncio.Event | None = None, connections: int = 64, timeout_s: float = 10.0,
) -> list[Shot]:
    """Open loop at `rps` until `stop` is set or `max_s` has passed (at most rps x max_s
    requests), then wait for the answers (each bounded by `timeout_s`). `make(i)`: the
    i-th request. The shots in the order they were scheduled."""
    pool = _Pool(url, connections, timeout_s)
    tasks: list[asyncio.Task[Shot]] = []
    start = time.monotonic()
    try:
        for i in range(math.ceil(rps * max_s)):
            due = start + i / rps
            if stop is not None and stop.is_set():
                break
            delay = due - time.monotonic()
            if delay > 0:
                if stop is None:
                    await asyncio.sleep(delay)  # the schedule itself, not a condition
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        break
            tasks.append(asyncio.create_task(pool.shoot(i, due, make(i))))
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        pool.close()


async def send_all(url: str, requests: Sequence[Request], *, concurrency: int = 32,
                   timeout_s: float = 30.0) -> list[Shot]:
    """Every request, `concurrency` at a time (each bounded by `timeout_s`); the shots in
    the requests' order."""
    pool = _Pool(url, concurrency, timeout_s)
    queue = list(enumerate(requests))[::-1]
    out: list[Shot | None] = [None] * len(requests)

    async def lane() -> None:
        while queue:
            i, request = queue.pop()
            out[i] = await pool.shoot(i, time.monotonic(), request)

    try:
        await asyncio.gather(*(lane() for _ in range(min(concurrency, len(requests)))))
    finally:
        pool.close()
    return [shot for shot in out if shot is not None]


__all__ = ["PATH", "Request", "Shot", "offer", "send_all"]
