"""Guard verdicts through the door: a core that settles some inputs with a guard's refusal,
or lets them through unguarded (their guard failed open), or fails one closed. A refusal is
one input's verdict, not the request's failure; a keyed request keeps its verdicts with its
outputs, so that a replay says the same; a guard that failed closed is a 503 the next
request runs again.

Over fakes of the core (the guards' stage code is the core's); the verdict each input gets
is its text's: "bad..." refused by the guard `safety` for `toxic`, "risky..." answered with
the guard `leak` skipped, "down..." failed closed."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import orjson
import pytest

from api.door import Door, RateLimiter, is_kept
from api.http import Answered, Job, Outcome, Rendered, render
from api.kept import MemoryIdempotencyStore
from api.metrics import Metrics
from batcher import GuardUnavailable, Item, MonotonicClock, Refused
from tests.api.door.fakes import REPLAYED, ROOMY, WHO, BatchCore, QueueCore, keyed

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # a request waits on an asyncio future (`PendingRequest`)


def verdict(item: Item) -> str | BaseException:
    if item.text.startswith("bad"):
        return Refused("safety", "toxic")
    if item.text.startswith("down"):
        return GuardUnavailable("the guard safety did not answer in time", 2.0)
    if item.text.startswith("risky"):
        item.skipped = ("leak",)
    return item.text[::-1]


class GuardedCore(QueueCore):
    def judge(self) -> None:
        """Settle every queued input by its verdict."""
        self._settle(verdict)


class GuardedBatches(BatchCore):
    def judge(self) -> None:
        """Land the running batch, each input by its verdict."""
        self._settle(verdict)


def door_over(core: QueueCore | BatchCore) -> Door:
    store = MemoryIdempotencyStore(ttl=60, max_entries=100)
    return Door(core, MonotonicClock(), RateLimiter(ROOMY), store, lambda tier: 0.0, Metrics())


def plain(*texts: str) -> Job:
    return Job(WHO, list(texts), len(texts) == 1, 10.0)


def keyed_many(texts: Sequence[str], key: str = "k-1", timeout: float = 10.0) -> Job:
    job = keyed("|".join(texts), key, timeout)
    return job._replace(texts=list(texts), single=len(texts) == 1)


async def run_judged(door: Door, core: GuardedCore, job: Job) -> Outcome:
    got: list[Outcome] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                got.append(await door.run(job))

            tg.start_soon(run)
            await anyio.wait_all_tasks_blocked()
            core.judge()
    return got[0]


def error(outcome: Outcome) -> dict[str, object]:
    assert isinstance(outcome, Rendered)
    return dict(orjson.loads(outcome.body)["error"])


async def test_a_refused_input_leaves_the_others_outputs_in_their_places() -> None:
    core = GuardedCore()
    outcome = await run_judged(door_over(core), core, plain("ab", "bad", "cd"))
    assert isinstance(outcome, Answered)
    assert outcome.outputs == ["ba", None, "dc"]
    assert outcome.refused == ((1, "safety", "toxic"),) and outcome.skipped == ()
    response, _ = render(outcome, single=False)
    assert response.status_code == 200


async def test_the_one_input_refused_is_answered_422_refused() -> None:
    core = GuardedCore()
    outcome = await run_judged(door_over(core), core, plain("bad"))
    response, _ = render(outcome, single=True)
    body = orjson.loads(bytes(response.body))
    assert response.status_code == 422 and body["error"]["code"] == "refused"
    assert body["error"]["refused"] == [{"index": 0, "guard": "safety", "reason": "toxic"}]


async def test_a_guard_that_failed_open_is_named_with_the_answer() -> None:
    core = GuardedCore()
    outcome = await run_judged(door_over(core), core, plain("risky", "ab"))
    assert isinstance(outcome, Answered) and outcome.outputs == ["yksir", "ba"]
    assert outcome.skipped == ("leak",) and outcome.refused == ()


async def test_a_guard_that_failed_closed_fails_the_request_503_with_retry_after() -> None:
    core = GuardedCore()
    outcome = await run_judged(door_over(core), core, plain("ab", "down"))
    assert isinstance(outcome, Rendered) and outcome.status == 503
    assert error(outcome)["code"] == "guard_unavailable"
    assert ("Retry-After", "2") in outcome.headers


async def test_a_keyed_answer_with_refusals_is_kept_and_replayed_as_it_was() -> None:
    core = GuardedCore()
    door = door_over(core)
    first = await run_judged(door, core, keyed_many(["ab", "bad", "risky"]))
    assert isinstance(first, Rendered) and first.status == 200
    body = orjson.loads(first.body)
    assert body["outputs"] == ["ba", None, "yksir"]
    assert body["refused"] == [{"index": 1, "guard": "safety", "reason": "toxic"}]
    assert ("Guard-Skipped", "leak") in first.headers
    again = await door.run(keyed_many(["ab", "bad", "risky"]))
    assert again == Rendered(200, first.body, (*first.headers, REPLAYED)) and core.queued == []


async def test_a_keyed_input_refused_whole_is_kept_its_422_replayed() -> None:
    core = GuardedCore()
    door = door_over(core)
    first = await run_judged(door, core, keyed("bad"))
    assert isinstance(first, Rendered) and first.status == 422 and is_kept(first.status)
    assert error(first)["code"] == "refused"
    again = await door.run(keyed("bad"))
    assert isinstance(again, Rendered) and again.body == first.body and REPLAYED in again.headers


async def test_a_keyed_input_whose_guard_failed_closed_is_not_kept() -> None:
    core = GuardedCore()
    door = door_over(core)
    first = await run_judged(door, core, keyed("down"))
    assert isinstance(first, Rendered) and first.status == 503 and not is_kept(first.status)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                await door.run(keyed("down"))

            tg.start_soon(run)
            await anyio.wait_all_tasks_blocked()
            assert len(core.queued) == 1  # run again, not replayed
            core.answer()


async def test_verdicts_that_land_after_the_deadline_are_kept_for_the_retry() -> None:
    core = GuardedBatches()
    door = door_over(core)
    job = keyed_many(["ab", "bad"], timeout=0.05)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            got: list[Outcome] = []

            async def run() -> None:
                got.append(await door.run(job))

            tg.start_soon(run)
            await anyio.wait_all_tasks_blocked()
            core.start()  # both inputs in a batch as the deadline passes
        assert isinstance(got[0], Rendered) and got[0].status == 504
        core.judge()  # the batch lands after its client was answered 504
        again = await door.run(keyed_many(["ab", "bad"]))
    assert isinstance(again, Rendered) and again.status == 200 and REPLAYED in again.headers
    body = orjson.loads(again.body)
    assert body["outputs"] == ["ba", None]
    assert body["refused"] == [{"index": 1, "guard": "safety", "reason": "toxic"}]
