"""The parts of `driver.World`: what it reads of the pool (`Slot`, a batch in `Flight`),
and what stands between the real parts and checks or notes what passes: the placement as
served, watched at each decision (`Spy`); the cores as the owner sees them (`Watched`); the
pool as the owner drives it, each action checked by the world (`Checked`); the pool's events
on their way to the owner, the world keeping its books first (`Heard`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batcher import FlushReason, Item, VersionKey
from failover import CoreActions, CoreOwner
from failover.core import Refusal
from failover.fleet.cores import ModelCores
from failover.fleet.placement import Switch, SwitchCost, VersionView, WorkerView
from failover.fleet.versions import ROLLOUT_TIMEOUT_S
from gpu_pool import Err, Load, Ok, Run, StartId, StartKind, WorkerId

if TYPE_CHECKING:
    from tests.failover.fleet.driver import World


@dataclass
class Flight:
    run: Run
    items: list[Item]
    sent_at: float
    version: str


class Slot:
    """A slot of the pool as it is now, however often its worker changes. `state`: loading
    (its start under way: loading, or waiting out its backoff), up, dead (gone, not yet
    heard by the pool) or gone (the slot left the pool)."""

    def __init__(self, world: World, index: int) -> None:
        self.world, self.index = world, index

    def __repr__(self) -> str:
        return f"Slot({self.index}, {self.worker}, {self.version}, {self.state})"

    def _view(self):  # type: ignore[no-untyped-def]
        view = self.world.pool.slot(self.index)
        assert view is not None, f"slot {self.index} left the pool"
        return view

    @property
    def state(self) -> str:
        view = self.world.pool.slot(self.index)
        if view is None:
            return "gone"
        if view.state in ("ready", "busy"):
            return "up"
        return "dead" if view.state == "dead" and not view.heard else "loading"

    @property
    def worker(self) -> WorkerId:
        return WorkerId(self._view().worker)

    @property
    def version(self) -> str:
        return str(self._view().version)

    @property
    def since(self) -> float:
        """Up: when it came up; loading: when its load began."""
        return float(self._view().since)

    @property
    def start(self) -> StartId | None:
        return self._view().start  # type: ignore[no-any-return]

    @property
    def counted(self) -> bool:
        """Loading a start the rule counts (an add or a restart; not a switch)."""
        return self.state == "loading" and self.start in self.world.expected


class Spy:
    """Placement as served (`SwitchCost`), watching the serving defaults at each decision:
    a rollout's new default takes over only once it is resident on as many workers as the
    old one (the views `decide` gets are taken right after `ModelCores` moved it), or once
    ROLLOUT_TIMEOUT_S has passed (a rollout starts at 0 at the earliest)."""

    def __init__(self, inner: SwitchCost) -> None:
        self.inner = inner
        self.settings = inner.settings  # what `ModelCores` reads the residency from
        self.cores: ModelCores | None = None
        self.serving: dict[str, str | None] = {}
        self.flips: list[tuple[str, str, str, int, int]] = []  # model, old, new, on new, on old
        self.judged_load_s: dict[WorkerId, float] = {}  # a switched worker: its version's load_s

    def note(self) -> None:
        """The serving defaults now are the baseline (a catalogue change moved them)."""
        assert self.cores is not None
        self.serving = {m: self.cores.serving_default(m) for m in self.cores.catalogue.models}

    def decide(self, now: float, workers: Sequence[WorkerView],
               versions: Sequence[VersionView]) -> list[Switch]:
        assert self.cores is not None
        on = Counter(w.version for w in workers)
        for name in self.cores.catalogue.models:
            now_serving, before = self.cores.serving_default(name), self.serving.get(name)
            if before is not None and now_serving != before:
                old, new = VersionKey.of(name, before), VersionKey.of(name, now_serving)
                self.flips.append((name, old, new, on[new], on[old]))
                assert on[new] >= max(1, on[old]) or now >= ROLLOUT_TIMEOUT_S, (
                    f"{name}'s default moved to {new} on {on[new]} workers, the old "
                    f"{old} on {on[old]}")
            self.serving[name] = now_serving
        switches = self.inner.decide(now, workers, versions)
        load_s = {v.version: v.load_s for v in versions}
        held = {w.worker: w.version for w in workers}
        for switch in switches:  # the residency it was judged by: a load measured later in
            self.judged_load_s[switch.worker] = load_s[held[switch.worker]]  # the turn moves it
        return switches

    def next_check(self, now: float, workers: Sequence[WorkerView],
                   versions: Sequence[VersionView]) -> float:
        return self.inner.next_check(now, workers, versions)


class Watched:
    """The cores as the owner sees them, noting whether an admission of a frame asked the
    owner for a turn (what `CoreOwner.admit_all` keeps to itself), and which items the
    turn sends (a send is checked against the queue as the cores left it, not as the owner
    carries out the turn's sends one by one)."""

    def __init__(self, cores: ModelCores) -> None:
        self.cores = cores
        self.asked_turn: bool | None = None
        self.sending: set[int] = set()  # items in sends decided, not carried out yet

    def __getattr__(self, name: str) -> object:
        return getattr(self.cores, name)

    def _noted(self, actions: CoreActions) -> CoreActions:
        for send in actions.send:
            self.sending.update(int(t.split(":")[1]) for t in send.run.inputs)
        return actions

    def worker_ready(self, *args: object) -> CoreActions:
        return self._noted(self.cores.worker_ready(*args))  # type: ignore[arg-type]

    def reply(self, *args: object) -> CoreActions:
        return self._noted(self.cores.reply(*args))  # type: ignore[arg-type]

    def worker_died(self, *args: object) -> CoreActions:
        return self._noted(self.cores.worker_died(*args))  # type: ignore[arg-type]

    def poll(self, now: float) -> CoreActions:
        return self._noted(self.cores.poll(now))

    def admit_all(self, requests: Sequence[tuple[list[Item], float]],
                  now: float) -> tuple[list[Refusal | None], bool]:
        refusals, self.asked_turn = self.cores.admit_all(requests, now)
        return refusals, self.asked_turn


class Checked:
    """The pool as the owner drives it: each action checked by the world, then carried out
    by the contract pool. A send is checked once the owner tells its observer why it went
    (`batch_sent`, right after), a group's re-run being exempt from the order."""

    def __init__(self, world: World) -> None:
        self.world, self.pool = world, world.pool
        self.sending: tuple[WorkerId, Run] | None = None

    def __getattr__(self, name: str) -> object:  # the reading side, as it is
        return getattr(self.pool, name)

    async def run(self, events: object, *, task_status: object) -> None:
        raise AssertionError("the world runs the pool itself")

    def send(self, worker: WorkerId, run: Run) -> None:
        self.pool.send(worker, run)
        self.sending = (worker, run)

    def batch_sent(self, size: int, reason: FlushReason | None, idle_gap: float | None,
                   version: VersionKey | None = None) -> None:
        assert self.sending is not None
        (worker, run), self.sending = self.sending, None
        self.world.sent(worker, run, str(version), reason is None)

    def batch_done(self, seconds: float, version: VersionKey | None = None) -> None:
        pass

    def load_done(self, version: VersionKey, seconds: float) -> None:
        pass

    def kill(self, worker: WorkerId) -> None:
        assert worker in self.world.flights, "a worker with no batch was killed as hung"
        self.pool.kill(worker)

    def forgive(self, worker: WorkerId) -> None:
        self.pool.forgive(worker)

    def switch(self, worker: WorkerId, load: Load, start: StartId) -> None:
        self.world.switched(worker, str(load.version))
        self.pool.switch(worker, load, start)

    def add(self, load: Load, start: StartId) -> None:
        self.world.add(str(load.version), start)
        self.pool.add(load, start)
        self.world.added(str(load.version))

    def retire(self, worker: WorkerId) -> None:
        version = self.world.retiring(worker)
        self.pool.retire(worker)
        self.world.retired_from(worker, version)

    def cancel_start(self, start: StartId) -> bool:
        self.world.cancelling(start)
        version = next((s.version for s in self.world.slots if s.start == start), None)
        taken = self.pool.cancel_start(start)
        if taken:
            assert version is not None
            self.world.cancelled(start, version)
        return taken


class Heard:
    """The pool's events on their way to the owner, the world keeping its books first."""

    def __init__(self, world: World, owner: CoreOwner) -> None:
        self.world, self.owner = world, owner

    def worker_ready(self, worker: WorkerId, start: StartId, version: VersionKey,
                     how: StartKind = StartKind.SPAWN) -> None:
        self.world.on_ready(worker, start, str(version))
        self.owner.worker_ready(worker, start, version, how)

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        self.world.flights.pop(worker, None)
        self.owner.worker_reply(worker, reply)

    def worker_died(self, worker: WorkerId, version: VersionKey,
                    restart: StartId | None) -> None:
        self.world.on_died(worker, str(version), restart)
        self.owner.worker_died(worker, version, restart)


__all__ = ["Checked", "Flight", "Heard", "Slot", "Spy", "Watched"]
