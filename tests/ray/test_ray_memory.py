"""The Ray pool replaces an actor over its memory bound between batches (issue 28, item 13),
as the process pool does: on the real cluster, every batch is answered by the same worker
id while its actor (and pid) is new, no death is reported and nothing counts as a crash."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

import anyio

from gpu_pool import BatchId, Ok, PoolSettings, RayPoolSettings, Run
from gpu_pool.ray_pool import RayPool
from tests.gpu_pool.test_pool import Events
from tests.ray.lab import SLOT, Lab

pytestmark = pytest.mark.anyio


async def test_an_actor_over_its_memory_bound_is_replaced_between_batches(lab: Lab) -> None:
    events = Events()
    base = PoolSettings(model="tests.models:leak", workers=1, restart_backoff=0.05,
                        max_rss_mb=1)  # every actor is over it: replaced after each batch
    pool = RayPool(RayPoolSettings(base, resources={SLOT: 1.0}))
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await events.wait_for(lambda: events.ready)
        (worker,) = events.ready
        pids = []  # of the actor that answered each batch
        for n in range(1, 4):  # each sent at once: while the previous actor is replaced
            pool.send(worker, Run(BatchId(n), (f"batch-{n}",)))
            await events.wait_for(lambda n=n: len(events.replies) == n or events.died)
            assert events.died == []
            replier, reply = events.replies[-1]
            assert replier == worker and isinstance(reply, Ok)
            assert reply.outputs == (f"batch-{n}"[::-1],)
            pids.append(pool.workers()[0].pid)
        tg.cancel_scope.cancel()
    assert events.ready == [worker] and len(set(pids)) == 3, pids  # a new actor each
    assert pool.replacements == 3 and pool.crashes == 0
