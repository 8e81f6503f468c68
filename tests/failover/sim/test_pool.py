"""The contract pool keeps the pool seam (`gpu_pool.Pool`) in virtual time: every start
carries its id back, a batch takes its version's latency whatever its size, one at a time,
and deaths restart as the seam says."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from batcher.shared import Backoff
from failover.sim import ContractPool, Death, run_virtual
from gpu_pool import BatchId as B
from gpu_pool import Err, Load, Ok, Origin, Run, StartId, StartKind, WorkerId

FAST, SLOW = Load("fast@v1", "sim", 0.1), Load("slow@v1", "sim", 0.3)
LOAD_S = {"fast@v1": 2.0, "slow@v1": 5.0}
BACKOFF = Backoff(first=1.0)


class Heard:
    """A `PoolEvents` that writes down what it hears, with the time."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, WorkerId, object, object]] = []

    def worker_ready(self, worker: WorkerId, start: StartId, version: str,
                     how: StartKind = StartKind.SPAWN) -> None:
        self.events.append((anyio.current_time(), "ready", worker, start, version))

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        self.events.append((anyio.current_time(), "reply", worker, reply, None))

    def worker_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        self.events.append((anyio.current_time(), "died", worker, version, restart))

    def of(self, kind: str) -> list[tuple[float, str, WorkerId, object, object]]:
        """The events of `kind`, their times rounded past the jumps' float noise."""
        return [(round(e[0], 9), *e[1:]) for e in self.events if e[1] == kind]


def with_pool(script: Callable[[ContractPool, Heard], Awaitable[None]],
              first: tuple[Load, ...] = (FAST,), deaths: tuple[Death, ...] = (),
              metered: tuple[float, float] = (0.0, float("inf"))) -> tuple[ContractPool, Heard]:
    pool = ContractPool(list(first), LOAD_S.__getitem__, BACKOFF, deaths, metered)
    heard = Heard()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run, heard)
            await script(pool, heard)
            tg.cancel_scope.cancel()

    run_virtual(main)
    return pool, heard


async def settle(until: float) -> None:
    await anyio.sleep_until(until)


def test_first_slots_come_up_after_their_load_with_their_first_start() -> None:
    _, heard = with_pool(lambda p, h: settle(10), first=(FAST, SLOW))
    assert heard.events == [(2.0, "ready", 1, StartId(Origin.FIRST, 0), "fast@v1"),
                            (5.0, "ready", 2, StartId(Origin.FIRST, 1), "slow@v1")]


def test_a_batch_takes_its_versions_latency_whatever_its_size() -> None:
    async def script(pool: ContractPool, heard: Heard) -> None:
        await settle(2)
        pool.send(WorkerId(1), Run(B(7), ("a",) * 100))
        await settle(3)
        pool.send(WorkerId(1), Run(B(8), ("b", "c")))
        await settle(4)

    pool, heard = with_pool(script)
    assert [(t, r.batch_id, r.outputs[:2]) for t, _, _, r, _ in heard.of("reply")
            if isinstance(r, Ok)] == [(2.1, 7, ("a", "a")), (3.1, 8, ("b", "c"))]
    assert (pool.counts.batches, pool.counts.items) == (2, 102)


@pytest.mark.parametrize("inputs", [(), ("x",) * 101])
def test_a_batch_outside_1_to_100_inputs_breaks_the_contract(inputs: tuple[str, ...]) -> None:
    async def script(pool: ContractPool, heard: Heard) -> None:
        await settle(2)
        pool.send(WorkerId(1), Run(B(1), inputs))

    with pytest.raises(ExceptionGroup) as broken:
        with_pool(script)
    assert broken.group_contains(RuntimeError, match="contract is broken")


def test_a_second_batch_to_a_busy_worker_breaks_the_contract() -> None:
    async def script(pool: ContractPool, heard: Heard) -> None:
        await settle(2)
        pool.send(WorkerId(1), Run(B(1), ("x",)))
        pool.send(WorkerId(1), Run(B(2), ("y",)))

    with pytest.raises(ExceptionGroup) as broken:
        with_pool(script)
    assert broken.group_contains(RuntimeError, match="busy")


