"""The request, queue and batch series by model and version; each version's queue depth,
resident workers, loads and load times. A request is counted under the version that ran
it; one answered otherwise under what it named if that is served, else under none, so no
name from the network makes a series. Unit tests on the metrics and a service's snapshot,
then a real server: its answers, and a switch made by a rollout."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from api.config import DEFAULT_TIERS, Settings, Workers
from api.door import Service
from api.metrics import Metrics, VersionGauges
from batcher import FlushReason
from loadtest.server import RunningServer, parse_metrics, running_server
from tests.api.door.fakes import FakePool
from tests.api.metric_samples import total
from tests.api.metrics_snapshots import snapshot

ROOT = Path(__file__).parents[2]
PAID = {"Authorization": "Bearer paid-demo-key"}
ADMIN = {"Authorization": "Bearer admin-demo-key"}


def lines(metrics: Metrics) -> list[str]:
    return metrics.render().decode().splitlines()


def test_an_answer_is_counted_under_the_version_that_ran_it() -> None:
    metrics = Metrics()
    metrics.request_done("paid", 200, 0.12, "topics@v2")
    metrics.queue_waited("paid", [0.01, 0.02], "topics@v2")
    shown = lines(metrics)
    assert 'batchgate_requests_total{code="200",model="topics",tier="paid",version="v2"} 1.0' \
        in shown
    assert 'batchgate_queue_wait_seconds_count{model="topics",tier="paid",version="v2"} 2.0' \
        in shown


@pytest.mark.parametrize(("named", "model", "version"), [
    ("topics", "topics", ""),  # a served model: its version was never chosen
    ("topics@v2", "topics", "v2"),  # a served version
    ("topics@v9", "topics", ""),  # a served model, a version it does not serve
    ("sentiment", "", ""),  # nothing served by that name
    ("", "", ""),  # no model named
])
def test_a_refusal_carries_what_it_named_only_if_that_is_served(
        named: str, model: str, version: str) -> None:
    metrics = Metrics()
    metrics.request_done("paid", 200, 0.1, "topics@v2")  # topics@v2 is served
    metrics.request_done("paid", 503, 0.001, named, ran=False)
    assert (f'batchgate_requests_total{{code="503",model="{model}",tier="paid",'
            f'version="{version}"}} 1.0') in lines(metrics)


def test_names_from_the_network_make_no_series() -> None:
    metrics = Metrics()
    metrics.request_done("paid", 422, 0.001, "nope-0", ran=False)
    before = len(lines(metrics))
    for i in range(1, 500):
        metrics.request_done("paid", 422, 0.001, f"nope-{i}@v{i}", ran=False)
    shown = lines(metrics)
    assert len(shown) == before and not any("nope" in line for line in shown)
    assert 'batchgate_requests_total{code="422",model="",tier="paid",version=""} 500.0' in shown


def test_batches_are_counted_by_the_version_they_ran() -> None:
    metrics = Metrics()
    for size in (3, 5):
        metrics.batch_sent(size, FlushReason.TIMEOUT, None, "a@v1")
        metrics.batch_done(0.1, "a@v1")
    metrics.batch_sent(7, FlushReason.FULL, None, "b@v2")
    shown = lines(metrics)
    assert 'batchgate_batch_size_sum{model="a",version="v1"} 8.0' in shown
    assert 'batchgate_batch_duration_seconds_count{model="a",version="v1"} 2.0' in shown
    assert 'batchgate_batch_size_sum{model="b",version="v2"} 7.0' in shown


def test_gauges_show_each_versions_queue_residents_and_loads() -> None:
    metrics = Metrics()
    metrics.watch(lambda: snapshot(
        versions={"a@v1": VersionGauges({"paid": 3, "free": 1}, 2),
                  "a@v2": VersionGauges({"paid": 0, "free": 0}, 0)},
        loads={("a@v2", "rollout"): 1, ("a@v2", "demand"): 0}))
    shown = lines(metrics)
    for line in ('batchgate_queue_depth{model="a",tier="paid",version="v1"} 3.0',
                 'batchgate_queue_depth{model="a",tier="free",version="v2"} 0.0',
                 'batchgate_model_resident_workers{model="a",version="v1"} 2.0',
                 'batchgate_model_resident_workers{model="a",version="v2"} 0.0',
                 'batchgate_model_loads_total{model="a",reason="rollout",version="v2"} 1.0',
                 'batchgate_model_loads_total{model="a",reason="demand",version="v2"} 0.0'):
        assert line in shown


CATALOGUE = """
[models.a]
default = "v1"
[models.a.versions.v1]
spec = "tests.models_versions:v1"
[models.a.versions.v2]
spec = "tests.models_versions:v2"
[models.b]
[models.b.versions.v1]
spec = "tests.models_versions:v2"
"""


def test_a_services_versions_have_their_series_and_each_load_is_observed_once(
        tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text(CATALOGUE)
    settings = Settings(models=str(tmp_path / "models.toml"), workers=Workers(2),
                        batch_latency_ms=10)
    metrics = Metrics()
    service = Service(settings, metrics, DEFAULT_TIERS, pool=FakePool(2))
    metrics.watch(service.snapshot)
    service.models.loads["a@v2", "cold"] += 1  # as the cores count a switch, and time it
    metrics.load_done("a@v2", 2.5)  # as the owner tells its observer
    shown = lines(metrics)
    for line in ('batchgate_requests_total{code="200",model="b",tier="free",version="v1"} 0.0',
                 'batchgate_batch_size_count{model="a",version="v2"} 0.0',
                 'batchgate_queue_wait_seconds_count{model="a",tier="paid",version="v1"} 0.0',
                 'batchgate_model_loads_total{model="a",reason="cold",version="v2"} 1.0',
                 'batchgate_model_loads_total{model="b",reason="rollout",version="v1"} 0.0',
                 'batchgate_model_load_seconds_count 1.0'):
        assert line in shown
    assert 'batchgate_model_load_seconds_count 1.0' in lines(metrics)  # not twice


# -- a real server -----------------------------------------------------------------------------
def chunked(body: bytes) -> Iterator[bytes]:
    """A body sent chunked: the request takes ASGI's way (`Routes.batchstring`)."""
    yield body


