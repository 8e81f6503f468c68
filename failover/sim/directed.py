"""The contract pool as a test directs it: what its workers finish waits for the test,
and the test says what happens to a worker now.

A test of the core states races the pool's own timing would seldom produce: a batch that
stalls until the core hedges it, an answer that comes early, short or failed, a load that
ends or fails now, a worker that dies now and is heard of only later (so the core may send
it a batch, switch or retire it meanwhile). `DirectedPool` is the `ContractPool` (the same
seam, the same checks, the same starts and backoff) with those handles: while `holding`,
an answer or a load that comes due waits; `let_go` ends every one that waits, and the pool
runs on its own timing until it holds again. Every handle is called inside the loop (the
pool reads its clock), as `Steps.call` does.
"""

from __future__ import annotations

import anyio

from failover.sim.pool import ContractPool, Slot, SlotState
from gpu_pool import Err, Ok, WorkerId


class DirectedPool(ContractPool):
    """A `ContractPool` a test drives event by event (see the module)."""

    def hold(self) -> None:
        """From now on, answers and loads that come due wait for the test."""
        self.holding = True

    def let_go(self) -> None:
        """Every answer and load that waits ends now, in the order it came due; from now
        on they end on time."""
        self.holding = False
        waiting, self._held_entries = self._held_entries, []
        now = anyio.current_time()
        for entry in waiting:
            self.counts.fired += 1
            self._fire(entry, now)

    def finish(self, worker: WorkerId, reply: Ok | Err | None = None) -> None:
        """Incarnation `worker` answers its batch now: `reply`, or its own answer."""
        slot = self._of.get(worker)
        if slot is None or slot.state is not SlotState.BUSY:
            raise LookupError(f"worker {worker} runs no batch")
        self._done(slot, reply)

    def load_done(self, index: int) -> None:
        """Slot `index`'s load ends now, up for its start (a restart waiting out its backoff
        begins and ends at once)."""
        slot = self._loading(index)
        now = anyio.current_time()
        if slot.state is SlotState.DEAD:
            self._begin(slot, now)
        self._up(slot, now)

    def fail_load(self, index: int) -> None:
        """Slot `index`'s load dies now: reported, its start retried after the backoff."""
        slot = self._loading(index)
        now = anyio.current_time()
        if slot.state is SlotState.DEAD:
            self._begin(slot, now)
        self._die(slot, now)

    def die(self, worker: WorkerId, heard: bool = True) -> None:
        """Up incarnation `worker` dies now; not `heard`, the pool notices (and reports it,
        and restarts its slot) only at `hear`."""
        slot = self._of.get(worker)
        if slot is None or slot.state not in (SlotState.READY, SlotState.BUSY):
            raise LookupError(f"worker {worker} is not up")
        self._die(slot, anyio.current_time(), heard)

    def hear(self) -> int:
        """The pool notices every death not heard yet: each is reported, in the order they
        died, and its slot starts again. How many there were."""
        unheard, self._unheard = self._unheard, []
        now = anyio.current_time()
        for index, worker, up, up_for in unheard:
            self._report(self._slots[index], worker, up, up_for, now)
        return len(unheard)

    def unheard(self) -> list[WorkerId]:
        """The incarnations dead that the pool has not noticed yet."""
        return [worker for _, worker, _, _ in self._unheard]

    def _loading(self, index: int) -> Slot:
        slot = self._slots.get(index)
        if slot is None or not (slot.state is SlotState.STARTING or (
                slot.state is SlotState.DEAD and slot.heard)):
            raise LookupError(f"slot {index} loads nothing")
        return slot


__all__ = ["DirectedPool"]
