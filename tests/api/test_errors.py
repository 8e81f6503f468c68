"""The error catalogue is the truth about what a client can receive: every code the code
can answer is in it, nothing in it is stale, and no status is decided outside it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import api.door  # every error class of the core's packages is imported
import api.gateway  # noqa: F401
import batcher
from api.errors import ERRORS, ApiError, ClientClosed, KeysFileError, to_api_error
from batcher import BatchgateError

ROOT = Path(__file__).parents[2]
STARLETTE = {"not_found", "method_not_allowed"}  # api/http/app.py `_http_error`
BUILDERS = ("ApiError", "error_response", "_refuse")


def calls(name_of: tuple[str, ...]) -> list[tuple[Path, ast.Call]]:
    found = []
    for path in (ROOT / "api").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = (func.id if isinstance(func, ast.Name) else func.attr
                        if isinstance(func, ast.Attribute) else "")
                if name in name_of:
                    found.append((path, node))
    return found


def literal_codes() -> set[str]:
    """The code of every `ApiError("code", ...)`, `error_response("code", ...)` and the
    HTTP protocol's own `self._refuse("code", ...)`."""
    return {node.args[0].value for _, node in calls(BUILDERS)
            if node.args and isinstance(node.args[0], ast.Constant)}


def domain_codes() -> set[str]:
    """The code of every error class that can reach a client."""
    found, classes = set(), [BatchgateError]
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        if cls is BatchgateError or cls is batcher.Overloaded or issubclass(
                cls, ApiError | KeysFileError):  # a base only; raised with a literal code
            continue
        found.add(cls.code)
    return found


def test_every_code_the_server_answers_is_in_the_catalogue() -> None:
    assert (literal_codes() | domain_codes() | STARLETTE) - set(ERRORS) == set()


def test_the_catalogue_names_no_code_the_server_never_answers() -> None:
    assert set(ERRORS) - (literal_codes() | domain_codes() | STARLETTE) == set()


def test_no_status_is_decided_outside_the_catalogue() -> None:
    """Every error built in api/ names its code; the status comes from ERRORS."""
    for path, node in calls(BUILDERS):
        assert not any(isinstance(a, ast.Constant) and isinstance(a.value, int)
                       for a in node.args), f"{path.name}:{node.lineno} passes a status"


@pytest.mark.parametrize("code", sorted(ERRORS))
def test_an_error_of_each_code_answers_its_catalogued_status(code: str) -> None:
    err = to_api_error(ApiError(code, "why"))
    assert err.status == ERRORS[code].status
    assert ("Retry-After" in err.headers) == (err.status in (429, 503))


def test_a_domain_error_carries_its_retry_after_and_a_client_leaving_is_499() -> None:
    refused = to_api_error(batcher.OverBudget("busy", retry_after=2.5))
    assert (refused.status, refused.code, refused.headers) == (
        503, "over_budget", {"Retry-After": "3"})
    assert to_api_error(ClientClosed("gone")).status == 499


def test_anything_else_is_a_500_that_says_nothing() -> None:
    err = to_api_error(KeyError("secret detail"))
    assert (err.status, err.code, err.message) == (500, "internal", "internal error")
