"""Guard stages in the core (`failover.fleet.stages`), in virtual time: the real owner and
composite core over contract workers (`failover.sim.ContractPool`) whose guards answer
verdicts by the input's marker. Each input is answered once, with its output, its refusal or
an error; a refused input never reaches the model; a guard that cannot answer fails as its
model asks for the tier."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import (
    BatchgateError,
    DeadlineUnreachable,
    FlushPolicy,
    GuardUnavailable,
    Item,
    ItemId,
    LoopClock,
    Refused,
    Tier,
    VersionKey,
)
from batcher.shared import Backoff
from failover import ContractViolation, CoreActions, CoreOwner, CoreSettings, build_core
from failover.core import DispatchCore
from failover.fleet.catalogue import Catalogue, parse_catalogue
from failover.fleet.cores import ModelCores
from failover.fleet.placement import PlacementSettings, SwitchCost
from failover.fleet.routing import Routing
from failover.fleet.staging import Stages
from failover.fleet.versions import Versions
from failover.sim import DirectedPool, Steps
from gpu_pool import Load, Ok, Run, WorkerId

LATENCY = 0.1
SETTINGS = CoreSettings(budgets={Tier.PAID: 2.0, Tier.FREE: 2.0},
                        policy=FlushPolicy(max_batch=8, max_wait=0.01),
                        queue_capacity=1000, initial_latency=LATENCY, max_attempts=3)
PLACEMENT = PlacementSettings(min_resident_s=1.0)


def catalogue(pre: str = '["safety"]', post: str = "[]", failure: str = '"closed"',
              extra: str = "") -> Catalogue:
    return parse_catalogue(f"""
