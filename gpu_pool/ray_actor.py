"""The Ray actor: one worker on one GPU anywhere in the cluster, the process worker's twin.

It loads the model once, then runs one batch per `run` call through the same `run_batch` as
the process worker, so the contract is checked alike, and says with each answer how much
memory it holds (the pool may be far from its node, so it cannot read the kernel's figure
itself; `gpu_pool.memory`).

An actor serves one owner, a core's pool (`Owner`), which `claim`s it: the pool that
spawned it, or, in a cell, a later core that found it alive after the earlier one died
(its model loaded: nothing to load again), which takes it whichever version it holds, if
that is one it names (a core may have switched it), and learns which from the claim's
answer (`Claim.config`). A claim waits for a batch the previous owner
left running, so the model never runs two batches at once; the dead owner's answer goes to
the dead owner's call, never to a new one. A `run` or a `sentinel` call of an owner that
has been superseded answers at once without running anything: whatever the old core left
queued here ends in bounded time. `sentinel` never answers while its caller owns the actor:
the pool keeps one call to it pending, and its failure is how a death is seen at once
whether or not a batch is running (actor crash, `ray.kill`, its node lost), as the process
pool watches a process sentinel; its answer says another core took the actor over.

A detached actor (a cell's) outlives every process of its cell, so it holds a lease, which
its owner renews (`renew`): one left unrenewed for the lease's length (its cell is gone, and
no core came back for it) kills itself, and its GPU is free again.

Its owner may `park` it, idle (weights to host memory, the process kept), and `wake` it
(weights back on its device), as the process worker parks (`gpu_pool.protocol.Park`).

A traced batch makes "worker.run" spans as the process worker's do (`gpu_pool.worker.RunSpans`),
sent where its owner said when it claimed the actor: a later core may trace elsewhere, or not.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import ray

from gpu_pool.memory import resident_bytes
from gpu_pool.models import HOST, BatchModel, move
from gpu_pool.protocol import Err, Ok, Ready, Run, Wake
from gpu_pool.worker import RunSpans, WorkerConfig, load_worker, run_batch
from gpu_pool.worker import wake as wake_model

# One thread waits in the owner's sentinel, one runs batches; the others take a new owner's
# claim and sentinel while an old owner's sentinel and batch still hold theirs.
MAX_CONCURRENCY = 4
_NAME = re.compile(r"^slot-(\d+)\.(\d+)$")


@dataclass(frozen=True, slots=True)
class Owner:
    """The pool an actor answers: its core's incarnation in the cell, and a nonce unique
    to the pool. A claim by a core of an earlier incarnation than the owner's is refused:
    such a claim can only be one a dead core left queued."""

    incarnation: int
    nonce: str


@dataclass(frozen=True, slots=True)
class Claim:
    """The actor is the claimer's and idle. `reused`: it was another owner's before (the
    model loaded then, not now, unless that owner died before it was loaded). `config`:
    what it holds (its model version, `WorkerConfig.version`)."""

    ready: Ready
    reused: bool
    config: WorkerConfig


class Refused(RuntimeError):
    """Raised by `BatchActor.claim` to a claimer older than the owner: the actor is not
    the claimer's."""


class Unwanted(Refused):
    """Raised by `BatchActor.claim` to a claimer that takes no model version the actor
    holds: a newer core than its owner, which kills it rather than leave it to its lease."""


