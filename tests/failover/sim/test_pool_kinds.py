"""The contract pool's start kinds (`StartTimes`), as the process pool makes them: a worker
let go idle parks (bounded, oldest given up first) and a start of its load wakes it; else a
start forks once the launcher is up; else it spawns. `start_kind` says which, before the
start, and the ready event carries it. Without kinds, every start is a spawn."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import anyio
import pytest

from batcher import Tier, VersionKey
from batcher.shared import Backoff
from failover import CoreSettings
from failover.fleet import LruOnDemand, Switch, VersionView, WorkerView
from failover.sim import (
    ContractPool,
    Death,
    Model,
    Outcome,
    Stream,
    World,
    run_virtual,
    simulate,
    varying,
)
from failover.sim.pool import StartTimes
from gpu_pool import Err, Load, Ok, Origin, StartId, StartKind, WorkerId

A, B, C, D = (Load(VersionKey.of(m, "v1"), "sim", 0.1) for m in "abcd")
LOAD_S = {"a@v1": 2.0, "b@v1": 5.0, "c@v1": 3.0, "d@v1": 4.0}
KINDS = StartTimes(fork_s=0.5, wake_s=0.25, parked_max=2)

Ready = tuple[float, WorkerId, StartId, str, StartKind]


class Heard:
    """A `PoolEvents` that writes down each ready event, with its time and how it came up."""

    def __init__(self) -> None:
        self.ready: list[Ready] = []

    def worker_ready(self, worker: WorkerId, start: StartId, version: str,
                     how: StartKind = StartKind.SPAWN) -> None:
        self.ready.append((round(anyio.current_time(), 9), worker, start, version, how))

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        pass

    def worker_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        pass


def with_pool(script: Callable[[ContractPool], Awaitable[None]], first: tuple[Load, ...],
              kinds: StartTimes | None = KINDS, deaths: tuple[Death, ...] = (),
              ) -> tuple[ContractPool, Heard]:
    pool = ContractPool(list(first), LOAD_S.__getitem__, Backoff(first=1.0), deaths,
                        kinds=kinds)
    heard = Heard()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run, heard)
            await script(pool)
            tg.cancel_scope.cancel()

    run_virtual(main)
    return pool, heard


def core(n: int) -> StartId:
    return StartId(Origin.CORE, n)


def test_a_switch_away_and_back_wakes_the_parked_worker_in_wake_s() -> None:
    seen: list[StartKind] = []

    async def script(pool: ContractPool) -> None:
        await anyio.sleep_until(3)
        pool.switch(WorkerId(1), B, core(1))  # a parks, b forks (the launcher is up)
        await anyio.sleep_until(4)
        seen.extend([pool.start_kind(A), pool.start_kind(B)])
        pool.switch(WorkerId(2), A, core(2))  # b parks, a wakes
        await anyio.sleep_until(5)
        seen.extend([pool.start_kind(A), pool.start_kind(B)])

    pool, heard = with_pool(script, (A,))
    assert heard.ready == [(2.0, 1, StartId(Origin.FIRST, 0), "a@v1", StartKind.SPAWN),
                           (3.5, 2, core(1), "b@v1", StartKind.FORK),
                           (4.25, 3, core(2), "a@v1", StartKind.WAKE)]
    assert seen == [StartKind.WAKE, StartKind.FORK, StartKind.FORK, StartKind.WAKE]
    assert pool.parked() == [B]
    c = pool.counts
    assert (c.spawns, c.forks, c.wakes, c.switches) == (1, 1, 1, 2)
    assert pool.counts.switch_s == pytest.approx(0.5 + 0.25)
    f = pool.figures(5.0)
    assert (f.spawns, f.forks, f.wakes) == (1, 1, 1)


def test_parked_max_bounds_the_parked_set_giving_up_the_oldest_first() -> None:
    async def script(pool: ContractPool) -> None:
        for n, (to, at) in enumerate(((B, 3), (C, 4), (D, 5)), start=1):
            await anyio.sleep_until(at)
            pool.switch(WorkerId(n), to, core(n))
        await anyio.sleep_until(6)

    pool, heard = with_pool(script, (A,))
    assert pool.parked() == [B, C]  # a, parked first, given up for c
    assert [pool.start_kind(x) for x in (A, B, C, D)] == [
        StartKind.FORK, StartKind.WAKE, StartKind.WAKE, StartKind.FORK]
    assert [r[4] for r in heard.ready] == [StartKind.SPAWN] + [StartKind.FORK] * 3


def test_a_switch_wakes_its_parked_worker_before_the_one_let_go_parks() -> None:
    said: list[StartKind] = []

    async def script(pool: ContractPool) -> None:
        await anyio.sleep_until(3)
        pool.switch(WorkerId(1), B, core(1))  # a parks: the set is full
        await anyio.sleep_until(4)
        said.append(pool.start_kind(A))
        pool.switch(WorkerId(2), A, core(2))  # a wakes, then b parks
        await anyio.sleep_until(5)

    pool, heard = with_pool(script, (A,), StartTimes(fork_s=0.5, wake_s=0.25, parked_max=1))
    assert said == [StartKind.WAKE]
    assert heard.ready[-1] == (4.25, 3, core(2), "a@v1", StartKind.WAKE)
    assert pool.parked() == [B]


def test_a_retired_worker_parks_holding_no_gpu_and_an_added_one_wakes_it() -> None:
    async def script(pool: ContractPool) -> None:
        await anyio.sleep_until(3)
        pool.add(B, core(1))  # forks: up at 3.5
        await anyio.sleep_until(10)
        pool.retire(WorkerId(2))  # parks: one GPU from here on
        await anyio.sleep_until(20)
        pool.add(B, core(2))  # wakes: up at 20.25
        await anyio.sleep_until(30)

    pool, heard = with_pool(script, (A,))
    assert [(r[0], r[3], r[4]) for r in heard.ready] == [
        (2.0, "a@v1", StartKind.SPAWN), (3.5, "b@v1", StartKind.FORK),
        (20.25, "b@v1", StartKind.WAKE)]
    assert pool.parked() == []
    # from 0: a all along (30), b from 3 to 10 (7) and from 20 (10); parked, nothing
    assert pool.figures(30.0).gpu_s == pytest.approx(30 + 7 + 10)


def test_start_kind_says_what_the_next_start_does_a_first_a_switch_a_restart_an_add(
) -> None:
    said: dict[StartId, StartKind] = {}

    async def script(pool: ContractPool) -> None:
        await anyio.sleep_until(3)
        said[core(1)] = pool.start_kind(B)
        pool.switch(WorkerId(1), B, core(1))  # a parks
        await anyio.sleep_until(4.5)  # slot 1 (a, worker 2) died at 4: it restarts at 5
        said[StartId(Origin.RESTART, 2)] = pool.start_kind(A)
        await anyio.sleep_until(6)
        said[core(2)] = pool.start_kind(A)
        pool.add(A, core(2))
        await anyio.sleep_until(10)

    spawn_only = StartTimes(wake_s=0.25, parked_max=1)  # no launcher: no forks
    for kinds, fresh, up in ((KINDS, StartKind.FORK, [3.5, 5.25, 6.5]),
                             (spawn_only, StartKind.SPAWN, [8.0, 5.25, 8.0])):
        said.clear()
        pool = ContractPool([A, A], LOAD_S.__getitem__, Backoff(first=1.0), (Death(4.0, 1),),
                            kinds=kinds)
        before = pool.start_kind(A)  # before it runs: a first start, a spawn
        heard = Heard()

        async def main(pool: ContractPool = pool, heard: Heard = heard) -> None:
            async with anyio.create_task_group() as tg:
                await tg.start(pool.run, heard)
                await script(pool)
                tg.cancel_scope.cancel()

        run_virtual(main)
        came = {r[2]: (r[0], r[4]) for r in heard.ready}
        assert before is StartKind.SPAWN
        assert [came[StartId(Origin.FIRST, i)] for i in (0, 1)] == [(2.0, before)] * 2
        assert list(said.values()) == [fresh, StartKind.WAKE, fresh]
        assert {s: came[s][1] for s in said} == said
        assert [came[s][0] for s in said] == up


def test_without_kinds_every_start_is_a_spawn_of_its_load_time_and_nothing_parks() -> None:
    kinds_said: list[StartKind] = []

    async def script(pool: ContractPool) -> None:
        await anyio.sleep_until(3)
        pool.switch(WorkerId(1), B, core(1))
        await anyio.sleep_until(11)
        kinds_said.extend(pool.start_kind(x) for x in (A, B))
        pool.switch(WorkerId(3), A, core(2))
        pool.add(B, core(3))
        await anyio.sleep_until(20)
        pool.retire(WorkerId(5))
        kinds_said.append(pool.start_kind(B))
        await anyio.sleep_until(30)

    pool, heard = with_pool(script, (A,), kinds=None, deaths=(Death(4.0, 0),))
    assert {r[4] for r in heard.ready} == {StartKind.SPAWN}
    assert kinds_said == [StartKind.SPAWN] * 3
    assert pool.parked() == []
    # b switched in at 3 died loading at 4, retried after 1 s: up at 10; a at 13, b at 16
    assert [(r[0], r[3]) for r in heard.ready] == [(2.0, "a@v1"), (10.0, "b@v1"),
                                                   (13.0, "a@v1"), (16.0, "b@v1")]
    c = pool.counts
    assert (c.spawns, c.forks, c.wakes) == (5, 0, 0)


def test_start_times_refuse_parking_with_no_wake_time_or_negative_times() -> None:
    with pytest.raises(ValueError, match="wake"):
        StartTimes(fork_s=1.0, parked_max=1)
    with pytest.raises(ValueError):
        StartTimes(fork_s=-1.0)
    with pytest.raises(ValueError):
        StartTimes(wake_s=1.0, parked_max=-1)


class Seen:
    """A placement (LRU on demand) that writes down the load time it is shown of each
    version at each decision (past the clock's float noise): what the core expects a start
    of it to take now."""

    def __init__(self) -> None:
        self.policy = LruOnDemand()
        self.load_s: list[tuple[float, dict[str, float]]] = []

    def decide(self, now: float, workers: Sequence[WorkerView],
               versions: Sequence[VersionView]) -> list[Switch]:
        self.load_s.append((now, {v.model: round(v.load_s, 6) for v in versions}))
        return self.policy.decide(now, workers, versions)

    def next_check(self, now: float, workers: Sequence[WorkerView],
                   versions: Sequence[VersionView]) -> float:
        return self.policy.next_check(now, workers, versions)


def alternating(kinds: StartTimes | None) -> tuple[Outcome, Seen]:
    """One worker, two models whose traffic takes turns every 10 s for 40 s."""
    def turn(model: int, t: float) -> float:
        return 20.0 if int(t // 10) % 2 == model else 0.0

    seen = Seen()
    models = tuple(Model(name, 0.1, 2.0, min_workers=0) for name in ("m1", "m2"))
    streams = tuple(Stream(varying(partial(turn, i), 20.0), name, Tier.PAID, timeout_s=30.0)
                    for i, name in enumerate(("m1", "m2")))
    world = World(streams, 40.0, CoreSettings(budgets=dict.fromkeys(Tier, 30.0)), models, 1,
                  lambda: seen, kinds=kinds)
    return simulate(world), seen


def test_the_simulated_core_expects_the_time_of_the_kind_the_pool_would_start() -> None:
    outcome, seen = alternating(StartTimes(fork_s=0.5, wake_s=0.25, parked_max=1))
    pool = outcome.pool
    assert (pool.spawns, pool.forks) == (1, 1) and pool.wakes == pool.switches - 1 >= 2
    assert pool.switch_s == pytest.approx(0.5 + 0.25 * pool.wakes)
    # once a wake is measured, a parked model is expected back in a wake's time
    later = [load_s for now, load_s in seen.load_s if now > 25.0]
    assert later and all(0.25 in (s["m1"], s["m2"]) for s in later)
    assert {s["m1"] for s in later} | {s["m2"] for s in later} <= {0.25, 0.5, 2.0}

    today, seen = alternating(None)
    assert (today.pool.forks, today.pool.wakes, today.pool.switches) == (0, 0, pool.switches)
    assert {s for _, load_s in seen.load_s for s in load_s.values()} == {2.0}
