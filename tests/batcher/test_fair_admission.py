"""Admission with fair share on: a request is judged by the work that would run before it
(`TierQueues.ahead`): its own account's queue and, of every other account's, the part fair
share serves first; not the whole tier's queue, which it would not wait for."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batcher import (
    Admission,
    AdmissionSettings,
    Batcher,
    FlushPolicy,
    Item,
    ItemId,
    Lane,
    OverBudget,
    Tier,
    TierQueues,
)
from tests.batcher.test_streamed import Sink

_ids = itertools.count()


def items(n: int, caller: str, text: str = "x" * 10, tier: Tier = Tier.PAID) -> list[Item]:
    return [Item(ItemId(next(_ids)), text, tier, 0.0, 100.0, Sink(), k, caller=caller)
            for k in range(n)]


def batcher(fair: bool) -> Batcher:
    # One ready worker runs 100 items per 0.1 s; paid waits at most 0.3 s for one answer.
    admission = Admission(AdmissionSettings({Tier.PAID: 0.3, Tier.FREE: 0.3}))
    return Batcher(TierQueues(dict.fromkeys(Tier, 100_000), fair=fair),
                   FlushPolicy(max_batch=100, max_wait=0.05), admission)


@pytest.mark.parametrize("fair", [True, False])
def test_a_small_request_is_judged_by_what_runs_before_it(fair: bool) -> None:
    b = batcher(fair)
    b.queues.put_all(items(250, "a"), Tier.PAID)  # a: 0.25 s of work queued
    if fair:  # fair share serves b's one input within a's next batch
        b.admit(items(1, "b"), 100.0, now=0.0, ready=1)
        with pytest.raises(OverBudget):  # a's own next one waits for all of a's
            b.admit(items(1, "a"), 100.0, now=0.0, ready=1)
    else:
        with pytest.raises(OverBudget):
            b.admit(items(1, "b"), 100.0, now=0.0, ready=1)


def test_the_work_ahead_counts_every_lane_above_and_the_fair_share_of_its_own() -> None:
    q = TierQueues(dict.fromkeys(Tier, 100_000), fair=True, weights={"b": 3.0})
    q.put_all(items(5, "r", tier=Tier.PAID), Tier.PAID)
    q.put_all(items(1000, "a", tier=Tier.FREE), Tier.FREE)
    q.put_all(items(10, "b", tier=Tier.FREE), Tier.FREE)
    # a's last input comes after all of a's queue: every input of b, which weighs 3, first
    assert q.ahead(Tier.FREE, "a", 10) == (5 + 1000 + 10, 50 + 10_000 + 100)
    # b's comes after its own 110 characters over 3: about 37 of a's
    assert q.ahead(Tier.FREE, "b", 10) == (5 + 10 + 4, 50 + 100 + 37)
    # c's, queued nothing: 10 of a's characters, 30 of b's
    assert q.ahead(Tier.FREE, "c", 10) == (5 + 1 + 3, 50 + 10 + 30)
    assert q.ahead(Tier.PAID, "c", 10) == (1, 10)  # r's 5 are paid too: shared
    fifo = TierQueues(dict.fromkeys(Tier, 100_000))
    fifo.put_all(items(1000, "a", tier=Tier.FREE), Tier.FREE)
    assert fifo.ahead(Tier.FREE, "c", 10) == (1000, 10_000)


@given(st.lists(st.tuples(st.sampled_from(["put", "cancel", "cut", "aged"]),
                          st.sampled_from(["a", "b", "c"]), st.integers(0, 30)),
                max_size=60))
def test_each_accounts_queued_count_follows_every_change(
        steps: list[tuple[str, str, int]]) -> None:
    q = TierQueues(dict.fromkeys(Tier, 100_000), fair=True)
    queued: list[Item] = []
    for op, caller, n in steps:
        if op == "put" and n:
            new = items(n, caller, "y" * (n % 7))
            q.put_all(new, Tier.PAID)
            queued += new
        elif op == "aged":
            one = items(1, caller, "z")[0]
            q.put_aged(one)
            queued.append(one)
        elif op == "cancel" and queued:
            q.cancel(queued.pop(n % len(queued)))
        elif op == "cut":
            batch, expired = q.pop_batch(max(n, 1), now=0.0)
            assert not expired
            queued = [i for i in queued if i not in batch]
        lane = q._fair[Lane.PAID]
        assert lane is not None
        flows = lane._flows.values()
        assert sum(f.live for f in flows) == q.depth(Lane.PAID) == len(queued)
        assert sum(f.chars for f in flows) == sum(len(i.text) for i in queued)
