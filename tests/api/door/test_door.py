"""`Door.submit` and `Door.conclude`: a frame of jobs of several callers and tiers, each
refused exactly as it would be alone (rate limits per key and per account, then admission by
the core), the rest queued in order; a concluded job's unanswered items are withdrawn.

Against the real dispatch core and its owner over a fake pool, in exact virtual time
(`tests.virtual`); the rate limits alone against a core that refuses nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import anyio
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.config import DEFAULT_TIERS, Principal, TierPolicy
from api.door import Door, RateLimiter
from api.errors import ApiError, ClientClosed, RateLimited
from api.http import Answered, Job, Outcome, Rendered
from api.kept import MemoryIdempotencyStore
from api.metrics import Metrics
from batcher import (
    BatchgateError,
    Clock,
    DeadlineExceeded,
    FlushPolicy,
    Item,
    LoopClock,
    OverBudget,
    Tier,
)
from failover import CoreOwner, CoreSettings, build_core
from tests.api.door.fakes import FakePool, QueueCore, Waiter
from tests.virtual import run_virtual

A1 = Principal(Tier.PAID, "acme", "a1")
A2 = Principal(Tier.PAID, "acme", "a2")  # another key of the same account
B1 = Principal(Tier.FREE, "bob", "b1")
ROOMY = {t: replace(p, rate=1e9, burst=1e9, account_rate=1e9, account_burst=1e9)
         for t, p in DEFAULT_TIERS.items()}
# Paid: 2 requests per key and 3 per account at once; free: 1 per key.
TIGHT = {Tier.PAID: replace(ROOMY[Tier.PAID], rate=0.001, burst=2, account_rate=0.001,
                            account_burst=3),
         Tier.FREE: replace(ROOMY[Tier.FREE], rate=10, burst=1)}
LATENCY = 0.1  # the fake pool's batches, and admission's estimate of them
# One worker serves 1,000 items/s: a free item is admitted with at most 6 items ahead of it.
BUDGETS = {Tier.PAID: 1e6, Tier.FREE: LATENCY + 0.0065}


def job(who: Principal, *texts: str) -> Job:
    return Job(who, list(texts), len(texts) == 1, 10.0)


def door_over(core: QueueCore | CoreOwner, clock: Clock,
              tiers: dict[Tier, TierPolicy] = ROOMY,
              pressure: Callable[[Tier], float] = lambda tier: 0.0) -> Door:
    store = MemoryIdempotencyStore(ttl=60, max_entries=100)
    return Door(core, clock, RateLimiter(tiers), store, pressure, Metrics())


class Taken:
    """`Admitted`: what the door made of a frame (the cell's own buckets: at once)."""

    def __init__(self) -> None:
        self.results: list[list[Item] | Rendered] = []

    def admitted(self, collations: Sequence[Waiter], results: Sequence[list[Item] | Rendered],
                 late: float) -> None:
        self.results += results


def submit(door: Door, jobs: Sequence[Job]) -> tuple[list[Waiter], list[list[Item] | Rendered]]:
    waiters, taken = [Waiter(len(j.texts)) for j in jobs], Taken()
    door.submit(jobs, waiters, taken)
    return waiters, taken.results


def status(outcome: Outcome | list[Item]) -> int:
    return outcome.status if isinstance(outcome, Rendered) else 200


def code(outcome: Outcome) -> tuple[int, str]:
    assert isinstance(outcome, Rendered)
    return outcome.status, orjson.loads(outcome.body)["error"]["code"]


@dataclass
class Rig:
    door: Door
    owner: CoreOwner
    pool: FakePool
    clock: LoopClock

    async def conclude(self, jobs: Sequence[Job], waiters: list[Waiter],
                       submitted: list[list[Item] | Rendered]) -> list[Outcome]:
        """Each job's outcome: its refusal, or its answer once its collation has ended."""
        out: list[Outcome] = []
        for one, waiter, items in zip(jobs, waiters, submitted, strict=True):
            if isinstance(items, Rendered):
                out.append(items)
                continue
            await waiter.wait()
            out.append(self.door.conclude(one, items, waiter, self.clock.now()))
        return out


def play(scenario: Callable[[Rig], Awaitable[None]]) -> Rig:
    """The real core and its owner over one fake worker, around `scenario`."""

    async def main() -> Rig:
        clock = LoopClock()
        core = build_core(CoreSettings(BUDGETS, FlushPolicy(max_wait=0.01),
                                       initial_latency=LATENCY))
        pool = FakePool(1, LATENCY)
        owner = CoreOwner(core, pool, clock)
        rig = Rig(door_over(owner, clock), owner, pool, clock)
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run, owner)
            await tg.start(owner.run)
            with anyio.fail_after(30):
                await scenario(rig)
            tg.cancel_scope.cancel()
        return rig

    return run_virtual(main)


# -- a frame against the real core ------------------------------------------------------------
def test_a_frame_queues_its_items_in_order_and_each_job_gets_its_own_outputs() -> None:
    jobs = [job(A1, "p1", "p2"), job(B1, "f1"), job(A2, "p3"), job(B1, "f2", "f3")]
    outcomes: list[Outcome] = []

    async def scenario(rig: Rig) -> None:
        outcomes.extend(await rig.conclude(jobs, *submit(rig.door, jobs)))

    rig = play(scenario)
    assert rig.pool.ran == ["p1", "p2", "p3", "f1", "f2", "f3"]  # paid first, each in order
    assert [o.outputs for o in outcomes if isinstance(o, Answered)] == [
        ["1p", "2p"], ["1f"], ["3p"], ["2f", "3f"]]


