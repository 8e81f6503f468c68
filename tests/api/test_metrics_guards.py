"""The guards' counters, as the core's stage code calls them: each verdict by guard and
reason, and each input a guard could not answer by guard and failure mode."""

from __future__ import annotations

from api.metrics import Metrics


def test_verdicts_count_by_guard_and_reason() -> None:
    metrics = Metrics()
    metrics.guard_verdict("safety", "allow", 98)
    metrics.guard_verdict("safety", "toxic")
    metrics.guard_verdict("safety", "toxic")
    metrics.guard_verdict("leak", "allow")
    value = metrics.registry.get_sample_value
    assert value("batchgate_guard_verdicts_total", {"guard": "safety", "reason": "allow"}) == 98
    assert value("batchgate_guard_verdicts_total", {"guard": "safety", "reason": "toxic"}) == 2
    assert value("batchgate_guard_verdicts_total", {"guard": "leak", "reason": "allow"}) == 1


def test_failures_count_by_guard_and_mode() -> None:
    metrics = Metrics()
    metrics.guard_failed("safety", "closed")
    metrics.guard_failed("safety", "open", 3)
    value = metrics.registry.get_sample_value
    assert value("batchgate_guard_failures_total", {"guard": "safety", "mode": "closed"}) == 1
    assert value("batchgate_guard_failures_total", {"guard": "safety", "mode": "open"}) == 3
    assert b"batchgate_guard_failures_total" in metrics.render()
