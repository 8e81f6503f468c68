"""A cell's core SIGKILLed while keyed requests run on its workers: every request is
answered right, no keyed input reaches the model twice, and the next core attaches to the
workers the last one left running instead of reloading them (issue 40, item 5;
`loadtest.hostile_core_death` offers the load and reads the model's run log)."""

from __future__ import annotations

import pytest

from loadtest.hostile_core_death import DeathRun, measure, report

pytestmark = pytest.mark.e2e


@pytest.fixture
def gateways() -> int:
    """Only a cell has a core process of its own: no single-process variant."""
    return 2


def assert_survived(run: DeathRun) -> None:
    why = report(run, expect_attach=True)
    assert set(run.answers) == {"200"} and not run.wrong, why
    assert run.answers["200"] == 150, why  # 30 requests a second for 5 s
    assert run.twice("k-") == 0, why
    assert len(run.kills) == 1, why
    assert run.kills[0].pids_before and run.kills[0].attached, why


@pytest.mark.parametrize("state", ["memory", "sqlite"])
def test_keyed_requests_run_once_and_workers_outlive_a_killed_core(state: str) -> None:
    assert_survived(measure(state=state, rps=30, duration=5, kills=1, every=2, workers=2))
