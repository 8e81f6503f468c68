"""A streamed request before and after it starts: judged whole against its deadline, not its
tier's budget (`Batcher.judge`); then its parts come through a window, and admission does
not judge them again (only the queue's hard cap holds)."""

from __future__ import annotations

import itertools

import pytest

from batcher import (
    Admission,
    AdmissionSettings,
    Batcher,
    Closed,
    DeadlineUnreachable,
    FlushPolicy,
    Item,
    ItemId,
    NoWorkerReady,
    OverBudget,
    QueueFull,
    Tier,
    TierQueues,
)

_ids = itertools.count()


class Sink:
    def item_done(self, item: Item, result: str | BaseException) -> None:
        raise AssertionError("the batcher answers nothing")


def items(n: int, streamed: bool = False) -> list[Item]:
    return [Item(ItemId(next(_ids)), "x" * 10, Tier.PAID, 0.0, 100.0, Sink(), k,
                 streamed=streamed) for k in range(n)]


def batcher(cap: int = 10_000) -> Batcher:
    # One ready worker runs 100 items per 0.1 s; paid waits at most 0.3 s for one answer.
    admission = Admission(AdmissionSettings({Tier.PAID: 0.3, Tier.FREE: 0.1}))
    return Batcher(TierQueues(dict.fromkeys(Tier, cap)),
                   FlushPolicy(max_batch=100, max_wait=0.05), admission)


def test_a_stream_is_judged_by_all_its_work_against_its_deadline_not_the_budget() -> None:
    b = batcher()
    b.judge(Tier.PAID, 1000, 10_000, 2.0, now=0.0, ready=1)  # 1 s of work: over the budget
    with pytest.raises(DeadlineUnreachable):
        b.judge(Tier.PAID, 1000, 10_000, 0.5, now=0.0, ready=1)
    b.admit(items(500, streamed=True), 100.0, now=0.0, ready=1)  # 0.5 s queued ahead of it
    b.judge(Tier.PAID, 1000, 10_000, 1.65, now=0.0, ready=1)
    with pytest.raises(DeadlineUnreachable) as late:
        b.judge(Tier.PAID, 1000, 10_000, 1.4, now=0.0, ready=1)
    assert late.value.retry_after > 0  # the queue ahead drains
    with pytest.raises(NoWorkerReady):
        b.judge(Tier.PAID, 1, 10, 10.0, now=0.0, ready=0)
    b.drain()
    with pytest.raises(Closed):
        b.judge(Tier.PAID, 1, 10, 10.0, now=0.0, ready=1)


def test_a_streams_parts_are_queued_past_the_budget_up_to_the_hard_cap() -> None:
    b = batcher(cap=600)
    b.admit(items(250, streamed=True), 100.0, now=0.0, ready=1)
    with pytest.raises(OverBudget):  # a plain request behind 0.25 s of work
        b.admit(items(100), 100.0, now=0.0, ready=1)
    b.admit(items(350, streamed=True), 100.0, now=0.0, ready=1)
    assert len(b) == 600
    with pytest.raises(QueueFull):
        b.admit(items(1, streamed=True), 100.0, now=0.0, ready=1)
    assert not b.admit_run([items(1, streamed=True), items(1)], 100.0, now=0.0, ready=1)
