"""The synchronous batcher: admission all or nothing, the cut (when, what, in which order),
cancellation, draining and the arrival rate, with time passed in as plain numbers."""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import (
    Admission,
    AdmissionSettings,
    Batcher,
    Capacity,
    Closed,
    FlushPolicy,
    FlushReason,
    Item,
    ItemId,
    Overloaded,
    QueueFull,
    Tier,
    TierQueues,
)
from batcher.batcher import RECENT_ADMITS

ONE_IDLE = Capacity(idle=1, ready=1)
NONE_IDLE = Capacity(idle=0, ready=1)
_ids = itertools.count()


class Sink:
    """The batcher never answers an item: its caller does. Anything reaching here is a bug."""

    def item_done(self, item: Item, result: str | BaseException) -> None:
        raise AssertionError(f"the batcher settled item {item.id}")


def items(n: int, tier: Tier = Tier.FREE, deadline: float = 100.0) -> list[Item]:
    return [
        Item(ItemId(i), f"in-{i}", tier, 0.0, deadline, Sink(), k)
        for k, i in enumerate(itertools.islice(_ids, n))
    ]


FAIR = [False]  # the queues `batcher` builds share tiers fairly between accounts


@pytest.fixture(scope="module", autouse=True, params=[False, True], ids=["fifo", "fair"])
def fair_share(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test of the batcher runs with fair share off and on (its items are of one
    account: the same order either way)."""
    FAIR[0] = bool(request.param)
    yield
    FAIR[0] = False


def batcher(
    cap: int = 1000, max_wait: float = 0.05, admission: Admission | None = None
) -> Batcher:
    policy = FlushPolicy(max_batch=100, max_wait=max_wait, idle_trigger=False)
    return Batcher(TierQueues(dict.fromkeys(Tier, cap), fair=FAIR[0]), policy, admission)


def admission(free_budget: float) -> Admission:
    # One ready worker serves 100 items per 0.1 s: 1,000 items/s.
    return Admission(AdmissionSettings({Tier.PAID: 10.0, Tier.FREE: free_budget}))


def ids(batch: list[Item]) -> list[int]:
    return [i.id for i in batch]


# -- admission ---------------------------------------------------------------------------------
def test_a_request_past_the_tier_cap_queues_none_of_its_items() -> None:
    b = batcher(cap=5)
    b.admit(items(3), 10.0, now=0.0, ready=1)
    with pytest.raises(QueueFull):
        b.admit(items(3), 10.0, now=0.0, ready=1)
    assert len(b) == 3 and b.statistics(0.0).depth["free"] == 3
    b.admit(items(2), 10.0, now=0.0, ready=1)  # exactly up to the cap still fits
    assert len(b) == 5


def test_the_cap_is_per_tier() -> None:
    b = batcher(cap=5)
    b.admit(items(5), 10.0, now=0.0, ready=1)
    b.admit(items(5, Tier.PAID), 10.0, now=0.0, ready=1)
    assert b.statistics(0.0).depth == {"retry": 0, "paid": 5, "free": 5}


def test_admission_refuses_a_whole_request_over_its_tier_budget() -> None:
    b = batcher(admission=admission(free_budget=0.15))
    b.admit(items(40), 10.0, now=0.0, ready=1)  # 39 ahead: 0.139 s expected
    with pytest.raises(Overloaded) as refused:
        b.admit(items(20), 10.0, now=0.0, ready=1)  # 59 ahead: 0.159 s > 0.15 s
    assert refused.value.code == "over_budget"
    assert len(b) == 40


def test_admission_refuses_everything_with_no_worker_ready() -> None:
    b = batcher(admission=admission(free_budget=10.0))
    with pytest.raises(Overloaded) as refused:
        b.admit(items(1), 10.0, now=0.0, ready=0)
    assert refused.value.code == "no_healthy_worker" and len(b) == 0


def test_the_offered_rate_counts_what_admission_refused_the_admitted_rate_does_not() -> None:
    b = batcher(admission=admission(free_budget=0.15))
    b.count_offered()
    b.admit(items(40), 10.0, now=0.0, ready=1)
    with pytest.raises(Overloaded):
        b.admit(items(20), 10.0, now=0.0, ready=1)
    assert b.offered_rate(1.0) == pytest.approx(b.arrival_rate(1.0) * 60 / 40)


def test_a_draining_batcher_raises_closed_and_queues_nothing() -> None:
    b = batcher()
    b.drain()
    with pytest.raises(Closed):
        b.admit(items(2), 10.0, now=0.0, ready=1)
    assert len(b) == 0 and b.draining


# -- when to cut -------------------------------------------------------------------------------
def test_nothing_is_cut_with_no_worker_idle() -> None:
    b = batcher()
    b.admit(items(100), 10.0, now=0.0, ready=1)
    assert b.cut(1.0, NONE_IDLE) is None
    assert len(b) == 100


def test_nothing_is_cut_before_it_is_due_or_from_an_empty_queue() -> None:
    b = batcher()
    assert b.cut(0.0, ONE_IDLE) is None
    b.admit(items(3), 10.0, now=0.0, ready=1)
    assert b.cut(0.049, ONE_IDLE) is None
    assert len(b) == 3


def test_timeout_cuts_exactly_at_enqueued_plus_max_wait() -> None:
    b = batcher(max_wait=0.05)
    assert b.due() == math.inf
    b.admit(items(3), 10.0, now=1.0, ready=1)
    assert b.due() == 1.0 + 0.05
    assert b.cut(math.nextafter(b.due(), 0.0), ONE_IDLE) is None
    cut = b.cut(b.due(), ONE_IDLE)
    assert cut is not None and cut.reason is FlushReason.TIMEOUT and len(cut.items) == 3


def test_full_cuts_at_max_batch_and_takes_no_more() -> None:
    b = batcher()
    b.admit(items(99), 10.0, now=0.0, ready=1)
    assert b.cut(0.0, ONE_IDLE) is None
    b.admit(items(51), 10.0, now=0.0, ready=1)
    cut = b.cut(0.0, ONE_IDLE)
    assert cut is not None and cut.reason is FlushReason.FULL
    assert len(cut.items) == 100 and len(b) == 50


def test_the_idle_trigger_cuts_at_once_with_workers_to_spare() -> None:
    b = Batcher(TierQueues(dict.fromkeys(Tier, 10)), FlushPolicy(idle_trigger=True))
    b.admit(items(1), 10.0, now=0.0, ready=2)
    assert b.cut(0.0, Capacity(idle=1, ready=2)) is None
    cut = b.cut(0.0, Capacity(idle=2, ready=2))
    assert cut is not None and cut.reason is FlushReason.IDLE


# -- what is cut, in which order ---------------------------------------------------------------
def test_paid_items_are_cut_ahead_of_an_older_free_backlog() -> None:
    b = batcher()
    free = items(95)
    paid = items(10, Tier.PAID)
    b.admit(free, 10.0, now=0.0, ready=1)
    b.admit(paid, 10.0, now=0.01, ready=1)
    cut = b.cut(0.01, ONE_IDLE)
    assert cut is not None and ids(cut.items) == ids(paid) + ids(free[:90])
    assert len(b) == 5


def test_items_of_one_tier_are_cut_in_arrival_order() -> None:
    b = batcher()
    first, second, third = items(3), items(2), items(4)
    for n, request in enumerate((first, second, third)):
        b.admit(request, 10.0, now=n * 0.01, ready=1)
    cut = b.cut(0.05, ONE_IDLE)
    assert cut is not None and ids(cut.items) == ids(first + second + third)


def test_retried_items_are_cut_first_with_reason_retry() -> None:
    b = batcher()
    failed = items(3)
    b.admit(failed, 10.0, now=0.0, ready=1)
    assert b.cut(0.05, ONE_IDLE) is not None  # out to a worker that then dies
    paid = items(2, Tier.PAID)
    b.admit(paid, 10.0, now=0.06, ready=1)
    b.push_retry(failed, now=0.07)
    cut = b.cut(0.07, ONE_IDLE)  # no wait: retried items already waited once
    assert cut is not None and cut.reason is FlushReason.RETRY
    assert ids(cut.items) == ids(failed + paid)


def test_expired_items_come_back_in_expired_never_in_items() -> None:
    b = batcher()
    late, live = items(2, deadline=0.03), items(3, deadline=10.0)
    b.admit(late, 10.0, now=0.0, ready=1)
    b.admit(live, 10.0, now=0.0, ready=1)
    cut = b.cut(0.05, ONE_IDLE)
    assert cut is not None
    assert ids(cut.expired) == ids(late) and ids(cut.items) == ids(live)
    assert len(b) == 0 and b.statistics(0.05).expired == 2


def test_a_cut_of_only_expired_items_has_no_items_and_counts_no_batch() -> None:
    b = batcher()
    b.admit(items(2, deadline=0.03), 10.0, now=0.0, ready=1)
    cut = b.cut(0.05, ONE_IDLE)
    assert cut is not None and cut.items == [] and len(cut.expired) == 2
    assert b.statistics(0.05).batches == 0


def test_cancelled_items_stop_counting_at_once_and_are_never_cut() -> None:
    b = batcher()
    head, rest = items(1), items(2)
    b.admit(head, 10.0, now=0.0, ready=1)
    b.admit(rest, 10.0, now=0.01, ready=1)
    b.cancel(head[0])
    b.cancel(head[0])  # twice is harmless
    assert len(b) == 2 and b.due() == 0.01 + 0.05  # the next oldest sets the timer
    cut = b.cut(b.due(), ONE_IDLE)
    assert cut is not None and ids(cut.items) == ids(rest) and cut.expired == []


def test_a_cancelled_item_is_not_retried() -> None:
    b = batcher()
    batch = items(2)
    b.admit(batch, 10.0, now=0.0, ready=1)
    b.cut(0.05, ONE_IDLE)
    b.cancel(batch[0])
    b.push_retry(batch, now=0.1)
    assert len(b) == 1


def test_draining_cuts_everything_at_once() -> None:
    b = batcher()
    queued = items(3) + items(2, Tier.PAID)
    b.admit(queued[:3], 10.0, now=0.0, ready=1)
    b.admit(queued[3:], 10.0, now=0.0, ready=1)
    b.drain()
    assert b.cut(0.0, NONE_IDLE) is None  # still only onto an idle worker
    cut = b.cut(0.0, ONE_IDLE)
    assert cut is not None and sorted(ids(cut.items)) == sorted(ids(queued)) and len(b) == 0


# -- rates, estimates and statistics -----------------------------------------------------------
def test_arrival_rate_counts_what_was_admitted_and_decays() -> None:
    b = batcher(cap=60)
    assert b.arrival_rate(0.0) == 0.0
    b.admit(items(30), 10.0, now=0.0, ready=1)
    b.admit(items(20, Tier.PAID), 10.0, now=0.0, ready=1)
    with pytest.raises(QueueFull):
        b.admit(items(31), 10.0, now=0.0, ready=1)  # refused: not an arrival
    assert b.arrival_rate(0.0) == pytest.approx(50.0)
    assert b.arrival_rate(1.0) == pytest.approx(50.0 / math.e)  # time constant of 1 s
    assert b.statistics(1.0).arrival_rate == pytest.approx(50.0 / math.e)


def test_load_rate_sees_a_step_in_load_at_once_and_never_reads_below_the_average() -> None:
    b = batcher(cap=1000)
    assert b.load_rate(0.0) == 0.0
    for k in range(RECENT_ADMITS + 1):  # a step: requests 1 ms apart, 1,000/s
        b.admit(items(1), 10.0, now=k * 0.001, ready=1)
    now = RECENT_ADMITS * 0.001
    assert b.arrival_rate(now) < 10  # the 1 s average has barely moved
    assert b.load_rate(now) == pytest.approx(1000.0)
    assert b.load_rate(now + 10.0) < 1.0  # quiet again: the step is over


def sizes_and_depths() -> st.SearchStrategy[tuple[int, list[int], float, int, int, bool]]:
    return st.tuples(st.integers(0, 120), st.lists(st.integers(1, 30), min_size=1, max_size=8),
                     st.sampled_from([0.05, 0.1, 0.2, 10.0]), st.integers(0, 2),
                     st.sampled_from([60, 150, 1000]), st.booleans())


@settings(max_examples=300)
@given(sizes_and_depths(), st.sampled_from(Tier))
def test_a_run_admitted_at_once_is_what_admitting_it_request_by_request_gives(
    case: tuple[int, list[int], float, int, int, bool], tier: Tier,
) -> None:
    """`admit_run` either queues the whole run, exactly as one `admit` per request would
    have, or queues nothing where one of those would have been refused."""
    queued, sizes, deadline_in, ready, cap, draining = case
    at_once, one_by_one = (batcher(cap=cap, admission=admission(free_budget=0.15))
                           for _ in range(2))
    for b in (at_once, one_by_one):
        if queued:
            b.admit(items(min(queued, cap), Tier.PAID), 10.0, now=0.0, ready=1)  # ahead of all
        if draining:
            b.drain()
    run = [items(n, tier) for n in sizes]
    before = at_once.statistics(0.0)
    refused = 0
    for request in run:
        try:
            one_by_one.admit(request, deadline_in, now=0.0, ready=ready)
        except (Overloaded, QueueFull, Closed):
            refused += 1
    if at_once.admit_run(run, deadline_in, now=0.0, ready=ready):
        assert refused == 0
        assert at_once.statistics(0.0) == one_by_one.statistics(0.0)
        assert at_once.load_rate(0.0) == one_by_one.load_rate(0.0)
    else:
        assert refused > 0
        assert at_once.statistics(0.0) == before


def test_expected_wait_counts_only_the_work_served_first() -> None:
    b = batcher(admission=admission(free_budget=10.0))
    b.admit(items(100), 10.0, now=0.0, ready=1)
    assert b.expected_wait(Tier.PAID, 0.0, ready=1) == pytest.approx(0.1)
    assert b.expected_wait(Tier.FREE, 0.0, ready=1) == pytest.approx(0.1 + 100 / 1000)
    assert b.expected_wait(Tier.FREE, 0.0, ready=0) == math.inf


def learned(free_budget: float = 10.0) -> Admission:
    """Batches cost 0.1 s plus 4 us a character: 12,500 characters a batch at most."""
    a = admission(free_budget)
    for chars in (10, 20, 30, 20_000, 40_000, 30_000):
        a.observe_batch(0.1 + 4e-6 * chars, chars)
    return a


def long_items(n: int, chars: int, tier: Tier = Tier.FREE, deadline: float = 100.0
               ) -> list[Item]:
    out = items(n, tier, deadline)
    for item in out:
        item.text = "c" * chars
    return out


def test_expected_wait_counts_the_characters_served_first() -> None:
    b = batcher(admission=learned())
    b.admit(long_items(10, 10_000), 100.0, now=0.0, ready=1)  # 100,000 free characters
    assert b.expected_wait(Tier.PAID, 0.0, ready=1) == pytest.approx(0.1)
    assert b.expected_wait(Tier.FREE, 0.0, ready=1) == pytest.approx(0.1 + 8 * 0.1 + 0.4)
    b.admit(long_items(10, 10_000, Tier.PAID), 100.0, now=0.0, ready=1)
    assert b.expected_wait(Tier.PAID, 0.0, ready=1) == pytest.approx(0.1 + 1.2)


def test_a_cut_holds_no_more_characters_than_the_measured_cost_allows() -> None:
    b = batcher(admission=learned())
    b.admit(long_items(10, 5_000), 100.0, now=0.0, ready=1)
    cut = b.cut(0.0, ONE_IDLE)  # full already: waiting cannot make it fuller
    assert cut is not None and cut.reason is FlushReason.FULL and len(cut.items) == 2


def test_a_fixed_character_cap_holds_without_admission() -> None:
    policy = FlushPolicy(max_batch=100, max_wait=0.05, idle_trigger=False,
                         max_batch_chars=15_000)
    b = Batcher(TierQueues(dict.fromkeys(Tier, 100)), policy)
    b.admit(long_items(3, 10_000) + long_items(1, 20_000), 100.0, now=0.0, ready=1)
    sizes = [len(cut.items) for _ in range(3) if (cut := b.cut(0.0, ONE_IDLE)) is not None]
    assert sizes == [1, 1, 1] and b.max_chars() == 15_000
    last = b.cut(0.0, ONE_IDLE)  # longer than the cap: alone, never an empty batch
    assert last is not None and [len(i.text) for i in last.items] == [20_000]


def test_a_long_request_is_refused_before_any_of_it_is_queued() -> None:
    b = batcher(admission=learned())
    with pytest.raises(Overloaded) as info:
        b.admit(long_items(100, 10_000), 2.0, now=0.0, ready=2)
    assert info.value.code == "deadline_unreachable" and len(b) == 0


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(1, 12), st.sampled_from([5, 3_000, 10_000])),
                min_size=1, max_size=6), st.sampled_from([0.3, 1.0, 5.0]),
       st.sampled_from(Tier), st.integers(0, 40))
def test_a_run_of_long_requests_admitted_at_once_is_what_one_by_one_gives(
    shapes: list[tuple[int, int]], deadline_in: float, tier: Tier, queued: int,
) -> None:
    at_once, one_by_one = (batcher(cap=1000, admission=learned(free_budget=1.0))
                           for _ in range(2))
    for b in (at_once, one_by_one):
        if queued:
            b.admit(long_items(queued, 3_000, Tier.PAID), 100.0, now=0.0, ready=2)
    run = [long_items(n, chars, tier) for n, chars in shapes]
    refused = 0
    for request in run:
        try:
            one_by_one.admit(request, deadline_in, now=0.0, ready=2)
        except Overloaded:
            refused += 1
    admitted = at_once.admit_run(run, deadline_in, now=0.0, ready=2)
    assert admitted == (refused == 0)
    if admitted:
        assert at_once.queues.chars() == one_by_one.queues.chars()


def test_statistics_count_batches_items_and_reasons() -> None:
    b = batcher()
    b.admit(items(130), 10.0, now=0.0, ready=1)
    b.cut(0.0, ONE_IDLE)
    b.cut(0.05, ONE_IDLE)
    stats = b.statistics(0.05)
    assert (stats.batches, stats.items, stats.pending) == (2, 130, 0)
    assert stats.flushes == {"full": 1, "timeout": 1, "idle": 0, "retry": 0}


# -- every schedule ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Admit:
    tier: Tier
    n: int
    short_deadline: bool


@dataclass(frozen=True)
class Cancel:
    pick: int


@dataclass(frozen=True)
class AskCut:
    idle: int


@dataclass(frozen=True)
class Wait:
    seconds: float


steps = st.lists(
    st.one_of(
        st.builds(Admit, st.sampled_from(Tier), st.integers(1, 30), st.booleans()),
        st.builds(Cancel, st.integers(0, 10**6)),
        st.builds(AskCut, st.integers(0, 2)),
        st.builds(Wait, st.floats(0.0, 0.04)),
    ),
    max_size=60,
)


@settings(max_examples=150)
@given(steps)
def test_every_admitted_item_leaves_the_queue_at_most_once_and_in_order(
    schedule: list[Admit | Cancel | AskCut | Wait],
) -> None:
    b, now = batcher(cap=200), 0.0
    admitted: list[Item] = []
    ran: list[Item] = []
    gone: set[int] = set()  # ids cut, expired or cancelled
    for step in schedule:
        match step:
            case Admit(tier, n, short):
                request = items(n, tier, deadline=now + (0.03 if short else 10.0))
                with contextlib.suppress(QueueFull):
                    b.admit(request, 10.0, now, ready=1)
                    admitted += request
            case Cancel(pick) if admitted:
                b.cancel(admitted[pick % len(admitted)])
                gone.add(admitted[pick % len(admitted)].id)
            case AskCut(idle):
                cut = b.cut(now, Capacity(idle=idle, ready=2))
                if cut is not None:
                    assert_a_valid_cut(cut.items, cut.expired, now, gone)
                    gone |= {i.id for i in cut.items + cut.expired}
                    ran += cut.items
            case Wait(seconds):
                now += seconds
        assert len(b) == sum(1 for i in admitted if i.id not in gone)
    for tier in Tier:
        order = [i.id for i in ran if i.tier is tier]
        assert order == sorted(order), f"{tier.name} items ran out of arrival order"


def assert_a_valid_cut(batch: list[Item], expired: list[Item], now: float, gone: set[int]) -> None:
    assert len(batch) <= 100
    assert not any(i.id in gone for i in batch + expired), "an item left the queue twice"
    assert all(i.deadline > now for i in batch) and all(i.deadline <= now for i in expired)
    tiers = [i.tier for i in batch]
    assert tiers == sorted(tiers), "a paid item was cut behind a free one"
