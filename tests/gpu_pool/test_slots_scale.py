"""Scaling bookkeeping, as both pools use it (`Slots.add`, `retire`, `cancel_start`,
`remove`): pure, or in virtual time."""

from __future__ import annotations

import itertools

import anyio
import pytest

from batcher.shared.backoff import Backoff
from gpu_pool import BatchId, Load, Origin, Run, StartId
from gpu_pool.protocol import WorkerId
from gpu_pool.slots import Slot, Slots, SlotState
from tests.virtual import run_virtual

V1 = Load("m@v1", "sim")
V2 = Load("m@v2", "tests.models_versions:v2")
_asked = itertools.count(1000)  # the numbers of the starts no test names


def first(index: int) -> StartId:
    return StartId(Origin.FIRST, index)


def asked(number: int) -> StartId:
    return StartId(Origin.CORE, number)


def make(count: int = 2, first: SlotState = SlotState.STARTING) -> Slots[Slot]:
    return Slots([Slot(i, load=V1) for i in range(count)], first=first,
                 backoff=Backoff(first=0.5, cap=30.0, stable_after=30.0))


def up(slots: Slots[Slot], slot: Slot) -> WorkerId:
    worker = slots.begin(slot)
    slots.mark_ready(slot, "cpu")
    return worker


def grow(slots: Slots[Slot], load: Load = V1, start: StartId | None = None) -> Slot:
    slot = slots.add(lambda index: Slot(index, load=load), start or asked(next(_asked)))
    assert slot is not None
    return slot


# -- add ---------------------------------------------------------------------------------------
def test_a_slot_added_takes_a_fresh_index_and_the_first_state() -> None:
    slots = make(first=SlotState.PENDING)
    slot = grow(slots, V2)
    assert (slot.index, slot.state, slot.load) == (2, SlotState.PENDING, V2)
    assert len(slots) == 3 and slots.state_counts()["pending"] == 3
    assert [w.slot for w in slots.workers()] == [0, 1, 2]


def test_an_index_is_never_used_twice_even_after_its_slot_is_gone() -> None:
    slots = make()
    added = grow(slots)
    slots.retire(added, up(slots, added))
    slots.remove(added)
    assert grow(slots).index == 3


def test_no_slot_is_added_once_stopping() -> None:
    slots = make()
    slots.stop()
    assert slots.add(lambda index: Slot(index, load=V1), asked(1)) is None and len(slots) == 2


# -- retire ------------------------------------------------------------------------------------
def test_a_retired_worker_is_forgotten_and_never_a_death() -> None:
    slots = make()
    worker = up(slots, slots[0])
    assert slots.retire(slots[0], worker)
    slot = slots[0]
    assert slots.find(worker) is None and slot.leaving and slots.ready_count() == 0
    assert slots.workers()[0].state == "stopped"
    assert not slots.mark_dead(slot, worker)
    assert (slots.crashes, slot.restarts, slot.failures) == (0, 0, 0)


def test_a_retired_slot_is_removed_and_vanishes_from_what_the_pool_reports() -> None:
    slots = make()
    worker = up(slots, slots[1])
    slots.retire(slots[1], worker)
    slots.remove(slots[1])
    assert [w.slot for w in slots.workers()] == [0]
    assert sum(slots.state_counts().values()) == 1


@pytest.mark.parametrize("state", [SlotState.BUSY, SlotState.DEAD, SlotState.STARTING,
                                   SlotState.STOPPED])
def test_a_worker_not_idle_is_not_retired(state: SlotState) -> None:
    slots = make()
    worker = up(slots, slots[0])
    slots[0].state = state
    assert not slots.retire(slots[0], worker)
    assert slots.find(worker) is slots[0] and not slots[0].leaving


def test_an_earlier_incarnation_does_not_retire_its_successor() -> None:
    slots = make()
    old = up(slots, slots[0])
    up(slots, slots[0])
    assert not slots.retire(slots[0], old)


def test_no_retirement_once_stopping_nor_twice() -> None:
    slots = make()
    a, b = up(slots, slots[0]), up(slots, slots[1])
    assert slots.retire(slots[0], a) and not slots.retire(slots[0], a)
    slots.stop()
    assert not slots.retire(slots[1], b)


def test_a_worker_being_replaced_retires_unless_it_holds_a_batch() -> None:
    slots = make()
    worker = up(slots, slots[0])
    slots.replace(slots[0])
    slots[0].held = Run(BatchId(1), ("x",))
    assert not slots.retire(slots[0], worker)
    slots[0].held = None
    assert slots.retire(slots[0], worker)
    assert not slots[0].replacing and slots[0].leaving


