"""Weighted fair share between the accounts of a tier (`batcher.fair`), in virtual time:
what each account is served, that nobody starves or waits behind another's backlog, FIFO
within an account, strict tier order, and plain FIFO with fair share off."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import (
    LANE_OF,
    Batcher,
    Capacity,
    FlushPolicy,
    Item,
    ItemId,
    Lane,
    Tier,
    TierQueues,
)
from batcher.fair import cost

ACCOUNTS = ("a", "b", "c", "d")
WEIGHTS = st.sampled_from([0.5, 1.0, 2.0, 3.0])
_ids = itertools.count()


class Sink:
    def item_done(self, item: Item, result: str | BaseException) -> None:
        raise AssertionError("the queues never answer an item")


def item(account: str | None, chars: int, tier: Tier = Tier.FREE, at: float = 0.0,
         deadline: float = math.inf) -> Item:
    it = Item(ItemId(next(_ids)), "x" * chars, tier, at, deadline, Sink(), caller=account)
    it.enqueued = at
    return it


def queues(weights: dict[str, float], fair: bool = True) -> TierQueues:
    return TierQueues(dict.fromkeys(Tier, 1_000_000), fair=fair, weights=weights)


@st.composite
def backlogs(draw: st.DrawFn) -> tuple[dict[str, float], dict[str, list[int]]]:
    """Two to four accounts with weights, each with a backlog of input lengths."""
    n = draw(st.integers(2, 4))
    weights = {a: draw(WEIGHTS) for a in ACCOUNTS[:n]}
    costs = {a: draw(st.lists(st.integers(0, 60), min_size=30, max_size=120))
             for a in weights}
    return weights, costs


def put_interleaved(q: TierQueues, costs: dict[str, list[int]], tier: Tier = Tier.FREE
                    ) -> list[Item]:
    """Queue every account's inputs, one request each, in turns (arrival order mixed)."""
    out: list[Item] = []
    for row in itertools.zip_longest(*costs.values()):
        for account, chars in zip(costs, row, strict=True):
            if chars is not None:
                out.append(it := item(account, chars, tier))
                q.put_nowait(it)
    return out


# -- (1) each account's share ------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(backlogs(), st.integers(1, 40))
def test_over_any_backlogged_window_each_account_gets_its_weighted_share(
    drawn: tuple[dict[str, float], dict[str, list[int]]], limit: int
) -> None:
    """SCFQ's bound: between two accounts backlogged over a window, the characters served
    over their weights differ by at most one item's cost over its weight, each side."""
    weights, costs = drawn
    q = queues(weights)
    queued = {a: len(c) for a, c in costs.items()}
    put_interleaved(q, costs)
    served: list[dict[str, int]] = [dict.fromkeys(weights, 0)]
    while all(queued.values()):  # stop once one account runs dry: the window ends
        batch, _ = q.pop_batch(limit, now=0.0)
        now = dict(served[-1])
        for it in batch:
            assert it.caller is not None
            now[it.caller] += cost(it)
            queued[it.caller] -= 1
        served.append(now)
    most = max(cost(item(None, c)) for cs in costs.values() for c in cs)
    for start, end in itertools.combinations(range(len(served) - 1), 2):
        share = {a: (served[end][a] - served[start][a]) / w for a, w in weights.items()}
        for x, y in itertools.combinations(weights, 2):
            assert abs(share[x] - share[y]) <= most / weights[x] + most / weights[y] + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(ACCOUNTS), WEIGHTS, min_size=2),
       st.lists(st.tuples(st.sampled_from(ACCOUNTS), st.integers(1, 30)), max_size=80),
       st.integers(2, 20))
def test_an_account_that_went_idle_banks_no_credit(
    weights: dict[str, float], early: list[tuple[str, int]], limit: int
) -> None:
    """However little an account was served while it was away, on its return it shares
    from then on: it does not take back the past."""
    q = queues(weights)
    first = next(iter(weights))
    for account, chars in early:  # everyone but `first` works for a while
        if account != first:
            q.put_nowait(item(account, chars))
    while q.pop_batch(limit, now=0.0)[0]:
        pass
    for account in weights:  # now all come back with the same backlog of 10-char inputs
        q.put_all([item(account, 10) for _ in range(200)], Tier.FREE)
    served = dict.fromkeys(weights, 0)
    for _ in range(5):
        for it in q.pop_batch(limit, now=0.0)[0]:
            assert it.caller is not None
            served[it.caller] += 10
    for x, y in itertools.combinations(weights, 2):  # all backlogged since they came back
        assert abs(served[x] / weights[x] - served[y] / weights[y]) \
            <= 10 / weights[x] + 10 / weights[y] + 1e-9