class BatchActor:
    """Created in a Ray worker process by `spawn_actor`; never directly."""

    def __init__(self, config: WorkerConfig, owner: Owner, lease: float | None) -> None:
        self._config = config
        self._owner = owner
        self._first_owner = owner
        self._owned = threading.Condition()  # notified when the owner changes
        self._loading = threading.Lock()
        self._running = threading.Lock()  # one batch at a time, whoever sent it
        self._model: BatchModel | None = None
        self._ready: Ready | None = None
        self._tracing = threading.Lock()
        self._spans: RunSpans | None = None  # the owner's, made at its claim
        self._traced_to: str | None = None
        self._renewed = time.monotonic()
        if lease is not None:  # from its creation on: its creator may die before a claim
            threading.Thread(target=self._expire, args=(lease,), daemon=True).start()

    def renew(self, owner: Owner) -> None:
        """The owner is alive: the lease starts again (a superseded owner's is ignored)."""
        if owner == self._owner:
            self._renewed = time.monotonic()

    def _expire(self, lease: float) -> None:
        while (left := self._renewed + lease - time.monotonic()) > 0:
            threading.Event().wait(left)
        print(f"batchgate: no owner renewed this actor's lease in {lease:.0f}s: ending it",
              file=sys.stderr, flush=True)
        ray.kill(ray.get_runtime_context().current_actor)

    def where(self) -> tuple[str, int]:
        """The node and pid this actor was placed on; answers as soon as it is placed."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def claim(
        self, owner: Owner, config: WorkerConfig, also: frozenset[WorkerConfig] = frozenset(),
        otlp_endpoint: str | None = None,
    ) -> Claim:
        """Make the actor `owner`'s, loaded and idle, if it holds `config` or one of `also`
        (an earlier core's may hold another version than the slot's first); raises
        `Refused` if it cannot be. `otlp_endpoint`: where the spans of the owner's traced
        batches go (None: it makes none)."""
        with self._owned:
            if owner.incarnation < self._owner.incarnation:
                raise Refused(f"owned by incarnation {self._owner.incarnation}")
            if config != self._config and self._config not in also:
                raise Unwanted(f"this actor holds {self._config}, not {config}")
            self._owner = owner
            self._renewed = time.monotonic()
            self._owned.notify_all()  # the superseded owner's sentinel answers
        self._trace_to(otlp_endpoint)
        ready = self._load()
        with self._running:  # a batch the superseded owner left running ends first
            pass
        return Claim(ready, reused=owner != self._first_owner, config=self._config)

    def _trace_to(self, endpoint: str | None) -> None:
        """The spans go to `endpoint` from now on; what the previous owner's runs left to
        send is flushed to its own."""
        with self._tracing:
            if endpoint == self._traced_to:
                return
            old, self._traced_to = self._spans, endpoint
            self._spans = RunSpans.of(endpoint)
        if old is not None:
            old.close()

    def _load(self) -> Ready:
        with self._loading:  # a claim while the previous owner's load runs waits for it
            if self._ready is None:
                # Ray pins the actor's GPUs with CUDA_VISIBLE_DEVICES: device 0 is its own.
                config = replace(self._config, gpu=0 if ray.get_gpu_ids() else None)
                self._model, device = load_worker(config)
                self._ready = Ready(pid=os.getpid(), device=device)
            return self._ready

    def run(self, owner: Owner, msg: Run) -> tuple[Ok | Err, int | None] | None:
        """The batch's answer, and this process's resident set after it (None: unknown);
        None instead if `owner` no longer owns the actor (nothing ran)."""
        with self._running:
            if owner != self._owner:
                return None
            if self._model is None:
                raise RuntimeError("run before load")  # the pool never does this
            run = partial(run_batch, self._model, floor=self._config.latency_floor)
            spans = self._spans
            reply = run(msg) if spans is None else spans.run(run, msg)
            return reply, resident_bytes(os.getpid())

    def park(self, owner: Owner) -> bool:
        """Move the weights to host memory, freeing the device's memory (Ray keeps the
        device reserved for the actor); whether it held weights to move. Only its owner
        may: any other is `Refused`."""
        self._owns(owner)
        with self._running:  # idle as the owner parks it; never under a batch anyway
            return self._model is not None and move(self._model, HOST)

    def wake(self, owner: Owner, threads: int) -> Claim:
        """Take the device again (weights back on it, `threads` torch threads): loaded and
        idle, answered as `claim` answers. Only its owner may."""
        self._owns(owner)
        with self._running:
            if self._model is None or self._ready is None:
                raise RuntimeError("wake before load")  # the pool never does this
            ready = wake_model(self._model, Wake(threads), self._ready)
        return Claim(ready, reused=False, config=self._config)

    def _owns(self, owner: Owner) -> None:
        with self._owned:
            if owner != self._owner:
                raise Refused(f"owned by incarnation {self._owner.incarnation}, another pool")

    def sentinel(self, owner: Owner) -> None:
        """Answers only once `owner` no longer owns the actor (at once if it does not)."""
        with self._owned:
            self._owned.wait_for(lambda: self._owner != owner)


_Remote = ray.remote(BatchActor)


def actor_name(slot: int, generation: int) -> str:
    """A slot's actors are named for it, each under a generation of its own: a new one
    never waits for its predecessor's name to be freed, and the newest is the slot's."""
    return f"slot-{slot}.{generation}"


def spawn_actor(
    config: WorkerConfig, owner: Owner, name: str, namespace: str, *, lease: float | None,
    **placement: Any,
) -> Any:
    """Create one incarnation (Ray places it when the cluster has room); its handle.
    With a `lease`, it is detached: it outlives the process that made it, for the next
    core to find, and ends itself once its lease has gone that long unrenewed.

    Ray restarts nothing and retries nothing: a new incarnation is the pool's decision,
    under a new `WorkerId`, so a batch never runs twice behind the core's back. The handle
    is untyped: its methods are Ray's dynamic attributes.
    """
    lifetime = {"lifetime": "detached"} if lease is not None else {}
    return _Remote.options(
        name=name, namespace=namespace, max_restarts=0, max_task_retries=0,
        max_concurrency=MAX_CONCURRENCY, **lifetime, **placement,
    ).remote(config, owner, lease)


@dataclass(frozen=True, slots=True)
class Found:
    """What a namespace holds of a pool's actors: the newest actor of each slot, the
    newest generation named per slot (the next actor's must be beyond it), and every
    other actor there (older generations, slots the pool no longer has) to be killed."""

    newest: dict[int, Any]
    generations: dict[int, int]
    others: list[Any]


def find_actors(namespace: str, slots: int) -> Found:
    """The live actors named in `namespace` (blocking: call it in a thread)."""
    named: dict[int, list[tuple[int, str]]] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        match = _NAME.match(entry["name"]) if entry["namespace"] == namespace else None
        if match:
            slot, generation = int(match[1]), int(match[2])
            named.setdefault(slot, []).append((generation, entry["name"]))
    newest: dict[int, Any] = {}
    others: list[Any] = []
    for slot, names in named.items():
        for _, name in sorted(names, reverse=True):
            try:
                actor = ray.get_actor(name, namespace=namespace)
            except ValueError:  # gone meanwhile
                continue
            if slot < slots and slot not in newest:
                newest[slot] = actor
            else:
                others.append(actor)
    generations = {slot: max(g for g, _ in names) for slot, names in named.items()}
    return Found(newest, generations, others)


__all__ = ["MAX_CONCURRENCY", "BatchActor", "Claim", "Found", "Owner", "Refused", "Unwanted",
           "actor_name", "find_actors", "spawn_actor"]
