import pytest

from batcher import Item, ItemId, Lane, QueueFull, Tier, TierQueues
from batcher.queues import COMPACT_SLACK


class Sink:
    def item_done(self, item: Item, result: str | BaseException) -> None:
        pass


def item(n: int, tier: Tier = Tier.FREE, deadline: float = 100.0) -> Item:
    it = Item(ItemId(n), f"t{n}", tier, 0.0, deadline, Sink())
    it.enqueued = float(n)
    return it


@pytest.fixture(params=[False, True], ids=["fifo", "fair"])
def fair(request: pytest.FixtureRequest) -> bool:
    """Each contract holds with fair share off and on (one account: the same order)."""
    return bool(request.param)


def queues(fair: bool, cap: int = 10) -> TierQueues:
    return TierQueues({Tier.PAID: cap, Tier.FREE: cap}, fair=fair)


def test_paid_pops_before_free_and_fifo_within_a_tier(fair: bool) -> None:
    q = queues(fair)
    for it in (item(1), item(2, Tier.PAID), item(3), item(4, Tier.PAID)):
        q.put_nowait(it)
    batch, _ = q.pop_batch(10, now=0.0)
    assert [i.id for i in batch] == [2, 4, 1, 3]


def test_retry_lane_outranks_every_tier_and_keeps_order(fair: bool) -> None:
    q = queues(fair)
    q.put_nowait(item(1, Tier.PAID))
    q.push_retry([item(7), item(8)])
    batch, _ = q.pop_batch(10, now=0.0)
    assert [i.id for i in batch] == [7, 8, 1]


def test_pop_respects_the_limit(fair: bool) -> None:
    q = queues(fair)
    for n in range(5):
        q.put_nowait(item(n))
    batch, _ = q.pop_batch(3, now=0.0)
    assert len(batch) == 3 and len(q) == 2


def test_full_tier_refuses_without_touching_the_other(fair: bool) -> None:
    q = queues(fair, cap=2)
    q.put_nowait(item(1))
    q.put_nowait(item(2))
    with pytest.raises(QueueFull):
        q.put_nowait(item(3))
    q.put_nowait(item(4, Tier.PAID))
    assert q.depth(Lane.FREE) == 2 and q.depth(Lane.PAID) == 1


def test_cancelled_items_stop_counting_at_once_and_never_pop(fair: bool) -> None:
    q = queues(fair)
    a, b = item(1), item(2)
    q.put_nowait(a)
    q.put_nowait(b)
    q.cancel(a)
    assert len(q) == 1
    assert q.oldest() is b
    batch, _ = q.pop_batch(10, now=0.0)
    assert batch == [b]


def test_memory_stays_bounded_by_the_caps_however_items_leave(fair: bool) -> None:
    """Clients that all give up while no worker frees up: their items must not pile up."""
    q, cap = queues(fair, cap=10), 10
    keep = item(0)
    q.put_nowait(keep)  # never cancelled: the lane's head never trims the rest
    for n in range(1, 5_000):
        doomed = item(n)
        q.put_nowait(doomed)
        q.cancel(doomed)
        assert q.statistics().held <= 2 * cap + COMPACT_SLACK + 1
    assert len(q) == 1
    batch, _ = q.pop_batch(10, now=0.0)
    assert batch == [keep]


def test_cancelling_twice_or_after_pop_changes_nothing(fair: bool) -> None:
    q = queues(fair)
    a = item(1)
    q.put_nowait(a)
    q.pop_batch(10, now=0.0)
    q.cancel(a)
    q.cancel(a)
    assert len(q) == 0


def test_expired_items_are_returned_apart_and_never_batched(fair: bool) -> None:
    q = queues(fair)
    late, fine = item(1, deadline=5.0), item(2, deadline=50.0)
    q.put_nowait(late)
    q.put_nowait(fine)
    batch, expired = q.pop_batch(10, now=10.0)
    assert batch == [fine] and expired == [late] and len(q) == 0


def test_depth_through_counts_own_tier_and_above(fair: bool) -> None:
    q = queues(fair)
    q.put_nowait(item(1, Tier.PAID))
    q.put_nowait(item(2))
    q.push_retry([item(3)])
    assert q.depth_through(Tier.PAID) == 2
    assert q.depth_through(Tier.FREE) == 3


def test_capacity_is_required_for_every_tier() -> None:
    with pytest.raises(ValueError):
        TierQueues({Tier.PAID: 1})


def test_length_follows_every_change(fair: bool) -> None:
    q = queues(fair)
    a, b, c = item(1), item(2, Tier.PAID), item(3)
    for it in (a, b, c):
        q.put_nowait(it)
    q.cancel(a)
    q.push_retry([item(4)])
    assert len(q) == 3
    q.pop_batch(2, now=0.0)
    assert len(q) == 1
    q.drain()
    assert len(q) == 0


def text(n: int, chars: int, tier: Tier = Tier.FREE, deadline: float = 100.0) -> Item:
    it = item(n, tier, deadline)
    it.text = "c" * chars
    return it


def test_characters_ahead_count_own_tier_and_above_and_follow_every_change(fair: bool) -> None:
    q = queues(fair)
    a, b, c = text(1, 100, Tier.PAID), text(2, 20), text(3, 3)
    q.put_all([a], Tier.PAID)
    q.put_all([b, c], Tier.FREE, chars=23)
    q.push_retry([text(4, 1000)])
    assert (q.chars_through(Tier.PAID), q.chars_through(Tier.FREE)) == (1100, 1123)
    q.cancel(b)
    assert q.chars() == 1103
    q.pop_batch(2, now=0.0)  # the retry item and the paid one
    assert q.chars() == q.chars_through(Tier.FREE) == 3
    q.drain()
    assert q.chars() == 0


def test_a_cut_stops_at_the_first_item_past_the_character_cap(fair: bool) -> None:
    q = queues(fair)
    for n, chars in enumerate((400, 500, 300, 10), start=1):
        q.put_nowait(text(n, chars))
    batch, _ = q.pop_batch(10, now=0.0, max_chars=1000)
    assert [i.id for i in batch] == [1, 2]  # not 4, which would fit: it is later in line
    assert q.chars() == 310


def test_a_paid_item_past_the_cap_lets_no_free_item_into_the_batch(fair: bool) -> None:
    q = queues(fair)
    q.put_nowait(text(1, 600, Tier.PAID))
    q.put_nowait(text(2, 600, Tier.PAID))
    q.put_nowait(text(3, 5))
    batch, _ = q.pop_batch(10, now=0.0, max_chars=1000)
    assert [i.id for i in batch] == [1]


def test_one_input_longer_than_the_cap_runs_alone_never_an_empty_batch(fair: bool) -> None:
    q = queues(fair)
    q.put_nowait(text(1, 5000))
    q.put_nowait(text(2, 5))
    assert [i.id for i in q.pop_batch(10, now=0.0, max_chars=1000)[0]] == [1]
    assert [i.id for i in q.pop_batch(10, now=0.0, max_chars=1000)[0]] == [2]


def test_expired_items_take_no_room_under_the_cap(fair: bool) -> None:
    q = queues(fair)
    q.put_nowait(text(1, 900, deadline=5.0))
    q.put_nowait(text(2, 900))
    batch, expired = q.pop_batch(10, now=10.0, max_chars=1000)
    assert [i.id for i in batch] == [2] and [i.id for i in expired] == [1]
