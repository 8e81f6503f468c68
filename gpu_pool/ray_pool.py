"""The Ray pool: one actor per GPU anywhere in a Ray cluster, behind the same seam as the
process pool. Needs Ray (`pip install 'batchgate[ray]'`); `gpu_pool` never imports this
module itself, so the process pool runs without Ray.

Each slot holds one actor incarnation at a time, with a fresh `WorkerId`. Every call's
answer comes back as an event on the event loop (a done-callback handed over with
`call_soon_threadsafe`), never a blocking wait. A death is seen through the actor's
`sentinel` call, pending for its whole life, or a failed batch, and is reported once: a
crash, `ray.kill` and a lost node look alike. Before it is reported, Ray is asked which
nodes are dead and the actor's raylet is knocked on (one that refuses the connection is a
lost node before Ray's health checks say so); every actor of a lost node is reported in
the same turn. Only then does the slot get a new actor, after the pool's backoff (a
restart's ready never precedes the death that announced it); it waits, `pending`, until
the cluster has room, and meanwhile the pool simply runs smaller.

With a memory bound, an actor that says with its answer that it holds more is killed while
it is idle and its slot gets a new actor at once, under the same worker id, as the process
pool does (`Slots.replace`): a batch the core sends meanwhile waits for the new actor. Calls
are fenced by the slot's list of pending calls, which a new actor (and a replacement)
clears: an answer from an actor no longer the slot's is dropped.

A switch to another model version (`switch`, the core's decision) kills the idle actor too,
and its slot starts an actor loading the other version, under a new worker id, once Ray has
declared the old one dead (its sentinel call fails: its process and GPU memory are gone).

With `--parked-max` (not in a cell), an actor let go by a switch or a retire parks instead,
as a process worker does (`gpu_pool.pool`): its weights go to host memory, the actor stays,
and a later start of its version wakes it (`StartKind.WAKE`); the oldest is killed past the
bound; one that dies is dropped, no death. But Ray lends a GPU to a live actor only: a parked
actor keeps its GPU reserved, idle, its memory of use to nobody but itself woken. So keep
`--parked-max` within the cluster's spare GPUs; a start that would find no room
(`capacity`) has the oldest parked actors killed first. `--parked-ram-mb` is not applied.

The core scales the pool (`gpu_pool.slot_pool`): an added actor waits, pending, for room
(with Ray's autoscaler, a pending actor is what brings a node); a retired one is killed,
its slot removed once Ray says it is dead; a start taken back is killed, its slot removed.

In a cell (`RayPoolSettings.cell`) the actors are detached and named for the cell's slots,
so they outlive a core that dies abruptly: the next core finds each slot's newest actor
alive and claims it (`gpu_pool.ray_actor`), its model already loaded, instead of starting
one, whichever version it holds, if the pool names it (`RayPoolSettings.claimable`: its
ready event carries it); an actor that cannot
be claimed within the ready timeout (the dead core's batch hangs on it) is killed and
replaced; one of a slot beyond the first `workers` (added by scaling) is killed. A pool
that stops, drained or cancelled, kills its actors, so nothing is left on the cluster; an
actor whose cell is gone entirely ends itself once its lease lapses
(`RayPoolSettings.orphan_after`). Ray's driver changes this process's signal handlers when
it connects; they are put back (`gpu_pool.ray_cluster`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import anyio
import ray
from anyio.abc import TaskStatus
from ray.exceptions import RayError

from batcher import VersionKey
from gpu_pool.load import Load
from gpu_pool.memory import MIB
from gpu_pool.protocol import Run, StartId, StartKind, WorkerId
from gpu_pool.ray_actor import (
    Claim,
    Owner,
    Refused,
    Unwanted,
    actor_name,
    find_actors,
    spawn_actor,
)
from gpu_pool.ray_cluster import capacity, join, kill_actors, leave
from gpu_pool.ray_cluster import lost_nodes as _lost_nodes
from gpu_pool.ray_parking import ActorLot
from gpu_pool.ray_settings import RayPoolSettings
from gpu_pool.seam import PoolEvents, Unstarted
from gpu_pool.slot_pool import SlotPool
from gpu_pool.slots import Slot, Slots, SlotState
from gpu_pool.worker import WorkerConfig

log = logging.getLogger("batchgate.ray_pool")

NODE_CHECK_S = 2.0  # the longest a death waits to be reported while its node is checked
ROOM_RECHECK_S = 1.0  # how often `wait_ready` asks Ray how many workers its nodes hold
RENEWALS_PER_LEASE = 4  # a lease is renewed this often within its length
STOP_GRACE_S = 10.0  # the longest a switch waits for Ray to declare the old actor dead
_PLACED = frozenset({SlotState.STARTING, SlotState.READY, SlotState.BUSY})  # holding room


@dataclass(slots=True, eq=False)
class _Call:
    """One pending call of a slot's incarnation, told apart by identity: a woken actor's
    sentinel is the same reference as when it was first claimed, under another worker."""

    ref: ray.ObjectRef[Any]


@dataclass(slots=True)
class _Slot(Slot):
    node: str = "-"  # none yet: Ray has not placed it
    actor: Any = None  # the incarnation's ActorHandle
    calls: list[_Call] = field(default_factory=list)  # kept alive until answered
    sentinel: ray.ObjectRef[Any] | None = None  # the incarnation's, once claimed
    retired: ray.ObjectRef[Any] | None = None  # a switched actor's sentinel: fails once dead
    actors: int = 0  # the newest generation named for this slot, by this pool or earlier
    found: Any = None  # an earlier core's live actor, claimed at this slot's first start
    loaded: Load | None = None  # what its incarnation holds (a switch changes `load` first)


class RayPool(SlotPool[_Slot]):
    """Implements `gpu_pool.seam.Pool` with Ray actors."""

    def __init__(self, settings: RayPoolSettings) -> None:
        self._settings = settings
        cell = settings.cell
        self._namespace = settings.namespace or (cell.namespace if cell else (
            f"batchgate-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"))
        self._owner = Owner(cell.incarnation if cell else 0, secrets.token_hex(8))
        self._lease = settings.orphan_after if cell else None  # None: not detached
        self.attached = 0  # actors claimed from an earlier core, their models loaded
        self._events: PoolEvents = Unstarted()
        self._loop: asyncio.AbstractEventLoop | None = None
        loads = settings.pool.slot_loads()
        super().__init__(Slots([_Slot(i, load=loads[i]) for i in range(settings.pool.workers)],
                               first=SlotState.PENDING, backoff=settings.pool.backoff))
        # What an earlier core's actor may hold to be claimed; grows with every switch.
        self._claimable = {self._config(load) for load in (*loads, *settings.claimable)}
        self._owns_ray = False
        self._died: dict[WorkerId, tuple[_Slot, VersionKey, StartId | None]] = {}
        self._suspects: set[str] = set()  # `_died`'s nodes: the dead are told once checked
        self._deaths = anyio.Event()  # set when `_died` gains one
        self._generations: dict[int, int] = {}  # slot -> newest actor an earlier core named
        self._lot = ActorLot(settings.pool.parked_max, self._owner, self._spared,
                             self._parked_changed)

    # -- lifecycle -------------------------------------------------------------------------
    async def run(
        self, events: PoolEvents, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Join (or start) Ray, start an actor per slot, replace dead ones until cancelled;
        kills the actors and leaves Ray on the way out."""
        self._events = events
        self._loop = asyncio.get_running_loop()
        await anyio.to_thread.run_sync(self._connect)  # ray.init blocks for seconds
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._report_deaths)
                if self._lease is not None:
                    tg.start_soon(self._renew, self._lease / RENEWALS_PER_LEASE)
                await tg.start(self._slots.keep_started, self._start)
                task_status.started()
        finally:
            with anyio.CancelScope(shield=True):
                await self.stop()

    async def wait_ready(self, count: int, within: float) -> int:
        """Wait until `count` actors are ready, or until each has come up, died once or is
        waiting for room the cluster does not have (the placed ones fill its nodes), with
        one ready; or `within` seconds."""
        with anyio.move_on_after(within):
            while self.ready_count() < count:
                changed = self._slots.changed()  # before asking Ray: a change meanwhile counts
                if self.ready_count() > 0:
                    fit = await anyio.to_thread.run_sync(capacity, self._settings.resources)
                    room = self._placed() + len(self._lot) < fit
                    if self._slots.settled(count, stuck=() if room else (SlotState.PENDING,)):
                        break
                with anyio.move_on_after(ROOM_RECHECK_S):  # Ray's room changes unannounced
                    await changed.wait()
        return self.ready_count()

    async def stop(self) -> None:
        """Kill every actor (after a drain none holds a batch) and leave Ray; stops the
        local Ray if this pool started it."""
        self._slots.stop()
        actors = [a for s in self._slots for a in (s.actor, s.found) if a is not None]
        actors += self._lot.stop()
        for slot in self._slots:
            self._slots.forget(slot.worker)
            slot.state, slot.actor, slot.found = SlotState.STOPPED, None, None
            slot.calls.clear()
        await anyio.to_thread.run_sync(self._disconnect, actors)

    # -- commands ----------------------------------------------------------------------------
    def send(self, worker: WorkerId, run: Run) -> None:
        """Hand a batch to a ready actor. One that is gone was (or will be) reported dead."""
        slot = self._slots.find(worker)
        if slot is not None and slot.replacing and slot.held is None:
            slot.held = run  # the new actor runs it once it is up
            return
        if slot is None or slot.state is not SlotState.READY:
            return
        self._run(slot, worker, run)

    def _run(self, slot: _Slot, worker: WorkerId, run: Run) -> None:
        try:
            ref = slot.actor.run.remote(self._owner, run)
        except RayError:  # this process lost Ray itself: as good as the actor gone
            self._lost(slot, worker)
            return
        slot.state = SlotState.BUSY
        self._call(slot, worker, ref, self._on_reply)

    LOGGER = "batchgate.ray_pool"

    def _switching_to(self, load: Load) -> None:
        """A switch (`SlotPool.switch`): the actor it starts is one a successor claims."""
        self._claimable.add(self._config(load))

    def kill(self, worker: WorkerId) -> None:
        """`ray.kill` the actor (hung batch) and report its death without waiting for Ray
        to declare it dead: for an actor on a node that stopped answering, that may take
        Ray's health checks a while."""
        slot = self._slots.find(worker)
        if slot is not None and slot.replacing and slot.state is SlotState.STARTING:
            # As in the process pool: its batch waits for the new actor's load (bounded by
            # the ready timeout). One still waiting for room may wait for ever: it dies.
            log.warning("worker %s is being replaced: its batch has not started, it runs "
                        "once the new actor is up; nothing to kill", worker)
        elif slot is not None:
            log.warning("killing worker %s (node %s, pid %s)", worker, slot.node, slot.pid)
            self._lost(slot, worker)

    # -- Ray, in a thread --------------------------------------------------------------------
    def _connect(self) -> None:
        if not ray.is_initialized():  # else the host process joined a cluster: share it
            join(self._settings, self._namespace)
            self._owns_ray = True
        if self._settings.cell is not None:
            self._find()
        fit = capacity(self._settings.resources)
        if fit < len(self._slots):
            log.warning("the cluster has room for %d of %d workers (each holds %s): the "
                        "rest wait, pending, until nodes with room join", fit,
                        len(self._slots), self._settings.resources)

    def _find(self) -> None:
        """Note each slot's newest live actor (an earlier core's) and kill the rest."""
        found = find_actors(self._namespace, len(self._slots))
        self._generations = found.generations  # a slot added later names its actors beyond
        for slot in self._slots:
            slot.found = found.newest.get(slot.index)
            slot.actors = found.generations.get(slot.index, 0)
        kill_actors(found.others)
        if found.newest:
            log.info("found %d live workers of an earlier core in %s: claiming them",
                     len(found.newest), self._namespace)

    def _placed(self) -> int:
        """Actors known to hold their room: placed, loading or up."""
        return sum(s.state in _PLACED for s in self._slots)

    def _disconnect(self, actors: list[Any]) -> None:
        kill_actors(actors)
        if self._owns_ray:
            leave()
            self._owns_ray = False

    # -- internals ---------------------------------------------------------------------------
    def _config(self, load: Load) -> WorkerConfig:
        return WorkerConfig(model=load.spec, gpu=None, threads=self._settings.threads,
                            latency_floor=self._settings.pool.floor(load), version=load.version)

    async def _start(self, slot: _Slot) -> None:
        await self._reap(slot)
        if self._slots.stopping:
            return
        if slot.leaving:  # retired (Ray says its actor is dead, or it parked) or taken back
            self._lot.bound()
            self._slots.remove(slot)
            return
        pool = self._settings.pool
        # The core never saw a replaced worker go: it keeps its id (its actor a new name).
        replacing = slot.replacing
        worker = slot.worker if replacing else self._slots.begin(slot)
        assert slot.load is not None  # every slot of this pool is given one
        config = self._config(slot.load)
        slot.loaded = slot.load
        actor, slot.found = slot.found, None  # an earlier core's: claimed once, at most
        parked = self._lot.take(config) if actor is None else None
        self._lot.bound()  # after the take: a switch back never gives up its own
        if parked is not None:
            slot.actor = parked.actor  # killed should the pool stop or take the start back
            parked = await self._lot.settled(parked, STOP_GRACE_S)
            if slot.worker != worker or slot.state is not SlotState.PENDING:
                return
        if parked is None and actor is None:
            await self._make_room(slot)  # parked actors hold room a new one may need
            if slot.worker != worker or slot.state is not SlotState.PENDING:
                return
            slot.actors += 1
            actor = spawn_actor(config, self._owner, actor_name(slot.index, slot.actors),
                                self._namespace, lease=self._lease,
                                **self._settings.actor_options())
        if parked is not None:
            actor, slot.node, slot.pid = parked.actor, parked.node, parked.pid
        slot.actor, slot.how = actor, StartKind.WAKE if parked else StartKind.SPAWN
        slot.calls.clear()
        try:
            if parked is None:
                slot.node = "-"
                slot.node, slot.pid = await actor.where.remote()  # waits for room
            if slot.worker != worker or slot.state is not SlotState.PENDING:
                return
            slot.state = SlotState.STARTING
            self._slots.signal_change()
            with anyio.fail_after(pool.ready_timeout):  # loading, or an old batch ending
                claim = await (
                    actor.wake.remote(self._owner, self._settings.threads) if parked else
                    actor.claim.remote(self._owner, config, frozenset(self._claimable),
                                       self._settings.pool.otlp_endpoint))
        except TimeoutError:
            log.error("worker %s gave no READY in %.0fs; killing it", worker,
                      pool.ready_timeout)
            self._lost(slot, worker)
            return
        except Unwanted as exc:  # an earlier core's, holding a version this pool names not
            log.error("worker %s (slot %d) holds another model: %s", worker, slot.index, exc)
            self._lost(slot, worker)
            return
        except Refused as exc:  # a later core's: not this pool's to kill
            log.error("worker %s (slot %d) refused: %s", worker, slot.index, exc)
            self._lost(slot, worker, kill=False)
            return
        except RayError as exc:  # died while placed or loading, or the model failed to load
            if not slot.leaving:  # else its start was taken back: killed on purpose
                log.error("worker %s failed to start: %s", worker, str(exc).splitlines()[0])
            self._lost(slot, worker)
            return
        if claim.reused:
            slot.how = StartKind.ATTACH  # loaded by an earlier core: no start to measure
        # Only once claimed: an earlier owner's sentinel might otherwise answer this one's.
        # A woken actor's is the one pending since its first claim (each holds a thread).
        slot.sentinel = parked.sentinel if parked else actor.sentinel.remote(self._owner)
        self._call(slot, worker, slot.sentinel, self._on_sentinel)
        self._up(slot, worker, claim)

    def _up(self, slot: _Slot, worker: WorkerId, claim: Claim) -> None:
        if slot.worker != worker or slot.state is not SlotState.STARTING:
            return
        if slot.switched_out == worker:  # it loaded the version switched away meanwhile
            self._let_go(slot)
            self._slots.take_back(slot, worker)
            return
        held = claim.config
        if slot.load is None or held != self._config(slot.load):  # an earlier core's switch
            self._slots.holds(slot, Load(held.version, held.model, held.latency_floor))
            slot.loaded = slot.load
        ready = claim.ready
        started = self._slots.mark_ready(slot, ready.device)
        self.attached += claim.reused
        log.info("worker %s %s (slot %d, node %s, pid %d, %s)", worker,
                 "attached, loaded by an earlier core" if claim.reused else
                 "woken" if slot.how is StartKind.WAKE else "ready",
                 slot.index, slot.node, ready.pid, ready.device)
        if started is not None:
            self._events.worker_ready(worker, started, slot.version, slot.how)
        elif slot.held is not None:  # the core's batch, sent meanwhile
            run, slot.held = slot.held, None
            self._run(slot, worker, run)

    def _call(
        self, slot: _Slot, worker: WorkerId, ref: ray.ObjectRef[Any],
        then: Callable[[_Slot, WorkerId, concurrent.futures.Future[Any]], None],
    ) -> None:
        """Run `then` on the event loop once `ref` is answered (or failed)."""
        loop = self._loop
        assert loop is not None
        call = _Call(ref)
        slot.calls.append(call)

        def done(future: concurrent.futures.Future[Any]) -> None:  # in a Ray thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(self._answered, slot, worker, call, future, then)

        ref.future().add_done_callback(done)

    def _answered(
        self, slot: _Slot, worker: WorkerId, call: _Call,
        future: concurrent.futures.Future[Any],
        then: Callable[[_Slot, WorkerId, concurrent.futures.Future[Any]], None],
    ) -> None:
        if not any(c is call for c in slot.calls):
            return  # an earlier incarnation's, or a replaced actor's: fenced off here
        slot.calls = [c for c in slot.calls if c is not call]
        if slot.worker == worker:
            then(slot, worker, future)

    def _on_reply(
        self, slot: _Slot, worker: WorkerId, future: concurrent.futures.Future[Any]
    ) -> None:
        if slot.state is not SlotState.BUSY:
            return
        try:
            answer = future.result()
        except Exception as exc:  # a RayError: the actor (or its node) is gone
            log.warning("worker %s lost mid-batch: %s", worker, str(exc).splitlines()[0])
            self._lost(slot, worker)
            return
        if answer is None:  # nothing ran: another core took the actor over
            self._taken(slot, worker)
            return
        reply, rss = answer
        self._slots.mark_answered(slot)
        memory = self._settings.pool.memory
        if memory.exceeded(rss):  # before its answer is passed on: see the module's doc
            log.warning("worker %s (slot %d, node %s, pid %s) holds %d MiB, over "
                        "--worker-max-rss-mb %d: replacing it between batches", worker,
                        slot.index, slot.node, slot.pid, rss // MIB, memory.max_rss_mb)
            self._retire(slot)
        self._events.worker_reply(worker, reply)

    def _retire(self, slot: _Slot) -> None:
        """Kill the slot's idle actor and have `_start` give it a new one at once."""
        slot.calls.clear()  # its sentinel answers as it goes: no death of the worker's
        with contextlib.suppress(RayError, ValueError):
            ray.kill(slot.actor)
        slot.actor = None
        self._slots.replace(slot)

    def _let_go(self, slot: _Slot, park: bool = True) -> None:
        """Kill the slot's actor (or park it, when `park` and parking is on), hearing
        nothing more from it (no death to report); the slot's next start waits until Ray
        says a killed one is dead (`_reap`), not for one parked."""
        if park and self._parks(slot):
            self._park(slot)
            return
        slot.retired, slot.sentinel = slot.sentinel, None
        slot.calls.clear()
        with contextlib.suppress(RayError, ValueError):
            ray.kill(slot.actor)  # idle: nothing to finish
        slot.actor = None

    async def _reap(self, slot: _Slot) -> None:
        """Wait (`STOP_GRACE_S` at most) until the switched actor is dead: its sentinel
        call fails then. Its node's room and GPU memory are free again."""
        ref = slot.retired
        if ref is None:
            return
        with anyio.move_on_after(STOP_GRACE_S), contextlib.suppress(Exception):
            await asyncio.wrap_future(ref.future())  # a RayError, as it should
        slot.retired = None

    def _on_sentinel(
        self, slot: _Slot, worker: WorkerId, future: concurrent.futures.Future[Any]
    ) -> None:
        if future.exception() is None:  # it answered: another core claimed the actor
            self._taken(slot, worker)
        else:  # it failed: the actor is gone
            self._lost(slot, worker)

    def _taken(self, slot: _Slot, worker: WorkerId) -> None:
        log.error("worker %s (slot %d) was claimed by another core", worker, slot.index)
        self._lost(slot, worker, kill=False)

    def _lost(self, slot: _Slot, worker: WorkerId, *, kill: bool = True) -> None:
        """The incarnation is gone, or must go: kill it (unless another core owns it); its
        death is reported, then its slot restarted, once its node is checked
        (`_report_deaths`). Not one the core switched away: its slot starts the new one."""
        if slot.switched_out == worker:
            if kill:
                self._let_go(slot, park=False)  # it failed: nothing to keep
            else:  # another core's now: nothing to kill, nothing to wait for
                slot.actor, slot.sentinel = None, None
                slot.calls.clear()
            self._slots.take_back(slot, worker)
            return
        if not self._slots.mark_dead(slot, worker):
            return
        slot.held = None  # the core re-runs it, told of the death
        if kill:
            with contextlib.suppress(RayError, ValueError):
                ray.kill(slot.actor)  # a no-op for one already dead
        else:
            slot.actor = None  # nor killed when this pool stops
        self._slots.forget(worker)
        if not self._slots.stopping:
            log.warning("worker %s (slot %d, node %s) died", worker, slot.index, slot.node)
        self._died[worker] = (slot, slot.version, self._restart_of(slot))
        if slot.node != "-":
            self._suspects.add(slot.node)
        self._deaths.set()

    # -- parking -------------------------------------------------------------------------------
    def parked(self) -> list[tuple[Load, int, int | None]]:
        """What is parked, oldest first: its load, its pid and the bytes it holds (None:
        not measured, its node may be another)."""
        return [(p.load, p.pid or 0, None) for p in self._lot.held()]

    def start_kind(self, load: Load) -> StartKind:
        """How a start of `load` would come up now: woken when an actor holding it is
        parked, else spawned."""
        return StartKind.WAKE if self._lot.holds(self._config(load)) else StartKind.SPAWN

    def _parks(self, slot: _Slot) -> bool:
        """Whether the slot's idle actor, let go, parks rather than dies: parking is on, it
        is no cell's (a later core could not tell a parked one from one that serves), and
        it was claimed (its sentinel pending)."""
        return self._settings.pool.parked_max > 0 and self._settings.cell is None and \
            not self._slots.stopping and slot.actor is not None and \
            slot.sentinel is not None and slot.loaded is not None

    def _park(self, slot: _Slot) -> None:
        """Tell the slot's idle actor to park and keep it (`gpu_pool.ray_parking`); the
        slot's next start does not wait for it (its room is its own)."""
        assert slot.sentinel is not None and slot.loaded is not None
        actor, sentinel = slot.actor, slot.sentinel
        slot.calls.clear()  # its sentinel answers the parked entry now, no death of a worker's
        slot.actor, slot.sentinel = None, None
        parked = self._lot.park(slot.loaded, self._config(slot.loaded), actor, slot.node,
                                slot.pid, sentinel)
        if parked is not None:
            log.info("worker %s (slot %d, node %s, pid %s) parks holding %s", slot.worker,
                     slot.index, parked.node, parked.pid, parked.load.version)

    def _spared(self) -> set[WorkerConfig]:
        """What slots about to start may wake: one let go for another version, its start
        not yet under way."""
        return {self._config(s.load) for s in self._slots if s.load is not None and
                s.actor is None and s.state is SlotState.PENDING and not s.leaving}

    async def _make_room(self, slot: _Slot) -> None:
        """Give up the oldest parked actors while the cluster's nodes have no room for one
        more actor beside them and the pool's others: a parked actor holds its room."""
        if not self._lot:
            return
        fit: int | None = None
        with anyio.move_on_after(NODE_CHECK_S), contextlib.suppress(RayError):
            fit = await anyio.to_thread.run_sync(capacity, self._settings.resources,
                                                 abandon_on_cancel=True)
        if fit is None:
            return
        held = sum(s is not slot and s.actor is not None and
                   (s.state in _PLACED or s.state is SlotState.PENDING) for s in self._slots)
        self._lot.make_room(fit, held)

    # -- scaling (`gpu_pool.slot_pool`) -------------------------------------------------------
    def _new_slot(self, index: int, load: Load) -> _Slot:
        return _Slot(index, load=load, actors=self._generations.get(index, 0))

    def _abandon(self, slot: _Slot) -> None:
        """Kill the leaving slot's actor (pending, loading, or a replacement's) and remove
        the slot: Ray frees its room. A start under way finds it gone (`_start`)."""
        slot.calls.clear()
        kill_actors([slot.actor] if slot.actor is not None else [])
        slot.actor = None
        if slot.retired is None:  # else its start reaps the one let go, then removes it
            self._slots.remove(slot)

    def _restarts(self) -> bool:
        return self._settings.pool.restart

    def _unreported(self) -> Collection[WorkerId]:
        return self._died

    async def _renew(self, every: float) -> None:
        """Renew each placed actor's lease, `every` seconds, as long as the pool runs."""
        while True:
            await anyio.sleep(every)
            for slot in self._slots:
                if slot.actor is not None and slot.state in _PLACED:
                    with contextlib.suppress(RayError):  # gone: its death is seen apart
                        slot.actor.renew.remote(self._owner)

    async def _report_deaths(self) -> None:
        """Report the dead once it is known whether their nodes are gone, and with them
        every actor of a lost node, in one turn: the core then never re-routes a dead
        actor's batch onto a dead neighbour not yet reported (its items' second death
        would make a lone one look like a query of death). Runs as long as the pool."""
        while True:
            await self._deaths.wait()
            self._deaths = anyio.Event()
            while self._died:
                checked = list(self._died)  # later deaths wait for a check of their own
                suspects, self._suspects = self._suspects, set()
                lost: set[str] = set()
                with anyio.move_on_after(NODE_CHECK_S):  # Ray's control plane may hang
                    lost = await anyio.to_thread.run_sync(
                        _lost_nodes, suspects, abandon_on_cancel=True)
                neighbours = [s for s in self._slots if s.node in lost and s.state in _PLACED]
                dead = [s.worker for s in neighbours if s.switched_out != s.worker]
                for slot in neighbours:
                    self._lost(slot, slot.worker)
                for worker in checked + dead:
                    slot, version, restart = self._died.pop(worker)
                    self._events.worker_died(worker, version, restart)
                    if restart is not None:  # only now: its ready must follow the death
                        self._slots.restart(slot)


__all__ = ["RayPool"]