def test_a_worker_that_dies_up_restarts_under_a_new_start_after_its_backoff() -> None:
    async def script(pool: ContractPool, heard: Heard) -> None:
        await settle(3)
        pool.send(WorkerId(1), Run(B(1), ("x",)))  # dies with it: never answered
        await settle(20)

    pool, heard = with_pool(script, deaths=(Death(3.05, 0),))
    restart = StartId(Origin.RESTART, 1)
    assert heard.of("died") == [(3.05, "died", 1, "fast@v1", restart)]
    assert heard.of("reply") == []
    # a death within its stable run waits the backoff's first delay, then loads
    assert heard.of("ready")[-1] == (6.05, "ready", 2, restart, "fast@v1")
    assert pool.crashes == 1


def test_a_worker_that_dies_loading_is_retried_under_the_same_start() -> None:
    _, heard = with_pool(lambda p, h: settle(20), deaths=(Death(1.0, 0),))
    first = StartId(Origin.FIRST, 0)
    assert heard.of("died") == [(1.0, "died", 1, "fast@v1", first)]
    assert heard.of("ready") == [(4.0, "ready", 2, first, "fast@v1")]


def test_a_switch_starts_the_other_version_under_a_new_id_and_reports_no_death() -> None:
    switch = StartId(Origin.CORE, 1)

    async def script(pool: ContractPool, heard: Heard) -> None:
        await settle(2)
        pool.switch(WorkerId(1), SLOW, switch)
        pool.switch(WorkerId(1), SLOW, StartId(Origin.CORE, 2))  # no longer its worker
        await settle(10)

    pool, heard = with_pool(script)
    assert heard.of("died") == []
    assert heard.of("ready")[-1] == (7.0, "ready", 2, switch, "slow@v1")
    assert (pool.counts.switches, pool.counts.switch_s) == (1, 5.0)


def test_a_busy_worker_is_never_switched_nor_retired() -> None:
    async def script(pool: ContractPool, heard: Heard) -> None:
        await settle(2)
        pool.send(WorkerId(1), Run(B(1), ("x",)))
        pool.switch(WorkerId(1), SLOW, StartId(Origin.CORE, 1))
        pool.retire(WorkerId(1))
        await settle(3)

    pool, heard = with_pool(script)
    assert len(heard.of("reply")) == 1 and pool.slots() == 1 and pool.counts.switches == 0


def test_added_slots_take_new_indexes_and_a_start_not_up_can_be_taken_back() -> None:
    add, late = StartId(Origin.CORE, 1), StartId(Origin.CORE, 2)

    async def script(pool: ContractPool, heard: Heard) -> None:
        await settle(2)
        pool.add(FAST, add)
        pool.add(FAST, late)
        assert pool.cancel_start(late) is True
        assert pool.cancel_start(late) is False  # gone already
        await settle(5)
        assert pool.cancel_start(add) is False  # up meanwhile
        assert [w.slot for w in pool.workers()] == [0, 1]

    pool, heard = with_pool(script)
    assert heard.of("ready")[-1] == (4.0, "ready", 2, add, "fast@v1")
    assert (pool.counts.started, pool.counts.stopped) == (2, 1)


def test_a_retired_worker_leaves_without_a_word_and_frees_its_gpu() -> None:
    async def script(pool: ContractPool, heard: Heard) -> None:
        await settle(4)
        pool.retire(WorkerId(1))
        await settle(10)

    pool, heard = with_pool(script, first=(FAST, FAST), metered=(0.0, 10.0))
    assert heard.of("died") == [] and pool.slots() == 1
    fig = pool.figures(10.0)
    assert fig.gpu_s == pytest.approx(2 * 4 + 1 * 6) and fig.peak == 2 and fig.stopped == 1


def test_a_killed_worker_is_reported_dead() -> None:
    async def script(pool: ContractPool, heard: Heard) -> None:
        await settle(2)
        pool.kill(WorkerId(1))
        await settle(2.5)

    _, heard = with_pool(script)
    assert heard.of("died") == [(2.0, "died", 1, "fast@v1", StartId(Origin.RESTART, 1))]


def test_wait_ready_returns_once_the_first_workers_are_up() -> None:
    async def script(pool: ContractPool, heard: Heard) -> None:
        assert await pool.wait_ready(2, within=60) == 2
        assert anyio.current_time() == 5.0
        assert pool.state_counts() == {"ready": 2}

    with_pool(script, first=(FAST, SLOW))
