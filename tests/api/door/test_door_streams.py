"""The door's side of streamed requests (`api.stream`): a stream passes the rate step and
admission's judgement once, as it starts (`Door.open_stream`); its parts skip the rate step
and admission's budget; a keyed stream's parts are numbered as they are answered, and the
number is kept with each part's answer."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import orjson
import pytest

from api.config import Principal, TierPolicy
from api.door import Door, RateLimiter, StreamStart
from api.http import Job, Rendered
from api.kept import MemoryIdempotencyStore
from api.metrics import Metrics
from batcher import FlushPolicy, LoopClock, MonotonicClock, Tier
from failover import CoreOwner, CoreSettings, build_core
from tests.api.door.fakes import ROOMY, FakePool, QueueCore, Waiter
from tests.api.door.test_door import Taken

WHO = Principal(Tier.PAID, "acme", "a1")
# Two requests at once for the key, then none.
TIGHT = {**ROOMY, Tier.PAID: replace(ROOMY[Tier.PAID], rate=0.001, burst=2)}


def door_over(core: QueueCore | CoreOwner, tiers: dict[Tier, TierPolicy] = ROOMY) -> Door:
    store = MemoryIdempotencyStore(ttl=60, max_entries=100)
    return Door(core, MonotonicClock(), RateLimiter(tiers), store, lambda tier: 0.0, Metrics())


def part(*texts: str, stream: str | None = "") -> Job:
    return Job(WHO, list(texts), False, 10.0, stream=stream)


def test_a_streams_parts_skip_the_rate_step_the_other_jobs_of_their_frame_pass_it() -> None:
    core = QueueCore()
    door = door_over(core, TIGHT)
    jobs = [part("1", stream=None), part("2"), part("3", stream=None), part("4"),
            part("5", stream=None), part("6")]
    taken = Taken()
    door.submit(jobs, [Waiter(1) for _ in jobs], taken)
    statuses = [r.status if isinstance(r, Rendered) else 200 for r in taken.results]
    assert statuses == [200, 200, 200, 200, 429, 200]  # the key's third plain job is over
    assert [(i.text, i.streamed) for i in core.queued] == [
        ("1", False), ("2", True), ("3", False), ("4", True), ("6", True)]


async def opened(door: Door, items: int, seconds: float, stream: str = "s"
                 ) -> tuple[Any, ...]:
    return await StreamStart(door)(stream, int(Tier.PAID), "acme", "a1", None, None,
                                   items, items, seconds)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stream_starts_once_its_rate_and_all_its_work_within_its_deadline_pass(
        anyio_backend: str) -> None:
    core = build_core(CoreSettings({Tier.PAID: 0.4, Tier.FREE: 0.2},
                                   FlushPolicy(max_wait=0.01), initial_latency=0.1))
    pool = FakePool(2, 0.1)
    owner = CoreOwner(core, pool, LoopClock())
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, owner)
        await tg.start(owner.run)
        door = door_over(owner, TIGHT)
        # 10,000 inputs on two workers of 100 per 0.1 s: 5 s, past a 1 s deadline
        no, status, body, headers = await opened(door, 10_000, 1.0)
        assert (no, status) == ("no", 503)
        assert orjson.loads(body)["error"]["code"] == "deadline_unreachable"
        assert dict(headers)["Retry-After"]
        # 1,000 inputs: 0.5 s, within 1 s, and over the paid budget of 0.4 s: a stream is
        # held to its deadline, not to the wait of one answer
        assert await opened(door, 1000, 1.0) == ("ok", "", 2)
        rate = await opened(door, 1, 1.0)  # the key's burst of two is spent
        assert rate[:2] == ("no", 429)
        roomy = door_over(owner)
        assert await opened(roomy, 1000, 1.0, "first") == ("ok", "", 2)
        # another stream has the first's 1,000 inputs not yet sent ahead of it: 1.1 s
        assert (await opened(roomy, 1000, 1.0, "second"))[:2] == ("no", 503)
        assert await opened(roomy, 1000, 1.0, "first") == ("ok", "", 2)  # resumed: not
        roomy.promised.sent("first", [item for i in range(40) for item in roomy.new_items(
            ["x"] * 25, Tier.PAID, 0.0, 10.0, Waiter(25))])  # sent: the queue's (not here)
        assert await opened(roomy, 1000, 1.0, "second") == ("ok", "", 2)
        assert (await opened(roomy, 1000, 1.0, "third"))[:2] == ("no", 503)  # second's
        await StreamStart(roomy).ended("second")  # its client left: the rest never comes
        assert await opened(roomy, 1000, 1.0, "third") == ("ok", "", 2)
        tg.cancel_scope.cancel()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_keyed_streams_parts_are_numbered_as_answered_and_replay_their_number(
        anyio_backend: str) -> None:
    core = QueueCore()
    door = door_over(core)

    def keyed_part(at: int, *texts: str) -> Job:
        return Job(WHO, list(texts), False, 10.0, (f"s #{at}", bytes([at])), stream="s")

    got: dict[int, Rendered] = {}

    async def run(at: int, *texts: str) -> None:
        answer = await door.run(keyed_part(at, *texts))
        assert isinstance(answer, Rendered)
        got[at] = answer

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, 1, "c", "d", "e")
            await anyio.wait_all_tasks_blocked()
            core.answer()  # part 1 first: it takes places 0..2
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(run, 0, "a", "b")
            await anyio.wait_all_tasks_blocked()
            core.answer()
    assert dict(got[1].headers)["Stream-Position"] == "0"
    assert dict(got[0].headers)["Stream-Position"] == "3"
    again = await door.run(keyed_part(1, "c", "d", "e"))  # a resume: the kept answer
    assert isinstance(again, Rendered) and dict(again.headers)["Stream-Position"] == "0"
    assert core.queued == []  # nothing ran again
