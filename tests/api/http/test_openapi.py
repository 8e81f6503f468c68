"""The OpenAPI document is valid, and it cannot drift from the validator: its examples
pass `parse_body`, and its request schema accepts exactly what `parse_body` accepts."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest
from openapi_spec_validator import validate

from api.config import Settings
from api.errors import ERRORS, ApiError
from api.http import Limits, document, parse_body
from api.http.openapi import ADMIN_ONLY, ANSWER_EXAMPLES, REQUEST_EXAMPLES, docs_page

LIMITS = Limits(max_inputs=7, max_input_chars=20, max_body_bytes=1 << 20)
DOC = document(LIMITS)


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(DOC)  # raises on the first problem
    assert DOC["openapi"].startswith("3.1")


@pytest.mark.parametrize("name", sorted(REQUEST_EXAMPLES))
def test_every_request_example_passes_the_validator_and_matches_its_answer(name: str) -> None:
    s = Settings()
    limits = Limits(s.max_inputs, s.max_input_chars, s.max_body_bytes)
    parsed = parse_body(orjson.dumps(REQUEST_EXAMPLES[name]["value"]), limits)
    answer = ANSWER_EXAMPLES[name]["value"]
    assert parsed.single == ("output" in answer)
    assert len(parsed.texts) == (1 if parsed.single else len(answer["outputs"]))


@pytest.mark.parametrize("body", [
    {"input": "a"}, {"inputs": ["a"] * 7}, {"inputs": ["a"] * 8}, {"inputs": []},
    {"input": "a", "inputs": ["b"]}, {}, {"input": 5}, {"inputs": [1]}, {"input": "x" * 20},
    {"input": "x" * 21}, {"inputs": ["x" * 21]}, {"input": "a", "model": "sim"},
    {"input": "a", "model": "other"}, {"input": "a", "extra": 1}, [], "text",
])
def test_the_request_schema_accepts_exactly_what_the_validator_accepts(body: Any) -> None:
    schema = DOC["components"]["schemas"]["Request"]
    valid = jsonschema.Draft202012Validator(schema).is_valid(body)
    try:
        parse_body(orjson.dumps(body), LIMITS)
        accepted = True
    except ApiError:
        accepted = False
    assert valid == accepted


def codes_of(response: dict[str, Any]) -> set[str]:
    content = response["content"]["application/json"]
    documented = set(content["schema"]["allOf"][1]["properties"]["error"]["properties"]
                     ["code"]["enum"])
    assert documented == set(content["examples"])
    return documented


def test_each_error_status_lists_exactly_the_codes_of_the_catalogue() -> None:
    """The hot route's, that is: the admin API's own codes are the admin API's."""
    responses = DOC["paths"]["/v1/batchstring"]["post"]["responses"]
    for status in {e.status for c, e in ERRORS.items() if c not in ADMIN_ONLY} - {404, 405}:
        assert codes_of(responses[str(status)]) == {
            c for c, e in ERRORS.items() if e.status == status and c not in ADMIN_ONLY}


def test_the_admin_api_of_the_models_is_documented_with_its_own_codes() -> None:
    paths = DOC["paths"]
    operations = [paths["/admin/models"]["get"], paths["/admin/models/{name}"]["put"],
                  paths["/admin/models/{name}/versions/{version}"]["delete"],
                  paths["/admin/models/{name}/overrides"]["delete"]]
    assert all(op["security"] == [{"adminKey": []}] for op in operations)
    codes = {code for op in operations for status, response in op["responses"].items()
             if status != "200" for code in codes_of(response)}
    assert codes == {"unauthorized", "invalid_request", "not_found", "body_too_large",
                     "invalid_change", "version_serving", "change_not_kept"}
    assert {c for c, e in ERRORS.items() if e.status not in (404, 405)} <= codes | {
        c for r in paths["/v1/batchstring"]["post"]["responses"].values()
        if "content" in r and "allOf" in r["content"]["application/json"]["schema"]
        for c in codes_of(r)}


def test_refusals_document_retry_after_and_every_answer_server_timing() -> None:
    responses = DOC["paths"]["/v1/batchstring"]["post"]["responses"]
    assert all("Server-Timing" in r["headers"] for r in responses.values())
    assert {s for s, r in responses.items() if "Retry-After" in r["headers"]} == {"429", "503"}


def test_the_docs_page_needs_no_script_and_lists_every_path() -> None:
    page = docs_page(DOC)
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert all(path in page for path in DOC["paths"])