def post(url: str, body: bytes, direct: bool = False) -> httpx.Response:
    return httpx.post(url + "/v1/batchstring", content=body if direct else chunked(body),
                      timeout=10, headers={**PAID, "Content-Type": "application/json"})


def served(catalogue: Path, workers: int) -> AbstractContextManager[RunningServer]:
    return running_server(workers=workers, args=[
        "--models", str(catalogue), "--keys", str(ROOT / "examples/keys.toml"),
        "--batch-latency-ms", "5"])


@pytest.mark.e2e
@pytest.mark.parametrize("direct", [False, True], ids=["asgi", "direct"])
def test_a_servers_series_name_the_version_that_answered(tmp_path: Path, direct: bool) -> None:
    (tmp_path / "models.toml").write_text(CATALOGUE)
    with served(tmp_path / "models.toml", 2) as srv:
        bodies = [b'{"input": "x"}', b'{"input": "x", "model": "a"}',
                  b'{"inputs": ["x", "y"], "model": "b"}', b'{"input": "x", "model": "zz"}']
        statuses = [post(srv.url, body, direct).status_code for body in bodies]
        assert statuses == [200, 200, 200, 422]
        m = parse_metrics(httpx.get(srv.url + "/metrics").text)
    requests = "batchgate_requests_total"
    assert total(m, requests, code="200", model="a", version="v1") == 2
    assert total(m, requests, code="200", model="b", version="v1") == 1
    assert total(m, requests, code="422", model="", version="") == 1
    assert total(m, "batchgate_queue_wait_seconds_count", model="b", version="v1") == 2
    assert total(m, "batchgate_batch_size_sum", model="a", version="v1") == 2
    assert total(m, "batchgate_batch_size_sum", model="b", version="v1") == 2
    assert total(m, "batchgate_model_resident_workers", model="a", version="v1") == 1
    assert total(m, "batchgate_model_resident_workers", model="b", version="v1") == 1
    assert total(m, "batchgate_queue_depth", model="a", version="v2") == 0


def metrics_until(url: str, done: Callable[[dict[str, float]], bool],
                  within: float = 30.0) -> dict[str, float]:
    """The server's metrics once `done(samples)` holds; polls it, bounded."""
    deadline = time.monotonic() + within
    while True:
        m = parse_metrics(httpx.get(url + "/metrics").text)
        if done(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


# A rollout switches a worker of the old default once past its minimum residency: 10 s, or
# 5 load times (a load never measured counts as its hint).
ROLLOUT = """
[models.a]
default = "v1"
[models.a.versions.v1]
spec = "tests.models_versions:v1"
load_s = 1
[models.a.versions.v2]
spec = "tests.models_versions:v2"
load_s = 1
"""


@pytest.mark.e2e
def test_a_rollouts_switch_is_a_load_counted_and_timed(tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text(ROLLOUT)
    with served(tmp_path / "models.toml", 2) as srv:
        before = metrics_until(srv.url, lambda m: total(
            m, "batchgate_model_resident_workers", model="a", version="v1") == 2)
        changed = httpx.put(srv.url + "/admin/models/a", json={"default": "v2"},
                            headers=ADMIN, timeout=10)
        assert changed.status_code == 200, changed.text
        m = metrics_until(srv.url, lambda m: total(
            m, "batchgate_model_resident_workers", model="a", version="v2") == 1)
    assert total(m, "batchgate_model_loads_total", model="a", version="v2",
                 reason="rollout") == 1
    assert total(m, "batchgate_model_loads_total", model="a", version="v1") == 0
    # The pool's first two loads are measured too; the rollout's is one more.
    first = total(before, "batchgate_model_load_seconds_count")
    assert total(m, "batchgate_model_load_seconds_count") == first + 1
    assert total(m, "batchgate_model_load_seconds_sum") > total(
        before, "batchgate_model_load_seconds_sum")
    assert total(m, "batchgate_model_resident_workers", model="a", version="v1") == 1
    assert 'batchgate_workers{state="switching"}' in m  # 0 again once the new one is up