[models.topics]
pre = {pre}
post = {post}
on_guard_failure = {failure}
guard_timeout_ms = 300
{extra}
[models.topics.versions.v1]
spec = "sim"
[models.safety.versions.v1]
spec = "sim"
[models.leak]
with_input = true
[models.leak.versions.v1]
spec = "sim"
""")


def answer(load: Load, run: Run) -> Ok:
    """safety refuses BLOCK and answers BAD nonsense; leak refuses an output saying LEAK;
    topics answers `out:<input>`, LEAK for an input saying secret."""
    model = load.version.model
    if model == "safety":
        outs = tuple("refuse:marker" if "BLOCK" in t else "maybe" if "BAD" in t else "allow"
                     for t in run.inputs)
    elif model == "leak":
        outs = tuple("refuse:leak" if "LEAK" in t else "allow" for t in run.inputs)
    else:
        outs = tuple(f"out:{t}" + (" LEAK" if "secret" in t else "") for t in run.inputs)
    return Ok(run.batch_id, outs, LATENCY)


@dataclass
class World:
    catalogue: Catalogue
    guard_s: float = LATENCY  # how long the safety guard's batches take
    pool: type[DirectedPool] = DirectedPool
    max_batch: int = 8
    model_s: float = LATENCY  # how long the model's batches take
    ran: dict[str, list[str]] = field(default_factory=dict)  # model -> inputs it ran
    gave_up: set[int] = field(default_factory=set)  # waited for until their deadlines
    guards: list[tuple[str, str, str]] = field(default_factory=list)  # what metrics heard
    settled: dict[int, list[str | BaseException]] = field(default_factory=dict)
    # `OrderedPool`'s: by (version, batch id), what its stage held queued once the event
    # that cut the batch was taken
    queued_when_cut: dict[tuple[VersionKey, int], list[Item]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cores = ModelCores(self.catalogue, self.make_core, SwitchCost(PLACEMENT))
        for event in ("reply", "worker_died", "worker_ready", "poll"):  # what cuts batches
            setattr(self.cores, event, self.noting(getattr(self.cores, event)))
        self.steps = Steps()
        initial = self.cores.initial(3)
        # A dead worker stays dead through a test (its restart waits 100 s).
        self.pool = self.pool([self.load(v) for v in initial], lambda v: LATENCY,  # type: ignore[misc, operator]
                              Backoff(first=100.0, cap=100.0), answer=self.record)
        self.pool.world = self  # type: ignore[attr-defined]
        self.owner = CoreOwner(self.cores, self.pool, LoopClock(), observer=self,
                               loads=self.load)
        self.steps.start(partial(self.pool.run, self.owner), self.owner.run)
        self.steps.advance(self.steps.now + 1.0)  # every worker up
        self.ids = 0

    def make_core(self, version: VersionKey, catalogue: Catalogue) -> DispatchCore:
        policy = FlushPolicy(max_batch=self.max_batch, max_wait=0.01)
        return build_core(replace(SETTINGS, policy=policy), version=version)

    def noting(self, event: Callable[..., CoreActions]) -> Callable[..., CoreActions]:
        """`event`, noting for each batch it sends what its stage still holds queued."""
        def taken(*args: Any) -> CoreActions:
            out = event(*args)
            held = self.cores._stages._held.values()
            for send in out.send:
                if send.version is not None:
                    self.queued_when_cut[send.version, send.run.batch_id] = [
                        i for i in held if i.version == send.version and i.batch < 0
                        and not i.cancelled and not i.done]
            return out
        return taken

    def load(self, version: VersionKey) -> Load:
        seconds = {"safety": self.guard_s, "topics": self.model_s}.get(version.model, LATENCY)
        return Load(version, "sim", seconds)

    def record(self, load: Load, run: Run) -> Ok:
        self.ran.setdefault(load.version.model, []).extend(run.inputs)
        return answer(load, run)

    # -- the observer (metrics) ----------------------------------------------------------
    def batch_sent(self, *args: object) -> None:
        pass

    def batch_done(self, *args: object) -> None:
        pass

    def load_done(self, *args: object) -> None:
        pass

    def guard_verdict(self, guard: str, reason: str, count: int = 1) -> None:
        self.guards.append(("verdict", guard, reason))

    def guard_failed(self, guard: str, mode: str, count: int = 1) -> None:
        self.guards.append(("failed", guard, mode))

    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.settled.setdefault(item.id, []).append(result)

    def submit(self, texts: list[str], tier: Tier = Tier.PAID, timeout: float = 5.0
               ) -> list[Item]:
        """A request's items, admitted through the owner (raises its refusal)."""
        version = self.cores.resolve("topics", None)
        now = self.steps.now
        items = [Item(ItemId(self.ids + k), t, tier, now, now + timeout, self, k,
                      version=version) for k, t in enumerate(texts)]
        self.ids += len(texts)
        self.steps.call(lambda: self.owner.admit(items, timeout))
        self.steps.loop.call_at(now + timeout, self.give_up, items)
        return items

    def give_up(self, items: list[Item]) -> None:
        """At its deadline the door's waiter stops waiting (its 504), as the door's does."""
        for item in items:
            if item.id not in self.settled:
                self.owner.cancel(item)
                self.gave_up.add(item.id)

    def run(self, seconds: float) -> None:
        self.steps.advance(self.steps.now + seconds)

    def answers(self, items: list[Item]) -> list[str | BaseException]:
        got = [self.settled.get(i.id, []) for i in items]
        assert all(len(g) == 1 for g in got), f"answered {[len(g) for g in got]} times"
        return [g[0] for g in got]


def assert_failed_as_asked(w: World, items: list[Item], opens: bool) -> None:
    """The guard could not answer "a": open, it went on unguarded and says so; closed, it
    is answered guard_unavailable and never reached the model."""
    got = w.answers(items)[0]
    if opens:
        assert got == "out:a" and items[0].skipped == ("safety",)
    else:
        assert isinstance(got, GuardUnavailable)
        assert "topics" not in w.ran


@pytest.fixture
def world() -> Iterator[World]:
    w = World(catalogue())
    yield w
    w.steps.close()


def test_a_refused_input_never_reaches_the_model(world: World) -> None:
    items = world.submit(["a", "BLOCK me", "c"])
    world.run(2.0)
    a, refused, c = world.answers(items)
    assert (a, c) == ("out:a", "out:c")
    assert isinstance(refused, Refused) and (refused.guard, refused.reason) == ("safety",
                                                                               "marker")
    assert sorted(world.ran["safety"]) == ["BLOCK me", "a", "c"]
    assert sorted(world.ran["topics"]) == ["a", "c"]
    assert sorted(world.guards) == [("verdict", "safety", "allow")] * 2 + [
        ("verdict", "safety", "marker")]


