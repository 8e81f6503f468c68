"""A worker's memory bound (issue 28, item 13): when a worker is over it, and how its slot
records a replacement (no crash, no failure, no restart, started again at once under the
same worker id). Pure: numbers in, a fake clock, virtual time."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import pytest

from batcher.shared.backoff import Backoff
from gpu_pool import PoolSettings
from gpu_pool.memory import MIB, MemoryBound, resident_bytes
from gpu_pool.slots import Slot, Slots, SlotState
from tests.virtual import run_virtual


# -- the decision ----------------------------------------------------------------------------
def test_a_worker_over_the_bound_is_replaced_and_one_at_or_under_it_is_not() -> None:
    bound = MemoryBound(300)
    assert bound.exceeded(300 * MIB + 1)
    assert not bound.exceeded(300 * MIB) and not bound.exceeded(10 * MIB)


def test_without_a_bound_or_a_known_size_no_worker_is_replaced() -> None:
    assert not MemoryBound(None).exceeded(1 << 40)
    assert not MemoryBound(300).exceeded(None)


@pytest.mark.parametrize("mb", [0, -5])
def test_a_bound_under_one_mib_is_refused(mb: int) -> None:
    with pytest.raises(ValueError, match="at least 1 MiB"):
        MemoryBound(mb)
    with pytest.raises(ValueError, match="at least 1 MiB"):
        PoolSettings(model="sim", workers=1, max_rss_mb=mb)


def test_the_pools_default_is_no_bound() -> None:
    assert PoolSettings(model="sim", workers=1).memory == MemoryBound(None)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_the_resident_set_is_read_from_the_kernel_and_grows_with_what_is_touched() -> None:
    grow = "import sys; b = b'x' * (64 << 20); sys.stdout.write('held'); sys.stdout.flush(); " \
           "sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", grow], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.read(4) == b"held"
        held = resident_bytes(child.pid)
        assert held is not None and held > 64 * MIB
        assert resident_bytes(os.getpid()) is not None
    finally:
        child.communicate(b"")
    assert resident_bytes(child.pid) is None  # gone: nothing to say


# -- the slot's bookkeeping ------------------------------------------------------------------
def make(count: int = 1) -> Slots[Slot]:
    return Slots([Slot(i) for i in range(count)], first=SlotState.STARTING,
                 backoff=Backoff(first=0.5, cap=30.0, stable_after=30.0), clock=lambda: 0.0)


def test_a_replacement_is_no_crash_no_failure_and_no_restart() -> None:
    slots = make()
    slot = slots[0]
    worker = slots.begin(slot)
    slots.mark_ready(slot, "cpu")
    slot.failures = 2  # an earlier crash's count is neither raised nor forgiven
    slots.replace(slot)
    assert (slot.state, slot.replacing, slot.worker) == (SlotState.STARTING, True, worker)
    assert (slots.crashes, slot.failures, slot.restarts, slots.replacements) == (0, 2, 0, 1)
    slots.mark_ready(slot, "cpu")  # the new process is up: the same worker, found as before
    assert not slot.replacing and slots.find(worker) is slot


def test_a_death_while_replaced_is_a_death_like_any_other() -> None:
    slots = make()
    slot = slots[0]
    worker = slots.begin(slot)
    slots.mark_ready(slot, "cpu")
    slots.replace(slot)
    assert slots.mark_dead(slot, worker)
    assert (slot.state, slot.replacing, slots.crashes, slot.failures) == \
        (SlotState.DEAD, False, 1, 1)


def test_a_replaced_slot_starts_again_at_once_whatever_its_backoff() -> None:
    async def main() -> list[float]:
        slots = make()
        starts: list[float] = []
        done = anyio.Event()

        async def start(slot: Slot) -> None:
            starts.append(anyio.current_time())
            if not slot.replacing:
                slots.begin(slot)
                slots.mark_ready(slot, "cpu")
                slot.failures = 5  # a backoff of 8 s, were it a restart
                slots.replace(slot)
            else:
                done.set()

        async with anyio.create_task_group() as tg:
            t0 = anyio.current_time()
            await tg.start(slots.keep_started, start)
            with anyio.fail_after(60):
                await done.wait()
            tg.cancel_scope.cancel()
        return [t - t0 for t in starts]

    assert run_virtual(main) == [0.0, 0.0]


def test_no_replacement_once_stopping() -> None:
    slots = make()
    slots.begin(slots[0])
    slots.stop()
    slots.replace(slots[0])
    assert slots.replacements == 0 and not slots[0].replacing
