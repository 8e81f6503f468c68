"""Domain errors -> HTTP. The only place that knows status codes.

Every error leaves as `{"error": {"code", "message"}}`; a refusal carries `Retry-After`.
Anything unexpected becomes a 500 with a generic message: no traceback reaches a client.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from api.auth import Unauthorized
from api.limits import RateLimited
from batcher import BatchgateError, Closed, DeadlineExceeded, Overloaded, QueueFull
from failover import (
    ContractViolation,
    IdempotencyMismatch,
    ModelError,
    NoHealthyWorker,
    QueryOfDeath,
    WorkerCrashed,
)

log = logging.getLogger("batchgate.api")


@dataclass(frozen=True, slots=True)
class ErrorCode:
    status: int
    when: str


ERRORS: dict[str, ErrorCode] = {
    "malformed_json": ErrorCode(400, "the body is not JSON"),
    "invalid_request": ErrorCode(400, "wrong types, or both or neither of input/inputs"),
    "invalid_timeout": ErrorCode(400, "X-Request-Timeout-Ms is not a number of at least 1 ms"),
    "invalid_idempotency_key": ErrorCode(400, "Idempotency-Key is empty or too long"),
    "idempotency_needs_key": ErrorCode(400, "Idempotency-Key sent without an API key"),
    "unauthorized": ErrorCode(401, "unknown key, or no key where anonymous use is off"),
    "not_found": ErrorCode(404, "no such path"),
    "request_timeout": ErrorCode(408, "the head or body did not arrive within "
                                      "--head-timeout-s or --body-timeout-s"),
    "method_not_allowed": ErrorCode(405, "the path does not take this method"),
    "body_too_large": ErrorCode(413, "the body is over --max-body-bytes"),
    "input_too_large": ErrorCode(413, "a string is over --max-input-chars"),
    "empty_inputs": ErrorCode(422, "inputs is empty"),
    "too_many_inputs": ErrorCode(422, "inputs holds more than --max-inputs strings"),
    "unknown_model": ErrorCode(422, "model names another model than the one served"),
    "unsupported_media_type": ErrorCode(415, "a Content-Type other than application/json"),
    "headers_too_large": ErrorCode(431, "the head is over --max-header-bytes, or has more "
                                        "than --max-headers headers"),
    "idempotency_key_reused": ErrorCode(422, "the same Idempotency-Key with another body"),
    "rate_limited": ErrorCode(429, "the key or account is over its tier's rate"),
    "client_closed": ErrorCode(499, "the client left; its items were withdrawn unrun"),
    "model_error": ErrorCode(500, "the model raised on this input (isolated by bisection)"),
    "contract_violation": ErrorCode(500, "the model broke the contract"),
    "query_of_death": ErrorCode(500, "run alone, this input killed its worker; refused on "
                                     "sight for 10 minutes"),
    "internal": ErrorCode(500, "a bug: nothing more is said"),
    "over_budget": ErrorCode(503, "admission: the expected wait exceeds the tier's budget"),
    "overloaded": ErrorCode(503, "admission refused the request"),
    "deadline_unreachable": ErrorCode(503, "admission: the deadline cannot be met"),
    "queue_full": ErrorCode(503, "the tier's queue is at its capacity"),
    "too_many_connections": ErrorCode(503, "the process holds --max-connections connections"),
    "no_healthy_worker": ErrorCode(503, "no worker is ready"),
    "worker_crashed": ErrorCode(503, "the item's worker died --max-attempts times"),
    "shutting_down": ErrorCode(503, "the server is draining"),
    "retry": ErrorCode(503, "the first request with this Idempotency-Key did not finish"),
    "deadline_exceeded": ErrorCode(
        504, "the deadline passed first: queued, or running (its output is then discarded)"),
}
"""Every error code a client can receive, with its status: the OpenAPI document and the
client's exceptions are built from it, and a test holds the code that raises to it."""


class ApiError(Exception):
    """A request the API itself refuses (malformed, too large, invalid)."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


def error_body(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}})


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(error_body(code, message), status_code=status, headers=headers,
                    media_type="application/json")


def retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def to_api_error(exc: BaseException) -> ApiError:
    """Translate any error raised while serving a request."""
    match exc:
        case ApiError():
            return exc
        case ClientDisconnect():
            return ApiError(499, "client_closed", "the client closed the connection")
        case Unauthorized():
            return ApiError(401, "unauthorized", str(exc))
        case RateLimited():
            return ApiError(429, "rate_limited", str(exc), retry_after(exc.retry_after))
        case QueueFull() | Overloaded():
            return ApiError(503, exc.code, str(exc), retry_after(exc.retry_after))
        case DeadlineExceeded():
            return ApiError(504, exc.code, str(exc))
        case Closed():
            return ApiError(503, "shutting_down", str(exc), retry_after(1))
        case NoHealthyWorker() | WorkerCrashed():
            return ApiError(503, exc.code, str(exc), retry_after(1))
        case IdempotencyMismatch():
            return ApiError(422, exc.code, str(exc))
        case ContractViolation() | QueryOfDeath():
            return ApiError(500, exc.code, str(exc))  # our own words
        case ModelError():
            # The model's message may quote its whole batch: other callers' inputs. It goes
            # to the server log under an id; the client gets the id.
            error_id = os.urandom(6).hex()
            log.warning("model error %s: %s", error_id, exc)
            return ApiError(500, exc.code, f"the model raised {exc.error_type} on this input "
                                           f"(error id {error_id}, in the server log)")
        case BatchgateError():
            return ApiError(500, exc.code, str(exc))
    log.error("unexpected error while serving a request", exc_info=exc)
    return ApiError(500, "internal", "internal error")


__all__ = ["ERRORS", "ApiError", "ErrorCode", "error_body", "error_response", "retry_after",
           "to_api_error"]
