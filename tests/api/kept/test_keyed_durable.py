"""The keyed path (`api.door.KeyedPath`, through `Door.run`) with a durable layer behind
the memory store: a key answered before a restart, or on another cell, is replayed and not
run again; one running on another cell is waited for; a store that cannot be reached
refuses keyed requests (503 `state_unavailable`) and leaves the others alone; no answer
is given out that the store did not keep.

Real SQLite files and a real Redis; a core whose batches the test starts and finishes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import orjson
import pytest
from anyio.abc import TaskGroup

from api.door import Door, RateLimiter
from api.http import Answered, Job, Outcome, Rendered
from api.kept import BackedStore, KeptState, MemoryIdempotencyStore, SqliteState
from api.metrics import Metrics
from batcher import BatchgateError, Item, MonotonicClock, OverBudget
from tests.api.door.fakes import REPLAYED, ROOMY, WHO, BatchCore, keyed
from tests.api.kept.conftest import redis_at, sqlite_at
from tests.redis_server import RedisServer

pytestmark = pytest.mark.anyio


class Core(BatchCore):
    """`BatchCore` that `refusing` makes refuse at admission, and whose admissions a test
    can wait for."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing: BatchgateError | None = None
        self._admitted = anyio.Event()

    def admit(self, items: list[Item], deadline_in: float, now: float) -> None:
        if self.refusing is not None:
            raise self.refusing
        super().admit(items, deadline_in, now)
        self._admitted.set()

    async def wait_queued(self, n: int = 1) -> None:
        while len(self.queued) < n:
            self._admitted = anyio.Event()
            await self._admitted.wait()


class Cell:
    """A door over its own core and a store backed by `durable`, running."""

    def __init__(self, durable: KeptState) -> None:
        self.core = Core()
        memory = MemoryIdempotencyStore(ttl=60, max_entries=100)
        self.store = BackedStore(memory, durable, MonotonicClock(), poll=0.02)
        self.metrics = Metrics()
        self.door = Door(self.core, MonotonicClock(), RateLimiter(ROOMY), self.store,
                         lambda tier: 0.0, self.metrics)

    def state_errors(self) -> float:
        value = self.metrics.registry.get_sample_value("batchgate_state_errors_total",
                                                       {"part": "kept"})
        return value or 0.0


@pytest.fixture
async def tg() -> AsyncIterator[TaskGroup]:
    async with anyio.create_task_group() as group:
        with anyio.fail_after(10):
            yield group
        group.cancel_scope.cancel()


async def running(tg: TaskGroup, durable: KeptState) -> Cell:
    cell = Cell(durable)
    await tg.start(cell.store.run)
    return cell


def plain(text: str = "hello") -> Job:
    return Job(WHO, [text], True, 10.0)


class Running:
    """A request run in a task: its answer once it comes."""

    def __init__(self) -> None:
        self.answer: Rendered | None = None
        self.done = anyio.Event()

    async def wait(self) -> Rendered:
        await self.done.wait()
        assert self.answer is not None
        return self.answer


def start(tg: TaskGroup, cell: Cell, job: Job) -> Running:
    running = Running()

    async def run() -> None:
        answer = await cell.door.run(job)
        assert isinstance(answer, Rendered)
        running.answer = answer
        running.done.set()

    tg.start_soon(run)
    return running


async def answered(tg: TaskGroup, cell: Cell, job: Job) -> Rendered:
    """`job` run to its answer, its batch started and finished by the test."""
    got = start(tg, cell, job)
    await cell.core.wait_queued()
    cell.core.start()
    cell.core.finish()
    return await got.wait()


async def served_plainly(cell: Cell) -> Outcome:
    """A request without a key, answered."""
    got: list[Outcome] = []
    async with anyio.create_task_group() as tg:
        async def run() -> None:
            got.append(await cell.door.run(plain()))

        tg.start_soon(run)
        await cell.core.wait_queued()
        cell.core.start()
        cell.core.finish()
    return got[0]


def code(answer: Rendered | object) -> tuple[int, str]:
    assert isinstance(answer, Rendered)
    return answer.status, orjson.loads(answer.body)["error"]["code"]


async def test_an_answer_kept_in_the_file_is_replayed_by_the_next_core_without_a_run(
        tg: TaskGroup, tmp_path: Path) -> None:
    first = await running(tg, sqlite_at(tmp_path / "kept.db"))
    answer = await answered(tg, first, keyed())
    await first.store.drain()  # the core goes; its file stays
    second = await running(tg, sqlite_at(tmp_path / "kept.db"))
    replayed = await second.door.run(keyed())
    assert answer.status == 200 and REPLAYED not in answer.headers
    assert isinstance(replayed, Rendered) and replayed.body == answer.body
    assert REPLAYED in replayed.headers and second.core.ran == []
    assert await second.door.run(keyed()) == replayed  # now from its memory store


