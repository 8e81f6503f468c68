"""Rate limits shared by cells through one real Redis (`api.door.shared_limits`): the script's
buckets decide as `RateLimiter` does (burst, refill, both-or-neither, Retry-After), two
limiters on one Redis (two cells) admit together what one would, and while Redis is out
the cell's own buckets decide, the outage costing one timeout, not one per request. As the
door's rate step, a frame is admitted as the cell's own buckets would admit it, and the
single process's limits ride on its kept answers' Redis connection.

Every test runs against a real redis-server (`tests.redis_server`), skipped where none is
installed."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import anyio
import httpx
import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from api.config import KeyRing, Principal, Settings, TierPolicy, Workers, parse_state
from api.door import Door, LocalRoute, RateLimiter, RateStep, SharedLimits, build
from api.door.shared_limits import BUDGET_SHARE, bucket_names
from api.errors import RateLimited
from api.http import Job, Rendered, server_config
from api.kept import MemoryIdempotencyStore, Owner, RedisSettings
from api.kept.redis import RedisState, connect
from api.metrics import Metrics
from batcher import Item, LoopClock, Tier
from tests.api.door.fakes import FakePool, QueueCore, Waiter
from tests.redis_server import RedisServer, running_redis

pytestmark = pytest.mark.anyio

POLICY = TierPolicy(rate=0.01, burst=5, account_rate=0.01, account_burst=8, budget_ms=250,
                    timeout_ms=2000)  # refills nothing while a test runs
LIMITS = {Tier.PAID: POLICY, Tier.FREE: POLICY}
KEY_A = Principal(Tier.FREE, "acct", "a-secret-key")
KEY_B = Principal(Tier.FREE, "acct", "b-secret-key")
ANON = Principal(Tier.FREE, "anonymous", None)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the redis client's asyncio API


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of the test's own, which it stops and starts."""
    with running_redis(tmp_path / "redis") as running:
        yield running


@pytest.fixture
async def fresh(redis_url: str) -> AsyncIterator[str]:
    """The module's server, emptied: every test starts with full buckets."""
    client = Redis.from_url(redis_url)
    await client.flushdb()
    await client.aclose()
    yield redis_url


class Clock:
    """The limiter's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def redis_settings(url: str) -> RedisSettings:
    spec = parse_state(url)
    return RedisSettings(spec.host, spec.port, spec.db, Owner("test-cell"), ttl=60)


@asynccontextmanager
async def limiter(url: str, limits: dict[Tier, TierPolicy] = LIMITS,
                  metrics: Metrics | None = None, clock: Clock | None = None
                  ) -> AsyncIterator[SharedLimits]:
    """Shared limits on a client built as the kept answers' is (`api.kept`), closed after."""
    client = connect(redis_settings(url))
    try:
        yield SharedLimits(client, limits, RateLimiter(limits), metrics or Metrics(),
                           clock or time.monotonic)
    finally:
        await client.aclose(close_connection_pool=True)


async def passed(shared: SharedLimits, checks: list[tuple[Principal, float]]) -> list[bool]:
    return [refusal is None for refusal in await shared.check_all(checks)]


def errors(metrics: Metrics) -> float:
    return float(metrics.state_errors.labels("limits")._value.get())


async def test_a_burst_passes_then_the_rate_holds(fresh: str) -> None:
    async with limiter(fresh) as shared:
        assert sum(await passed(shared, [(KEY_A, 1.0)] * 20)) == 5
        assert sum([await shared.check_all([(KEY_A, 1.0)]) == [None] for _ in range(3)]) == 0


async def test_a_refusal_by_the_account_spends_nothing_of_the_key(fresh: str) -> None:
    async with limiter(fresh, {t: replace(POLICY, account_burst=3) for t in Tier}) as shared:
        assert await passed(shared, [(KEY_A, 1.0)] * 4) == [True, True, True, False]
        key, account = bucket_names(KEY_A)
        client = Redis.from_url(fresh)
        assert float(await client.hget(key, "tokens") or -1) == pytest.approx(2, abs=0.01)
        assert float(await client.hget(account, "tokens") or -1) < 1
        await client.aclose()


