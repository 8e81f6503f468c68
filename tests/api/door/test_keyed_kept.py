"""What ran is kept: a keyed request whose deadline passes (or whose client leaves) while its
inputs are in a batch leaves them to finish, and their answer is kept when it lands, so the
retry replays it and the model runs once. An input that never started keeps nothing.

Driven through the door (`Door.run`) over a core whose batches the test starts, finishes and
fails, as the dispatch core marks and settles items.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import anyio
import orjson
import pytest
from anyio.abc import TaskGroup

from api.door import Door, RateLimiter
from api.door import keyed as keyed_module
from api.http import ClientWatch, Job, Rendered
from api.kept import MemoryIdempotencyStore
from api.metrics import Metrics
from batcher import MonotonicClock
from failover import ModelError
from tests.api.door.fakes import REPLAYED, ROOMY, WHO, BatchCore, Client

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # a request waits on an asyncio future (`PendingRequest`)


def keyed(texts: Sequence[str] = ("hello",), key: str = "k-1", timeout: float = 10.0) -> Job:
    body = orjson.dumps(list(texts))
    return Job(WHO, list(texts), len(texts) == 1, timeout,
               (key, hashlib.sha256(body).digest()))


def door_over(core: BatchCore) -> Door:
    store = MemoryIdempotencyStore(ttl=60, max_entries=100)
    return Door(core, MonotonicClock(), RateLimiter(ROOMY), store, lambda tier: 0.0, Metrics())


def start(tg: TaskGroup, door: Door, job: Job, client: ClientWatch | None = None
          ) -> list[Rendered]:
    got: list[Rendered] = []

    async def run() -> None:
        answer = await door.run(job, client)
        assert isinstance(answer, Rendered)
        got.append(answer)

    tg.start_soon(run)
    return got


async def ended(door: Door, job: Job, core: BatchCore, client: Client | None = None,
                started: int | None = None) -> Rendered:
    """`job` run until its batch of `started` inputs (all by default) is running and its
    deadline passes (or, with `client`, its client hangs up): its own answer."""
    async with anyio.create_task_group() as tg:
        got = start(tg, door, job, client)
        await anyio.wait_all_tasks_blocked()
        core.start(started)
        if client is not None:
            client.hang_up()
    return got[0]


def code(answer: Rendered) -> tuple[int, str]:
    return answer.status, orjson.loads(answer.body)["error"]["code"]


async def test_a_batch_that_lands_after_the_deadline_is_kept_and_replayed() -> None:
    core = BatchCore()
    door = door_over(core)
    with anyio.fail_after(5):
        first = await ended(door, keyed(timeout=0.05), core)
        core.finish()  # the batch lands after its client was answered 504
        again = await door.run(keyed())
    assert code(first) == (504, "deadline_exceeded") and core.cancelled == []
    assert isinstance(again, Rendered) and again.status == 200 and REPLAYED in again.headers
    assert orjson.loads(again.body)["output"] == "olleh" and core.ran == ["hello"]


async def test_a_retry_while_the_batch_still_runs_joins_it_and_gets_its_answer() -> None:
    core = BatchCore()
    door = door_over(core)
    with anyio.fail_after(5):
        first = await ended(door, keyed(timeout=0.05), core)
        async with anyio.create_task_group() as tg:
            retry = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            assert core.queued == []  # joined: nothing admitted again
            core.finish()
    assert code(first) == (504, "deadline_exceeded")
    assert retry[0].status == 200 and REPLAYED in retry[0].headers and core.ran == ["hello"]


async def test_a_batch_that_lands_after_the_client_left_is_kept_and_replayed() -> None:
    core, client = BatchCore(), Client()
    door = door_over(core)
    with anyio.fail_after(5):
        first = await ended(door, keyed(), core, client)
        core.finish()
        again = await door.run(keyed())
    assert code(first) == (499, "client_closed")
    assert isinstance(again, Rendered) and again.status == 200 and REPLAYED in again.headers
    assert core.ran == ["hello"]


async def test_a_request_whose_deadline_passed_while_queued_keeps_nothing_and_runs_again(
) -> None:
    core = BatchCore()
    door = door_over(core)
    with anyio.fail_after(5):
        first = await door.run(keyed(timeout=0.05))  # never started: withdrawn
        async with anyio.create_task_group() as tg:
            again = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            core.start()
            core.finish()
    assert isinstance(first, Rendered) and code(first) == (504, "deadline_exceeded")
    assert [item.text for item in core.cancelled] == ["hello"]
    assert again[0].status == 200 and REPLAYED not in again[0].headers
    assert core.ran == ["hello"]  # once: the first never ran


async def test_inputs_some_of_which_never_started_are_all_withdrawn_and_nothing_kept() -> None:
    core = BatchCore()
    door = door_over(core)
    job = keyed(["one", "two"], timeout=0.05)
    with anyio.fail_after(5):
        first = await ended(door, job, core, started=1)  # "two" is still queued
        core.finish()  # "one" lands: half an answer, not kept
        async with anyio.create_task_group() as tg:
            again = start(tg, door, job._replace(timeout=10.0))
            await anyio.wait_all_tasks_blocked()
            core.start()
            core.finish()
    assert code(first) == (504, "deadline_exceeded") and len(core.cancelled) == 2
    assert again[0].status == 200 and REPLAYED not in again[0].headers
    assert orjson.loads(again[0].body)["outputs"] == ["eno", "owt"]


async def test_a_batch_that_fails_after_the_deadline_keeps_nothing_and_joiners_retry() -> None:
    core = BatchCore()
    door = door_over(core)
    with anyio.fail_after(5):
        first = await ended(door, keyed(timeout=0.05), core)
        async with anyio.create_task_group() as tg:
            joiner = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            core.fail(ModelError("ValueError", "bad input"))
        async with anyio.create_task_group() as tg:
            again = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            core.start()
            core.finish()
    assert code(first) == (504, "deadline_exceeded") and code(joiner[0]) == (503, "retry")
    assert again[0].status == 200 and REPLAYED not in again[0].headers


async def test_an_answer_that_lands_before_the_request_is_concluded_is_kept() -> None:
    core, client = BatchCore(), Client()
    door = door_over(core)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            first = start(tg, door, keyed(), client)
            await anyio.wait_all_tasks_blocked()
            core.start()
            client.hang_up()
            core.finish()  # in the same turn: before the door decides what to withdraw
        again = await door.run(keyed())
    assert code(first[0]) == (499, "client_closed")
    assert isinstance(again, Rendered) and again.status == 200 and REPLAYED in again.headers


async def test_a_batch_that_never_lands_gives_the_key_up_after_the_backstop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keyed_module, "LINGER_S", 0.05)
    core = BatchCore()
    store = MemoryIdempotencyStore(ttl=60, max_entries=100)
    door = Door(core, MonotonicClock(), RateLimiter(ROOMY), store, lambda tier: 0.0, Metrics())
    with anyio.fail_after(5):
        await ended(door, keyed(timeout=0.05), core)
        assert store.statistics().in_flight == 1  # the key waits for its batch
        joiner = await door.run(keyed())  # joins it until the backstop gives it up
        assert isinstance(joiner, Rendered) and code(joiner) == (503, "retry")
        assert store.statistics().in_flight == 0
        async with anyio.create_task_group() as tg:
            again = start(tg, door, keyed())
            await anyio.wait_all_tasks_blocked()
            assert [item.text for item in core.queued] == ["hello"]  # it leads: runs again
            core.start()
            core.finish()
    assert again[0].status == 200 and REPLAYED not in again[0].headers
