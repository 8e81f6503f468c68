"""What one worker of a version drains, as its dispatch core measures it: admission's first
estimate until a batch is answered, then the batches' own time at full batches of the mix
they carried."""

from __future__ import annotations

import pytest

from batcher import FlushPolicy, Item, ItemId, Throughput, Tier
from failover import CoreSettings, DispatchCore, build_core
from gpu_pool import Ok, WorkerId

W = WorkerId(1)


class Sink:
    def item_done(self, item: Item, result: str | BaseException) -> None:
        pass


def core(latency: float, max_batch: int = 10) -> DispatchCore:
    return build_core(CoreSettings(budgets={Tier.PAID: 60.0, Tier.FREE: 60.0},
                                   policy=FlushPolicy(max_batch=max_batch),
                                   initial_latency=latency))


def run_batches(c: DispatchCore, n: int, seconds: float, size: int = 10) -> None:
    """`n` full batches of `size` items (the core's max_batch), each answered after
    `seconds` of model time."""
    now, ident = 0.0, 0
    c.worker_ready(W, now)
    for _ in range(n):
        items = [Item(ItemId(ident + k), "x" * 8, Tier.PAID, now, now + 60.0, Sink())
                 for k in range(size)]
        ident += size
        c.admit(items, 60.0, now)
        (send,) = c.poll(now).send
        now += seconds
        c.reply(W, Ok(send.run.batch_id, send.run.inputs, seconds), now, now)


def test_before_any_batch_it_is_admissions_first_estimate() -> None:
    assert core(0.3).throughput() == Throughput(batch_items=10, batch_s=0.3)
    assert core(0.3).throughput().per_worker == pytest.approx(10 / 0.3)


def test_answered_batches_set_it() -> None:
    slow, fast = core(0.01), core(0.01)
    run_batches(slow, 20, 0.3)
    run_batches(fast, 20, 0.025)
    assert slow.throughput().per_worker == pytest.approx(10 / 0.3, rel=1e-6)
    assert fast.throughput().per_worker == pytest.approx(10 / 0.025, rel=1e-6)