def test_a_guard_that_answers_nonsense_is_a_contract_violation(world: World) -> None:
    items = world.submit(["BAD"])
    world.run(2.0)
    assert isinstance(world.answers(items)[0], ContractViolation)
    assert "topics" not in world.ran


def test_a_post_guard_reads_the_input_and_output_and_refuses_a_leak() -> None:
    w = World(catalogue(post='["leak"]'))
    try:
        items = w.submit(["fine", "secret"])
        w.run(3.0)
        fine, secret = w.answers(items)
        assert fine == "out:fine"
        assert isinstance(secret, Refused) and secret.guard == "leak"
        assert '{"input":"fine","output":"out:fine"}' in w.ran["leak"]
    finally:
        w.steps.close()


@pytest.mark.parametrize(("failure", "tier", "opens"), [
    ('"closed"', Tier.PAID, False),
    ('"open"', Tier.PAID, True),
    ('{ paid = "open", free = "closed" }', Tier.FREE, False),
    ('{ paid = "open", free = "closed" }', Tier.PAID, True),
])
def test_a_guard_with_no_worker_fails_as_the_tier_asks(failure: str, tier: Tier,
                                                       opens: bool) -> None:
    w = World(catalogue(failure=failure))
    try:
        for slot in w.pool.view():  # the guard's worker dies and never comes back
            if slot.version.model == "safety":
                w.steps.call(lambda slot=slot: w.pool.die(slot.worker))  # type: ignore[misc]
        w.run(0.5)
        try:
            items = w.submit(["a"], tier=tier)
        except GuardUnavailable:  # refused at the door: no guard can take it
            assert not opens
            return
        w.run(2.0)
        assert_failed_as_asked(w, items, opens)
    finally:
        w.steps.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b", "BLOCK", "secret"]), min_size=1,
                         max_size=5), min_size=1, max_size=12),
       st.lists(st.floats(0.0, 0.3), min_size=12, max_size=12))
def test_every_input_is_answered_once_and_refused_ones_never_run(
        requests: list[list[str]], gaps: list[float]) -> None:
    w = World(catalogue(post='["leak"]'))
    try:
        sent, refused = [], []
        for texts, gap in zip(requests, gaps, strict=False):
            named = [f"{t}-{w.ids + k}" for k, t in enumerate(texts)]
            try:
                sent.append(w.submit(named))
            except BatchgateError:  # refused at the door: none of it may run
                refused += named
                w.ids += len(named)
            w.run(gap)
        w.run(5.0)
        ran = {text for texts in w.ran.values() for text in texts}
        assert not ran & set(refused)
        for items in sent:  # each answered once (`answers`), and closed: never unguarded
            for item, got in zip(items, w.answers(items), strict=True):
                if isinstance(got, GuardUnavailable):  # its guard's share ran out
                    continue
                if "BLOCK" in item.text:
                    assert isinstance(got, Refused) and got.guard == "safety"
                    assert item.text not in w.ran.get("topics", [])
                elif "secret" in item.text:
                    assert isinstance(got, Refused) and got.guard == "leak"
                else:
                    assert got == f"out:{item.text}"
            for item in items:  # the model ran only what the pre guard allowed
                if item.text in w.ran.get("topics", []):
                    assert "BLOCK" not in item.text
    finally:
        w.steps.close()


@pytest.mark.parametrize(("failure", "opens"), [('"closed"', False), ('"open"', True)])
def test_a_guard_too_slow_for_its_share_fails_as_asked(failure: str, opens: bool) -> None:
    w = World(catalogue(failure=failure), guard_s=10.0)  # its batch outlives 300 ms
    try:
        items = w.submit(["a"])
        w.run(0.31)  # its share, and a little: the model's batch has begun, or it is answered
        w.run(1.0)
        assert_failed_as_asked(w, items, opens)
        assert w.guards == [("failed", "safety", "open" if opens else "closed")]
    finally:
        w.steps.close()


def test_in_parallel_the_model_runs_beside_the_guard_and_a_refused_output_is_dropped(
        ) -> None:
    w = World(catalogue(extra='guard_mode = "parallel"'))
    try:
        items = w.submit(["a", "BLOCK me"])
        w.run(0.15)  # one batch's time: both stages ran at once
        a, refused = w.answers(items)
        assert a == "out:a" and isinstance(refused, Refused)
        assert sorted(w.ran["topics"]) == ["BLOCK me", "a"]  # the model ran it, unreleased
    finally:
        w.steps.close()


