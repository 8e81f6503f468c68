"""The scaling simulation on a one-minute day with 5 s start-ups, on the real core: exact
and seeded."""

from __future__ import annotations

import dataclasses

import pytest

from batcher import Tier
from failover.fleet import ScalerSettings
from failover.sim import Outcome
from loadtest import sim_scaling_report as report
from loadtest.sim_rules import Oracle
from loadtest.sim_scaling import (
    BUDGET,
    CAPACITY,
    POLICIES,
    HostStarts,
    Result,
    Trace,
    run,
    run_all,
    run_kinds,
)
from loadtest.sim_scaling_report import table, verdicts

DAY = Trace(low=50, peak=1_000, duration_s=60, burst_at_s=21, burst_s=3, start_s=5,
            scale_down_delay_s=10, seed=3)


def figures(o: Outcome) -> tuple[object, ...]:
    """Everything but the real time it took (latencies in order: `percentile` sorts them)."""
    tallies = [(t.offered, sorted(t.latencies), t.refused, t.failed, t.unanswered)
               for t in o.tallies]
    return dataclasses.replace(o, wall_s=0.0, tallies=()), tallies


@pytest.fixture(scope="module")
def by() -> dict[str, Result]:
    return {r.policy: r for r in run_all(DAY)}


def test_every_request_is_answered_refused_or_dropped(by: dict[str, Result]) -> None:
    assert set(by) == set(POLICIES)
    offered = [by["oracle"].tier(t).offered for t in Tier]
    for r in by.values():
        for tier in Tier:
            t = r.tier(tier)
            assert t.answered + sum(t.refused.values()) + sum(t.failed.values()) \
                + t.unanswered == t.offered
        assert [r.tier(t).offered for t in Tier] == offered  # the same arrivals
        assert r.tier(Tier.PAID).percentile(0.0) >= 0.1 - 1e-9


def test_fixed_pools_pay_for_every_second(by: dict[str, Result]) -> None:
    for name in ("fixed-peak", "fixed-fewest"):
        o = by[name].outcome
        assert o.pool.gpu_s == pytest.approx(int(by[name].workers) * DAY.duration_s)
        assert (o.pool.started, o.pool.stopped) == (0, 0)
    assert int(by["fixed-fewest"].workers) < int(by["fixed-peak"].workers)
    peak = by["fixed-peak"].outcome
    assert sum(peak.tally().refused.values()) == 0
    assert by["fixed-peak"].tier(Tier.PAID).over(BUDGET[Tier.PAID]) == 0


def test_the_oracle_spends_the_fewest_gpu_seconds_and_holds_the_sla(
    by: dict[str, Result],
) -> None:
    oracle = by["oracle"].outcome
    assert all(oracle.pool.gpu_s < r.outcome.pool.gpu_s for r in by.values()
               if r.policy != "oracle")
    assert by["oracle"].tier(Tier.PAID).over(BUDGET[Tier.PAID]) == 0


def test_batchgate_stays_within_bounds_and_keeps_paid_in_budget(
    by: dict[str, Result],
) -> None:
    r = by["batchgate"]
    low, high = (int(x) for x in r.workers.split(":"))
    assert low <= 1 < r.outcome.pool.peak <= high
    assert r.outcome.pool.started > 0 and r.outcome.scaling[("up", "demand")] > 0
    assert r.tier(Tier.PAID).over(BUDGET[Tier.PAID]) == 0
    assert by["fixed-peak"].outcome.pool.gpu_s > r.outcome.pool.gpu_s \
        > by["oracle"].outcome.pool.gpu_s


def test_ray_serve_default_counts_a_batch_as_many_ongoing_requests(
    by: dict[str, Result],
) -> None:
    # 2 ongoing requests per replica is a target a worker batching 100 at a time always
    # exceeds: Ray's policy asks for the maximum once its 30 s delay has passed, and its
    # 600 s downscale delay outlasts the day.
    r = by["ray-serve-default"]
    high = int(r.workers.split(":")[1])
    assert r.outcome.pool.peak == high and r.outcome.pool.started == high - 1
    assert r.outcome.pool.stopped == 0
    assert sum(r.outcome.tally().refused.values()) == 0  # no door: the queue takes everything
    assert r.tier(Tier.PAID).over(BUDGET[Tier.PAID]) > 0


