"""Placement: the rules of `SwitchCost` over random views (hypothesis, virtual time), worked
cases of each trigger, the baseline, the ETA admission reads and the starting placement."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import Throughput
from failover.fleet.placement import (
    REASONS,
    LruOnDemand,
    PlacementSettings,
    Switch,
    SwitchCost,
    VersionView,
    WorkerView,
    initial_placement,
    load_eta,
    queued_batches,
)
from gpu_pool import WorkerId

NOW = 1_000.0
S = PlacementSettings()
CONTRACT = Throughput(batch_items=100, batch_s=0.1)  # what a core measures of the contract
# Measured throughputs the random views draw from: the contract's, slower and faster
# batches, and long inputs that fill a batch by its characters.
MEASURED = [CONTRACT, Throughput(100, 0.3), Throughput(100, 0.025), Throughput(12.5, 0.15)]
RESIDENT = S.min_resident(2.0)  # residency of a 2 s load


def version(key: str, **kw: object) -> VersionView:
    model = key.split("@")[0]
    base = VersionView(version=key, model=model, queued=0, paid=0, oldest=math.inf,
                       oldest_deadline=math.inf, rate=0.0, last_arrival=NOW - 60, loading=0,
                       load_s=2.0, throughput=CONTRACT, min_workers=0, max_workers=None,
                       idle_unload_s=600.0, retired=False)
    return replace(base, **kw)  # type: ignore[arg-type]


def waiting(key: str, queued: int, waited: float = 0.1, budget: float = 5.0,
            **kw: object) -> VersionView:
    return version(key, queued=queued, paid=queued, oldest=NOW - waited,
                   oldest_deadline=NOW - waited + budget, **kw)


def worker(n: int, key: str, idle: bool = True, since: float = NOW - 100) -> WorkerView:
    return WorkerView(WorkerId(n), key, idle, since)


# -- the rules, over random views ------------------------------------------------------------

@st.composite
def views(draw: st.DrawFn) -> tuple[list[WorkerView], list[VersionView]]:
    models = draw(st.integers(1, 3))
    out: list[VersionView] = []
    for m in range(models):
        lo = draw(st.integers(0, 2))
        hi = draw(st.one_of(st.none(), st.integers(max(lo, 1), 4)))
        idle_unload = draw(st.sampled_from([5.0, 60.0, 600.0]))
        for v in range(draw(st.integers(1, 2))):
            queued = draw(st.integers(0, 400))
            waited = draw(st.floats(0, 8))
            out.append(VersionView(
                version=f"m{m}@v{v}", model=f"m{m}", queued=queued,
                paid=draw(st.integers(0, queued)),
                oldest=NOW - waited if queued else math.inf,
                oldest_deadline=NOW - waited + draw(st.floats(0.5, 10)) if queued else math.inf,
                rate=draw(st.sampled_from([0.0, 5.0, 300.0, 900.0, 1_600.0, 3_000.0])),
                last_arrival=draw(st.sampled_from([-math.inf, NOW - 700, NOW - 30, NOW - 0.5])),
                loading=draw(st.integers(0, 1)), load_s=draw(st.sampled_from([0.5, 2.0, 8.0])),
                throughput=draw(st.sampled_from(MEASURED)),
                min_workers=lo, max_workers=hi, idle_unload_s=idle_unload,
                retired=draw(st.booleans()) and v > 0, wanted=draw(st.booleans()) or v == 0))
    workers = [WorkerView(WorkerId(i + 1), draw(st.sampled_from(out)).version, draw(st.booleans()),
                          NOW - draw(st.sampled_from([0.0, 1.0, 9.0, 15.0, 50.0, 500.0])))
               for i in range(draw(st.integers(1, 6)))]
    return workers, out


def model_of(key: str) -> str:
    return key.split("@")[0]


def check_rules(workers: list[WorkerView], versions: list[VersionView],
                switches: list[Switch]) -> None:
    by_key = {v.version: v for v in versions}
    held = {w.worker: w for w in workers}
    assert len({s.worker for s in switches}) == len(switches)  # a worker switches once
    targets = Counter(s.to for s in switches)
    for s in switches:
        w, to = held[s.worker], by_key[s.to]
        assert w.idle  # never loads while busy
        assert s.reason in REASONS and s.to != w.version
        assert to.loading == 0 and targets[s.to] == 1  # one load at a time per version
        assert not to.retired and to.wanted
        src = by_key[w.version]
        if not src.retired:  # the minimum residency
            assert w.resident_since + S.min_resident(src.load_s) <= NOW
    holding = Counter(w.version for w in workers)
    for key, left in Counter(held[s.worker].version for s in switches
                             if not (by_key[s.to].paid and not by_key[held[s.worker].version].paid)
                             ).items():
        # the workers that stay take the batches still waiting there (unless they left
        # free work for waiting paid work: paid outranks free across models)
        assert holding[key] - left >= queued_batches(by_key[key])
    resident = Counter(model_of(w.version) for w in workers)
    out = Counter(model_of(held[s.worker].version) for s in switches)
    for m in {v.model for v in versions}:
        mine = [v for v in versions if v.model == m]
        floor, cap = mine[0].min_workers, mine[0].max_workers
        if all(not v.retired and v.wanted for v in mine):  # no version leaving on its own
            assert resident[m] - out[m] >= min(floor, resident[m])
        cross_in = sum(1 for s in switches
                       if model_of(s.to) == m and model_of(held[s.worker].version) != m)
        cross_out = sum(1 for s in switches
                        if model_of(s.to) != m and model_of(held[s.worker].version) == m)
        if cap is not None and cross_in:
            assert resident[m] + sum(v.loading for v in mine) + cross_in - cross_out <= cap


@st.composite
def at_floor(draw: st.DrawFn) -> tuple[list[WorkerView], list[VersionView]]:
    """Random views in which the first model holds exactly its floor, idle and settled."""
    workers, versions = draw(views())
    first = versions[0].model
    floor = max(1, versions[0].min_workers)
    versions = [replace(v, min_workers=floor, retired=False, wanted=True)
                if v.model == first else v for v in versions]
    mine = [WorkerView(WorkerId(100 + i), versions[0].version, True, NOW - 500)
            for i in range(floor)]
    return mine + [w for w in workers if model_of(w.version) != first], versions


@settings(max_examples=300, deadline=None)
@given(at_floor())
def test_a_model_at_its_floor_never_loses_a_worker(
    drawn: tuple[list[WorkerView], list[VersionView]]
) -> None:
    workers, versions = drawn
    switches = SwitchCost().decide(NOW, workers, versions)
    assert not [s for s in switches if s.worker >= 100]
    check_rules(workers, versions, switches)


def test_the_last_resident_worker_of_a_model_with_a_floor_is_never_switched_away() -> None:
    # Its version is idle, spare by rate and settled; another model is cold with items waiting.
    ws = [worker(1, "a@v1")]
    vs = [version("a@v1", min_workers=1), waiting("b@v1", 50, rate=500.0)]
    assert SwitchCost().decide(NOW, ws, vs) == []


@settings(max_examples=400, deadline=None)
@given(views())
def test_switch_cost_keeps_every_rule(drawn: tuple[list[WorkerView], list[VersionView]]) -> None:
    workers, versions = drawn
    switches = SwitchCost().decide(NOW, workers, versions)
    check_rules(workers, versions, switches)


@settings(max_examples=200, deadline=None)
@given(views())
def test_switch_cost_is_deterministic_and_wakes_only_in_the_future(
    drawn: tuple[list[WorkerView], list[VersionView]]
) -> None:
    workers, versions = drawn
    assert SwitchCost().decide(NOW, workers, versions) == SwitchCost().decide(
        NOW, list(workers), list(versions))
    assert SwitchCost().next_check(NOW, workers, versions) > NOW


@settings(max_examples=200, deadline=None)
@given(views())
def test_busy_workers_never_switch(drawn: tuple[list[WorkerView], list[VersionView]]) -> None:
    workers, versions = drawn
    busy = [replace(w, idle=False) for w in workers]
    assert SwitchCost().decide(NOW, busy, versions) == []
    assert LruOnDemand().decide(NOW, busy, versions) == []


@settings(max_examples=200, deadline=None)
@given(views())
def test_demand_and_cold_switches_are_justified(
    drawn: tuple[list[WorkerView], list[VersionView]]
) -> None:
    workers, versions = drawn
    resident = Counter(w.version for w in workers)
    by_key = {v.version: v for v in versions}
    for s in SwitchCost().decide(NOW, workers, versions):
        to = by_key[s.to]
        horizon = S.horizon_loads * to.load_s
        if s.reason == "demand":  # the work over the horizon pays for the load
            cap = to.throughput.per_worker  # measured, per version
            excess = to.queued / cap + (to.rate / cap - resident[s.to]) * horizon
            assert resident[s.to] >= 1 and excess >= S.factor * to.load_s
        if s.reason == "cold":  # nobody holds it, and someone asks for it
            assert resident[s.to] == 0
            assert to.queued > 0 or NOW - to.last_arrival <= S.cold_recent_s


@settings(max_examples=200, deadline=None)
@given(views())
def test_the_baseline_loads_only_from_free_workers_one_per_version(
    drawn: tuple[list[WorkerView], list[VersionView]]
) -> None:
    workers, versions = drawn
    by_key = {v.version: v for v in versions}
    held = {w.worker: w for w in workers}
    switches = LruOnDemand().decide(NOW, workers, versions)
    assert len({s.to for s in switches}) == len({s.worker for s in switches}) == len(switches)
    for s in switches:
        w = held[s.worker]
        assert w.idle and by_key[w.version].queued == 0
        assert by_key[s.to].queued > 0 and by_key[s.to].loading == 0


# -- worked cases ---------------------------------------------------------------------------

def test_a_cold_version_with_items_waiting_loads_on_a_spare_worker() -> None:
    ws = [worker(1, "a@v1"), worker(2, "a@v1", idle=False), worker(3, "b@v1", idle=False)]
    vs = [version("a@v1", min_workers=1, rate=100.0), version("b@v1", rate=200.0),
          waiting("c@v1", 3, rate=1.0)]
    assert SwitchCost().decide(NOW, ws, vs) == [Switch(WorkerId(1), "c@v1", "cold")]


def test_a_cold_load_waits_for_the_minimum_residency_and_says_when() -> None:
    since = NOW - 3
    ws = [worker(1, "a@v1", since=since), worker(2, "a@v1", idle=False, since=since)]
    vs = [version("a@v1", min_workers=1), waiting("c@v1", 3, budget=30.0)]
    policy = SwitchCost()
    assert policy.decide(NOW, ws, vs) == []
    at = policy.next_check(NOW, ws, vs)
    assert at == since + RESIDENT
    assert policy.decide(at, ws, vs) == [Switch(WorkerId(1), "c@v1", "cold")]


def test_a_retired_version_drains_its_queue_then_its_workers_leave() -> None:
    ws = [worker(1, "a@v1", since=NOW - 1), worker(2, "a@v2", idle=False)]
    draining = [waiting("a@v1", 40, retired=True, min_workers=1),
                version("a@v2", min_workers=1, rate=50.0)]
    assert SwitchCost().decide(NOW, ws, draining) == []  # its last batch is still to run
    drained = [replace(draining[0], queued=0, paid=0, oldest=math.inf,
                       oldest_deadline=math.inf), draining[1]]
    # retired: no minimum residency; the model keeps its floor through its live version
    assert SwitchCost().decide(NOW, ws, drained) == [Switch(WorkerId(1), "a@v2", "retire")]


def test_a_model_idle_past_idle_unload_is_unloaded_to_the_first_models_default() -> None:
    ws = [worker(1, "a@v1", idle=False), worker(2, "b@v1", since=NOW - 900)]
    vs = [version("a@v1", min_workers=1, rate=0.0),
          version("b@v1", last_arrival=NOW - 500, idle_unload_s=600.0)]
    policy = SwitchCost()
    assert policy.decide(NOW, ws, vs) == []
    assert policy.next_check(NOW, ws, vs) == NOW + 100
    later = [vs[0], replace(vs[1], last_arrival=NOW - 600)]
    assert policy.decide(NOW, ws, later) == [Switch(WorkerId(2), "a@v1", "idle")]


def test_a_model_with_a_floor_is_never_idle_unloaded() -> None:
    ws = [worker(1, "a@v1"), worker(2, "b@v1")]
    vs = [version("a@v1", min_workers=1), version("b@v1", min_workers=1, last_arrival=-math.inf,
                                                   idle_unload_s=5.0)]
    assert SwitchCost().decide(NOW, ws, vs) == []


def test_a_version_just_loaded_stays_its_minimum_residency_though_another_needs_it() -> None:
    since = NOW - 5
    ws = [worker(1, "a@v1", idle=False), worker(2, "b@v1", since=since),
          worker(3, "b@v1", idle=False)]
    hot = waiting("a@v1", 900, rate=2_500.0, min_workers=1)
    vs = [hot, version("b@v1", rate=10.0)]
    policy = SwitchCost()
    assert policy.decide(NOW, ws, vs) == []
    assert policy.next_check(NOW, ws, vs) == since + RESIDENT
    assert policy.decide(since + RESIDENT, ws, vs) == [Switch(WorkerId(2), "a@v1", "demand")]


def test_demand_below_the_control_limit_switches_nothing() -> None:
    # One worker at 900/s with a short queue runs its work: no load is worth it.
    ws = [worker(1, "a@v1", idle=False), worker(2, "b@v1"), worker(3, "b@v1", idle=False)]
    vs = [waiting("a@v1", 150, rate=900.0), version("b@v1", rate=10.0)]
    assert SwitchCost().decide(NOW, ws, vs) == []
    over = [waiting("a@v1", 150, rate=1_300.0), vs[1]]
    assert SwitchCost().decide(NOW, ws, over) == [Switch(WorkerId(2), "a@v1", "demand")]


def test_the_control_limit_reads_each_versions_measured_throughput() -> None:
    # 600/s is 0.6 of a worker at the contract's batches, 1.8 at 300 ms batches.
    ws = [worker(1, "a@v1", idle=False), worker(2, "b@v1"), worker(3, "b@v1", idle=False)]
    fast = [version("a@v1", rate=600.0), version("b@v1", rate=10.0)]
    assert SwitchCost().decide(NOW, ws, fast) == []
    slow = [replace(fast[0], throughput=Throughput(100, 0.3)), fast[1]]
    assert SwitchCost().decide(NOW, ws, slow) == [Switch(WorkerId(2), "a@v1", "demand")]


def test_a_queue_whose_tail_would_miss_its_deadline_gets_a_worker() -> None:
    # A burst at a low rate: no excess over the horizon, but the tail would wait 3 s of 5.
    ws = [worker(1, "a@v1", idle=False), worker(2, "b@v1"), worker(3, "b@v1", idle=False)]
    vs = [waiting("a@v1", 3_000, rate=100.0), version("b@v1", rate=10.0)]
    assert SwitchCost().decide(NOW, ws, vs) == [Switch(WorkerId(2), "a@v1", "deadline")]


def test_demand_never_takes_a_worker_its_own_version_needs() -> None:
    ws = [worker(1, "a@v1", idle=False), worker(2, "b@v1"), worker(3, "b@v1", idle=False)]
    vs = [waiting("a@v1", 2_000, rate=2_000.0), version("b@v1", rate=1_200.0)]
    assert SwitchCost().decide(NOW, ws, vs) == []


def test_paid_work_of_one_model_outranks_free_work_of_another() -> None:
    """Both workers hold `hot`, whose free backlog keeps them busy; a paid request waits at
    `cold`: the first to finish a batch (idle now, past its residency) loads `cold`."""
    ws = [worker(1, "hot@v1"), worker(2, "hot@v1", idle=False)]
    hot = version("hot@v1", queued=400, paid=0, oldest=NOW - 0.5, oldest_deadline=NOW + 1.5,
                  rate=1_500.0)
    cold = waiting("cold@v1", 1, rate=1.0)
    assert SwitchCost().decide(NOW, ws, [hot, cold]) == [
        Switch(WorkerId(1), "cold@v1", "cold")]
    free_only = replace(cold, paid=0)  # a free request alone does not outrank hot's backlog
    assert SwitchCost().decide(NOW, ws, [hot, free_only]) == []


def test_a_version_with_nothing_waiting_gives_its_worker_to_work_that_pays_for_a_load() -> None:
    """`cold` was asked once (its rate decays, far from paying for a load) and keeps its
    worker idle; `hot`'s waiting work pays for a load: the worker goes now, not after
    idle_unload_s."""
    ws = [worker(1, "hot@v1", idle=False), worker(2, "cold@v1")]
    hot = waiting("hot@v1", 300, rate=1_400.0)
    cold = version("cold@v1", rate=0.2, last_arrival=NOW - 20)
    assert SwitchCost().decide(NOW, ws, [hot, cold]) == [Switch(WorkerId(2), "hot@v1", "demand")]
    busy = replace(cold, rate=300.0)  # its own arrivals would pay for its load: it stays
    assert SwitchCost().decide(NOW, ws, [hot, busy]) == []


def test_a_free_arrival_never_takes_a_worker_from_waiting_paid_work() -> None:
    """`a`'s paid traffic needs both its workers (one idle between batches); a free request
    for cold `b` waits rather than take one. A paid one may."""
    ws = [worker(1, "a@v1"), worker(2, "a@v1", idle=False)]
    a = waiting("a@v1", 50, rate=1_500.0)
    b = version("b@v1", queued=1, paid=0, oldest=NOW - 0.1, oldest_deadline=NOW + 4.0)
    assert SwitchCost().decide(NOW, ws, [a, b]) == []
    assert SwitchCost().decide(NOW, ws, [a, replace(b, paid=1)]) == [
        Switch(WorkerId(1), "b@v1", "cold")]


def test_a_model_at_max_workers_gets_no_more() -> None:
    ws = [worker(1, "a@v1", idle=False), worker(2, "b@v1"), worker(3, "b@v1", idle=False)]
    vs = [waiting("a@v1", 3_000, rate=3_000.0, max_workers=1), version("b@v1", rate=10.0)]
    assert SwitchCost().decide(NOW, ws, vs) == []


def test_one_load_at_a_time_per_version() -> None:
    ws = [worker(1, "b@v1"), worker(2, "b@v1"), worker(3, "b@v1", idle=False)]
    vs = [waiting("a@v1", 3_000, rate=3_000.0, loading=1), version("b@v1")]
    assert SwitchCost().decide(NOW, ws, vs) == []
    vs[0] = replace(vs[0], loading=0)
    assert len(SwitchCost().decide(NOW, ws, vs)) == 1


def test_the_baseline_thrashes_where_switch_cost_holds() -> None:
    # a@v1's second worker is free a moment between batches; b's worker is busy a batch.
    ws = [worker(1, "a@v1"), worker(2, "a@v1", idle=False), worker(3, "b@v1", idle=False)]
    vs = [version("a@v1", rate=900.0, min_workers=1), waiting("b@v1", 20, 0.03, rate=200.0)]
    assert LruOnDemand().decide(NOW, ws, vs) == [Switch(WorkerId(1), "b@v1", "demand")]
    assert SwitchCost().decide(NOW, ws, vs) == []


# -- the ETA and the start ------------------------------------------------------------------

def test_load_eta_reads_residency_loads_and_what_placement_would_refuse() -> None:
    v = version("a@v1", load_s=3.0)
    assert load_eta(replace(v, resident=1), NOW) == 0.0
    assert load_eta(replace(v, loading=1, load_started=NOW - 1), NOW) == pytest.approx(2.0)
    assert load_eta(replace(v, loading=1, load_started=NOW - 9), NOW) == 0.0
    assert load_eta(v, NOW) == 3.0
    assert load_eta(replace(v, retired=True), NOW) == math.inf
    assert load_eta(replace(v, wanted=False), NOW) == math.inf


def test_initial_placement_fills_floors_then_spreads_in_catalogue_order() -> None:
    vs = [version("a@v1"), version("b@v2"), version("c@v1")]
    assert initial_placement(4, vs) == ["a@v1", "a@v1", "b@v2", "c@v1"]
    assert initial_placement(2, vs) == ["a@v1", "b@v2"]  # the first model at least 1
    floors = [version("a@v1", max_workers=1), version("b@v2", min_workers=2), version("c@v1")]
    assert initial_placement(5, floors) == ["a@v1", "b@v2", "b@v2", "c@v1", "c@v1"]


def test_initial_placement_refuses_bounds_the_pool_cannot_fit() -> None:
    with pytest.raises(ValueError, match="min_workers"):
        initial_placement(2, [version("a@v1", min_workers=2), version("b@v1", min_workers=1)])
    with pytest.raises(ValueError, match="max_workers"):
        initial_placement(3, [version("a@v1", max_workers=1), version("b@v1", max_workers=1)])


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="utilization"):
        PlacementSettings(utilization=0.0)
    with pytest.raises(ValueError, match="factor"):
        PlacementSettings(factor=-1.0)