async def test_retry_after_is_the_later_of_the_two_waits(fresh: str) -> None:
    tight = replace(POLICY, rate=1, burst=1, account_rate=0.25, account_burst=1)
    async with limiter(fresh, {t: tight for t in Tier}) as shared:
        await shared.check(KEY_A)
        with pytest.raises(RateLimited) as info:
            await shared.check(KEY_A)
        assert info.value.retry_after == 4  # the account's token comes in 4 s, the key's in 1


async def test_tokens_come_back_at_the_rate(fresh: str) -> None:
    async with limiter(fresh, {t: replace(POLICY, rate=20, burst=1) for t in Tier}) as shared:
        started = time.monotonic()
        await shared.check(KEY_A)
        refused = 0
        with anyio.fail_after(5):
            while await shared.check_all([(KEY_A, 1.0)]) != [None]:
                refused += 1
                await anyio.sleep(0.005)  # Redis's clock must move: the condition is time
        assert refused > 0
        assert time.monotonic() - started >= 1 / 20  # a token every 50 ms


async def test_buckets_expire_once_full_again_and_hold_no_api_key(fresh: str) -> None:
    quick = replace(POLICY, rate=10, burst=5, account_rate=2, account_burst=8)
    async with limiter(fresh, {t: quick for t in Tier}) as shared:
        await shared.check(KEY_A)
        client = Redis.from_url(fresh)
        key, account = bucket_names(KEY_A)
        assert 0 < await client.pttl(key) <= 500 + 1000  # full again in burst / rate
        assert 0 < await client.pttl(account) <= 4000 + 1000
        names = [name if isinstance(name, str) else name.decode()
                 for name in await client.keys("*")]
        await client.aclose()
        assert sorted(names) == sorted([key, account])
        assert not any("secret" in name for name in names)


CALLERS = st.sampled_from([KEY_A, KEY_B, ANON, Principal(Tier.PAID, "acct", "a-secret-key")])


@settings(max_examples=40)
@given(frame=st.lists(st.tuples(CALLERS, st.sampled_from([1.0, 0.5, 0.1])), max_size=30))
def test_a_frame_is_decided_as_the_local_limiter_decides_it_at_one_instant(
    redis_url: str, frame: list[tuple[Principal, float]]
) -> None:
    tiers = {Tier.FREE: replace(POLICY, rate=3, burst=4, account_rate=2, account_burst=6),
             Tier.PAID: replace(POLICY, rate=1, burst=2, account_rate=0.5, account_burst=3)}
    local = RateLimiter(tiers)
    expected: list[float | None] = []
    for principal, factor in frame:
        try:
            local.check(principal, 0.0, factor)
            expected.append(None)
        except RateLimited as refusal:
            expected.append(refusal.retry_after)

    async def shared_decisions() -> list[float | None]:
        client = Redis.from_url(redis_url)
        await client.flushdb()
        await client.aclose()
        async with limiter(redis_url, tiers) as shared:
            return [None if r is None else r.retry_after for r in await shared.check_all(frame)]

    assert asyncio.run(shared_decisions()) == expected


async def test_two_cells_on_one_redis_admit_together_at_most_burst_plus_rate_times_elapsed(
    fresh: str
) -> None:
    rate, burst = 50.0, 20.0
    tiers = {t: replace(POLICY, rate=1e6, burst=1e6, account_rate=rate, account_burst=burst)
             for t in Tier}
    admitted = [0, 0]

    async def hammer(cell: int, until: float) -> None:
        while time.monotonic() < until:  # bounded by time; each call is a round trip
            admitted[cell] += sum(await passed(cells[cell], [(KEY_A, 1.0), (KEY_B, 1.0)]))

    started = time.monotonic()
    async with limiter(fresh, tiers) as one, limiter(fresh, tiers) as two:
        cells = [one, two]
        async with anyio.create_task_group() as tg:
            for cell in (0, 1):
                tg.start_soon(hammer, cell, started + 1.0)
    allowed = burst + rate * (time.monotonic() - started)
    assert sum(admitted) <= allowed + 1  # one account, two keys, two cells: one bucket
    assert sum(admitted) >= 0.8 * allowed  # and it was taken, not refused throughout
    assert min(admitted) > 0


