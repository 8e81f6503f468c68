"""The scaling simulation on a two-minute day with 10 s start-ups: exact and seeded."""

from __future__ import annotations

import dataclasses
import math
from array import array

import pytest

from batcher import Tier
from failover.fleet import ScalerSettings
from loadtest.sim_scaling import (
    POLICIES,
    Arrivals,
    Outcome,
    Pool,
    Trace,
    arrivals,
    run_all,
    simulate,
)
from loadtest.sim_scaling import Oracle as OraclePolicy
from loadtest.sim_scaling_report import table, verdicts

DAY = Trace(low=100, peak=2_000, duration_s=120, burst_at_s=42, burst_s=6, seed=3)
START_S = 10.0
TICK_S = 0.001


@pytest.fixture(scope="module")
def day() -> Arrivals:
    return arrivals(DAY)


@pytest.fixture(scope="module")
def by(day: Arrivals) -> dict[str, Outcome]:
    return {o.policy: o for o in run_all(day, start_s=START_S)}


def test_the_day_follows_its_rate_and_its_paid_share(day: Arrivals) -> None:
    expected = sum(day.rates) * TICK_S
    paid, free = (sum(c) for c in day.counts)
    assert abs(paid + free - expected) < 4 * math.sqrt(expected)
    assert abs(paid / (paid + free) - DAY.paid_share) < 0.01
    assert day.top == pytest.approx(DAY.rate(DAY.burst_at_s + DAY.burst_s - TICK_S), 1e-3)
    assert day.top > 1.5 * DAY.peak  # the burst near the peak tops it
    assert arrivals(DAY).counts == day.counts
    assert arrivals(dataclasses.replace(DAY, seed=4)).counts != day.counts


def test_every_request_is_answered_refused_or_dropped(day: Arrivals,
                                                      by: dict[str, Outcome]) -> None:
    assert set(by) == set(POLICIES)
    for o in by.values():
        for tier in Tier:
            answered = sum(o.latency[tier])
            assert answered + o.refused[tier] + o.dropped[tier] == sum(day.counts[tier])
        assert min(h for h, n in enumerate(o.latency[Tier.PAID]) if n) * TICK_S >= 0.1


def test_fixed_pools_refuse_nothing_and_pay_for_every_second(by: dict[str, Outcome]) -> None:
    for name in ("fixed-peak", "fixed-fewest"):
        o = by[name]
        assert o.refused == [0, 0] and o.dropped == [0, 0]
        assert o.over(Tier.PAID) == 0
        assert o.gpu_s == pytest.approx(int(o.workers) * DAY.duration_s)
    assert int(by["fixed-fewest"].workers) < int(by["fixed-peak"].workers)


def test_the_oracle_spends_the_fewest_gpu_seconds_and_holds_the_sla(
    by: dict[str, Outcome],
) -> None:
    oracle = by["oracle"]
    assert all(oracle.gpu_s < o.gpu_s for o in by.values() if o is not oracle)
    assert oracle.over(Tier.PAID) == 0 and oracle.refused == [0, 0]


def test_batchgate_stays_within_bounds_sheds_free_and_keeps_paid_in_budget(
    by: dict[str, Outcome],
) -> None:
    o = by["batchgate"]
    low, high = (int(x) for x in o.workers.split(":"))
    assert low <= 1 < o.peak <= high
    assert o.started > 0
    assert o.over(Tier.PAID) == 0
    assert o.refused[Tier.FREE] > 0  # the day rises faster than 10 s start-ups follow
    assert by["fixed-peak"].gpu_s > o.gpu_s > by["oracle"].gpu_s


def test_every_free_refusal_has_a_retry_after_and_a_measured_wait(
    by: dict[str, Outcome],
) -> None:
    o = by["batchgate"]
    for kind, waits in o.waits.items():
        assert sum(n for *_, n in waits) == o.refused[Tier.FREE], kind
        assert all(r >= 0 and math.isfinite(r) and w >= TICK_S for _, r, w, _ in waits)
        share, median, n = o.retry_fit(kind)
        assert n == o.refused[Tier.FREE] and 0 <= share <= 1 and median > 0


