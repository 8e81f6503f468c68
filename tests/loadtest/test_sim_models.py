"""The placement simulation, briefly: a minute of simulated traffic per run (exact, seeded)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from failover.fleet.placement import (
    LruOnDemand,
    Placement,
    Switch,
    SwitchCost,
    VersionView,
    WorkerView,
)
from loadtest.sim_models import Outcome, Scenario, main, simulate

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


def run(policy: Placement, rate: float, shift_s: float = 30.0) -> tuple[Outcome, Recording]:
    recording = Recording(policy)
    return simulate(Scenario(rate, shift_s, duration_s=MINUTE), recording), recording


@pytest.mark.parametrize("policy", [SwitchCost, LruOnDemand])
def test_every_item_is_answered_or_counted_failed_and_every_load_counted(
    policy: type[SwitchCost] | type[LruOnDemand],
) -> None:
    outcome, recording = run(policy(), 2_000.0)
    assert outcome.arrivals > 0.9 * 2_000 * MINUTE
    assert outcome.answered + outcome.failed == outcome.arrivals
    assert sum(len(lat) for lat in outcome.latencies) == outcome.answered
    assert outcome.loads == len(recording.switches)
    assert outcome.load_s == pytest.approx(outcome.loads * 2.0)
    assert 0 < outcome.largest_batch <= 100


def test_no_answer_comes_sooner_than_one_batch() -> None:
    outcome, _ = run(SwitchCost(), 400.0)
    assert min(lat[0] for lat in outcome.latencies) >= 0.1 - 1e-9


def test_switch_cost_loads_a_tenth_of_what_lru_loads_on_the_shifting_split() -> None:
    ours, _ = run(SwitchCost(), 400.0)
    lru, _ = run(LruOnDemand(), 400.0)
    assert lru.loads >= 10  # the baseline thrashes here, so the comparison means something
    assert ours.loads * 10 <= lru.loads
    assert ours.failed == 0


def test_switch_cost_follows_the_hot_model_when_it_moves() -> None:
    # At 2,000/s the hot model needs two workers; after the shift at 30 s, one must move.
    outcome, recording = run(SwitchCost(), 2_000.0)
    assert [s.to for s in recording.switches] == ["m2@v1"]
    assert recording.switches[0].reason == "demand"
    assert outcome.failed == 0
    assert outcome.percentile(1, 0.95) < 2.0  # the hot model's backlog drained well in time


def test_the_command_prints_a_markdown_table_and_the_verdicts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--duration", "20", "--rates", "400", "--markdown"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| policy | scenario |")
    assert len(rows) == 1 + 4  # two scenarios, two policies
    assert sum(1 for line in out.splitlines() if line.startswith("- ")) == 2
