"""The scaling rule plans with what the versions' cores measure a worker to drain: one
version's throughput as it is; several versions' as the capacity per worker that runs their
mix (the demand-weighted harmonic mean). With the real rule, in virtual time: at one steady
load, a version whose batches take three times as long asks for about three times the
workers, one four times as fast for a quarter (down to the floor); a new worker goes to the
version whose demand keeps the most of its workers busy."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from batcher import Throughput
from failover.fleet import (
    Capacity,
    Ledger,
    Scaler,
    ScalerSettings,
    Scaling,
    VersionView,
    pool_throughput,
)
from tests.failover.test_core_throughput import core, run_batches

RATE = 1_260.0  # items/s offered
LOAD_S = 5.0


def view(version: str, throughput: Throughput, rate: float = RATE, **kw: object) -> VersionView:
    base = VersionView(version=version, model=version.split("@")[0], queued=0, paid=0,
                       oldest=math.inf, oldest_deadline=math.inf, rate=rate,
                       last_arrival=0.0, loading=0, load_s=LOAD_S, throughput=throughput,
                       min_workers=0, max_workers=None, idle_unload_s=600.0, retired=False,
                       resident=1)
    return replace(base, **kw)  # type: ignore[arg-type]


def stepped(views: list[VersionView], rate: float = RATE) -> tuple[Capacity, Scaling]:
    """The rule asked after a minute of `rate` items/s offered, a worker up per view."""
    capacity = Capacity(Scaler(ScalerSettings(1, 8, short_window_s=1.0, long_window_s=5.0)))
    for tick in range(600):
        capacity.arrived(round(rate / 10), tick / 10, paid=True)
    return capacity, capacity.step(60.0, len(views), views, [], lambda v: LOAD_S, Ledger())


def asked(views: list[VersionView], rate: float = RATE) -> int:
    """Workers the rule wants after a minute of `rate` items/s."""
    return stepped(views, rate)[0].scaler.desired()


def measured(batch_s: float) -> Throughput:
    """What a version's core measures once batches of 100 items have been answered after
    `batch_s` each."""
    c = core(0.01, max_batch=100)
    run_batches(c, 20, batch_s, size=100)
    return c.throughput()


def test_the_rule_asks_for_workers_by_each_versions_measured_batch_time() -> None:
    slow, contract, fast = measured(0.3), measured(0.1), measured(0.025)
    assert contract.per_worker == pytest.approx(1_000.0)
    wants = {ms: asked([view("m@v1", t)]) for ms, t in
             ((300, slow), (100, contract), (25, fast))}
    assert wants == {300: 6, 100: 2, 25: 1}  # 5.4, 1.8 and 0.45 workers at 70 %


def test_one_version_is_its_own_throughput() -> None:
    t = Throughput(100, 0.3)
    assert pool_throughput([view("a@v1", t)], LOAD_S) == pytest.approx(t.per_worker)


def test_several_versions_weigh_by_the_workers_their_demand_keeps_busy() -> None:
    # 1,000/s of a at 1,000/s a worker and 1,000/s of b at 250/s: 1 + 4 workers for 2,000/s.
    views = [view("a@v1", Throughput(100, 0.1), rate=1_000.0),
             view("b@v1", Throughput(100, 0.4), rate=1_000.0)]
    assert pool_throughput(views, LOAD_S) == pytest.approx(2_000 / 5)
    assert asked(views, 2_000.0) == math.ceil(5 / 0.7)


def test_a_queue_weighs_as_the_rule_spreads_it() -> None:
    views = [view("a@v1", Throughput(100, 0.1), rate=0.0),
             view("b@v1", Throughput(100, 0.4), rate=0.0, queued=5_000)]
    assert pool_throughput(views, LOAD_S) == pytest.approx(250.0)


def test_with_no_demand_the_live_versions_weigh_alike() -> None:
    views = [view("a@v1", Throughput(100, 0.1), rate=0.0),
             view("b@v1", Throughput(100, 0.4), rate=0.0),
             view("c@v1", Throughput(100, 0.025), rate=0.0, retired=True)]
    assert pool_throughput(views, LOAD_S) == pytest.approx(2 / (1 / 1_000 + 1 / 250))


def test_a_new_worker_goes_where_demand_keeps_the_most_workers_busy() -> None:
    # a offers more items, but b's 600/s keep 2.4 of its slower workers busy, a's 1,000/s one.
    views = [view("a@v1", Throughput(100, 0.1), rate=1_000.0),
             view("b@v1", Throughput(100, 0.4), rate=600.0)]
    _, scaling = stepped(views, 1_600.0)
    assert scaling.grow == ["b@v1"] * 3  # 3.4 workers busy at 70 %: 5 in all