async def test_a_stopped_redis_falls_back_to_the_cells_buckets_then_comes_back(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    clock, metrics = Clock(), Metrics()
    async with limiter(server.url, metrics=metrics, clock=clock) as shared:
        assert sum(await passed(shared, [(KEY_A, 1.0)] * 2)) == 2  # shared: 3 left
        server.stop()
        with caplog.at_level(logging.ERROR, "batchgate.limits"):
            decided = [await shared.check_all([(KEY_A, 1.0)]) == [None] for _ in range(10)]
        assert sum(decided) == 5  # the cell's own bucket: its whole burst
        assert shared.out and errors(metrics) == 1  # one call failed; the rest did not ask
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
        server.start()
        await shared.check_all([(KEY_B, 1.0)])
        assert shared.out  # not asked again before RETRY_S
        clock.t += 1.0
        assert await passed(shared, [(KEY_B, 1.0)] * 6) == [True] * 5 + [False]
        assert not shared.out and errors(metrics) == 1


async def test_a_hung_redis_costs_one_timeout_then_the_cell_decides_at_once(
    server: RedisServer
) -> None:
    metrics = Metrics()
    assert server.process is not None
    async with limiter(server.url, metrics=metrics) as shared:
        await shared.check(KEY_A)  # connected
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            await shared.check(KEY_A)
            timed_out = time.monotonic() - started
            started = time.monotonic()
            for _ in range(20):
                await shared.check_all([(KEY_B, 1.0)])
            after = time.monotonic() - started
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert POLICY.budget_ms / 1000 * BUDGET_SHARE <= timed_out < 2.0  # once
        assert after < 0.1 and errors(metrics) == 1


async def test_a_redis_slower_than_a_share_of_the_budget_hands_the_check_to_the_cell(
    server: RedisServer
) -> None:
    metrics = Metrics()
    assert server.process is not None
    pid = server.process.pid
    async with limiter(server.url, metrics=metrics) as shared:
        await shared.check(KEY_A)  # connected
        os.kill(pid, signal.SIGSTOP)
        resumed = asyncio.get_running_loop().call_later(0.3, os.kill, pid, signal.SIGCONT)
        try:  # Redis answers, in 0.3 s: more than a quarter of the 250 ms budget
            await shared.check(KEY_A)
            assert shared.out and errors(metrics) == 1  # before: waited for Redis, not out
        finally:
            resumed.cancel()
            os.kill(pid, signal.SIGCONT)


def frame_door(limits: dict[Tier, TierPolicy], shared: SharedLimits | None) -> Door:
    store = MemoryIdempotencyStore(ttl=60, max_entries=100)
    rates: RateStep = RateLimiter(limits) if shared is None else shared
    return Door(QueueCore(), LoopClock(), rates, store, lambda tier: 0.0, Metrics())


class Taken:
    """`Admitted`: what the door made of a frame, once its rate step decided."""

    def __init__(self) -> None:
        self.results: list[list[Item] | Rendered] = []
        self.done = anyio.Event()

    def admitted(self, collations: Sequence[Waiter], results: Sequence[list[Item] | Rendered],
                 late: float) -> None:
        self.results += results
        self.done.set()


async def submitted(door: Door, jobs: list[Job]) -> list[list[Item] | Rendered]:
    """`door.submit` of a frame, its rate step run meanwhile: the frame's results."""
    taken = Taken()
    async with anyio.create_task_group() as tg:
        await tg.start(door.rates.run)
        door.submit(jobs, [Waiter(1) for _ in jobs], taken)
        await taken.done.wait()
        tg.cancel_scope.cancel()
    return taken.results


async def test_the_door_refuses_and_admits_a_shared_frame_as_it_does_a_local_one(
    fresh: str
) -> None:
    jobs = [Job(who, ["x"], True, 10.0) for who in [KEY_A] * 6 + [KEY_B] * 4 + [ANON] * 7]
    async with limiter(fresh) as shared:
        local = await submitted(frame_door(LIMITS, None), jobs)
        door = frame_door(LIMITS, shared)
        results = await submitted(door, jobs)
    codes = [[r.status if isinstance(r, Rendered) else 200 for r in out]
             for out in (local, results)]
    assert codes[1] == codes[0] == [200] * 5 + [429] + [200] * 3 + [429] + [200] * 5 + [429] * 2


async def test_the_doors_run_checks_the_shared_buckets(fresh: str) -> None:
    async with limiter(fresh) as shared, anyio.create_task_group() as tg:
        door = frame_door(LIMITS, shared)
        await tg.start(door.rates.run)
        outcomes = [await door.run(Job(KEY_A, ["x"], True, 0.01)) for _ in range(6)]
        tg.cancel_scope.cancel()
    # Admitted and never answered by the fake core (504), until the key's burst is spent.
    assert [o.status for o in outcomes if isinstance(o, Rendered)] == [504] * 5 + [429]


@asynccontextmanager
async def single_process(url: str, monkeypatch: pytest.MonkeyPatch
                         ) -> AsyncIterator[tuple[httpx.AsyncClient, LocalRoute]]:
    """The single process (`api.door.build`) with `--state url` over a fake pool, served by
    uvicorn with batchgate's protocol on a free loopback port, its lifespan run."""
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)  # the lifespan's exit if the core fails
    thresholds = gc.get_threshold()
    settings = Settings(workers=Workers(2), batch_latency_ms=10, max_wait_ms=1, log_level="warning",
                        state=url)
    pool = FakePool(size=2)
    built = build(settings, KeyRing({}, frozenset()), pool=pool)
    assert isinstance(built.direct, LocalRoute)
    kept = built.service.kept
    assert kept is not None and isinstance(kept.durable, RedisState)
    assert isinstance(built.direct.door.rates, SharedLimits)  # on the kept answers' client
    assert built.direct.door.rates._script.registered_client is kept.durable.client
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(server_config(built.app, settings, built.direct))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:"
                                             f"{sock.getsockname()[1]}", trust_env=False
                                             ) as client:
                    with anyio.fail_after(15):
                        yield client, built.direct
            finally:
                server.should_exit = True
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert exits == [], "the core failed while serving"


