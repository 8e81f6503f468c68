"""The capacity series: the workers a pool aims at, when the next one it started is expected
up, and why it scaled. A pool that follows the load shows its scaler's; a fixed pool its
size, nothing coming and no event, so one dashboard reads both. Every scaling event's
series exists from the first scrape, at zero."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from api.metrics import SCALE_EVENTS, Metrics, ScalingGauges, pool_capacity
from loadtest.server import parse_metrics
from tests.api.metrics_snapshots import snapshot

ROOT = Path(__file__).parents[2]
EVENTS = "batchgate_scale_events_total"


def scraped(**fields: object) -> dict[str, float]:
    metrics = Metrics()
    metrics.watch(lambda: snapshot(**fields))
    return parse_metrics(metrics.render().decode())


def event(direction: str, reason: str) -> str:
    return f'{EVENTS}{{direction="{direction}",reason="{reason}"}}'


def scaling(desired: int = 4, eta_s: float = 0.0,
            events: dict[tuple[str, str], int] | None = None) -> ScalingGauges:
    return ScalingGauges(desired=desired, starting=2, running=2, eta_s=eta_s,
                         events=events or {})


def test_a_pool_that_follows_the_load_shows_its_scalers_target_and_eta() -> None:
    shown = scraped(workers={"ready": 1, "busy": 1, "starting": 2},
                    scaling=scaling(desired=5, eta_s=3.5))
    assert shown["batchgate_workers_desired"] == 5.0  # not the 4 workers listed
    assert shown["batchgate_capacity_eta_seconds"] == 3.5


def test_scale_events_are_counted_by_direction_and_reason() -> None:
    shown = scraped(scaling=scaling(events={("up", "demand"): 3, ("up", "queue"): 1,
                                            ("down", "idle"): 2}))
    assert shown[event("up", "demand")] == 3.0
    assert shown[event("up", "queue")] == 1.0
    assert shown[event("down", "idle")] == 2.0
    assert shown[event("up", "floor")] == shown[event("down", "floor")] == 0.0


@pytest.mark.parametrize("gauges", [None, scaling()], ids=["fixed", "scaling"])
def test_every_scale_event_series_exists_at_zero_from_the_first_scrape(
        gauges: ScalingGauges | None) -> None:
    shown = scraped(scaling=gauges)
    events = {key: value for key, value in shown.items() if key.startswith(EVENTS)}
    assert events == {event(*pair): 0.0 for pair in SCALE_EVENTS}
    assert {pair[0] for pair in SCALE_EVENTS} == {"up", "down"}


def test_a_reason_the_scaler_adds_gets_its_own_series() -> None:
    shown = scraped(scaling=scaling(events={("down", "bounds"): 1}))
    assert shown[event("down", "bounds")] == 1.0
    assert shown[event("down", "idle")] == 0.0


def test_a_fixed_pool_shows_its_size_and_nothing_coming() -> None:
    shown = scraped(workers={"ready": 2, "busy": 1, "dead": 1, "starting": 1, "stopped": 0})
    assert shown["batchgate_workers_desired"] == 5.0  # a dead worker is restarted
    assert shown["batchgate_capacity_eta_seconds"] == 0.0


def test_an_overdue_start_is_expected_now_not_in_the_past() -> None:
    assert scraped(scaling=scaling(eta_s=-0.4))["batchgate_capacity_eta_seconds"] == 0.0


def test_the_series_are_typed_for_prometheus() -> None:
    metrics = Metrics()
    metrics.watch(lambda: snapshot(scaling=scaling()))
    text = metrics.render().decode()
    for name, kind in (("batchgate_workers_desired", "gauge"),
                       ("batchgate_capacity_eta_seconds", "gauge"),
                       ("batchgate_scale_events_total", "counter")):
        assert f"# TYPE {name} {kind}" in text


@pytest.mark.parametrize(("states", "counts"), [
    ({"ready": 3}, (3, 0, 3)),
    ({"ready": 1, "busy": 1, "switching": 1, "starting": 1, "pending": 1, "dead": 1},
     (6, 2, 3)),
    ({"ready": 0, "stopped": 4}, (0, 0, 0)),  # stopping: nothing is wanted any more
])
def test_a_fixed_pools_capacity_is_read_from_its_workers_by_state(
        states: dict[str, int], counts: tuple[int, int, int]) -> None:
    assert pool_capacity(states) == counts


def test_the_dashboard_shows_capacity() -> None:
    dashboard = json.loads((ROOT / "examples/grafana/batchgate.json").read_text())
    capacity = [p for p in dashboard["panels"] if p["title"].startswith("Capacity")]
    exprs = " ".join(t["expr"] for p in capacity for t in p["targets"])
    named = set(re.findall(r"\bbatchgate_[a-z0-9_]+", exprs))
    assert {"batchgate_workers_desired", "batchgate_capacity_eta_seconds",
            "batchgate_scale_events_total", "batchgate_workers"} <= named
    assert "by (direction, reason)" in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