def test_ray_serve_default_counts_a_batch_as_many_ongoing_requests(
    by: dict[str, Outcome],
) -> None:
    # 2 ongoing requests per replica is a target a worker batching 100 at a time always
    # exceeds: Ray's policy asks for the maximum once its 30 s delay has passed.
    o = by["ray-serve-default"]
    high = int(o.workers.split(":")[1])
    assert o.peak == high and o.started == high - 1 and o.stopped == 0
    assert o.refused == [0, 0]  # no door: the queue takes everything
    assert o.over(Tier.PAID) > 0  # one replica through the 30 s delay and the start-up


def test_the_oracle_bridges_a_gap_shorter_than_a_start_up() -> None:
    def oracle(rates: list[tuple[float, float]]) -> OraclePolicy:
        """Rates as (seconds, requests/s) steps."""
        steps = array("d", (r for secs, r in rates for _ in range(round(secs / TICK_S))))
        none = array("i", bytes(4 * len(steps)))
        return OraclePolicy(Arrivals(DAY, (none, none), steps, max(steps)), 0.7, 1, 5,
                            START_S)

    short = oracle([(20, 500), (20, 2_000), (5, 500), (15, 2_000)])  # needs 1, 3, 1, 3
    assert short.initial == 1
    assert list(short.starts) == [10_000, 10_000] and list(short.retires) == []
    long = oracle([(20, 500), (20, 2_000), (15, 500), (15, 2_000)])
    assert list(long.starts) == [10_000, 10_000, 45_000, 45_000]
    assert list(long.retires) == [40_000, 40_000]
    pool = Pool(1, 1)
    for k in range(10_001):
        long.control(pool, (k + 1) * TICK_S, 0, 0)
    assert list(pool.starts) == pytest.approx([10.001 + START_S] * 2)


def test_other_rule_settings_change_the_outcome(day: Arrivals, by: dict[str, Outcome]) -> None:
    settings = ScalerSettings(2, 6, target_utilization=0.5, down_utilization=0.4)
    o = run_all(day, start_s=START_S, settings=settings, names=["batchgate"])[0]
    assert o.workers == "2:6"
    assert o.gpu_s > by["batchgate"].gpu_s
    assert o.refused[Tier.FREE] < by["batchgate"].refused[Tier.FREE]


def test_the_report_has_a_row_per_policy_and_a_verdict_per_target(
    by: dict[str, Outcome],
) -> None:
    outs = list(by.values())
    rows = [line for line in table(outs, markdown=True, trace=DAY).splitlines()
            if line.startswith("| ")]
    assert rows[0].startswith("| policy | workers | GPU-s | x oracle |")
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == list(POLICIES)
    lines = verdicts(outs, trace=DAY)
    assert len(lines) == 9  # two fixed pools, paid over budget, two waits x three phases
    assert all(line.endswith(("holds", "does not hold", "no refusals")) for line in lines)
    assert "paid over budget 0 (target 0): holds" in lines
    plain = table(outs, markdown=False, trace=DAY).splitlines()
    assert len(plain) == 1 + len(POLICIES) and plain[0].startswith("policy")


def test_a_policy_alone_runs_the_same_simulation_again(day: Arrivals,
                                                       by: dict[str, Outcome]) -> None:
    o = simulate(day, OraclePolicy(day, 0.7, 1, int(by["oracle"].workers.split(":")[1]),
                                   START_S), by["oracle"].workers)
    assert o == by["oracle"]



def test_policies_run_in_parallel_to_the_same_outcomes(day: Arrivals,
                                                       by: dict[str, Outcome]) -> None:
    names = ["fixed-fewest", "ray-serve-default"]
    assert run_all(day, start_s=START_S, names=names, jobs=2) == [by[n] for n in names]
