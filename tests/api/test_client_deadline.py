"""Every attempt stays inside the call's deadline: its timeouts are what is left of it, a
timeout raises DeadlineExceeded (not ConnectionFailed), and against a real socket that
accepts and never answers, `timeout=1` raises DeadlineExceeded with no attempt begun later."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
import httpx
import pytest

import batchgate_client as c
from tests.api.client_fakes import FakeClock, echo, make, refuse, run

KINDS = ["sync", "async"]


def test_each_attempt_times_out_at_what_is_left_of_the_deadline() -> None:
    clock, timeouts = FakeClock(), list[dict[str, float]]()

    def handler(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"])
        return refuse(429, "rate_limited", 1) if len(timeouts) == 1 else echo(request)

    make(handler, clock, timeout=10).batchstring(["a"])
    assert set(timeouts[0].values()) == {10.0}
    assert set(timeouts[1].values()) == {10.0 - clock.slept[0]}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("timeout", [httpx.ReadTimeout, httpx.ConnectTimeout,
                                     httpx.WriteTimeout, httpx.PoolTimeout])
def test_a_timeout_is_the_deadline_passing_and_ends_the_call(
        kind: str, timeout: type[httpx.TimeoutException]) -> None:
    attempts: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(request)
        raise timeout("no answer")

    with pytest.raises(c.DeadlineExceeded) as caught:
        run(kind, handler, ["a"])
    assert len(attempts) == 1 and isinstance(caught.value, TimeoutError)


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_connection_is_still_a_connection_failure(kind: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(c.ConnectionFailed):
        run(kind, handler, ["a"])


@dataclass
class Silent:
    """A real listening socket that accepts connections and never answers."""

    url: str
    accepted: list[float] = field(default_factory=list)  # time.monotonic() of each


@contextmanager
def silent_server() -> Iterator[Silent]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    server, stop, held = Silent(f"http://127.0.0.1:{listener.getsockname()[1]}"), \
        threading.Event(), list[socket.socket]()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            server.accepted.append(time.monotonic())
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        listener.close()


def call_silently(kind: str, url: str, texts: list[str]) -> None:
    if kind == "sync":
        with c.Client(url, "k", timeout=1) as client:
            client.batchstring(texts)
        return

    async def call() -> None:
        async with c.AsyncClient(url, "k", timeout=1) as client:
            await client.batchstring(texts)

    anyio.run(call)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("count", [1, 150])
def test_a_silent_server_ends_the_call_at_its_deadline(kind: str, count: int) -> None:
    with silent_server() as server:
        started = time.monotonic()
        with pytest.raises(c.DeadlineExceeded):
            call_silently(kind, server.url, [f"t{i}" for i in range(count)])
        ended = time.monotonic()
    assert ended - started >= 0.9  # it waited for the answer until the deadline
    # One attempt per request, each begun before the deadline: none after it.
    assert len(server.accepted) == (count + 99) // 100
    assert all(t < started + 1.0 for t in server.accepted)
