"""A worker over `--worker-max-rss-mb` is replaced between batches (issue 28, item 13): real
spawned workers running `tests.models:leak` (it keeps 20 MB per batch for ever). Every batch
is answered, the worker's pid changes under the same worker id, its resident set stays
bounded, and nothing counts as a crash: no death reported, no restart, no backoff."""

from __future__ import annotations

import anyio
import pytest

from gpu_pool import BatchId, Ok, Run, WorkerId, WorkerPool
from gpu_pool.memory import MIB, resident_bytes
from tests.gpu_pool.test_pool import Events, running_pool

pytestmark = pytest.mark.anyio
LEAK = "tests.models:leak"
LEAKS_MB = 20  # per batch
ROOM_MB = 5 * LEAKS_MB  # the bound sits this far above a fresh worker: replaced every ~5 batches


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def fresh_worker_mb(model: str = LEAK) -> int:
    """What a fresh worker of `model` holds, spawned as the server spawns it: a bound set
    relative to it tests the replacement, a fixed figure would test the model's imports
    (torch or not is the model's business)."""
    async with running_pool(model) as (pool, _):
        pid = pool.workers()[0].pid
        assert pid is not None
        return (resident_bytes(pid) or 0) // MIB


@pytest.fixture(scope="module")
def bound_mb() -> int:
    return anyio.run(fresh_worker_mb) + ROOM_MB


async def run_one(pool: WorkerPool, events: Events, worker: WorkerId, n: int) -> Ok:
    """Send batch `n` to `worker` and wait for its answer (sent while the worker may be
    being replaced: then the new process runs it)."""
    pool.send(worker, Run(BatchId(n), (f"batch-{n}",)))
    await events.wait_for(lambda: len(events.replies) >= n or events.died)
    assert events.died == []
    answered, reply = events.replies[n - 1]
    assert answered == worker and isinstance(reply, Ok) and reply.batch_id == n
    assert reply.outputs == (f"batch-{n}"[::-1],)
    return reply


async def test_a_leaking_worker_is_replaced_between_batches_and_stays_bounded(
    bound_mb: int,
) -> None:
    async with running_pool(LEAK, max_rss_mb=bound_mb) as (pool, events):
        (worker,) = events.ready
        pids: list[int] = []
        peak = 0
        for n in range(1, 13):  # 240 MB leaked in all: more than twice the room, unreplaced
            await run_one(pool, events, worker, n)
            pid = pool.workers()[0].pid
            rss = resident_bytes(pid) if pid is not None else None
            if pid is not None and pid not in pids:
                pids.append(pid)
            peak = max(peak, rss or 0)
        (info,) = pool.workers()
        assert len(pids) >= 3, pids  # replaced at least twice, the pid new each time
        assert info.id == worker and info.restarts == 0 and events.ready == [worker]
        # The last replacement may still be loading (its pid not seen yet).
        assert len(pids) - 1 <= pool.replacements <= len(pids) and pool.crashes == 0
        assert peak <= (bound_mb + LEAKS_MB + 5) * MIB, peak // MIB  # one batch past it at most


async def test_without_a_bound_the_same_worker_keeps_what_leaks(bound_mb: int) -> None:
    async with running_pool(LEAK) as (pool, events):
        (worker,) = events.ready
        first = pool.workers()[0].pid
        for n in range(1, 9):
            await run_one(pool, events, worker, n)
        assert pool.workers()[0].pid == first and pool.replacements == 0
        assert first is not None and (resident_bytes(first) or 0) > bound_mb * MIB


async def test_a_kill_while_the_worker_is_replaced_waits_for_the_new_process() -> None:
    # The hang watchdog may give up on a batch that waits for a slow load: it never ran, so
    # nothing hangs, and killing the loading process would count a death against its items.
    async with running_pool(LEAK, max_rss_mb=1) as (pool, events):  # over it at once
        (worker,) = events.ready
        await run_one(pool, events, worker, 1)
        pool.send(worker, Run(BatchId(2), ("two",)))  # held for the new process
        pool.kill(worker)
        await events.wait_for(lambda: len(events.replies) == 2 or events.died)
        assert events.died == [] and events.ready == [worker] and pool.crashes == 0
        answered, reply = events.replies[1]
        assert answered == worker and isinstance(reply, Ok) and reply.outputs == ("owt",)