def test_a_guard_with_weights_draws_its_version_per_input() -> None:
    """A turn looks a guard's version up once, unless weights draw it per input: a canary
    guard sees its share of every turn's inputs."""
    weighted = parse_catalogue("""
[models.topics]
pre = ["safety", "leak"]
[models.topics.versions.v1]
spec = "sim"
[models.safety]
default = "v1"
weights = { v1 = 50, v2 = 50 }
[models.safety.versions.v1]
spec = "sim"
[models.safety.versions.v2]
spec = "sim"
[models.leak.versions.v1]
spec = "sim"
""")
    versions = Versions(weighted)
    versions.change(weighted, 0.0)
    stages = Stages(versions, Routing.__new__(Routing), {})
    looked: list[str] = []
    resolve = versions.resolve
    versions.resolve = lambda model, sticky: looked.append(model) or resolve(model, sticky)  # type: ignore[method-assign]
    stages._memo.clear()  # a turn's start
    drawn = {str(stages._resolve("safety")) for _ in range(40)}
    assert drawn == {"safety@v1", "safety@v2"}
    assert {str(stages._resolve("leak")) for _ in range(40)} == {"leak@v1"}
    assert looked.count("leak") == 1 and looked.count("safety") == 40


def test_sequential_stages_take_one_batch_each(world: World) -> None:
    items = world.submit(["a"])
    world.run(0.15)
    assert items[0].id not in world.settled  # the guard's batch, then the model's
    world.run(0.1)
    assert world.answers(items) == ["out:a"]


def test_an_input_withdrawn_during_its_guard_never_reaches_the_model(world: World) -> None:
    items = world.submit(["a"])
    world.run(0.05)  # the guard's batch runs
    world.steps.call(lambda: world.owner.cancel(items[0]))
    world.run(1.0)
    assert items[0].id not in world.settled and "topics" not in world.ran
    later = world.submit(["b"])  # nothing was left behind holding a worker
    world.run(1.0)
    assert world.answers(later) == ["out:b"]


def test_admission_weighs_every_stage_a_request_passes(world: World) -> None:
    """A deadline that the guard alone could meet but not the guard and the model: refused
    at the door, not after the guard ran."""
    with pytest.raises(DeadlineUnreachable):
        world.submit(["a"], timeout=0.15)
    assert "safety" not in world.ran
    items = world.submit(["a"], timeout=0.5)
    world.run(1.0)
    assert world.answers(items) == ["out:a"]


class OrderedPool(DirectedPool):
    """Checks each fresh batch as it is sent: no input queued in that stage as the batch was
    cut outranks one sent (a better tier, or the same tier and older).

    "Queued as it was cut" is what the stage holds once the event that cut the batch is
    taken (`World.noting`), the inputs that event's answers moved in included, and not
    what it holds when the owner sends the batch: the owner sends a turn's batches after
    taking all of the turn's events. A model's worker answering takes its next batch at
    once (`DispatchCore.reply`: the next batch first, then the answers); a guard's answer
    read after it in the same turn moves in an input that was still in the guard's batch
    as the model's batch was cut, and so could not be in it (and might yet be refused).
    Keeping its tier and age, it outranks what follows in its new stage, not what left that
    stage before it came."""

    world: World

    def send(self, worker: WorkerId, run: Run) -> None:
        stages = self.world.cores._stages
        view = {s.worker: s.version for s in self.view()}
        version = view.get(worker)
        held = [i for i in stages._held.values() if i.version == version]
        sent = [i for i in held if i.text in run.inputs and i.batch >= 0]
        assert version is not None
        left = self.world.queued_when_cut.pop((version, run.batch_id))  # each batch noted
        for item in sent:
            if item.attempts == 0:
                assert not any((q.tier, q.arrived) < (item.tier, item.arrived) for q in left), (
                    f"{version}: {item.text} sent before an older or better input")
        super().send(worker, run)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "BLOCK", "secret"]),
                          st.sampled_from([Tier.PAID, Tier.FREE]),
                          st.floats(0.0, 0.05)), min_size=1, max_size=40),
       st.lists(st.floats(0.0, 2.0), max_size=3), st.booleans())
