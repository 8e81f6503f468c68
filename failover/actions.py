"""What a dispatch core asks of its owner after an event (`CoreActions`): batches to send,
workers to kill, items to settle, and what the fleet and the metrics are told."""

from __future__ import annotations

from dataclasses import dataclass, field

from batcher import FlushReason, Item, VersionKey
from gpu_pool import Run, StartId, WorkerId

Result = tuple[Item, str | BaseException]


@dataclass(frozen=True, slots=True)
class Send:
    """Run `run` on `worker`. `reason` is None for a group bisected out of a failed batch;
    `idle_gap` is how long the worker had been free, when it was cut in the same step as
    the reply that freed it (the gap the core's own overhead costs a GPU)."""

    worker: WorkerId
    run: Run
    reason: FlushReason | None
    idle_gap: float | None = None
    version: VersionKey | None = None  # the model version of the core that cut it (metrics)


@dataclass(slots=True)
class CoreActions:
    """What the owner must do, in this order: send, kill, settle."""

    send: list[Send] = field(default_factory=list)
    kill: list[WorkerId] = field(default_factory=list)
    settle: list[Result] = field(default_factory=list)
    # Model time of answered batches, with the version that ran each (metrics).
    batch_seconds: list[tuple[float, VersionKey | None]] = field(default_factory=list)
    forgive: list[WorkerId] = field(default_factory=list)  # deaths pinned on an input
    # An idle worker to another version, and the start that loads it.
    switch: list[tuple[WorkerId, VersionKey, StartId]] = field(default_factory=list)
    grow: list[tuple[VersionKey, StartId]] = field(default_factory=list)  # a new worker, its start
    retire: list[WorkerId] = field(default_factory=list)  # idle workers leaving for good
    cancel_start: list[StartId] = field(default_factory=list)  # starts taken back
    loaded: list[tuple[VersionKey, float]] = field(default_factory=list)  # loads measured (metrics)
    # Each guard's word on an input (metrics): (guard, "allow" or its reason, False), or
    # (guard, "closed" or "open", True) when it could not answer.
    guards: list[tuple[str, str, bool]] = field(default_factory=list)

    def extend(self, other: CoreActions) -> None:
        self.send += other.send
        self.kill += other.kill
        self.settle += other.settle
        self.batch_seconds += other.batch_seconds
        self.forgive += other.forgive
        self.switch += other.switch
        self.grow += other.grow
        self.retire += other.retire
        self.cancel_start += other.cancel_start
        self.loaded += other.loaded
        self.guards += other.guards


__all__ = ["CoreActions", "Result", "Send"]