def test_the_oracle_bridges_a_gap_shorter_than_a_start_up() -> None:
    def oracle(steps: list[tuple[float, float]]) -> Oracle:
        """Rates as (until seconds, requests/s) steps; capacity 1,000/s a worker at 0.7."""
        def rate(t: float) -> float:
            return next(r for until, r in steps if t < until)

        return Oracle(rate, steps[-1][0], CAPACITY, ScalerSettings(1, 5), 10.0)

    short = oracle([(20, 500), (40, 2_000), (45, 500), (60, 2_000)])  # needs 1, 3, 1, 3
    assert [short.held(t) for t in (0, 9.9, 10.1, 44, 50, 59)] == [1, 1, 3, 3, 3, 3]
    long = oracle([(20, 500), (40, 2_000), (55, 500), (70, 2_000)])
    assert [long.held(t) for t in (0, 10.1, 39.9, 40.1, 45.1, 60)] == [1, 3, 3, 1, 3, 3]
    assert long.next_check(10.5, 0) == pytest.approx(40.0)


def test_other_rule_settings_change_the_outcome(by: dict[str, Result]) -> None:
    settings = ScalerSettings(2, 6, target_utilization=0.5, down_utilization=0.4,
                              scale_down_delay_s=10, down_step_s=1)
    r = run(DAY, "batchgate", settings=settings)
    assert r.workers == "2:6"
    assert r.outcome.pool.gpu_s > by["batchgate"].outcome.pool.gpu_s


def test_the_report_has_a_row_per_policy_and_a_verdict_per_target(
    by: dict[str, Result],
) -> None:
    results = list(by.values())
    rows = [line for line in table(results, markdown=True).splitlines()
            if line.startswith("| ")]
    assert rows[0].startswith("| policy | workers | GPU-s | x oracle |")
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == list(POLICIES)
    lines = verdicts(results)
    assert len(lines) == 3  # two fixed pools, paid over budget
    assert all(line.endswith(("holds", "does not hold")) for line in lines)
    assert "paid over budget 0 (target 0): holds" in lines
    plain = table(results, markdown=False).splitlines()
    assert len(plain) == 1 + len(POLICIES) and plain[0].startswith("policy")


def test_a_policy_again_and_in_parallel_runs_to_the_same_outcome(
    by: dict[str, Result],
) -> None:
    names = ["fixed-fewest", "oracle"]
    again = run_all(DAY, names=names, jobs=2)
    assert [figures(r.outcome) for r in again] == [figures(by[n].outcome) for n in names]


def test_start_kinds_run_batchgate_beside_todays_single_kind_against_the_oracle(
    by: dict[str, Result], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    today, fork, wake, oracle = run_kinds(DAY, HostStarts(spawn_s=20.0, fork_s=1.0))
    # The command, on the one-minute day: its 5 s start-up stands for a 20 s spawn (x 4);
    # the runs are the ones above (each simulated once: the suite's time).
    monkeypatch.setattr(report, "Trace", lambda seed, start_s: dataclasses.replace(
        DAY, seed=seed, start_s=start_s))
    asked: list[HostStarts] = []
    monkeypatch.setattr(report, "run_kinds", lambda trace, host, *_: (
        asked.append(host) or (today, fork, wake, oracle)))
    assert report.main(["--kinds", "--spawn-s", "20", "--wake-s", "2", "--markdown"]) == 0
    assert [(h.spawn_s, h.wake_s) for h in asked] == [(20.0, 2.0)]
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")]
    assert rows[0][0] == "| policy" and rows[0][-1] == "spawn/fork/wake |"
    assert [r[0][2:] for r in rows[1:]] == ["batchgate spawn (today)", "batchgate + fork",
                                           "batchgate + fork, wake", "oracle"]
    assert "spawn 20 s -> 5 s; fork 0.92 s" in out and "wake 2 s (weights host-to-GPU) " \
        "-> 0.50 s; parked at most 2" in out

    for r in (today, fork, wake):
        assert r.tier(Tier.PAID).over(BUDGET[Tier.PAID]) == 0
    pool = today.outcome.pool  # every start a spawn, as `run` gives it
    assert (pool.spawns, pool.forks, pool.wakes) == (1 + pool.started, 0, 0)
    assert figures(today.outcome) == figures(by["batchgate"].outcome)
    for r in (fork, wake):  # the first slot spawns; every start the rule adds forks or wakes
        pool = r.outcome.pool
        assert pool.spawns == 1 and pool.forks + pool.wakes == pool.started > 0
    assert fork.outcome.pool.wakes == 0
    assert oracle.policy == "oracle" and oracle.outcome.pool.forks == 0

