"""The `/v2` routes of a real server (sim workers, `--model sim`) held to their part of the
OpenAPI document by schemathesis: no 5xx, errors in the protocol's shape, and a
well-formed request refused only for what the document cannot show."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from loadtest.server import RunningServer, running_server

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[3]
PAID = {"Authorization": "Bearer paid-demo-key"}
ARGS = ["--keys", str(ROOT / "examples/keys.toml"), "--batch-latency-ms", "5"]

# What a request the document calls well-formed may still be refused for: the models served
# (state), a shape the data does not fill or strings over --max-input-chars (no schema
# relates them), a binary body (its bytes are free-form), and the limits' state.
STATEFUL = {"unknown_model", "not_found", "invalid_request", "malformed_json",
            "input_too_large", "body_too_large", "rate_limited", "idempotency_key_reused"}


@pytest.fixture(scope="module")
def live() -> Iterator[RunningServer]:
    with running_server(workers=2, args=ARGS) as srv:
        yield srv


@pytest.fixture(scope="module")
def api_schema(live: RunningServer) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(live.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def test_the_document_holds_every_v2_route(api_schema: schemathesis.BaseSchema) -> None:
    paths = set(api_schema.raw_schema["paths"])
    model, version = "/v2/models/{name}", "/v2/models/{name}/versions/{version}"
    assert {"/v2", "/v2/health/live", "/v2/health/ready", model, version, model + "/ready",
            version + "/ready", model + "/infer", version + "/infer"} <= paths


def short_deadline(case: schemathesis.Case) -> bool:
    """The request set a deadline under a second (header or `parameters.timeout`)."""
    header = (case.headers or {}).get("X-Request-Timeout-Ms")
    body = case.body if isinstance(case.body, dict) else {}
    params = body.get("parameters")
    micros = params.get("timeout") if isinstance(params, dict) else None
    return (header is not None and float(header) < 1000) or \
        (isinstance(micros, int) and micros < 1_000_000)


def answers_in_the_protocols_shape(
    ctx: object, response: schemathesis.Response, case: schemathesis.Case
) -> None:
    status = response.status_code
    if status >= 400 and response.content and status not in (404, 405):
        # (a path or method no /v2 route takes is the router's: the server's own shape)
        assert isinstance(response.json()["error"], str), response.text[:200]
    if status >= 500:
        code = response.json().get("code")
        assert short_deadline(case) and code in ("deadline_exceeded", "deadline_unreachable"), \
            f"{status} {response.text[:200]}"
    elif status >= 400 and case.meta is not None and case.meta.generation.mode.is_positive:
        error = response.json() if response.content else {}
        code = error.get("code") or error.get("error", {}).get("code")
        # a model not ready (400, no code: Triton's answer) is state too
        assert code in STATEFUL or (status == 400 and case.path.endswith("/ready")), \
            f"a valid request refused: {response.text[:200]}"


@schema.include(path_regex="^/v2").parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_v2_operation_answers_as_documented(case: schemathesis.Case,
                                                  live: RunningServer) -> None:
    case.call_and_validate(
        base_url=live.url, headers=PAID, timeout=10,
        excluded_checks=[not_a_server_error, positive_data_acceptance, negative_data_rejection],
        additional_checks=[answers_in_the_protocols_shape],
    )