async def test_a_file_that_cannot_grow_refuses_keyed_requests_before_the_model_runs(
        tg: TaskGroup, tmp_path: Path) -> None:
    durable = sqlite_at(tmp_path / "kept.db")
    cell = await running(tg, durable)
    assert isinstance(durable, SqliteState) and durable._db is not None
    pages = durable._db.execute("PRAGMA page_count").fetchone()[0]
    durable._db.execute(f"PRAGMA max_page_count={pages}")  # SQLITE_FULL, as a full disk
    with anyio.move_on_after(2):  # before: queued for the model, then 503 once it ran
        refused = await cell.door.run(keyed())
        assert code(refused) == (503, "state_unavailable")
    assert cell.core.queued == [] and cell.core.ran == []
    assert cell.state_errors() == 1
    served = await served_plainly(cell)
    assert isinstance(served, Answered) and served.outputs == ["olleh"]


async def test_a_key_answered_on_one_cell_is_replayed_on_another(
        tg: TaskGroup, redis_server: RedisServer) -> None:
    a = await running(tg, redis_at(redis_server, "cell-a"))
    b = await running(tg, redis_at(redis_server, "cell-b"))
    answer = await answered(tg, a, keyed())
    replayed = await b.door.run(keyed())
    assert isinstance(replayed, Rendered) and replayed.body == answer.body
    assert REPLAYED in replayed.headers and b.core.ran == []


async def test_a_key_running_on_another_cell_is_waited_for_and_runs_once(
        tg: TaskGroup, redis_server: RedisServer) -> None:
    a = await running(tg, redis_at(redis_server, "cell-a"))
    b = await running(tg, redis_at(redis_server, "cell-b"))
    leader = start(tg, a, keyed())
    await a.core.wait_queued()
    waiting = start(tg, b, keyed())
    await anyio.sleep(0.1)  # b polls Redis meanwhile, and admits nothing
    assert waiting.answer is None and b.core.queued == []
    a.core.start()
    a.core.finish()
    led, waited = await leader.wait(), await waiting.wait()
    assert waited.body == led.body and REPLAYED in waited.headers
    assert a.core.ran == ["hello"] and b.core.ran == []


async def test_a_leader_that_keeps_nothing_lets_another_cell_run_the_key_at_once(
        tg: TaskGroup, redis_server: RedisServer) -> None:
    a = await running(tg, redis_at(redis_server, "cell-a"))
    b = await running(tg, redis_at(redis_server, "cell-b"))
    a.core.refusing = OverBudget("expected wait 900 ms exceeds the paid tier's budget", 0.5)
    assert code(await a.door.run(keyed())) == (503, "over_budget")
    with anyio.fail_after(2):  # not the claim's lease (the request's 10 s and more)
        answer = await answered(tg, b, keyed())
    assert answer.status == 200 and b.core.ran == ["hello"]


async def test_the_key_with_another_body_on_another_cell_is_refused(
        tg: TaskGroup, redis_server: RedisServer) -> None:
    a = await running(tg, redis_at(redis_server, "cell-a"))
    b = await running(tg, redis_at(redis_server, "cell-b"))
    await answered(tg, a, keyed("hello"))
    assert code(await b.door.run(keyed("other"))) == (422, "idempotency_key_reused")


async def test_with_redis_gone_keyed_requests_get_503_and_the_rest_are_served(
        tg: TaskGroup, redis_server: RedisServer) -> None:
    cell = await running(tg, redis_at(redis_server))
    redis_server.stop()
    refused = await cell.door.run(keyed())
    assert code(refused) == (503, "state_unavailable")
    assert isinstance(refused, Rendered) and ("Retry-After", "1") in refused.headers
    assert cell.state_errors() == 1 and cell.core.queued == []
    served = await served_plainly(cell)
    assert isinstance(served, Answered) and served.outputs == ["olleh"]
    redis_server.start()
    assert (await answered(tg, cell, keyed())).status == 200  # no restart needed


async def test_an_answer_the_store_cannot_keep_is_not_given_out(
        tg: TaskGroup, redis_server: RedisServer) -> None:
    cell = await running(tg, redis_at(redis_server))
    leader = start(tg, cell, keyed())
    await cell.core.wait_queued()
    joiner = start(tg, cell, keyed())
    await anyio.wait_all_tasks_blocked()
    redis_server.stop()
    cell.core.start()
    cell.core.finish()
    assert code(await leader.wait()) == code(await joiner.wait()) == (503, "state_unavailable")
    redis_server.start()
    answer = await answered(tg, cell, keyed())  # nothing was kept: it runs again
    assert answer.status == 200 and REPLAYED not in answer.headers
    assert cell.core.ran == ["hello", "hello"]


async def test_a_batch_that_lands_after_its_deadline_is_kept_for_the_other_cells(
        tg: TaskGroup, redis_server: RedisServer) -> None:
    a = await running(tg, redis_at(redis_server, "cell-a"))
    b = await running(tg, redis_at(redis_server, "cell-b"))
    first = start(tg, a, keyed(timeout=0.3))
    await a.core.wait_queued()
    a.core.start()  # running when its deadline passes
    assert code(await first.wait()) == (504, "deadline_exceeded")
    a.core.finish()  # lands: kept in Redis by the store's own task
    with anyio.fail_after(2):
        replayed = await b.door.run(keyed())
    assert isinstance(replayed, Rendered) and replayed.status == 200
    assert REPLAYED in replayed.headers and b.core.ran == []
    assert orjson.loads(replayed.body)["output"] == "olleh"
