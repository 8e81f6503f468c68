"""`--workers 1:8` under one steady load, on real servers whose batches take 25, 100 and
300 ms: the scaling rule plans with what a worker really drains (each version's measured
throughput), so the slower the batch, the more workers it asks for.

The order is asserted, not the figures: those are `python -m loadtest.scale_latency`'s (at
this load, 1, 2 and 6 workers; the rule's windows follow `--scale-down-delay-s`, short here).
"""

from __future__ import annotations

import pytest

from loadtest.scale_latency import LatencyPlan, LatencyRun, run_all

pytestmark = pytest.mark.e2e
PLAN = LatencyPlan(seconds=10.0, tail_s=4.0)


@pytest.fixture
def gateways() -> int:
    """One process per server: a cell's gateways would take the generator's CPU."""
    return 1


@pytest.fixture(scope="module")
def runs() -> dict[float, LatencyRun]:
    return {r.batch_ms: r for r in run_all(PLAN, [25.0, 100.0, 300.0])}


def test_the_load_was_offered_and_answered(runs: dict[float, LatencyRun]) -> None:
    for r in runs.values():
        assert r.probe.sent >= 0.9 * PLAN.rps * PLAN.seconds, r.batch_ms
        assert (r.probe.lost, r.probe.wrong) == (0, 0), r.batch_ms


def test_slower_batches_ask_for_more_workers_at_the_same_load(
    runs: dict[float, LatencyRun],
) -> None:
    shown = {ms: (r.desired, r.tail()) for ms, r in runs.items()}
    assert runs[300.0].desired > runs[100.0].desired > runs[25.0].desired, shown
