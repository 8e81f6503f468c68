"""Guard stages: an input of a guarded model moves from guard to guard, to the model, to
its post guards, inside the core, in the turn each batch is answered.

A model of the catalogue names guard models (`pre`, `post`); a guard is a model like any
other (its own versions, workers, placement), batched, hedged, isolated and re-routed by its
own dispatch core. An input of a guarded request never enters a core itself: each stage gets
an item of its own (`Route.next_item`), with the input's tier, age (`arrived`) and deadline,
capped at the guard's share (`guard_timeout_s`), whose sink is the input's `Route`. When a
stage's item settles, the composite core (`failover.fleet.cores.ModelCores`) asks the route
what follows (`Route.advance`): the next stage's item, admitted to its core at once, or the
input's own answer. A guard answers `allow` or `refuse:<reason>`; a refusal settles the input
with `batcher.Refused` (it never reaches a later stage, nor takes a slot in the model's
batches), anything else is a contract violation answered as a model error.

A guard that cannot answer (its stage item expired, its workers kept dying, no worker could
take it) fails as the model asks for the input's tier: closed, the input is answered
`GuardUnavailable` (503, never the model's output unguarded); open, the input goes on and
its answer names the guard skipped (`Item.skipped`). Exactly once holds across stages: each
stage item settles once (its core's promise), each settles its route once, and the route
settles the input once, with its output, its refusal or an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from batcher import (
    BatchgateError,
    Closed,
    DeadlineExceeded,
    GuardUnavailable,
    Item,
    ItemId,
    Overloaded,
    QueueFull,
    Refused,
    Tier,
    VersionKey,
)
from failover import ContractViolation, ModelFailing, ModelUnplaceable, WorkerCrashed
from failover.fleet.catalogue import Catalogue

VERDICT = re.compile(r"allow|refuse:([a-z0-9_]{1,64})")
GUARD_RETRY_AFTER_S = 1.0  # a guard that failed closed: when a retry may find it answering
CANNOT_ANSWER = (DeadlineExceeded, WorkerCrashed, Overloaded, QueueFull, ModelFailing,
                 ModelUnplaceable)
"""What a guard's stage item may end with that says the guard could not answer (its share
of the deadline passed, its workers kept dying, none could take it): its failure mode
decides. Anything else (the guard's own error, a shutdown) answers the input as it is."""


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a guarded model: a guard (`guard` its model's name) or the model."""

    model: str
    guard: bool
    with_input: bool = False  # a post guard reading {"input", "output"}


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A guarded model's stages, in order, and how its guards fail. `parallel`: the pre
    guards run beside the model (its output held until every one allowed the input)."""

    stages: tuple[Stage, ...]
    timeout_s: float
    open_tiers: frozenset[Tier]  # tiers whose guards fail open
    parallel: bool = False

    @classmethod
    def of(cls, catalogue: Catalogue, model: str) -> Pipeline | None:
        """`model`'s pipeline; None for a model without guards (the one-stage path)."""
        config = catalogue.models[model]
        if not config.pre and not config.post:
            return None
        stages = (*(Stage(g, True) for g in config.pre), Stage(model, False),
                  *(Stage(g, True, catalogue.models[g].with_input) for g in config.post))
        return cls(stages, config.guard_timeout_s,
                   frozenset(t for t in Tier if config.fails_open(t.label)),
                   config.guard_mode == "parallel" and bool(config.pre))

    @property
    def model_at(self) -> int:
        """The model's own stage."""
        return next(i for i, s in enumerate(self.stages) if not s.guard)


Resolve = Callable[[str], VersionKey]  # a guard model's name -> the version it runs on now
Ids = Callable[[], ItemId]


class Route:
    """One input's way through its model's stages: the sink of each of its stage items.

    `running` holds its stage items in flight: one, or in parallel mode the pre guards'
    and the model's together; `advance` takes each one's result."""

    __slots__ = ("at", "cancelled", "done", "held", "input", "output", "pipeline", "running",
                 "skipped")

    def __init__(self, item: Item, pipeline: Pipeline) -> None:
        self.input, self.pipeline = item, pipeline
        self.at = 0  # the stage it is in (parallel: the model's, once every item started)
        self.running: dict[ItemId, tuple[int, Item]] = {}  # stage item: its stage, itself
        self.output: str | None = None  # the model's, while its post guards run
        self.held: str | BaseException | None = None  # parallel: what ends the pre stages
        self.skipped: list[str] = []  # guards that failed open
        self.cancelled = False
        self.done = False

    def item_done(self, item: Item, result: str | BaseException) -> None:
        """Not called: the composite core takes a stage item's result (`advance`) as its
        core settles it. Were one settled some other way, its input is answered an error,
        never a stage's text."""
        if not self.done and self.running.pop(item.id, None) is not None:
            self.done = True
            self.input.settle(BatchgateError("the input left its guard stages unanswered"))

    def next_items(self, ids: Ids, resolve: Resolve, now: float) -> list[Item]:
        """The items of the stage it is in (parallel, at the start: every pre guard's and
        the model's)."""
        pipeline = self.pipeline
        if pipeline.parallel and self.at == 0:
            return [self._item(at, ids, resolve, now) for at in range(pipeline.model_at + 1)]
        return [self._item(self.at, ids, resolve, now)]

    def _item(self, at: int, ids: Ids, resolve: Resolve, now: float) -> Item:
        stage, source = self.pipeline.stages[at], self.input
        text = source.text
        if self.output is not None:  # a post guard: the model's output, with the input
            text = self.output if not stage.with_input else orjson.dumps(
                {"input": source.text, "output": self.output}).decode()
        version = resolve(stage.model) if stage.guard else source.version
        assert version is not None  # a guarded request names its version
        deadline = min(source.deadline, now + self.pipeline.timeout_s) if stage.guard else \
            source.deadline
        item = Item(ids(), text, source.tier, source.arrived, deadline, self, source.index,
                    caller=source.caller, version=version, trace=source.trace,
                    streamed=source.streamed)
        self.running[item.id] = at, item
        return item

    def advance(self, item: Item, result: str | BaseException) -> str | BaseException | None:
        """Stage item `item` settled with `result`: the input's answer, or None while it
        goes on (`at` moved to the next stage, whose items `next_items` makes) or waits
        (for its other parallel items, or a stale item's result came)."""
        entry = self.running.pop(item.id, None)
        if entry is None or self.done:
            return None  # stale: the route went on without it (timed out, answered)
        at = entry[0]
        stage, source = self.pipeline.stages[at], self.input
        if not source.dispatched and item.dispatched:  # its wait: until its first stage ran
            source.dispatched = item.dispatched
        if not stage.guard:  # the answer's batch and attempts are the model's
            source.batch, source.attempts = item.batch, item.attempts
        if stage.guard:
            outcome = self._verdict(stage, result)
        elif isinstance(result, BaseException):
            outcome = result
        else:
            self.output, outcome = result, None
        if outcome is not None:  # a refusal, or an error: the first one ends it
            return self._end(outcome)
        if self.running:
            return None  # parallel: the other items of its first stages still run
        if self.pipeline.parallel and at <= self.pipeline.model_at:
            self.at = self.pipeline.model_at  # every pre guard allowed, the model answered
        self.at += 1
        if self.at < len(self.pipeline.stages):
            return None
        assert self.output is not None  # the model's stage came before the last
        return self._end(self.output)

    def said(self, item: Item, result: str | BaseException) -> tuple[str, str, bool] | None:
        """What a guard stage item's `result` tells the metrics (`CoreActions.guards`),
        before `advance` takes it; None for the model's stage, or a stale item."""
        entry = self.running.get(item.id)
        if entry is None or self.done or not self.pipeline.stages[entry[0]].guard:
            return None
        at = entry[0]
        guard = self.pipeline.stages[at].model
        if result == "allow":  # the usual word: no pattern to match
            return guard, "allow", False
        if isinstance(result, BaseException):
            if not isinstance(result, CANNOT_ANSWER) or isinstance(result, Closed):
                return None
            opens = self.input.tier in self.pipeline.open_tiers
            return guard, "open" if opens else "closed", True
        verdict = VERDICT.fullmatch(result)
        if verdict is None:
            return None
        return guard, verdict.group(1) or "allow", False

    def in_flight(self) -> bool:
        """Whether one of its stage items is in a batch now (its input runs on when its
        request ends unanswered: `api.door.keyed.KeptRequest.runs_on`)."""
        return any(item.flights > 0 for _, item in self.running.values())

    def waiting(self) -> bool:
        """Whether it waits for items of its stage (else `next_items` starts the next)."""
        return bool(self.running)

    def _verdict(self, stage: Stage, result: str | BaseException) -> BaseException | None:
        """What a guard's result means: None to go on, or the input's error."""
        if result == "allow":
            return None
        if isinstance(result, BaseException):
            if not isinstance(result, CANNOT_ANSWER) or isinstance(result, Closed):
                return result
            if self.input.tier not in self.pipeline.open_tiers:
                return GuardUnavailable(f"the guard {stage.model} could not answer in time",
                                        retry_after=GUARD_RETRY_AFTER_S)
            self.skipped.append(stage.model)
            return None
        verdict = VERDICT.fullmatch(result)
        if verdict is None:
            return ContractViolation("ContractViolation", f"the guard {stage.model} "
                                     "answered neither allow nor refuse:<reason>")
        if verdict.group(1) is not None:
            return Refused(stage.model, verdict.group(1))
        return None

    def _end(self, answer: str | BaseException) -> str | BaseException:
        self.done = True
        if self.skipped:
            self.input.skipped = tuple(self.skipped)
        return answer


__all__ = ["CANNOT_ANSWER", "GUARD_RETRY_AFTER_S", "VERDICT", "Pipeline", "Resolve", "Route",
           "Stage"]
