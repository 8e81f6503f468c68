"""Switch bookkeeping, as both pools use it (`Slots.switch`, `take_back`, `Slot.version`):
pure, or in virtual time."""

from __future__ import annotations

import anyio
import pytest

from batcher.shared.backoff import Backoff
from gpu_pool import DEFAULT_VERSION, BatchId, Load, Origin, Run, StartId
from gpu_pool.protocol import WorkerId
from gpu_pool.slots import Slot, Slots, SlotState
from tests.virtual import run_virtual

V1 = Load("m@v1", "sim")
V2 = Load("m@v2", "tests.models_versions:v2")
SWITCH = StartId(Origin.CORE, 1)  # the start of the one switch a test asks for


def make(count: int = 2) -> Slots[Slot]:
    return Slots([Slot(i, load=V1) for i in range(count)], first=SlotState.STARTING,
                 backoff=Backoff(first=0.5, cap=30.0, stable_after=30.0))


def up(slots: Slots[Slot], index: int) -> WorkerId:
    worker = slots.begin(slots[index])
    slots.mark_ready(slots[index], "cpu")
    return worker


# -- Load ------------------------------------------------------------------------------------
def test_a_loads_floor_is_its_own_else_the_pools_else_the_specs() -> None:
    assert Load("m@v1", "sim", latency_floor=0.02).floor(0.5) == 0.02
    assert Load("m@v1", "sim").floor(0.5) == 0.5
    assert Load("m@v1", "sim").floor(None) == 0.1  # sim's own: the contract's latency
    assert Load("m@v1", "tests.models:poison").floor(None) == 0.0


@pytest.mark.parametrize(("version", "spec", "floor"), [
    ("", "sim", None), ("m@v1", "not a spec", None), ("m@v1", "sim", -0.1)])
def test_a_malformed_load_is_refused(version: str, spec: str, floor: float | None) -> None:
    with pytest.raises(ValueError):
        Load(version, spec, floor)


# -- switch ----------------------------------------------------------------------------------
def test_an_idle_worker_switches_forgotten_and_no_crash() -> None:
    slots = make()
    worker = up(slots, 0)
    assert slots.switch(slots[0], worker, V2, SWITCH)
    slot = slots[0]
    assert slots.find(worker) is None and slot.load == V2
    assert (slots.crashes, slot.restarts, slot.failures, slots.switches) == (0, 0, 0, 1)
    assert slots.state_counts()["switching"] == 1 and slots.workers()[0].state == "switching"


def test_the_new_incarnation_holds_the_new_version_under_a_new_id() -> None:
    slots = make()
    old = up(slots, 0)
    held = slots[0].version  # what the pool's ready event for `old` carries
    slots.switch(slots[0], old, V2, SWITCH)
    new = up(slots, 0)
    assert new != old
    assert (held, slots[0].version) == ("m@v1", "m@v2")
    assert slots.workers()[0].state == "ready" and slots.workers()[0].version == "m@v2"


@pytest.mark.parametrize("state", [SlotState.BUSY, SlotState.DEAD, SlotState.STARTING,
                                   SlotState.STOPPED])
def test_a_worker_not_idle_does_not_switch(state: SlotState) -> None:
    slots = make()
    worker = up(slots, 0)
    slots[0].state = state
    assert not slots.switch(slots[0], worker, V2, SWITCH)
    assert slots[0].load == V1 and slots.find(worker) is slots[0] and slots.switches == 0


def test_an_earlier_incarnation_does_not_switch_its_successor() -> None:
    slots = make()
    old = up(slots, 0)
    up(slots, 0)
    assert not slots.switch(slots[0], old, V2, SWITCH)


def test_no_switch_once_stopping() -> None:
    slots = make()
    worker = up(slots, 0)
    slots.stop()
    assert not slots.switch(slots[0], worker, V2, SWITCH)


def test_a_worker_being_replaced_switches_unless_it_holds_a_batch() -> None:
    slots = make()
    worker = up(slots, 0)
    slots.replace(slots[0])
    slots[0].held = Run(BatchId(1), ("x",))
    assert not slots.switch(slots[0], worker, V2, SWITCH)
    slots[0].held = None
    assert slots.switch(slots[0], worker, V2, SWITCH)
    assert not slots[0].replacing and slots[0].switched_out == worker


def test_a_replacement_switched_away_is_taken_back_once() -> None:
    slots = make()
    worker = up(slots, 0)
    slots.replace(slots[0])
    slots.switch(slots[0], worker, V2, SWITCH)
    assert slots.take_back(slots[0], worker)
    assert not slots.take_back(slots[0], worker)
    assert slots[0].switched_out is None and slots[0].state is SlotState.STARTING


def test_a_death_while_loading_the_new_version_is_a_crash_and_keeps_it() -> None:
    slots = make()
    old = up(slots, 0)
    slots.switch(slots[0], old, V2, SWITCH)
    new = slots.begin(slots[0])
    assert slots.mark_dead(slots[0], new)
    assert (slots.crashes, slots[0].failures, slots[0].load) == (1, 1, V2)
    assert slots.workers()[0].state == "dead" and slots[0].version == "m@v2"


def test_a_slot_without_a_load_holds_the_default_version() -> None:
    slots = Slots([Slot(0)], first=SlotState.STARTING, backoff=Backoff())
    up(slots, 0)
    assert slots[0].version == DEFAULT_VERSION == slots.workers()[0].version


def test_a_claimed_incarnation_holds_what_it_says() -> None:
    slots = make()
    up(slots, 0)
    slots.holds(slots[0], V2)
    assert slots[0].version == "m@v2" and slots[0].load == V2


# -- starting (virtual time) -----------------------------------------------------------------
def test_a_switch_starts_at_once_and_a_death_after_it_waits_its_backoff() -> None:
    async def main() -> list[tuple[str, float]]:
        slots = make(count=1)
        starts: list[tuple[str, float]] = []
        done = anyio.Event()

        async def start(slot: Slot) -> None:
            assert slot.load is not None
            starts.append((slot.load.version, anyio.current_time()))
            worker = slots.begin(slot)
            if len(starts) == 1:  # up, then switched at t = 10
                slots.mark_ready(slot, "cpu")
                await anyio.sleep(10)
                slots.switch(slot, worker, V2, SWITCH)
            elif len(starts) == 2:  # the new version dies while loading
                slots.mark_dead(slot, worker)
                slots.restart(slot)
            else:
                done.set()

        async with anyio.create_task_group() as tg:
            t0 = anyio.current_time()
            await tg.start(slots.keep_started, start)
            with anyio.fail_after(60):
                await done.wait()
            tg.cancel_scope.cancel()
        return [(v, t - t0) for v, t in starts]

    assert run_virtual(main) == [("m@v1", 0.0), ("m@v2", 10.0), ("m@v2", 10.5)]