# -- (2) nobody starves ------------------------------------------------------------------------
Op = tuple[str, str, int, Tier]  # (what, account, characters, tier)
OPS = st.tuples(st.sampled_from(["put", "put", "put", "aged", "cancel", "late"]),
                st.sampled_from(ACCOUNTS), st.integers(0, 200), st.sampled_from(Tier))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(ACCOUNTS), WEIGHTS, min_size=2),
       st.lists(OPS, min_size=1, max_size=150), st.integers(1, 30), st.floats(100.0, 5000.0))
def test_every_item_leaves_exactly_once_while_batches_keep_being_cut(
    weights: dict[str, float], ops: list[Op], limit: int, max_chars: float
) -> None:
    """Arrivals, inputs from an earlier stage, cancellations and deadlines mixed with cuts:
    every item is cut, expired or cancelled, once; the counts follow every change."""
    q = queues(weights)
    made: list[Item] = []
    live: list[Item] = []
    left: list[Item] = []  # cut, expired or cancelled
    for n, (what, account, chars, tier) in enumerate(ops):
        if what == "cancel" and live:
            gone = live.pop(chars % len(live))
            q.cancel(gone)
            left.append(gone)
        elif what == "aged":  # it arrived before some of the items queued since
            q.put_aged(it := item(account, chars, tier, at=float(n - chars % 10)))
            made.append(it)
        else:
            deadline = float(n) + 1 if what == "late" else math.inf
            q.put_nowait(it := item(account, chars, tier, at=float(n), deadline=deadline))
            made.append(it)
        live = [i for i in made if i not in left]
        if n % 3 == 0:  # cuts keep pace with a third of the arrivals: a backlog builds
            batch, expired = q.pop_batch(limit, now=float(n), max_chars=max_chars)
            left += batch + expired
            live = [i for i in made if i not in left]
        assert len(q) == len(live) and q.chars() == sum(len(i.text) for i in live)
        oldest = q.oldest()
        assert (oldest and oldest.enqueued) == min((i.enqueued for i in live), default=None)
    for _ in range(len(live)):  # then batches keep being cut
        batch, expired = q.pop_batch(limit, now=math.inf, max_chars=max_chars)
        left += batch + expired
    assert sorted(i.id for i in left) == sorted(i.id for i in made) and len(q) == 0


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(ACCOUNTS[1:]), WEIGHTS, min_size=1),
       WEIGHTS, st.integers(1, 100))
def test_an_item_is_cut_while_other_accounts_keep_the_tier_overloaded(
    others: dict[str, float], weight: float, chars: int
) -> None:
    """Others arrive faster than batches are cut, forever: a's one input still runs, once
    the tags of the work queued ahead of it are passed."""
    q = queues({"a": weight, **others})
    for account in others:
        q.put_all([item(account, 50) for _ in range(100)], Tier.FREE)
    mine = item("a", chars)
    q.put_nowait(mine)
    for _ in range(100):
        for account in others:  # 20 inputs an account for every 10 cut
            q.put_all([item(account, 50) for _ in range(20)], Tier.FREE)
        if mine in q.pop_batch(10, now=0.0)[0]:
            return
    raise AssertionError("a's input starved")


# -- (3) first come, first served within an account -------------------------------------------
@settings(max_examples=150, deadline=None)
@given(backlogs(), st.integers(1, 40), st.floats(30.0, 2000.0))
def test_each_accounts_items_are_cut_in_arrival_order(
    drawn: tuple[dict[str, float], dict[str, list[int]]], limit: int, max_chars: float
) -> None:
    weights, costs = drawn
    q = queues(weights)
    put_interleaved(q, costs)
    order: list[Item] = []
    while batch := q.pop_batch(limit, now=0.0, max_chars=max_chars)[0]:
        order += batch
    for account in weights:
        ids = [i.id for i in order if i.caller == account]
        assert ids == sorted(ids) and len(ids) == len(costs[account])