def test_each_job_of_a_frame_is_admitted_as_it_would_be_alone_after_those_before_it() -> None:
    free = [f"f{n}" for n in range(16)]
    jobs = [job(B1, *free[:3]), job(B1, *free[3:13]), job(B1, *free[13:15]),
            job(A1, *(f"p{n}" for n in range(20))), job(B1, free[15])]
    outcomes: list[Outcome] = []

    async def scenario(rig: Rig) -> None:
        outcomes.extend(await rig.conclude(jobs, *submit(rig.door, jobs)))

    rig = play(scenario)
    # 10 free items behind 3, and 1 behind 25 (the paid ones run first), are over budget
    assert [status(o) for o in outcomes] == [200, 503, 200, 200, 503]
    assert code(outcomes[1]) == code(outcomes[4]) == (503, "over_budget")
    assert rig.pool.ran == [f"p{n}" for n in range(20)] + free[:3] + free[13:15]


@pytest.mark.parametrize(("end", "answer"), [
    ("leave", (499, "client_closed")), ("expire", (504, "deadline_exceeded")),
])
def test_conclude_withdraws_the_items_of_a_job_that_ended_unanswered(
    end: str, answer: tuple[int, str]
) -> None:
    jobs = [job(A1, "kept"), job(A1, "gone-1", "gone-2")]
    outcomes: list[Outcome] = []

    async def scenario(rig: Rig) -> None:
        waiters, submitted = submit(rig.door, jobs)
        getattr(waiters[1], end)()  # before the owner's next turn: nothing has run
        gone = submitted[1]
        assert isinstance(gone, list)
        outcomes.append(rig.door.conclude(jobs[1], gone, waiters[1], rig.clock.now()))
        assert rig.owner.statistics().batcher.pending == 1  # "kept" alone
        outcomes.extend(await rig.conclude(jobs[:1], waiters[:1], submitted[:1]))

    rig = play(scenario)
    assert code(outcomes[0]) == answer and rig.pool.ran == ["kept"]
    assert isinstance(outcomes[1], Answered) and outcomes[1].outputs == ["tpek"]


# -- rate limits: per key and per account, as if each job came alone --------------------------
class Tick:
    """A clock the test sets."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_a_job_over_its_keys_or_accounts_rate_is_refused_and_the_rest_are_queued() -> None:
    core = QueueCore()
    door = door_over(core, Tick(), TIGHT)
    jobs = [job(A1, "1"), job(A1, "2"), job(A1, "3"), job(A2, "4"), job(A2, "5"),
            job(B1, "6"), job(A1, "7")]
    _, submitted = submit(door, jobs)
    # a1's third is over its key; a2's second is over acme's account of 3
    assert [status(s) for s in submitted] == [200, 200, 429, 200, 429, 200, 429]
    assert [item.text for item in core.queued] == ["1", "2", "4", "6"]


@given(st.lists(st.lists(st.sampled_from([A1, A2, B1]), max_size=12), max_size=4),
       st.floats(0.0, 2.0))
def test_a_frame_refuses_exactly_the_jobs_that_checked_one_by_one_are_refused(
    frames: list[list[Principal]], gap: float
) -> None:
    clock, alone = Tick(), RateLimiter(TIGHT)
    door = door_over(QueueCore(), clock, TIGHT)
    for callers in frames:
        _, submitted = submit(door, [job(who, "x") for who in callers])
        expected = []
        for who in callers:
            try:
                alone.check(who, clock.t)
                expected.append(200)
            except RateLimited:
                expected.append(429)
        assert [status(s) for s in submitted] == expected
        clock.t += gap


@pytest.mark.parametrize(("pressure", "second"), [(0.0, 200), (1.0, 429)])
def test_a_tiers_rate_tightens_as_its_expected_wait_nears_its_budget(
    pressure: float, second: int
) -> None:
    clock = Tick()
    door = door_over(QueueCore(), clock, TIGHT, lambda tier: pressure)
    first = submit(door, [job(B1, "x")])[1]
    clock.t = 0.5  # 5 tokens at free's rate of 10/s, half of one at a tenth of it
    assert [status(s) for s in first + submit(door, [job(B1, "y")])[1]] == [200, second]


# -- refusals are counted --------------------------------------------------------------------
@pytest.mark.parametrize(("error", "counted"), [
    (RateLimited("rate limit exceeded for this key or account", 2), True),
    (OverBudget("expected wait 300 ms exceeds the free tier's budget", 0.2), True),
    (DeadlineExceeded("the deadline passed"), False),
    (ClientClosed("the client closed the connection"), False),
    (ApiError("empty_inputs", "inputs is empty"), False),
])
def test_a_refusal_counts_429_and_503_as_rejected_under_its_tier_and_code(
    error: BatchgateError, counted: bool
) -> None:
    door = door_over(QueueCore(), Tick())
    answer = door.refusal(error, Tier.FREE)
    rejected = door.metrics.registry.get_sample_value(
        "batchgate_rejected_total", {"tier": "free", "reason": code(answer)[1]})
    assert (rejected == 1) is counted
    assert (("Retry-After" in dict(answer.headers)) is counted)
