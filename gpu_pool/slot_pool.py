"""What of the pool seam every pool answers alike from its slots (`SlotPool`): each pool
inherits it and supplies how its workers are let go, ended and removed.

Scaling is the core's decision, carried out here alike for processes and actors: `add`
starts one more worker in a new slot; `retire` lets an idle worker go for good, as a switch
does (told to stop, killed past a grace), and its slot is removed once it has exited;
`cancel_start` takes back the newest start not yet up, ending what it started. Neither a
retired worker nor a cancelled start is ever reported dead.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection
from typing import Generic, TypeVar

import anyio

from gpu_pool.load import Load
from gpu_pool.protocol import StartId, StartKind, WorkerId
from gpu_pool.seam import WorkerInfo
from gpu_pool.slots import Slot, Slots, SlotState

S = TypeVar("S", bound=Slot)


class SlotPool(Generic[S]):
    """What of the pool seam (`gpu_pool.seam.Pool`) every pool answers alike from its
    slots: each pool inherits it."""

    LOGGER = "batchgate.pool"  # where a pool says what it does

    def __init__(self, slots: Slots[S]) -> None:
        self._slots = slots
        self._parking = anyio.Event()

    def switch(self, worker: WorkerId, load: Load, start: StartId) -> None:
        """Retire idle `worker` for `load` (`gpu_pool.seam.Pool.switch`): the pool lets its
        incarnation go (`_let_go`), and once that is gone the slot starts `load` under a new
        id. Nothing when `worker` is not the slot's live, idle incarnation."""
        slot = self._slots.find(worker)
        if slot is None:
            return
        idle = slot.state is SlotState.READY
        if not self._slots.switch(slot, worker, load, start):
            return
        self._log().info("worker %s (slot %d) switches to %s", worker, slot.index, load.version)
        self._switching_to(load)
        if idle:
            self._let_go(slot)

    # -- scaling -----------------------------------------------------------------------------
    def add(self, load: Load, start: StartId) -> None:
        """Start one more worker holding `load`, in a new slot (`gpu_pool.seam.Pool.add`)."""
        slot = self._slots.add(functools.partial(self._new_slot, load=load), start)
        if slot is not None:
            self._switching_to(load)
            self._log().info("slot %d added for %s", slot.index, load.version)

    def retire(self, worker: WorkerId) -> None:
        """Let idle `worker` go for good and remove its slot once it has exited
        (`gpu_pool.seam.Pool.retire`); nothing when it is not its slot's live idle one."""
        slot = self._slots.find(worker)
        if slot is None:
            return
        idle = slot.state is SlotState.READY
        if not self._slots.retire(slot, worker):
            return
        self._log().info("worker %s (slot %d) retired", worker, slot.index)
        if idle:
            self._let_go(slot)  # its slot's start, asked at once, waits for it and removes it
        else:  # being replaced: what the replacement started is ended
            self._abandon(slot)

    def cancel_start(self, start: StartId) -> bool:
        """Take back `start` while no worker is up for it (`gpu_pool.seam.Pool`)."""
        slot = self._slots.cancel_start(start, skip=self._unreported())
        if slot is None:
            return False
        self._log().info("start of %s in slot %d taken back", slot.version, slot.index)
        self._abandon(slot)
        return True

    def _new_slot(self, index: int, load: Load) -> S:
        """A slot of this pool's kind, holding `load`."""
        raise NotImplementedError

    def _abandon(self, slot: S) -> None:
        """End what leaving `slot` started; remove it once nothing of it runs."""
        raise NotImplementedError

    def _restart_of(self, slot: S) -> StartId | None:
        """What a death of `slot`'s incarnation reports: the start its slot carries out
        next, or None when it does not start again."""
        if self._slots.stopping or slot.leaving or not self._restarts():
            return None
        return slot.start

    def _restarts(self) -> bool:
        """Whether a dead slot starts again."""
        return True

    def _unreported(self) -> Collection[WorkerId]:
        """Incarnations dead but not reported yet: their slots are not taken back."""
        return ()

    def _switching_to(self, load: Load) -> None:
        """A slot now holds `load` (the Ray pool notes it claimable)."""

    def _let_go(self, slot: S) -> None:
        """End the slot's idle incarnation, hearing nothing more from it: no death."""
        raise NotImplementedError

    def _log(self) -> logging.Logger:
        return logging.getLogger(self.LOGGER)

    # -- what the pool reports ---------------------------------------------------------------
    def parking(self) -> anyio.Event:
        """Set when what is parked next changes (parks, settles, wakes, goes)."""
        return self._parking

    def _parked_changed(self) -> None:
        self._parking.set()
        self._parking = anyio.Event()

    def start_kind(self, load: Load) -> StartKind:
        """How a start of `load` would come up now (`gpu_pool.seam.Pool.start_kind`)."""
        return StartKind.SPAWN

    def ready_count(self) -> int:
        return self._slots.ready_count()

    def workers(self) -> list[WorkerInfo]:
        return self._slots.workers()

    def state_counts(self) -> dict[str, int]:
        return self._slots.state_counts()

    @property
    def crashes(self) -> int:
        return self._slots.crashes

    def forgive(self, worker: WorkerId) -> None:
        self._slots.forgive(worker)

    @property
    def replacements(self) -> int:
        return self._slots.replacements

    @property
    def switches(self) -> int:
        return self._slots.switches


__all__ = ["SlotPool"]