def test_an_aged_item_goes_ahead_of_its_accounts_younger_items_only() -> None:
    q = queues({})
    young = [item("a", 5, at=10.0), item("a", 5, at=11.0)]
    q.put_all(young, Tier.FREE)
    other = item("b", 5, at=12.0)
    q.put_nowait(other)
    aged = item("a", 5, at=1.0)
    q.put_aged(aged)
    assert q.oldest() is aged
    order = q.pop_batch(10, now=0.0)[0]
    assert [i for i in order if i.caller == "a"] == [aged, *young]


# -- (4) strict tier order ---------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(ACCOUNTS), WEIGHTS, min_size=1),
       st.lists(st.tuples(st.sampled_from(ACCOUNTS), st.integers(0, 40),
                          st.sampled_from([*Tier, None])), min_size=1, max_size=120),
       st.integers(1, 25))
def test_no_free_item_is_cut_while_a_paid_one_waits_and_retries_go_first(
    weights: dict[str, float], arrivals: list[tuple[str, int, Tier | None]], limit: int
) -> None:
    """`None`: a re-routed item, put back at the head of the retry lane."""
    q = queues(weights)
    retried: set[int] = set()
    for account, chars, tier in arrivals:
        it = item(account, chars, tier or Tier.PAID)
        if tier is None:
            q.push_retry([it])
            retried.add(it.id)
        else:
            q.put_nowait(it)
    while batch := q.pop_batch(limit, now=0.0)[0]:
        lanes = [Lane.RETRY if i.id in retried else LANE_OF[i.tier] for i in batch]
        assert lanes == sorted(lanes)  # retry, then paid, then free
        if lanes[-1] > Lane.RETRY:
            assert q.depth(Lane.RETRY) == 0
        if lanes[-1] == Lane.FREE:
            assert q.depth(Lane.PAID) == 0


# -- (5) a single small input never waits behind another account's backlog --------------------
@settings(max_examples=100, deadline=None)
@given(WEIGHTS, WEIGHTS, st.lists(st.integers(1, 400), min_size=2000, max_size=2000),
       st.integers(0, 5), st.integers(0, 10))
def test_a_small_input_of_b_is_cut_within_a_batch_behind_as_thousands_of_inputs(
    weight_a: float, weight_b: float, costs: list[int], cut_before: int, chars: int
) -> None:
    q = queues({"a": weight_a, "b": weight_b})
    q.put_all([item("a", c) for c in costs], Tier.FREE)
    for _ in range(cut_before):
        q.pop_batch(100, now=0.0)
    mine = item("b", chars)
    q.put_nowait(mine)
    first = q.pop_batch(100, now=0.0)[0]
    assert mine in first or mine in q.pop_batch(100, now=0.0)[0]


def test_through_the_batcher_b_rides_the_next_batch_not_after_as_backlog() -> None:
    """The same in the batcher's virtual time: a's 5,000-input backlog, b's one input."""
    policy = FlushPolicy(max_batch=100, max_wait=0.05, idle_trigger=False)
    b = Batcher(TierQueues(dict.fromkeys(Tier, 10_000), fair=True), policy)
    b.admit([item("a", 20) for _ in range(5000)], 60.0, now=0.0, ready=1)
    first = b.cut(0.0, Capacity(idle=1, ready=1))
    mine = item("b", 20, at=0.01)
    b.admit([mine], 60.0, now=0.01, ready=1)
    second = b.cut(0.1, Capacity(idle=1, ready=1))
    assert first is not None and second is not None
    assert mine in second.items and len(second.items) == 100


# -- (6) fair share off: first come, first served within a tier -------------------------------
@settings(max_examples=100, deadline=None)
@given(backlogs(), st.integers(1, 40))
def test_with_fair_share_off_a_tier_is_cut_in_arrival_order(
    drawn: tuple[dict[str, float], dict[str, list[int]]], limit: int
) -> None:
    weights, costs = drawn
    q = queues(weights, fair=False)
    queued = put_interleaved(q, costs)
    order: list[Item] = []
    while batch := q.pop_batch(limit, now=0.0)[0]:
        order += batch
    assert order == queued


# -- the rest of the contract with many accounts ----------------------------------------------
def test_the_oldest_item_is_the_oldest_accounts_head_and_cancelling_it_moves_on() -> None:
    q = queues({})
    a, b, c = item("a", 5, at=3.0), item("b", 5, at=1.0), item("c", 5, at=2.0)
    for it in (a, b, c):
        q.put_nowait(it)
    assert q.oldest() is b
    q.cancel(b)
    assert q.oldest() is c and len(q) == 2 and q.chars() == 10
    assert q.pop_batch(10, now=0.0)[0] == [a, c]


