import pytest
from hypothesis import given
from hypothesis import strategies as st

from batcher import MAX_BATCH, Capacity, FlushPolicy, FlushReason

policy = FlushPolicy(max_batch=100, max_wait=0.05, idle_trigger=True)


def decide(
    p: FlushPolicy, pending: int, waited: float, idle: int, retry: bool = False,
    ready: int = 12, needed: float = 0.0,
) -> FlushReason | None:
    return p.decide(
        pending=pending, oldest_enqueued=-waited, now=0.0,
        pool=Capacity(idle, max(ready, idle), needed), retry=retry,
    )


def test_no_idle_worker_never_flushes() -> None:
    assert decide(policy, 100, 9.0, 0, True) is None


def test_empty_queue_never_flushes() -> None:
    assert decide(policy, 0, 0.0, 5, False) is None


def test_full_batch_flushes_at_once() -> None:
    assert decide(policy, 100, 0.0, 1, False) is FlushReason.FULL


def test_oldest_past_max_wait_flushes() -> None:
    got = decide(policy, 3, 0.05, 1, False)
    assert got is FlushReason.TIMEOUT


def test_one_idle_worker_waits_for_fill() -> None:
    assert decide(policy, 3, 0.01, 1, False) is None


def test_spare_capacity_flushes_at_once() -> None:
    assert decide(policy, 1, 0.0, 2, False) is FlushReason.IDLE


def test_the_idle_trigger_keeps_the_workers_the_load_needs() -> None:
    # 10 workers, 4 busy, the load needs 4 at full batches: 4 + 1 + 1.5 x 4 > 10, so wait.
    assert decide(policy, 1, 0.0, 6, ready=10, needed=4.0) is None
    assert decide(policy, 1, 0.0, 6, ready=10, needed=3.0) is FlushReason.IDLE


def test_under_heavy_load_the_idle_trigger_never_fires() -> None:
    # 20,000 items/s on 22 workers needs 20 of them: two idle workers never cut early.
    assert decide(policy, 30, 0.0, 2, ready=22, needed=20.0) is None


def test_idle_trigger_can_be_turned_off() -> None:
    plain = FlushPolicy(idle_trigger=False)
    assert decide(plain, 1, 0.0, 8, False) is None


def test_retried_items_never_wait_again() -> None:
    assert decide(policy, 1, 0.0, 1, True) is FlushReason.RETRY


def test_settings_are_validated() -> None:
    bad_settings = (
        {"max_batch": 0}, {"max_batch": MAX_BATCH + 1}, {"max_wait": -1.0}, {"spare": -1.0}
    )
    for bad in bad_settings:
        try:
            FlushPolicy(**bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")


@given(
    pending=st.integers(0, 500),
    waited=st.floats(0, 1),
    idle=st.integers(0, 12),
    busy=st.integers(0, 12),
    needed=st.floats(0, 30),
    retry=st.booleans(),
    idle_trigger=st.booleans(),
)
def test_flushes_exactly_when_a_trigger_holds(
    pending: int, waited: float, idle: int, busy: int, needed: float, retry: bool,
    idle_trigger: bool,
) -> None:
    p = FlushPolicy(max_batch=100, max_wait=0.05, idle_trigger=idle_trigger)
    got = p.decide(
        pending=pending, oldest_enqueued=-waited, now=0.0,
        pool=Capacity(idle, idle + busy, needed), retry=retry,
    )
    spare = idle > 1 and busy + 1 + 1.5 * needed <= idle + busy
    trigger = retry or pending >= 100 or waited >= 0.05 or (idle_trigger and spare)
    assert (got is not None) == (idle > 0 and pending > 0 and trigger)


def test_characters_up_to_the_cap_make_a_batch_full() -> None:
    got = policy.decide(pending=3, oldest_enqueued=0.0, now=0.0, pool=Capacity(1, 12),
                        retry=False, pending_chars=30_000, max_chars=25_000)
    assert got is FlushReason.FULL
    under = policy.decide(pending=3, oldest_enqueued=0.0, now=0.0, pool=Capacity(1, 12),
                          retry=False, pending_chars=20_000, max_chars=25_000)
    assert under is None


def test_a_fixed_character_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch_chars"):
        FlushPolicy(max_batch_chars=0)


def test_a_timed_or_idle_cut_waits_for_a_partner_stage_a_full_one_or_a_retry_never_does() -> None:
    def held(pending: int, waited: float, idle: int, retry: bool = False,
             until: float = 0.004) -> FlushReason | None:
        return policy.decide(pending=pending, oldest_enqueued=-waited, now=0.0,
                             pool=Capacity(idle, 12, 0.0), retry=retry, hold_until=until)

    assert held(3, 0.06, 1) is None  # due by its time, held
    assert held(1, 0.0, 2) is None  # idle workers to spare, held
    assert held(100, 0.0, 1) is FlushReason.FULL
    assert held(1, 0.0, 1, retry=True) is FlushReason.RETRY
    assert held(3, 0.06, 1, until=0.0) is FlushReason.TIMEOUT  # the hold is over