def test_through_deaths_each_input_is_answered_once_in_tier_and_age_order(
        arrivals: list[tuple[str, Tier, float]], deaths: list[float], parallel: bool) -> None:
    extra = 'guard_mode = "parallel"' if parallel else ""
    w = World(catalogue(post='["leak"]', failure='{ paid = "open", free = "closed" }',
                        extra=extra), pool=OrderedPool, max_batch=2, model_s=0.25)
    try:
        sent: list[list[Item]] = []
        deaths = sorted(deaths)
        for n, (text, tier, gap) in enumerate(arrivals):
            while deaths and deaths[0] <= w.steps.now - 1.0:
                deaths.pop(0)
                busy = [s for s in w.pool.view() if s.state == "busy"]
                if busy:
                    w.steps.call(lambda s=busy[0]: w.pool.die(s.worker))  # type: ignore[misc]
            with contextlib.suppress(BatchgateError):
                sent.append(w.submit([f"{text}-{n}"], tier=tier))
            w.run(gap)
        w.run(10.0)
        assert not w.cores._stages.routes and not w.cores._stages._held  # nothing left
        for items in sent:
            if items[0].id in w.gave_up:  # its deadline passed: the door answered it
                assert items[0].id not in w.settled
                continue
            (got,) = w.answers(items)  # once
            if isinstance(got, str):  # released: every guard allowed it (or failed open)
                assert ("BLOCK" not in items[0].text and "secret" not in items[0].text) \
                    or items[0].skipped
                assert items[0].tier is Tier.PAID or not items[0].skipped
    finally:
        w.steps.close()


def test_an_input_out_of_its_guard_in_the_turn_the_model_cuts_is_first_in_the_next_batch(
        ) -> None:
    """Hypothesis's example: at 1.61 s the model's worker answers and the guard's, in one
    turn, in that order. The model's worker takes its next batch at once (a-3, a-4: paid,
    then free), before the guard's answer moves paid a-10 in; a-10 then goes first in the
    batch after, ahead of the free a-5 and a-6 queued before it (`OrderedPool` checks each
    batch against what was queued as it was cut)."""
    w = World(catalogue(post='["leak"]', failure='{ paid = "open", free = "closed" }'),
              pool=OrderedPool, max_batch=2, model_s=0.25)
    try:
        gaps = [1 / 32, 1 / 32, 3 / 64, 3 / 64] * 2 + [0.0] * 3
        for n, gap in enumerate(gaps):
            w.submit([f"{'BLOCK' if n in (8, 9) else 'a'}-{n}"],
                     tier=Tier.PAID if n < 4 or n > 7 else Tier.FREE)
            w.run(gap)
        w.run(5.0)
        assert w.ran["topics"] == ["a-0", "a-1", "a-2", "a-3", "a-4", "a-10", "a-5", "a-6"]
    finally:
        w.steps.close()


def test_a_guard_share_queued_behind_a_hung_batch_runs_out_on_time() -> None:
    """The owner sleeps until its next look: a queued guard item's share ending before it
    is seen all the same (paid fails open here, free closed)."""
    w = World(catalogue(failure='{ paid = "open", free = "closed" }'), guard_s=100.0)
    try:
        hung = w.submit(["x"], tier=Tier.FREE)  # holds the only guard worker
        w.run(0.5)
        queued = w.submit(["y"])
        w.run(0.45)  # its share (0.3 s), then the model's batch
        assert isinstance(w.answers(hung)[0], GuardUnavailable)
        assert w.answers(queued) == ["out:y"] and queued[0].skipped == ("safety",)
    finally:
        w.steps.close()


def test_an_input_is_in_flight_while_a_stage_item_of_it_is_in_a_batch(world: World) -> None:
    """What the keyed path asks as a request ends unanswered (`KeptRequest.runs_on`)."""
    items = world.submit(["a"])
    route = items[0].route
    assert route is not None
    world.run(0.05)  # its guard batch runs (cut within max_wait)
    assert route.in_flight()
    world.run(1.0)
    assert world.answers(items) == ["out:a"] and not route.in_flight()