def test_expired_items_are_returned_uncharged_and_the_cap_stops_the_fair_order() -> None:
    q = queues({})
    late = item("a", 500, deadline=1.0)
    q.put_all([late, item("a", 600)], Tier.FREE)
    q.put_nowait(small := item("b", 10))
    batch, expired = q.pop_batch(10, now=5.0, max_chars=500)
    assert expired == [late] and batch == [small]  # a's 600 does not fit after b's 10
    assert q.chars() == 600


def test_memory_stays_bounded_when_every_accounts_items_are_cancelled() -> None:
    q = TierQueues(dict.fromkeys(Tier, 10), fair=True)
    keep = item("keep", 5)
    q.put_nowait(keep)
    for n in range(5000):
        doomed = item(f"acct-{n % 50}", 5)
        q.put_nowait(doomed)
        q.cancel(doomed)
        assert q.statistics().held <= 2 * 10 + 64 + 1
    assert q.pop_batch(10, now=0.0)[0] == [keep]


def test_batch_slots_are_counted_by_tier_and_account() -> None:
    q = queues({})
    q.put_all([item("a", 5, Tier.PAID) for _ in range(3)], Tier.PAID)
    q.put_all([item("b", 5) for _ in range(2)], Tier.FREE)
    q.put_nowait(item(None, 5))
    q.pop_batch(4, now=0.0)
    q.pop_batch(4, now=0.0)
    assert q.statistics().slots == {("paid", "a"): 3, ("free", "b"): 2, ("free", None): 1}


@pytest.mark.parametrize("weight", [0.0, -1.0, math.inf, math.nan])
def test_weights_must_be_positive_and_finite(weight: float) -> None:
    with pytest.raises(ValueError, match="weights must be > 0"):
        TierQueues(dict.fromkeys(Tier, 1), fair=True, weights={"a": weight})


def test_an_account_whose_queued_items_were_all_cancelled_comes_back_with_no_credit() -> None:
    """Its cancelled items were never served: it was idle all along, and shares from V."""
    q = queues({})
    gone = item("a", 10_000)  # its tag is far ahead: a is not picked (and trimmed) soon
    q.put_nowait(gone)
    q.put_all([item("b", 10) for _ in range(1000)], Tier.FREE)
    q.cancel(gone)
    for _ in range(5):  # b alone is served: V moves on
        q.pop_batch(20, now=0.0)
    q.put_all([item("a", 10) for _ in range(100)], Tier.FREE)
    batch = q.pop_batch(20, now=0.0)[0]
    assert abs(sum(i.caller == "a" for i in batch) - 10) <= 1


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(ACCOUNTS), WEIGHTS, min_size=2),
       st.dictionaries(st.sampled_from(ACCOUNTS), WEIGHTS), st.integers(2, 20))
def test_new_weights_hold_for_accounts_backlogged_across_the_change(
    before: dict[str, float], after: dict[str, float], limit: int
) -> None:
    """A keys file read again (SIGHUP): accounts that stay backlogged share by their new
    weights from the change on, within SCFQ's bound, as if they had all just come (an
    account the new file does not name weighs 1)."""
    q = queues(before)
    for account in before:
        q.put_all([item(account, 10) for _ in range(400)], Tier.FREE)
    q.pop_batch(limit, now=0.0)  # some served at the old weights: tags and V moved
    q.set_weights(after)
    weights = {a: after.get(a, 1.0) for a in before}
    served = dict.fromkeys(weights, 0)
    for _ in range(6):
        for it in q.pop_batch(limit, now=0.0)[0]:
            assert it.caller is not None
            served[it.caller] += 10
    for x, y in itertools.combinations(weights, 2):  # SCFQ's bound, from the change
        assert abs(served[x] / weights[x] - served[y] / weights[y]) \
            <= 10 / weights[x] + 10 / weights[y] + 1e-9


def test_new_weights_are_checked_and_leave_fifo_lanes_alone() -> None:
    with pytest.raises(ValueError, match="weights must be > 0"):
        queues({}).set_weights({"a": 0.0})
    q = queues({}, fair=False)
    first = item("a", 5)
    q.put_nowait(first)
    q.put_nowait(item("b", 5))
    q.set_weights({"b": 3.0})
    assert q.pop_batch(1, now=0.0)[0] == [first]
