"""Slot bookkeeping, as both pools use it: pure, on a fake clock or in virtual time."""

from __future__ import annotations

import anyio
import pytest

from batcher.shared.backoff import Backoff
from gpu_pool.protocol import WorkerId
from gpu_pool.seam import WorkerInfo
from gpu_pool.slots import Slot, Slots, SlotState
from tests.virtual import run_virtual


class FakeClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(count: int = 2, first: SlotState = SlotState.STARTING,
         clock: FakeClock | None = None) -> Slots[Slot]:
    return Slots([Slot(i) for i in range(count)], first=first,
                 backoff=Backoff(first=0.5, cap=30.0, stable_after=30.0),
                 clock=clock or FakeClock())


def up(slots: Slots[Slot], index: int) -> WorkerId:
    """Start slot `index` and bring its new incarnation up; its id."""
    worker = slots.begin(slots[index])
    slots.mark_ready(slots[index], "cpu")
    return worker


# -- Backoff ---------------------------------------------------------------------------------
def test_the_delay_doubles_with_each_failure_and_is_capped() -> None:
    backoff = Backoff(first=0.5, cap=30.0)
    assert [backoff.delay(f) for f in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff.delay(50) == 30.0


def test_no_failure_in_a_row_waits_the_first_delay() -> None:
    assert Backoff(first=0.5).delay(0) == 0.5


def test_a_death_after_a_stable_run_resets_the_count() -> None:
    backoff = Backoff(stable_after=30.0)
    assert backoff.after_exit(7, up_for=30.0) == 0


def test_a_death_before_a_stable_run_is_one_failure_more() -> None:
    backoff = Backoff(stable_after=30.0)
    assert backoff.after_exit(7, up_for=29.9) == 8
    assert backoff.after_exit(0, up_for=0.0) == 1  # never came up


def test_the_defaults_are_the_pools() -> None:
    assert Backoff() == Backoff(first=0.5, cap=30.0, stable_after=30.0)


@pytest.mark.parametrize("kw", [{"first": -1.0}, {"cap": -1.0}, {"stable_after": -1.0}])
def test_a_negative_time_is_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Backoff(**kw)


# -- incarnations ----------------------------------------------------------------------------
def test_every_incarnation_gets_a_fresh_id_and_starts_in_the_first_state() -> None:
    slots = make(first=SlotState.PENDING)
    a, b = slots.begin(slots[0]), slots.begin(slots[1])
    again = slots.begin(slots[0])
    assert len({a, b, again}) == 3
    assert slots[0].state is SlotState.PENDING and slots.find(again) is slots[0]


def test_a_forgotten_worker_is_not_found() -> None:
    slots = make()
    worker = slots.begin(slots[0])
    slots.forget(worker)
    assert slots.find(worker) is None


def test_ready_records_the_device_and_when_it_came_up() -> None:
    clock = FakeClock()
    slots = make(clock=clock)
    clock.now = 12.0
    up(slots, 0)
    assert (slots[0].state, slots[0].device, slots[0].ready_at) == (SlotState.READY, "cpu", 12.0)
    assert slots.ready_count() == 1


def test_an_answered_batch_leaves_the_slot_idle_and_counted() -> None:
    slots = make()
    up(slots, 0)
    slots[0].state = SlotState.BUSY
    slots.mark_answered(slots[0])
    assert (slots[0].state, slots[0].batches) == (SlotState.READY, 1)


# -- deaths ----------------------------------------------------------------------------------
def test_a_death_is_recorded_once() -> None:
    slots = make()
    worker = up(slots, 0)
    assert slots.mark_dead(slots[0], worker) is True
    assert slots.mark_dead(slots[0], worker) is False
    assert (slots[0].state, slots.crashes) == (SlotState.DEAD, 1)


def test_the_death_of_an_earlier_incarnation_is_not_the_current_ones() -> None:
    slots = make()
    old = up(slots, 0)
    up(slots, 0)
    assert slots.mark_dead(slots[0], old) is False
    assert slots[0].state is SlotState.READY and slots.crashes == 0


def test_a_quick_death_is_a_failure_and_a_stable_runs_death_is_forgiven() -> None:
    clock = FakeClock()
    slots = make(clock=clock)
    worker = up(slots, 0)
    clock.now += 29.0
    slots.mark_dead(slots[0], worker)
    assert slots[0].failures == 1
    worker = up(slots, 0)
    clock.now += 30.0
    slots.mark_dead(slots[0], worker)
    assert slots[0].failures == 0


def test_a_death_while_loading_is_a_failure_however_long_it_loaded() -> None:
    clock = FakeClock()
    slots = make(clock=clock)
    worker = slots.begin(slots[0])
    clock.now += 3600.0
    slots.mark_dead(slots[0], worker)
    assert slots[0].failures == 1


def test_a_death_while_stopping_is_no_crash() -> None:
    slots = make()
    worker = up(slots, 0)
    slots.stop()
    assert slots.mark_dead(slots[0], worker) is True
    assert slots.crashes == 0


def test_a_restart_is_counted_but_none_once_stopping() -> None:
    slots = make()
    slots.restart(slots[0])
    slots.stop()
    slots.restart(slots[1])
    assert (slots[0].restarts, slots[1].restarts) == (1, 0)


# -- what the pool reports -------------------------------------------------------------------
def test_state_counts_show_every_state_but_pending_where_none_waits_for_room() -> None:
    slots = make()
    up(slots, 0)
    assert slots.state_counts() == {"starting": 1, "ready": 1, "busy": 0, "dead": 0,
                                    "stopped": 0, "switching": 0}


def test_state_counts_show_pending_where_workers_wait_for_room() -> None:
    slots = make(first=SlotState.PENDING)
    assert slots.state_counts()["pending"] == 2


def test_workers_describe_each_slots_incarnation() -> None:
    slots = make(count=1)
    worker = up(slots, 0)
    slots[0].pid = 42
    assert slots.workers() == [WorkerInfo(id=worker, slot=0, pid=42, state="ready",
                                          device="cpu", batches=0, restarts=0)]


# -- start-up settled ------------------------------------------------------------------------
def test_start_up_is_settled_once_all_are_up() -> None:
    slots = make()
    up(slots, 0)
    assert not slots.settled(2)
    up(slots, 1)
    assert slots.settled(2)


def test_one_that_dies_while_loading_holds_no_one_back() -> None:
    slots = make()
    up(slots, 0)
    slots.mark_dead(slots[1], slots.begin(slots[1]))
    assert slots.settled(2)


def test_with_none_up_start_up_is_never_settled() -> None:
    slots = make()
    for slot in slots:
        slots.mark_dead(slot, slots.begin(slot))
    assert not slots.settled(2)


def test_a_slot_stuck_waiting_for_room_holds_no_one_back() -> None:
    slots = make(first=SlotState.PENDING)
    up(slots, 0)
    slots.begin(slots[1])
    assert not slots.settled(2)
    assert slots.settled(2, stuck={SlotState.PENDING})


def test_every_waiter_wakes_at_a_change() -> None:
    async def main() -> None:
        slots = make()
        first, second = slots.changed(), slots.changed()
        up(slots, 0)
        assert first is second and first.is_set()
        assert not slots.changed().is_set()  # the next change gets a fresh event

    run_virtual(main)


# -- starting and restarting (virtual time) --------------------------------------------------
def test_every_slot_starts_at_once_and_a_dead_one_again_after_its_backoff() -> None:
    async def main() -> list[tuple[int, float]]:
        slots = make()
        starts: list[tuple[int, float]] = []
        done = anyio.Event()

        async def start(slot: Slot) -> None:
            starts.append((slot.index, anyio.current_time()))
            worker = slots.begin(slot)
            if slot.index == 0 and slot.restarts < 2:  # dies while loading, twice
                slots.mark_dead(slot, worker)
                slots.restart(slot)
            elif slot.index == 0:
                done.set()

        async with anyio.create_task_group() as tg:
            t0 = anyio.current_time()
            await tg.start(slots.keep_started, start)
            with anyio.fail_after(60):
                await done.wait()
            tg.cancel_scope.cancel()
        return [(i, t - t0) for i, t in starts]

    assert sorted(run_virtual(main)) == [(0, 0.0), (0, 0.5), (0, 1.5), (1, 0.0)]


def test_a_restart_due_after_stop_never_starts() -> None:
    async def main() -> int:
        slots = make(count=1)
        calls = 0

        async def start(slot: Slot) -> None:
            nonlocal calls
            calls += 1
            slots.mark_dead(slot, slots.begin(slot))
            slots.restart(slot)
            slots.stop()

        async with anyio.create_task_group() as tg:
            await tg.start(slots.keep_started, start)
            await anyio.sleep(60)  # virtual: far past the backoff
            tg.cancel_scope.cancel()
        return calls

    assert run_virtual(main) == 1


def test_a_death_reported_after_the_starts_ended_is_no_restart() -> None:
    """A pool torn down without `stop` (its task group cancelled) may still hear a worker's
    exit: nothing is left to start it, and the report must not raise into the loop."""

    async def main() -> tuple[bool, int]:
        slots = make(count=1)

        async def start(slot: Slot) -> None:
            slots.begin(slot)
            slots.mark_ready(slot, "cpu")

        async with anyio.create_task_group() as tg:
            await tg.start(slots.keep_started, start)
            await anyio.sleep(1)  # virtual: the first start has run
            tg.cancel_scope.cancel()
        slot = slots[0]
        slots.mark_dead(slot, slot.worker)
        slots.restart(slot)  # raised BrokenResourceError before
        return slots.stopping, slot.restarts

    assert run_virtual(main) == (True, 0)


def test_a_forgiven_death_counts_no_failure_and_shortens_the_wait_under_way() -> None:
    """Deaths pinned on a convicted input are taken back: the slot's next start comes after
    the backoff its own failures earn, even when the restart was already waiting."""

    async def main() -> list[tuple[int, float]]:
        slots = make(count=1)
        starts: list[tuple[int, float]] = []
        done = anyio.Event()

        async def start(slot: Slot) -> None:
            starts.append((slot.restarts, anyio.current_time()))
            worker = slots.begin(slot)
            if slot.restarts < 2:  # dies at once, twice: the second wait would be 1 s
                slots.mark_dead(slot, worker)
                slots.restart(slot)
                if slot.restarts == 2:
                    await anyio.sleep(0.1)
                    slots.forgive(worker)  # its input was convicted 0.1 s later
                    assert slot.failures == 1
            else:
                done.set()

        async with anyio.create_task_group() as tg:
            t0 = anyio.current_time()
            await tg.start(slots.keep_started, start)
            with anyio.fail_after(60):
                await done.wait()
            tg.cancel_scope.cancel()
        return [(n, t - t0) for n, t in starts]

    assert run_virtual(main) == [(0, 0.0), (1, 0.5), (2, 1.0)]  # not 1.5
