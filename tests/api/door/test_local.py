"""The direct way's local route against the real core over a fake pool: the single process as
`api.door.build` makes it, served by uvicorn with batchgate's HTTP protocol, its lifespan run.
A plain POST /v1/batchstring is served by the protocol itself, its items admitted straight
into the core with the request as their collation."""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace

import anyio
import httpx
import orjson
import pytest
import uvicorn
from anyio.abc import ByteStream, TaskGroup

from api.config import DEFAULT_TIERS, KeyRing, Settings, Workers
from api.door import Built, LocalRoute, build
from api.http import server_config
from batcher import Tier
from tests.api.door.fakes import FakePool

pytestmark = pytest.mark.anyio
SETTINGS = Settings(workers=Workers(1), batch_latency_ms=100, max_wait_ms=1, log_level="warning")
KEYS = KeyRing({}, frozenset())  # everyone anonymous, free tier


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves on asyncio


@pytest.fixture(autouse=True)
def process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The lifespan freezes the heap and retunes the collector, and ends the process if the
    core fails once up: undone, and the exit recorded, here."""
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    assert exits == [], "the core failed while serving"


@asynccontextmanager
async def served(pool: FakePool, keys: KeyRing = KEYS
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, Built]]:
    """The single process over `pool`, on a free loopback port, its lifespan run."""
    settings = replace(SETTINGS, workers=Workers(pool.size))
    built = build(settings, keys, pool=pool)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections wait in the backlog until the workers are ready
    server = uvicorn.Server(server_config(built.app, settings, built.direct))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        try:
            async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
                with anyio.fail_after(10):
                    yield client, built
        finally:
            pool.release()  # the drain on the way out waits for whatever runs
            server.should_exit = True


async def until(condition: Callable[[], bool]) -> None:
    """Once `condition` holds of the core's state: the core announces no change of its
    queue, so it is read between the server's loop turns (bounded by `served`)."""
    while not condition():  # noqa: ASYNC110
        await anyio.sleep(0.005)


def pending(built: Built) -> int:
    return built.service.core.statistics().batcher.pending


def error(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


async def test_each_request_gets_its_own_outputs() -> None:
    texts = [f"request-{n}" for n in range(20)]
    async with served(FakePool(size=2)) as (client, built), anyio.create_task_group() as tg:
        assert isinstance(built.direct, LocalRoute)
        answers = [post_soon(tg, client, text, text.upper()) for text in texts]
    for text, (answer,) in zip(texts, answers, strict=True):
        assert answer.status_code == 200
        assert answer.json()["outputs"] == [text[::-1], text.upper()[::-1]]


async def test_a_refused_request_is_a_json_503_with_retry_after_and_never_runs() -> None:
    tiers = dict(DEFAULT_TIERS)
    tiers[Tier.FREE] = replace(tiers[Tier.FREE], budget_ms=120)  # 100 items take ~200 ms
    pool = FakePool()
    async with served(pool, KeyRing({}, frozenset(), tiers=tiers)) as (client, _):
        answer = await client.post("/v1/batchstring",
                                   json={"inputs": [f"x{n}" for n in range(100)]})
    assert error(answer) == (503, "over_budget") and answer.headers["retry-after"] == "1"
    assert answer.headers["content-type"] == "application/json" and pool.ran == []


async def test_a_client_that_hangs_up_is_withdrawn_and_its_item_never_reaches_the_pool(
) -> None:
    pool = FakePool()
    async with served(pool) as (client, built), anyio.create_task_group() as tg:
        pool.hold()
        first = post_soon(tg, client, "first")
        await pool.wait_batches(1)  # the one worker is busy with it
        gone = await plain_request(client, "gone")
        await until(lambda: pending(built) == 1)  # queued behind it
        await gone.aclose()
        await until(lambda: pending(built) == 0)  # withdrawn
        pool.release()
        later = await client.post("/v1/batchstring", json={"input": "later"})
    assert first[0].json()["outputs"] == ["tsrif"] and later.json()["output"] == "retal"
    assert pool.ran == ["first", "later"]


async def test_a_request_whose_deadline_passes_gets_504() -> None:
    pool = FakePool()
    async with served(pool) as (client, _):
        pool.hold()  # its batch runs on and on
        answer = await client.post("/v1/batchstring", json={"input": "slow"},
                                   headers={"X-Request-Timeout-Ms": "50"})
    assert error(answer) == (504, "deadline_exceeded") and pool.ran == ["slow"]


def post_soon(tg: TaskGroup, client: httpx.AsyncClient, *texts: str) -> list[httpx.Response]:
    """POST `texts` in a task of `tg`; the answer lands in the list."""
    got: list[httpx.Response] = []

    async def post() -> None:
        got.append(await client.post("/v1/batchstring", json={"inputs": list(texts)}))

    tg.start_soon(post)
    return got


async def plain_request(client: httpx.AsyncClient, text: str) -> ByteStream:
    """A plain request for `text` on a connection of its own, left open."""
    port, body = client.base_url.port, orjson.dumps({"input": text})
    assert port is not None
    stream = await anyio.connect_tcp("127.0.0.1", port)
    await stream.send(b"POST /v1/batchstring HTTP/1.1\r\nHost: t\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return stream
