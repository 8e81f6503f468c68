"""Every start a slot carries out has an identity (`StartId`), as both pools report it:
the slot's first, the core's (a slot added, a switch), or a restart of a worker that died
once up; a start that dies while loading is retried under the same id; a memory
replacement is no start. Pure."""

from __future__ import annotations

from batcher.shared.backoff import Backoff
from gpu_pool import Load, Origin, StartId
from gpu_pool.protocol import WorkerId
from gpu_pool.slots import Slot, Slots, SlotState

V1 = Load("m@v1", "sim")
V2 = Load("m@v2", "tests.models_versions:v2")
ASKED = StartId(Origin.CORE, 7)  # a start the core asks for


def make(count: int = 2) -> Slots[Slot]:
    return Slots([Slot(i, load=V1) for i in range(count)], first=SlotState.STARTING,
                 backoff=Backoff(first=0.5, cap=30.0, stable_after=30.0))


def come_up(slots: Slots[Slot], slot: Slot) -> tuple[WorkerId, StartId | None]:
    """A new incarnation of `slot` comes up: its id and the start its ready event ends."""
    worker = slots.begin(slot)
    return worker, slots.mark_ready(slot, "cpu")


def test_the_first_slots_come_up_for_their_first_starts() -> None:
    slots = make()
    assert [come_up(slots, slot)[1] for slot in slots] == [
        StartId(Origin.FIRST, 0), StartId(Origin.FIRST, 1)]
    assert [slot.start for slot in slots] == [None, None]  # nothing under way


def test_a_slot_added_comes_up_for_the_start_the_core_gave() -> None:
    slots = make()
    added = slots.add(lambda index: Slot(index, load=V2), ASKED)
    assert added is not None and added.start == ASKED
    assert come_up(slots, added)[1] == ASKED


def test_a_switch_comes_up_for_the_start_the_core_gave() -> None:
    slots = make()
    worker, _ = come_up(slots, slots[0])
    assert slots.switch(slots[0], worker, V2, ASKED)
    assert come_up(slots, slots[0])[1] == ASKED


def test_a_start_that_dies_while_loading_is_retried_under_the_same_id() -> None:
    slots = make()
    dead = slots.begin(slots[0])
    assert slots.mark_dead(slots[0], dead)
    assert slots[0].start == StartId(Origin.FIRST, 0)  # what its death reports
    assert come_up(slots, slots[0])[1] == StartId(Origin.FIRST, 0)


def test_a_switch_that_dies_while_loading_is_retried_under_its_id() -> None:
    slots = make()
    worker, _ = come_up(slots, slots[0])
    slots.switch(slots[0], worker, V2, ASKED)
    slots.mark_dead(slots[0], slots.begin(slots[0]))
    assert slots[0].start == ASKED
    assert come_up(slots, slots[0])[1] == ASKED


def test_a_worker_that_dies_once_up_is_restarted_under_a_start_named_for_it() -> None:
    slots = make()
    dead, _ = come_up(slots, slots[0])
    assert slots.mark_dead(slots[0], dead)
    restart = StartId(Origin.RESTART, dead)
    assert slots[0].start == restart
    slots.mark_dead(slots[0], slots.begin(slots[0]))  # and its restart dies loading
    assert slots[0].start == restart
    assert come_up(slots, slots[0])[1] == restart


def test_a_memory_replacement_is_no_start() -> None:
    slots = make()
    worker, _ = come_up(slots, slots[0])
    slots.replace(slots[0])
    assert slots.mark_ready(slots[0], "cpu") is None  # the core never saw it go
    assert slots[0].start is None and slots[0].worker == worker


def test_a_memory_replacement_that_dies_while_loading_is_a_restart_of_its_worker() -> None:
    slots = make()
    worker, _ = come_up(slots, slots[0])
    slots.replace(slots[0])
    assert slots.mark_dead(slots[0], worker)
    assert slots[0].start == StartId(Origin.RESTART, worker)
    assert come_up(slots, slots[0])[1] == StartId(Origin.RESTART, worker)


def test_a_replacement_switched_away_comes_up_for_the_switch() -> None:
    slots = make()
    worker, _ = come_up(slots, slots[0])
    slots.replace(slots[0])
    slots.switch(slots[0], worker, V2, ASKED)
    assert slots.take_back(slots[0], worker)  # the old version's process let go
    assert come_up(slots, slots[0])[1] == ASKED
