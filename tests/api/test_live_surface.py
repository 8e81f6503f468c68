"""The HTTP surface of a real server (sim workers) held to its OpenAPI document by
schemathesis, the Grafana dashboard held to its /metrics, and its access log read back."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from batchgate_client import Client
from loadtest.server import RunningServer, running_server
from tests.e2e.helpers import logged

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]
PAID = {"Authorization": "Bearer paid-demo-key"}
ADMIN = {"Authorization": "Bearer admin-demo-key"}
ARGS = ["--keys", str(ROOT / "examples/keys.toml"), "--batch-latency-ms", "5",
        "--access-log", "json"]


@pytest.fixture(scope="module")
def live() -> Iterator[RunningServer]:
    with running_server(workers=2, args=ARGS) as srv:
        yield srv


@pytest.fixture(scope="module")
def api_schema(live: RunningServer) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(live.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


# 4xx codes a well-formed request may still get: they depend on state, not on the request.
# Which models and versions are served is state too: the catalogue changes while serving
# (admin API, SIGHUP), and a gateway serves the document without knowing it.
STATEFUL_REFUSALS = {"idempotency_key_reused", "rate_limited", "body_too_large",
                     "unknown_model", "not_found", "invalid_change"}


def answers_as_a_gateway_should(
    ctx: object, response: schemathesis.Response, case: schemathesis.Case
) -> None:
    """No 5xx, save a deadline the request itself set too short to be met (504 when it
    passed, 503 deadline_unreachable when admission saw it coming); a well-formed request is
    accepted unless refused for state the document cannot show."""
    status = response.status_code
    if status >= 500:
        asked = (case.headers or {}).get("X-Request-Timeout-Ms")
        short = asked is not None and float(asked) < 1000
        code = response.json()["error"]["code"]
        assert short and code in ("deadline_exceeded", "deadline_unreachable"), \
            f"{status} {response.text[:200]} (X-Request-Timeout-Ms: {asked})"
    elif status >= 400 and case.meta is not None and case.meta.generation.mode.is_positive:
        code = response.json()["error"]["code"]
        assert code in STATEFUL_REFUSALS, f"a valid request refused: {response.text[:200]}"


@schema.exclude(path_regex="^/v2").parametrize()  # its errors: tests/api/oip/test_openapi_live
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case: schemathesis.Case,
                                               live: RunningServer) -> None:
    headers = ADMIN if case.path.startswith("/admin/") else PAID
    case.call_and_validate(
        base_url=live.url, headers=headers, timeout=10,
        # Replaced by the check above. Negative cases include unknown headers, which an
        # HTTP server must accept (proxies add them): they are held to no 5xx and to the
        # document, not to a 4xx.
        excluded_checks=[not_a_server_error, positive_data_acceptance, negative_data_rejection],
        additional_checks=[answers_as_a_gateway_should],
    )


def exported(text: str) -> set[str]:
    """Metric names a scrape shows: samples, and each family's series by its type."""
    names = {m.group(1) for m in re.finditer(r"^([a-z_:][a-z0-9_:]*)[{ ]", text, re.M)}
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)", text, re.M):
        names |= {name + s for s in suffixes.get(kind, ("",))}
    return names


def test_every_metric_the_dashboard_queries_is_exported(live: RunningServer) -> None:
    with Client(live.url, "paid-demo-key") as client:
        assert client.batchstring(["warm", "up"]) == ["mraw", "pu"]
    dashboard = json.loads((ROOT / "examples/grafana/batchgate.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    wanted = {name for e in exprs for name in re.findall(r"\bbatchgate_[a-z0-9_]+", e)}
    assert len(wanted) >= 15
    assert wanted - exported(httpx.get(live.url + "/metrics").text) == set()


def test_the_access_log_has_a_line_per_request_and_no_inputs(live: RunningServer) -> None:
    answer = httpx.post(live.url + "/v1/batchstring", headers=PAID,
                        json={"inputs": ["private-input-7", "private-input-8"]})
    assert answer.status_code == 200
    line = logged(live, answer.json()["id"])
    assert line["account"] == "acme" and line["tier"] == "paid" and line["status"] == 200
    assert isinstance(line["queue_ms"], float) and isinstance(line["batch_ms"], float)
    assert line["attempts"] == 1 and line["batch_ids"] and line["code"] is None
    assert "private-input" not in live.log_path.read_text()
