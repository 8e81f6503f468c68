"""The placement simulation, briefly: a minute of simulated traffic per run on the real core
(exact, seeded), `SwitchCost` against LRU-on-demand plugged in as the core's placement."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from batcher import Tier
from failover import CoreSettings
from failover.fleet import (
    LruOnDemand,
    Placement,
    Switch,
    SwitchCost,
    VersionView,
    WorkerView,
)
from failover.sim import Outcome, simulate
from loadtest.sim_models import Scenario, host_kinds, main, run

MINUTE = 60.0


class Recording:
    """A placement that records every switch the policy it wraps returns."""

    def __init__(self, policy: Placement) -> None:
        self.policy = policy
        self.switches: list[Switch] = []

    def decide(self, now: float, workers: Sequence[WorkerView],
               versions: Sequence[VersionView]) -> list[Switch]:
        out = self.policy.decide(now, workers, versions)
        self.switches.extend(out)
        return out

    def next_check(self, now: float, workers: Sequence[WorkerView],
                   versions: Sequence[VersionView]) -> float:
        return self.policy.next_check(now, workers, versions)


def recorded(policy: Placement, rate: float, shift_s: float = 30.0,
             budget: float | None = None, duration_s: float = MINUTE
             ) -> tuple[Outcome, Recording]:
    recording = Recording(policy)
    world = Scenario(rate, shift_s, duration_s=duration_s).world(lambda: recording)
    if budget is not None:
        world = dataclasses.replace(world, core=CoreSettings(dict.fromkeys(Tier, budget)))
    return simulate(world), recording


@pytest.mark.parametrize("policy", [SwitchCost, LruOnDemand])
def test_every_request_is_answered_or_counted_and_every_load_counted(
    policy: type[SwitchCost] | type[LruOnDemand],
) -> None:
    outcome, recording = recorded(policy(), 400.0)
    every = outcome.tally()
    assert every.offered > 0.9 * 400 * MINUTE and every.unanswered == 0
    assert every.answered + sum(every.refused.values()) + sum(every.failed.values()) == \
        every.offered
    assert outcome.loads_total == len(recording.switches) == outcome.pool.switches
    assert outcome.pool.switch_s == pytest.approx(outcome.loads_total * 2.0)
    assert 0 < outcome.pool.fill <= 100  # the pool itself refuses a batch past the contract


def test_no_answer_comes_sooner_than_one_batch() -> None:
    result = run(Scenario(400.0, 30.0, duration_s=MINUTE), "switch-cost")
    assert min(result.model(i).percentile(0.0) for i in range(3)) >= 0.1 - 1e-9


def test_switch_cost_loads_a_tenth_of_what_lru_loads_on_the_shifting_split() -> None:
    scenario = Scenario(400.0, 30.0, duration_s=MINUTE)
    ours, lru = run(scenario, "switch-cost"), run(scenario, "lru-on-demand")
    assert lru.loads >= 10  # the baseline thrashes here, so the comparison means something
    assert ours.loads * 10 <= lru.loads
    assert ours.failed == 0


def test_switch_cost_follows_the_hot_model_when_admission_does_not_hide_it() -> None:
    # At 2,000/s the hot model needs two workers; after the shift at 30 s, one must move.
    # With the budget past reach, the queue shows the demand.
    outcome, recording = recorded(SwitchCost(), 2_000.0, budget=5.0)
    assert [s.to for s in recording.switches] == ["m2@v1"]
    assert recording.switches[0].reason == "demand"
    assert outcome.tally().failed == {} and outcome.tally().refused == {}
    assert outcome.tally(model="m2").percentile(0.95) < 2.0  # its backlog drained in time


def test_switch_cost_follows_the_hot_model_under_the_paid_budget() -> None:
    outcome, recording = recorded(SwitchCost(), 2_000.0, duration_s=40.0)
    assert [s.to for s in recording.switches] == ["m2@v1"]
    assert outcome.tally(model="m2").refused["OverBudget"] < 3_000  # while it loads


def test_the_command_prints_a_markdown_table_and_the_verdicts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--duration", "20", "--rates", "400", "--markdown"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| policy | scenario |")
    assert len(rows) == 1 + 4  # two scenarios, two policies
    assert sum(1 for line in out.splitlines() if line.startswith("- ")) == 2


def test_with_kinds_a_switch_back_wakes_the_parked_worker_and_any_other_forks() -> None:
    kinds = host_kinds(2.0)  # a 120 s host's shares of its spawn, of a 2 s switch
    assert (kinds.fork_s, kinds.wake_s, kinds.parked_max) == pytest.approx(
        (2.0 * 0.30 / 6.5, 2.0 / 60, 2))
    scenario = Scenario(400.0, 30.0, duration_s=MINUTE)
    today = run(scenario, "lru-on-demand")
    parked = run(dataclasses.replace(scenario, kinds=kinds), "lru-on-demand")
    assert (today.outcome.pool.forks, today.outcome.pool.wakes) == (0, 0)
    pool = parked.outcome.pool
    assert pool.spawns == scenario.workers  # the first slots; every switch wakes or forks
    assert pool.wakes > 0 and pool.forks > 0 and pool.wakes + pool.forks == pool.switches
    assert kinds.fork_s is not None and kinds.wake_s is not None
    assert pool.switch_s == pytest.approx(pool.forks * kinds.fork_s + pool.wakes * kinds.wake_s)
    assert parked.lost_share < today.lost_share


def test_the_command_with_kinds_prints_the_rotating_split_started_both_ways(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--kinds", "--duration", "20", "--rates", "400", "--markdown"]) == 0
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")]
    assert rows[0][:6] == ["| policy", "scenario", "items/s", "starts", "loads/min",
                           "wakes/min"]
    assert [(r[0][2:], r[1], r[3]) for r in rows[1:]] == [
        (p, "80/15/5 rotating every 30 s", s) for p in ("switch-cost", "lru-on-demand")
        for s in ("spawn", "fork+wake")]
    assert "a fork 0.092 s, a wake 0.033 s, parked at most 2" in out
