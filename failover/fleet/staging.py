"""The composite core's side of guard stages (`failover.fleet.stages`): a guarded request
enters its first stage at the door, each stage item's result moves its input on in the turn
it lands, and a guard that does not answer within its share of the deadline is given up.

A first stage is admitted as any request is (its guard's admission may refuse it: failing
closed, the request is refused `GuardUnavailable`; failing open, it goes on to the next
stage). A later stage's item was admitted at the door already: it is queued by its age
(`DispatchCore.move_in`), never refused for its queue, and only a version that cannot serve
it (cold past its deadline, failing, gone) ends it. Nothing here runs for a catalogue without
guards, and only while an input is on its way through stages for the rest.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from typing import cast

from batcher import (
    BatchgateError,
    DeadlineExceeded,
    DeadlineUnreachable,
    Item,
    ItemId,
    VersionKey,
)
from failover import CoreActions, DispatchCore, Refusal
from failover.fleet.catalogue import Catalogue
from failover.fleet.routing import Routing
from failover.fleet.stages import Pipeline, Route
from failover.fleet.versions import Versions

# How near its batch's expected end (a share of that batch's time) a partner stage's worker
# is waited for. In the guard benchmark's world (800 RPS, two workers a stage) 0.10-0.20
# kept parallel stages in step through drift and a 30 ms slip; 0.3 already cost 23 ms P50.
PACE = 0.15


class Stages:
    """Guarded requests' inputs on their way through stages, for `ModelCores`."""

    def __init__(self, versions: Versions, routing: Routing,
                 cores: dict[VersionKey, DispatchCore]) -> None:
        """`cores`: the composite's, by version (read only)."""
        self._versions, self._routing, self._cores = versions, routing, cores
        self.pipelines: dict[str, Pipeline] = {}  # guarded models' stages, by model
        self.routes = 0  # inputs on their way
        self._ids = itertools.count(1 << 48)  # apart from the door's item ids
        self._guards: list[tuple[float, int, Item]] = []  # guard stage items by deadline
        self._seq = itertools.count()
        self._held: dict[ItemId, Item] = {}  # stage items in cores, by id (a waiter's cancel)
        self.said: list[tuple[str, str, bool]] = []  # guards' words between turns (metrics)
        self._told = math.inf  # the owner's next look, as `next_deadline` last said
        self._memo: dict[str, VersionKey] = {}  # unweighted guards' versions, this call
        self._partners: dict[str, frozenset[str]] = {}  # models whose stages run beside

    def set_catalogue(self, catalogue: Catalogue) -> None:
        self.pipelines = {m: p for m in catalogue.models
                          if (p := Pipeline.of(catalogue, m)) is not None}
        partners: dict[str, set[str]] = {}
        for pipeline in self.pipelines.values():
            if pipeline.parallel:
                beside = {s.model for s in pipeline.stages[:pipeline.model_at + 1]}
                for one in beside:
                    partners.setdefault(one, set()).update(beside - {one})
        self._partners = {m: frozenset(p) for m, p in partners.items()}
        for version, core in self._cores.items():
            self.pace(version, core)

    def pace(self, version: VersionKey, core: DispatchCore) -> None:
        """Keep `core` in step with its parallel partners' cores (`DispatchCore.pace_with`),
        or let it cut alone when its model runs beside none."""
        partners = self._partners.get(version.model)
        core.pace_with(None if partners is None else
                       lambda now: self._partner_cut(partners, now))

    def _partner_cut(self, partners: frozenset[str], now: float) -> float:
        """Until when a core of `partners` is about to cut: its worker is due to free
        within `PACE` of a batch's time, or is that late (-inf: none is; one has a worker
        idle already)."""
        until = -math.inf
        for version, core in self._cores.items():
            if version.model in partners and core.ready_count():
                free = core.next_free()
                if free == -math.inf:
                    return -math.inf
                slack = PACE * core.batch_latency()
                if free - slack <= now <= free + slack:
                    until = max(until, free + slack)
        return until

    def guards(self, items: list[Item]) -> Pipeline | None:
        """The pipeline the request's items pass through; None: none (not guarded)."""
        version = items[0].version
        return self.pipelines.get(version.model) if version else None

    # -- the door --------------------------------------------------------------------------
    def admit_all(self, requests: Sequence[tuple[list[Item], float]], now: float,
                  draining: bool) -> tuple[list[Refusal | None], bool]:
        """`ModelCores.admit_all` while some model has guards: the others' requests
        together, each guarded one alone."""
        plain = [at for at, (items, _) in enumerate(requests) if self.guards(items) is None]
        refusals: list[Refusal | None] = [None] * len(requests)
        said, turn = self._routing.admit_all([requests[at] for at in plain], now, draining) \
            if plain else ([], False)
        for at, refusal in zip(plain, said, strict=True):
            refusals[at] = refusal
        for at, (items, _) in enumerate(requests):
            pipeline = self.guards(items)
            if pipeline is not None:
                try:
                    turn = self.enter(items, pipeline, now, draining) or turn
                except BatchgateError as exc:
                    refusals[at] = exc
        return refusals, turn

    def enter(self, items: list[Item], pipeline: Pipeline, now: float, draining: bool
              ) -> bool:
        """Admit a guarded request to its first stage (in parallel mode, its pre guards' and
        its model's together): a guard whose admission refuses it and that fails open is
        skipped; any other refusal is the request's (raised), nothing of it left queued."""
        self._memo.clear()
        routes = [Route(item, pipeline) for item in items]
        whole, later = self._waits(pipeline, items[0], now)  # admission weighs every stage
        if items[0].deadline - now < whole:
            raise DeadlineUnreachable(f"its stages expect {whole:.2f} s together, past the "
                                      "request's deadline", retry_after=whole)
        turn, queued = False, []
        while True:
            firsts = [item for route in routes for item in self._items(route, now)]
            skipped = False
            for group in _by_version(firsts):
                until = min(group[0].deadline, items[0].deadline - later)
                try:
                    turn = self._routing.admit(group, until - now, now, draining) or turn
                    queued += group
                    continue
                except BatchgateError as exc:
                    refusal = exc
                answers = []
                for item in group:
                    self._held.pop(item.id, None)
                    self._tell(cast(Route, item.sink), item, refusal)
                    answers.append(cast(Route, item.sink).advance(item, refusal))
                if answers[0] is not None:  # the request's refusal: nothing of it stays
                    for item in queued:
                        self._withdraw(item)
                    for item in firsts:
                        self._held.pop(item.id, None)
                    raise answers[0] if isinstance(answers[0], BaseException) else refusal
                skipped = skipped or not routes[0].waiting()
            if not skipped:  # in parallel mode a skipped guard's partners still run
                break
        for item, route in zip(items, routes, strict=True):
            item.route = route
        self.routes += len(routes)
        # A guard's share that ends before the owner's next look needs a turn to be seen.
        return turn or firsts[0].deadline < self._told

    def _waits(self, pipeline: Pipeline, item: Item, now: float) -> tuple[float, float]:
        """What an input's stages expect to take, by their cores' admission: all of them
        (in parallel mode the pre guards and the model overlap), and those after the first.
        A stage with no worker up is not counted: whether its load comes in time is asked
        as the input reaches it."""
        waits = []
        for stage in pipeline.stages:
            core = self._cores.get(self._resolve(stage.model) if stage.guard else
                                   cast(VersionKey, item.version))
            expected = core.expected_wait(item.tier, now) if core is not None else math.inf
            waits.append(expected if math.isfinite(expected) else 0.0)
        first = pipeline.model_at + 1 if pipeline.parallel else 1
        return max(waits[:first]) + sum(waits[first:]), sum(waits[first:])

    def cancel(self, item: Item) -> list[Item]:
        """The input's waiter gave up: the stage items its cores hold for it."""
        route = item.route
        if not isinstance(route, Route):
            return [item]
        route.cancelled = True
        if not route.done:  # its waiter answers it (the door's 499 or 504): nothing here
            route.done = True
            self.routes -= 1
        return [self._held.pop(i) for i in list(route.running) if i in self._held]

    # -- each turn -------------------------------------------------------------------------
    def staged(self, out: CoreActions, now: float, draining: bool) -> CoreActions:
        """`out`, its stage items' results taken: each moves its input on to the next stage
        (queued now, dispatched in this turn) or answers it."""
        settle: list[tuple[Item, str | BaseException]] = []
        moved: set[VersionKey] = set()
        self._memo.clear()
        for item, result in out.settle:
            route = item.sink
            if not isinstance(route, Route):
                settle.append((item, result))
                continue
            self._held.pop(item.id, None)
            self._tell(route, item, result)
            answer = route.advance(item, result)
            if answer is None and not route.done and not route.waiting():
                answer = self._move(route, now, draining, moved)
            if answer is not None:  # `advance` ends a route once
                self.routes -= 1
                settle.append((route.input, answer))
                for stale in list(route.running):  # parallel: what runs beside is dropped
                    self._withdraw(self._held.get(stale))
                route.running.clear()
        out.settle = settle
        if self.said:
            out.guards += self.said
            self.said = []
        for version in moved:
            out.extend(self._cores[version].pump(now))
        if self._partners:
            self._pump_paced(out, now)
        return out

    def _pump_paced(self, out: CoreActions, now: float) -> None:
        """A partner that cut, or that has a worker idle now, ends the waits of the cores
        paced by it: they are asked again in the same turn, not at their wait's end."""
        for version, core in self._cores.items():
            if version.model in self._partners:
                out.extend(core.pump(now))

    def expire(self, now: float, out: CoreActions) -> None:
        """Guard stage items past their share of the deadline: given up (what runs of them
        is dropped when it lands), as though they expired in their queues."""
        guards = self._guards
        while guards and guards[0][0] <= now:
            _, _, item = heapq.heappop(guards)
            if _watched(item):
                core = self._cores.get(item.version) if item.version else None
                if core is not None:
                    core.cancel(item)
                item.done = True  # a twin's or a late batch's answer is dropped
                out.settle.append((item, DeadlineExceeded("the guard did not answer in time")))

    def next_deadline(self) -> float:
        """The next guard share to run out (those of stages already left are dropped)."""
        guards = self._guards
        while guards and not _watched(guards[0][2]):
            heapq.heappop(guards)
        self._told = guards[0][0] if guards else math.inf
        return self._told

    # -- internals -------------------------------------------------------------------------
    def _items(self, route: Route, now: float) -> list[Item]:
        items = route.next_items(lambda: cast(ItemId, next(self._ids)), self._resolve, now)
        for item in items:
            self._held[item.id] = item
            if item.deadline < route.input.deadline:  # a guard's share: watched
                heapq.heappush(self._guards, (item.deadline, next(self._seq), item))
        return items

    def _resolve(self, model: str) -> VersionKey:
        """A guard's version, resolved once per door call or turn (`_memo`, cleared by each)
        unless weights choose it per input."""
        version = self._memo.get(model)
        if version is None:
            version = self._versions.resolve(model, None)
            if not self._versions.catalogue.models[version.model].weights:
                self._memo[model] = version
        return version

    def _tell(self, route: Route, item: Item, result: str | BaseException) -> None:
        said = route.said(item, result)
        if said is not None:
            self.said.append(said)

    def _withdraw(self, item: Item | None) -> None:
        """Take a stage item back from its core (what of it runs is dropped as it lands)."""
        if item is None:
            return
        self._held.pop(item.id, None)
        item.done = True
        if item.version in self._cores:
            self._cores[item.version].cancel(item)

    def _move(self, route: Route, now: float, draining: bool, moved: set[VersionKey]
              ) -> str | BaseException | None:
        """Queue the route's next stage: None once queued, else the input's answer (its
        version cannot serve it, and what that means for a guard's failure mode)."""
        while not route.cancelled:
            (item,) = self._items(route, now)
            try:
                assert item.version is not None
                core, _ = self._routing.core_for([item], item.deadline - now, now, draining)
            except BatchgateError as exc:
                self._held.pop(item.id, None)
                self._tell(route, item, exc)
                answer = route.advance(item, exc)
                if answer is not None or route.done:
                    return answer
                continue  # a guard skipped (open): the stage after it
            core.move_in(item, now)
            moved.add(item.version)
            return None
        return None


def _watched(item: Item) -> bool:
    """Whether a guard stage item still holds its input up."""
    route = item.sink
    return isinstance(route, Route) and item.id in route.running and not route.done


def _by_version(items: list[Item]) -> list[list[Item]]:
    groups: dict[VersionKey | None, list[Item]] = {}
    for item in items:
        groups.setdefault(item.version, []).append(item)
    return list(groups.values())


__all__ = ["Stages"]
