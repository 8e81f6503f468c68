"""The error catalogue is the truth about what a client can receive: every code the code
can answer is in it with the same status, and nothing in it is stale."""

from __future__ import annotations

import ast
from pathlib import Path

import batcher
import failover
from api.errors import ERRORS, to_api_error
from batcher import BatchgateError

ROOT = Path(__file__).parents[2]
STARLETTE = {("not_found", 404), ("method_not_allowed", 405)}  # api/app.py _http_error


def literal_errors() -> set[tuple[str, int]]:
    """(code, status) of every `ApiError(status, "code", ...)`, `error_response(...)`, and
    the HTTP protocol's own `self._refuse(...)`."""
    found = set()
    for path in (ROOT / "api").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = (node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                    if isinstance(node.func, ast.Attribute) else "")
            if (name in ("ApiError", "error_response", "_refuse") and len(node.args) > 1
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[1], ast.Constant)):
                found.add((node.args[1].value, node.args[0].value))
    return found


def domain_errors() -> set[tuple[str, int]]:
    """What `to_api_error` makes of every domain error class and every code it is given."""
    given = {node.value.value for path in (ROOT / "batcher").glob("*.py")
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.keyword)
             and node.arg == "code" and isinstance(node.value, ast.Constant)}
    found, classes = set(), [BatchgateError]
    assert batcher and failover  # every subclass is imported
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        for code in {cls.code} | (given if cls is batcher.Overloaded else set()):
            exc = cls.__new__(cls)
            exc.code, exc.retry_after = code, 1.0  # type: ignore[attr-defined]
            err = to_api_error(exc)
            found.add((err.code, err.status))
    return found


def test_every_code_the_server_answers_is_in_the_catalogue_with_its_status() -> None:
    catalogue = {(code, e.status) for code, e in ERRORS.items()}
    answered = literal_errors() | domain_errors() | STARLETTE
    assert answered - catalogue == set()


def test_the_catalogue_names_no_code_the_server_never_answers() -> None:
    answered = {code for code, _ in literal_errors() | domain_errors() | STARLETTE}
    assert set(ERRORS) - answered == set()
