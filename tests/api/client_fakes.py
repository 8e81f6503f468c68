"""A fake batchgate for the client's unit tests (handlers for httpx.MockTransport) and a
fake clock whose sleeps advance it; `run` calls either client the same way."""

from __future__ import annotations

import random
from collections.abc import Callable

import anyio
import httpx

import batchgate_client as c

Handler = Callable[[httpx.Request], httpx.Response]


class FakeClock:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, list[float]()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def inputs_of(request: httpx.Request) -> list[str]:
    inputs: list[str] = httpx.Response(200, content=request.content).json()["inputs"]
    return inputs


def echo(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"id": "x", "outputs": [s[::-1] for s in inputs_of(request)]})


def refuse(status: int, code: str, retry_after: int | str | None = None,
           headers: dict[str, str] | None = None) -> httpx.Response:
    headers = dict(headers or {})
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return httpx.Response(status, json={"error": {"code": code, "message": "no"}},
                          headers=headers)


def make(handler: Handler, clock: FakeClock, timeout: float = 30.0,
         api_key: str | None = "k", retry: c.RetryPolicy | None = None) -> c.Client:
    return c.Client("http://batchgate", api_key, timeout=timeout, retry=retry,
                    transport=httpx.MockTransport(handler), clock=clock, sleep=clock.sleep,
                    rng=random.Random(1))


def make_async(handler: Handler, clock: FakeClock, timeout: float = 30.0) -> c.AsyncClient:
    return c.AsyncClient("http://batchgate", "k", timeout=timeout,
                         transport=httpx.MockTransport(handler), clock=clock,
                         sleep=clock.asleep, rng=random.Random(1))


def run(kind: str, handler: Handler, texts: list[str], clock: FakeClock | None = None,
        timeout: float = 30.0) -> list[str]:
    """`batchstring(texts)` on a blocking (`kind` "sync") or async client of the fake."""
    clock = clock or FakeClock()
    if kind == "sync":
        with make(handler, clock, timeout) as client:
            return client.batchstring(texts)

    async def call() -> list[str]:
        async with make_async(handler, clock, timeout) as client:
            return await client.batchstring(texts)

    return anyio.run(call)
