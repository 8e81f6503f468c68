"""The access log names the version that answered: from the core's answer, or from the
body of a kept one (without parsing its outputs); nothing for an error."""

from __future__ import annotations

from typing import Any

import orjson

from api.config import Principal
from api.http import Answered, Rendered
from api.http.access_log import hot, record
from api.http.jobs import answer_body
from batcher import Tier

PAID = Principal(Tier.PAID, "acme", "k1")


def line_of(served: Any) -> dict[str, Any]:
    return orjson.loads(record(served))  # type: ignore[no-any-return]


def test_an_answer_is_logged_with_the_version_that_ran_it() -> None:
    answered = Answered(["out"], (0.01,), 0.1, (3,), 1, "topics@v2")
    assert line_of(hot(PAID, 0.1, answered, "id1"))["model"] == "topics@v2"


def test_a_kept_answer_is_logged_with_the_version_its_body_names() -> None:
    tricky = 'x","model":"forged'  # an output's quotes are escaped in the body
    kept = Rendered(200, answer_body([tricky, "y"], False, "id2", "topics@v1"),
                    (("Idempotent-Replayed", "true"),))
    assert line_of(hot(PAID, 0.001, kept))["model"] == "topics@v1"
    older = Rendered(200, b'{"id":"id3","outputs":["o"]}')  # kept before models
    assert line_of(hot(PAID, 0.001, older))["model"] is None


def test_an_error_names_no_model() -> None:
    body = b'{"error":{"code":"unknown_model","message":"model \'x\' is not served"}}'
    assert line_of(hot(PAID, 0.001, Rendered(422, body)))["model"] is None
    assert line_of(hot(PAID, 0.001, code="model_loading"))["model"] is None
