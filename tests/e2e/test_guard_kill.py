"""A guard's workers all killed under load (issue 36), on a real server in one process and in a
cell: `loadtest.hostile_guard_kill` at a small rate and a short outage."""

from __future__ import annotations

import pytest

from loadtest.hostile_guard_kill import WITHIN_S, measure

pytestmark = pytest.mark.e2e


# Each mode in one shape (the stages are the core's, the same behind one gateway or two):
# closed in one process, open in a cell; the script runs all four (docs/guards.md).
@pytest.mark.parametrize("gateways", [pytest.param(1, id="gateways=1")], indirect=True)
def test_closed_answers_guard_unavailable_and_nothing_unguarded_runs(gateways: int) -> None:
    run = measure("closed", gateways, rps=20, duration=8, outage_at=1.5, outage_s=2)
    failed = run.failed()
    assert failed, run.answers  # the outage's answers show the guard down: 503s
    assert max(a.latency_s for a in failed) < WITHIN_S
    assert not [a for a in run.answers if "BLOCKME" in a.text and a.code == "200"]
    assert run.blocked_ran() == []  # no input the guard did not allow reached the model
    assert run.recovery_s() is not None
    assert run.problems() == []


@pytest.mark.parametrize("gateways", [pytest.param(2, id="gateways=2")], indirect=True)
def test_open_lets_inputs_through_marked_skipped_and_recovers(gateways: int) -> None:
    run = measure("open", gateways, rps=20, duration=8, outage_at=1.5, outage_s=2)
    failed = run.failed()
    assert failed and all(a.code == "200" and a.skipped == "safety" for a in failed)
    assert max(a.latency_s for a in failed) < WITHIN_S
    skipped = {a.text for a in run.answers if a.skipped}
    assert run.blocked_ran() and set(run.blocked_ran()) <= skipped  # open: they ran, marked
    assert run.recovery_s() is not None
    assert run.problems() == []
