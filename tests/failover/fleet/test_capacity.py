"""The pool's size following the load, worked cases in exact virtual time: `ModelCores` with
a `Capacity` on the world of `scaled_world` (the real owner carrying out grow, retire and
take-back on the contract pool, the world checking each).

One model on 1 to 4 workers (`--workers 1:4`): a step in load grows the pool at once by what
the rule says; while the workers start, free is refused with the Retry-After at which its
tier fits on the capacity coming and paid is admitted when its budget fits on it; once they
are up the refusals stop; when the load drops, workers leave one at a time after the delay,
pending starts first. A worker lost is restarted, not replaced twice; a failed start is
retried after the backoff. Two models: a new worker goes where demand per worker is highest,
within max_workers; a retirement never takes a model below min_workers.

The last cases pin bugs found here, fixed since.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import pytest

from batcher import RateMeter, Tier
from batcher.admission import capacity_wait
from batcher.errors import OverBudget
from failover.fleet.capacity import STEP_S
from failover.fleet.catalogue import Catalogue
from failover.fleet.failing import FAILED_LOADS
from gpu_pool import WorkerId
from tests.failover.fleet.driver import LATENCY, MAX_BATCH
from tests.failover.fleet.scaled_world import (
    BACKOFF,
    CAPACITY,
    SCALED,
    ScaledWorld,
    backoff,
    scaling,
)

V = "m@v1"
LOAD_S = 2.0
RULE = scaling(1, 4)
OFFER_TAU = RateMeter().tau  # the batcher meters what is offered over this


def catalogue(**models: dict[str, Any]) -> Catalogue:
    return Catalogue.from_dict({"models": models})


def model(load_s: float = LOAD_S, **kw: Any) -> dict[str, Any]:
    return {"versions": {"v1": {"spec": "sim", "load_s": load_s}}, **kw}


def one(load_s: float = LOAD_S, workers: int = 1, **kw: Any) -> ScaledWorld:
    """One model, `--workers 1:4`, started with `workers`."""
    return ScaledWorld(catalogue(m=model(load_s, **kw)), workers, scaling=RULE)


def stepped(load_s: float = LOAD_S) -> ScaledWorld:
    """9 items/s for 10 s on one worker, then 150 (a fifth paid) until the rule's next
    look at 11 s."""
    w = one(load_s)
    w.offer(10.0, free=7, paid=2)
    assert w.grown == []
    w.offer(11.0, free=120, paid=30)
    return w


def quote(w: ScaledWorld, tier: Tier, items: int = 1, joining: bool = True) -> float:
    """The Retry-After a refusal of `tier` should carry if asked now (`Admission.check`):
    the time until a request like it fits its budget on the capacity curve (`capacity_wait`)
    of the workers up and, with `joining`, those on their way, paid arrivals overtaking a
    free one; and while what this tier and those above offer (this request too) is more
    than the workers up run, no sooner than the ones on their way cover it."""
    core, fixed = w.core(V), LATENCY / MAX_BATCH
    demand, workers = core.demand(w.now), w.resident(V)
    ahead = (demand.paid if tier is Tier.PAID else demand.queued) * fixed
    own = (items - 1) * fixed
    paid = w.paid_rates.get(V)
    used = paid.rate(w.now) * fixed if tier is Tier.FREE and paid is not None else 0.0
    curve = [max(0.0, t - w.now) for t in core.joining] if joining else []
    expected = capacity_wait(ahead + own, workers, curve, used) + LATENCY
    drained = capacity_wait(ahead, workers, curve, used)
    retry = min(max(0.0, expected - SCALED.budgets[tier]), drained)
    offered = sum(m.rate(w.now) for (v, t), m in w.offered.items() if v == V and t <= tier)
    need = (offered + items / OFFER_TAU) * fixed  # worker-seconds a second, this one too
    if curve and need > workers:
        retry = max(retry, curve[min(math.ceil(need - workers - 1e-9), len(curve)) - 1])
    return retry


# -- one model: up -------------------------------------------------------------------------

def test_a_step_in_load_grows_the_pool_at_once_by_what_the_rule_says() -> None:
    w = stepped()
    decided = w.scaler.decided[-1]
    assert (decided.now, decided.running, decided.start_s) == (11.0, 1, LOAD_S)
    assert decided.queued == w.core(V).demand(w.now).queued
    need = math.ceil(w.scaler.predicted(w.now, decided.queued, LOAD_S)
                     / (CAPACITY * RULE.target_utilization))
    assert decided.decision.up == min(need, RULE.max_workers) - 1 == 3
    assert w.grown == [(11.0, V)] * 3
    assert w.made[V].joining == (11.0 + LOAD_S,) * 3


def test_while_workers_start_free_is_refused_until_its_capacity_is_up() -> None:
    w = stepped()
    eta = 11.0 + LOAD_S
    quoted: list[tuple[float, float, float]] = []  # when, Retry-After, as computed
    while w.now < eta - 0.05:
        w.run(w.now + 0.02)
        w.submit(None, 1, Tier.PAID)
        for _ in range(3):
            want = quote(w, Tier.FREE)
            refused = w.submit(None, 1, Tier.FREE)
            if not isinstance(refused, list):
                assert isinstance(refused, OverBudget), refused
                quoted.append((w.now, refused.retry_after, want))
    assert len(quoted) > 100
    assert all(math.isclose(got, want, abs_tol=1e-9) for _, got, want in quoted), quoted
    # Offered more than the four workers run: come back when the last of them is up.
    early = [(now, got) for now, got, _ in quoted if now < eta - 0.5]
    assert early and all(math.isclose(got, eta - now, abs_tol=1e-9) for now, got in early)


def test_while_workers_start_paid_is_admitted_when_its_budget_fits_on_them() -> None:
    w = stepped()
    w.offer(11.0 + LOAD_S - 0.3, free=120, paid=30)
    # 30 items are 0.75 worker-seconds: over the paid budget on the one worker up, within
    # it on four from 0.3 s on.
    alone = capacity_wait(29 * LATENCY / MAX_BATCH + quote_ahead(w), w.resident(V)) + LATENCY
    assert alone > SCALED.budgets[Tier.PAID]
    items = w.submit(None, 30, Tier.PAID)
    assert isinstance(items, list), items
    refused = w.submit(None, 1, Tier.FREE)
    assert isinstance(refused, OverBudget)
    # It is told to come back once the workers coming drain what is ahead of it, sooner
    # than the one worker up alone would.
    assert math.isclose(refused.retry_after, quote(w, Tier.FREE), abs_tol=1e-9)
    assert refused.retry_after < quote(w, Tier.FREE, joining=False)
    w.run(w.now + 1.0)
    assert all(isinstance(r, str) for r in w.answers(items))


def quote_ahead(w: ScaledWorld) -> float:
    """Worker-seconds of paid work queued now."""
    return w.core(V).demand(w.now).paid * LATENCY / MAX_BATCH


def test_once_the_workers_are_up_the_refusals_stop() -> None:
    w = stepped()
    w.offer(11.0 + LOAD_S, free=90, paid=30)
    assert w.refusals, "the step was refused in part while capacity came"
    w.offer(11.0 + LOAD_S + 0.5, free=90, paid=30)
    settled = len(w.refusals)
    w.offer(30.0, free=90, paid=30)
    assert len(w.refusals) == settled
    assert len(w.slots) == w.resident(V) == 4 and w.made[V].joining == ()


# -- one model: down -----------------------------------------------------------------------

def test_after_the_load_drops_workers_leave_one_at_a_time_after_the_delay() -> None:
    w = stepped()
    w.offer(20.0, free=90, paid=30)
    w.offer(60.0, free=7, paid=2)
    times = [t for t, _, _ in w.retirements]
    assert len(times) == 3 and len(w.slots) == w.resident(V) == 1
    assert times[0] >= 20.0 + RULE.scale_down_delay_s
    assert all(b - a >= RULE.down_step_s for a, b in pairwise(times))
    downs = [d for d in w.scaler.decided if d.decision.down]
    assert [d.now for d in downs] == times  # each decision carried out, one worker each
    assert w.cancels == []
    assert w.capacity.events[("down", "idle")] == 3


def test_a_start_still_on_its_way_is_taken_back_before_a_worker_leaves() -> None:
    """Start-ups longer than the load lasts: the starts are taken back, one a decision,
    while no worker that serves leaves."""
    w = stepped(load_s=30.0)
    w.offer(60.0, free=2, paid=1)
    assert [v for _, v in w.cancels] == [V] * 3 and w.retirements == []
    downs = [d.now for d in w.scaler.decided if d.decision.down]
    assert [t for t, _ in w.cancels] == downs and downs[-1] < 11.0 + 30.0
    assert len(w.slots) == w.resident(V) == 1 and w.made[V].joining == ()
    assert tuple(w.cores.starts()) == ()


def test_when_the_pool_shrinks_a_restart_pending_goes_before_a_serving_worker() -> None:
    def dropped(until: float) -> ScaledWorld:
        w = stepped()
        w.offer(20.0, free=90, paid=30)
        w.offer(until, free=7, paid=2)
        return w

    probe = dropped(40.0)
    first = probe.retirements[0][0]
    w = dropped(first - LOAD_S / 2)
    w.die(w.slots[-1].worker)
    w.report_deaths()  # its slot restarts: a start on its way when the pool shrinks
    w.offer(60.0, free=7, paid=2)
    assert [v for _, v in w.cancels] == [V] and len(w.retirements) == 2
    assert w.cancels[0][0] < w.retirements[0][0]
    assert len(w.slots) == w.resident(V) == 1


# -- one model: deaths and failed starts ---------------------------------------------------------

def test_a_worker_lost_while_serving_is_restarted_not_replaced_twice() -> None:
    w = one(workers=2)
    w.offer(10.0, free=30, paid=10)  # two workers' worth at the target utilization
    assert w.grown == [] and w.scaler.desired() == 2
    w.die(w.slots[1].worker)
    w.report_deaths()
    eta = w.now + LOAD_S
    assert w.made[V].joining == (eta,)
    w.offer(eta - 0.01, free=30, paid=10)
    assert w.grown == [] and [s.eta for s in tuple(w.cores.starts())] == [eta]
    w.offer(eta + 3.0, free=30, paid=10)
    assert w.grown == [] and len(w.slots) == w.resident(V) == 2
    assert w.made[V].joining == ()


def test_a_failed_start_is_retried_after_the_backoff_and_its_eta_moves_out() -> None:
    """Its ETA moves out by the backoff; once the version's loads have failed FAILED_LOADS
    times in a row no capacity is said to be coming (the start still tries)."""
    w = stepped()
    slot = next(s for s in w.slots if s.counted)
    for failures in range(1, FAILED_LOADS + 1):
        w.run(w.now + 0.25)
        w.load_failed(slot)
        eta = w.now + backoff(failures) + LOAD_S
        if failures < FAILED_LOADS:
            assert max(w.made[V].joining) == pytest.approx(eta)
        else:
            assert w.made[V].joining == (), "loads that keep failing promised as capacity"
        assert tuple(w.cores.starts())[-1].failures == failures
    assert backoff(3) == 4 * BACKOFF.first
    w.offer(eta - 0.01, free=90, paid=30)
    assert w.grown == [(11.0, V)] * 3, "a failed start asks for no second worker"
    assert slot.state == "loading"
    w.offer(eta + 0.5, free=90, paid=30)
    assert slot.state == "up" and tuple(w.cores.starts()) == ()


# -- two models ----------------------------------------------------------------------------

def two(b_max: int | None = None, min_workers: int = 1) -> ScaledWorld:
    """Models a and b on one worker each, a pool of 2 to 4."""
    b = model(min_workers=min_workers) if b_max is None else model(
        min_workers=min_workers, max_workers=b_max)
    w = ScaledWorld(catalogue(a=model(min_workers=min_workers), b=b), 2,
                    scaling=scaling(2, 4))
    assert [s.version for s in w.slots] == ["a@v1", "b@v1"]
    return w


def test_a_new_worker_holds_the_version_with_most_demand_per_worker() -> None:
    w = two()
    w.offer(5.0, free=4, paid=1, model="a")
    w.offer(6.0, free=80, paid=20, model="b")
    assert [v for _, v in w.grown] == ["b@v1"] * 2


def test_a_model_grows_no_further_than_its_max_workers() -> None:
    w = two(b_max=2)
    w.offer(5.0, free=4, paid=1, model="a")
    w.offer(6.0, free=80, paid=20, model="b")
    assert [v for _, v in w.grown] == ["b@v1", "a@v1"]
    assert w.on_model("b") == 2


def test_a_worker_leaves_from_a_model_above_its_min_workers_only() -> None:
    """a is idle and has the least demand, yet its only worker stays."""
    w = two()
    w.offer(2.0 + LOAD_S, free=80, paid=20, model="b")
    assert [v for _, v in w.grown] == ["b@v1"] * 2 and w.resident("b@v1") == 3
    w.offer(60.0, free=4, paid=1, model="b")
    assert [v for *_, v in w.retirements] == ["b@v1"] * 2
    assert w.resident("a@v1") == 1 and w.resident("b@v1") == 1


# -- bugs found here, fixed ------------------------------------------------------------------------

def test_a_worker_retired_as_it_died_is_counted_when_its_slot_restarts() -> None:
    def calmed() -> ScaledWorld:
        w = stepped()
        w.offer(20.0, free=90, paid=30)
        w.offer(28.0, free=7, paid=2)
        return w

    probe = calmed()
    while not probe.retirements:
        probe.run(probe.now + STEP_S)
    first, worker, _ = probe.retirements[0]
    w = calmed()
    w.run(first - 0.01)
    w.die(worker)  # and the owner takes its turn at `first` before the pool hears of it
    w.advance(first, hear=False)
    w.turn()
    assert w.retirements == [(first, worker, V)]
    w.report_deaths()  # the pool restarts it: a start the rule must count
    w.check_capacity()


def test_placement_sends_no_worker_to_a_version_whose_added_workers_load() -> None:
    w = ScaledWorld(catalogue(a=model(0.4), b=model(0.8, min_workers=0, max_workers=2)),
                    1, scaling=scaling(1, 4, short_window_s=0.5, long_window_s=2.0))
    w.offer(3.0, free=60, paid=5, model="b")  # b grows by 2, a by 1; a's is up first
    assert w.on_model("b") <= 2


def test_a_restart_counts_once_against_max_workers() -> None:
    w = one(workers=2, max_workers=3)
    w.die(w.slots[1].worker)
    w.report_deaths()
    w.offer(2.0 + 1e-6, free=100, paid=20)
    up = [d for d in w.scaler.decided if d.decision.up]
    assert up and up[0].decision.up == 2  # the rule asks for two; max_workers 3 lets one in
    assert w.grown == [(up[0].now, V)] and len(w.slots) == 3


def test_a_start_taken_back_never_leaves_a_model_below_min_workers() -> None:
    def grown() -> ScaledWorld:
        w = two()
        w.offer(3.0, free=80, paid=20, model="a")
        return w

    probe = grown()
    while not probe.retirements:
        probe.run(probe.now + STEP_S)
    first = probe.retirements[0][0]
    w = grown()
    w.run(first - 0.5)
    b = next(s for s in w.slots if s.version == "b@v1")
    w.die(b.worker)
    w.report_deaths()
    w.run(first + 0.1)  # the world checks b's floor as the start is taken back


def test_a_restart_and_a_switch_of_one_version_are_each_counted_once() -> None:
    w = ScaledWorld(catalogue(a=model(0.4), b=model(0.8, min_workers=0, max_workers=2,
                                                   idle_unload_s=3)),
                    1, scaling=scaling(1, 4, short_window_s=0.5, long_window_s=2.0,
                                       scale_down_delay_s=2.0, down_step_s=0.5))
    w.offer(2.0, free=0, paid=40, model="b")
    w.run(w.now + 3.0)
    switch = next(s for s in w.slots if s.state == "loading")
    assert switch.version == "a@v1" and not switch.counted
    w.die(WorkerId(1))  # a's worker dies: its slot restarts a while the switch loads it
    w.report_deaths()
    restart = next(s for s in w.slots if s.counted)
    w.ready(restart)  # each ready names the start it ends: the restart's, not the switch's
    w.ready(switch)
    w.check_capacity()  # once both are up, each counted once