async def test_the_direct_way_is_not_held_up_while_a_check_asks_a_hung_redis_again(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert server.process is not None
    async with single_process(server.url, monkeypatch) as (client, route):
        shared = route.door.rates
        assert isinstance(shared, SharedLimits)

        async def post() -> tuple[int, float]:
            started = time.monotonic()
            answer = await client.post("/v1/batchstring", json={"input": "ab"})
            return answer.status_code, time.monotonic() - started

        assert (await post())[0] == 200  # connected, shared
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            assert (await post())[0] == 200  # a timeout, then the cell's own buckets
            assert shared.out
            while shared.retry_in > 0:  # noqa: ASYNC110  (bounded by `single_process`)
                await anyio.sleep(0.01)
            probe: list[tuple[int, float]] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _append(probe, post()))  # asks Redis: hangs
                while shared.checking == 0:  # noqa: ASYNC110
                    await anyio.sleep(0.001)
                meanwhile = await post()
                assert probe == []  # overtaken
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
    assert meanwhile[0] == 200 and meanwhile[1] < 0.25
    assert probe[0][0] == 200 and probe[0][1] >= 0.05  # the probe's bound: a budget's share


async def _append(to: list[tuple[int, float]], answer: Awaitable[tuple[int, float]]) -> None:
    to.append(await answer)