# -- cancel_start ------------------------------------------------------------------------------
def test_the_start_named_is_taken_back() -> None:
    slots = make()
    up(slots, slots[0])
    slots.begin(slots[1])  # starting, v1
    newest = grow(slots, start=asked(1))
    slots.begin(newest)
    other = grow(slots, V2, asked(2))  # newer, but another version
    assert slots.cancel_start(asked(1)) is newest
    assert newest.leaving and slots.find(newest.worker) is None and not other.leaving
    assert slots.cancel_start(first(1)) is slots[1]
    assert slots.cancel_start(first(0)) is None  # the one left is up


def test_a_start_up_taken_back_or_never_made_is_not_taken_back() -> None:
    slots = make()
    added = grow(slots, start=asked(1))
    up(slots, added)
    leaving = grow(slots, start=asked(2))
    assert slots.cancel_start(asked(2)) is leaving
    assert slots.cancel_start(asked(1)) is None and not added.leaving
    assert slots.cancel_start(asked(2)) is None and slots.cancel_start(asked(3)) is None


def test_a_start_waiting_out_its_backoff_is_taken_back() -> None:
    slots = make(count=1)
    slots.mark_dead(slots[0], slots.begin(slots[0]))
    assert slots.cancel_start(first(0)) is slots[0]


def test_a_switch_a_replacement_or_an_unreported_death_is_not_taken_back() -> None:
    slots = make(count=3)
    switched = up(slots, slots[0])
    slots.switch(slots[0], switched, Load("m@v1", "sim"), asked(1))
    replaced = up(slots, slots[1])
    slots.replace(slots[1])
    dying = slots.begin(slots[2])
    slots.mark_dead(slots[2], dying)
    named = (asked(1), first(1), StartId(Origin.RESTART, replaced), first(2))
    assert all(slots.cancel_start(start, skip=[dying]) is None for start in named)
    assert slots.cancel_start(first(2)) is slots[2]


def test_nothing_is_taken_back_once_stopping() -> None:
    slots = make()
    slots.stop()
    assert slots.cancel_start(first(1)) is None


def test_a_leaving_slot_holds_no_start_up_back() -> None:
    slots = make()
    up(slots, slots[0])
    slots.begin(slots[1])
    assert not slots.settled(2)
    slots.cancel_start(first(1))
    assert slots.settled(2)


# -- starting (virtual time) -------------------------------------------------------------------
def test_a_slot_added_while_running_starts_at_once_and_one_added_before_once() -> None:
    async def main() -> list[tuple[int, float]]:
        slots = make(count=1)
        grow(slots)  # before `keep_started`: started with the first one
        starts: list[tuple[int, float]] = []

        async def start(slot: Slot) -> None:
            starts.append((slot.index, anyio.current_time()))

        async with anyio.create_task_group() as tg:
            t0 = anyio.current_time()
            await tg.start(slots.keep_started, start)
            await anyio.sleep(5)
            grow(slots)
            await anyio.sleep(5)
            tg.cancel_scope.cancel()
        return sorted((i, t - t0) for i, t in starts)

    assert run_virtual(main) == [(0, 0.0), (1, 0.0), (2, 5.0)]


def test_a_retired_slot_is_started_at_once_to_let_its_worker_go() -> None:
    async def main() -> list[tuple[bool, float]]:
        slots = make(count=1)
        starts: list[tuple[bool, float]] = []

        async def start(slot: Slot) -> None:
            starts.append((slot.leaving, anyio.current_time()))
            if not slot.leaving:
                worker = up(slots, slot)
                await anyio.sleep(3)
                slots.retire(slot, worker)

        async with anyio.create_task_group() as tg:
            t0 = anyio.current_time()
            await tg.start(slots.keep_started, start)
            await anyio.sleep(10)
            tg.cancel_scope.cancel()
        return [(leaving, t - t0) for leaving, t in starts]

    assert run_virtual(main) == [(False, 0.0), (True, 3.0)]


def test_a_start_taken_back_while_it_waits_its_backoff_goes_at_once() -> None:
    """The pool's start then removes the slot, instead of it lingering for the backoff."""

    async def main() -> list[tuple[bool, float]]:
        slots = make(count=1)
        slots[0].failures = 5  # the next wait would be 8 s
        starts: list[tuple[bool, float]] = []

        async def start(slot: Slot) -> None:
            starts.append((slot.leaving, anyio.current_time()))
            if not slot.leaving:
                slots.mark_dead(slot, slots.begin(slot))
                slots.restart(slot)

        async with anyio.create_task_group() as tg:
            t0 = anyio.current_time()
            await tg.start(slots.keep_started, start)
            await anyio.sleep(1)
            assert slots.cancel_start(first(0)) is slots[0]
            await anyio.sleep(20)
            tg.cancel_scope.cancel()
        return [(leaving, t - t0) for leaving, t in starts]

    assert run_virtual(main) == [(False, 0.0), (True, 1.0)]
