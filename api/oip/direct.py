"""`POST /v2/models/{name}[/versions/{version}]/infer` on the direct way (`api.http.direct`),
as `/v1/batchstring` is served: the connection hands the parsed head and body over, the job
goes straight to the core, and its answer is written in the loop turn that settles it.

Through ASGI an infer woke a task per answer: a batch's answers, written together, queued
behind each other's tasks, and `/v2` ran 2 to 3 ms P50 behind `/v1` at 800 RPS on one worker
(docs/benchmarks.md). The direct way takes the requests it can (a whole body of declared
length, no Idempotency-Key: `DirectRoute.call`); the rest, and every other `/v2` route,
stay on ASGI's (`api.oip.http`), with the same checks and answers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from starlette.responses import Response

from api.config import Principal
from api.errors import ApiError
from api.http import Job, Outcome, Routes
from api.oip.http import INFER, answer_response, error_response, unencoded
from api.oip.infer import job_of
from api.oip.tensors import InferRequest, decode_request

INFER_URL = re.compile(rb"/v2/models/([^/?#]+)(?:/versions/([^/?#]+))?/infer")
"""An infer's URL as the request line carries it (no query string: that one takes ASGI's
way, where Starlette reads the path)."""


class InferCall:
    """One infer's `api.http.Shape`: its model and version from the URL, its tensors read
    when the body is in."""

    __slots__ = ("asked", "model", "version")

    path = INFER

    def __init__(self, model: str, version: str | None) -> None:
        self.model, self.version = model, version
        self.asked: InferRequest | None = None

    def job(self, routes: Routes, principal: Principal, headers: Mapping[str, str],
            body: bytes) -> Job:
        unencoded(headers)
        asked = self.asked = decode_request(body, headers.get("inference-header-content-length"))
        return job_of(routes, principal, headers, asked.texts, self.model, self.version,
                      asked.timeout_ms, body)

    def render(self, outcome: Outcome, job: Job) -> tuple[Response, str | None]:
        assert self.asked is not None  # `job` read it
        return answer_response(outcome, self.model, self.asked)

    def refusal(self, err: ApiError) -> Response:
        return error_response(err)


def infer_call(url: bytes) -> InferCall | None:
    """The shape of a request to `url` if it is an infer (`DirectRoute.shapes`), else None."""
    if not url.startswith(b"/v2/models/") or b"%" in url:  # ASGI's way decodes the path
        return None
    found = INFER_URL.fullmatch(url)
    if found is None:
        return None
    try:
        model, version = found.group(1).decode(), found.group(2)
        return InferCall(model, version.decode() if version is not None else None)
    except UnicodeDecodeError:
        return None  # ASGI's way answers it


__all__ = ["INFER_URL", "InferCall", "infer_call"]
