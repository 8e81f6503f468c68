"""The one error tree of the front door, and the only place that knows HTTP statuses.

    BatchgateError (batcher.errors)            every class has a `code`; ERRORS maps it
    ├── ApiError                   http/       the request as sent is refused (400, 413, 415,
    │   │                                      422), by the `code` it is built with
    │   └── Unauthorized           config/     unknown key, or none where one is needed
    ├── KeysFileError (ValueError) config/     the keys file is malformed (never a response)
    ├── RateLimited                door/       the key or account is over its rate
    ├── ClientClosed               http/door   the client left; its items were withdrawn
    ├── LeaderGone                 door/       a keyed request's leader ended unanswered
    ├── CoreUnavailable            gateway/    the core process is gone or not answering
    ├── QueueFull, Overloaded (OverBudget, DeadlineUnreachable, NoWorkerReady,
    │   GuardUnavailable), Closed, DeadlineExceeded   batcher/: refused or out of time
    ├── Refused                                batcher/: a guard refused one input (the
    │                                          answer is 422 only when it refused every one)
    ├── WorkerCrashed, NoHealthyWorker, ShuttingDown, QueryOfDeath, CallerRefused, ModelError
    │   (ContractViolation), IdempotencyMismatch    failover/: what happened to a batch
    ├── UnknownModel, ModelLoading, ModelFailing (Overloaded)  failover/: no such model, or
    │                                              it is cold, or its loads keep failing
    ├── ModelUnplaceable                           failover/: no placement can give the
    │                                              version a worker on this pool
    └── StateUnavailable (ConnectionError)          failover/state/: the store of kept
                                                   answers (--state) cannot be reached

A status is looked up by code in `ERRORS`, never decided by the raiser: importing the
classes of failover/ here would load the dispatch core into every gateway. Anything that is
not a BatchgateError becomes a 500 with a generic message: no traceback reaches a client.
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

from batcher import BatchgateError

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
    "resume_needs_key": ErrorCode(400, "Last-Event-ID or ?after= sent without the stream's "
                                       "Idempotency-Key: only a keyed stream resumes"),
    "invalid_host": ErrorCode(400, "an HTTP/1.1 request without a Host header, or with more "
                                   "than one (RFC 9112 3.2)"),
    "repeated_header": ErrorCode(400, "Authorization, Idempotency-Key or X-Request-Timeout-Ms "
                                      "sent more than once"),
    "unauthorized": ErrorCode(401, "unknown key, or no key where anonymous use is off"),
    "not_found": ErrorCode(404, "no such path"),
    "method_not_allowed": ErrorCode(405, "the path does not take this method"),
    "request_timeout": ErrorCode(408, "the head or body did not arrive within "
                                      "--head-timeout-s or --body-timeout-s"),
    "body_too_large": ErrorCode(413, "the body is over --max-body-bytes"),
    "input_too_large": ErrorCode(413, "a string is over --max-input-chars"),
    "unsupported_media_type": ErrorCode(415, "a Content-Type other than application/json"),
    "empty_inputs": ErrorCode(422, "inputs is empty"),
    "too_many_inputs": ErrorCode(422, "inputs holds more than --max-inputs strings"),
    "unknown_model": ErrorCode(422, "model names no model (or model@version) served now"),
    "invalid_change": ErrorCode(422, "admin: the change would leave the catalogue of models "
                                     "invalid (the message says why); nothing changed"),
    "version_serving": ErrorCode(409, "admin: the version still serves traffic (the serving "
                                      "default, or a weight): the message says what to do "
                                      "first; nothing changed"),
    "idempotency_key_reused": ErrorCode(422, "the same Idempotency-Key with another body"),
    "refused": ErrorCode(422, "a guard of the model refused the input (with inputs: every "
                              "input; some refused get a 200 with null in their place): "
                              "error.refused lists each input's index, guard and reason"),
    "rate_limited": ErrorCode(429, "the key or account is over its tier's rate"),
    "caller_refused": ErrorCode(429, "this account's inputs (or anonymous inputs) killed "
                                     "workers again and again: refused for a while"),
    "headers_too_large": ErrorCode(431, "the head is over --max-header-bytes, or has more "
                                        "than --max-headers headers"),
    "client_closed": ErrorCode(499, "the client left; its items were withdrawn unrun"),
    "model_error": ErrorCode(500, "the model raised on this input (isolated by bisection)"),
    "contract_violation": ErrorCode(500, "the model broke the contract"),
    "query_of_death": ErrorCode(500, "run alone, this input killed its worker; refused on "
                                     "sight for 10 minutes"),
    "internal": ErrorCode(500, "a bug: nothing more is said"),
    "over_budget": ErrorCode(503, "admission: the expected wait exceeds the tier's budget"),
    "deadline_unreachable": ErrorCode(503, "admission: the deadline cannot be met"),
    "queue_full": ErrorCode(503, "the tier's queue is at its capacity"),
    "too_many_connections": ErrorCode(503, "the process holds --max-connections connections"),
    "no_healthy_worker": ErrorCode(503, "no worker is ready"),
    "guard_unavailable": ErrorCode(503, "a guard of the model could not answer an input "
                                        "within guard_timeout_ms and the model fails closed "
                                        "(on_guard_failure); nothing ran past it"),
    "model_loading": ErrorCode(503, "the version holds no worker yet and its load ends past "
                                    "the request's deadline: Retry-After is the load's ETA"),
    "model_failing": ErrorCode(503, "the version holds no worker and its loads keep failing: "
                                    "nothing is loaded for it until Retry-After (or a "
                                    "change to the catalogue)"),
    "model_unplaceable": ErrorCode(503, "the version holds no worker and no placement can "
                                        "give it one on this pool (no load is coming: the "
                                        "message says what to change)"),
    "suspect_input": ErrorCode(503, "the same input's last run stalled or killed its "
                                    "worker, and it is being judged"),
    "worker_crashed": ErrorCode(503, "the item's worker died --max-attempts times"),
    "shutting_down": ErrorCode(503, "the server is draining, or shut down before the item ran"),
    "core_unavailable": ErrorCode(503, "a gateway's core process is gone or not answering"),
    "state_unavailable": ErrorCode(503, "the store of kept answers (--state) cannot be "
                                        "reached: a request with an Idempotency-Key is "
                                        "refused (one without is served)"),
    "retry": ErrorCode(503, "the first request with this Idempotency-Key ended unanswered "
                            "(its client left)"),
    "change_not_kept": ErrorCode(503, "admin: a cell's core could not write the change "
                                      "where the next core reads it (its scratch folder); "
                                      "nothing changed"),
    "deadline_exceeded": ErrorCode(
        504, "the deadline passed first: queued, or running (its output is then discarded)"),
}
"""Every error code a client can receive, with its status: the OpenAPI document and the
client's exceptions are built from it, and a test holds the code that raises to it."""

RETRIED = frozenset((429, 503))  # statuses that carry Retry-After


class ApiError(BatchgateError):
    """Raised by the routes and the HTTP protocol: the request as sent is refused. Its
    status comes from `ERRORS` by `code`; `headers` go out with the answer (a refusal's
    Retry-After is 1 s unless given)."""

    def __init__(self, code: str, message: str, headers: Mapping[str, str] | None = None
                 ) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.status = ERRORS[code].status
        self.headers = dict(headers or {})
        if self.status in RETRIED:
            self.headers.setdefault("Retry-After", "1")


class Unauthorized(ApiError):
    """Raised by `KeyRing.identify`: an unknown key, or none where anonymous use is off."""

    def __init__(self, message: str) -> None:
        super().__init__("unauthorized", message)


class KeysFileError(BatchgateError, ValueError):
    """Raised by `load_keys`: the keys file is malformed; the message says where."""

    code = "internal"


class RateLimited(BatchgateError):
    """Raised by the door's rate limiter: a key or account went over its rate."""

    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ClientClosed(BatchgateError):
    """The client hung up before its answer; nothing is written back."""

    code = "client_closed"


class LeaderGone(BatchgateError):
    """Raised for the joiners of a keyed request whose leader ended without an answer of
    its own (its client left): they retry, and the next one leads."""

    code = "retry"
    retry_after = 1.0


class CoreUnavailable(BatchgateError):
    """Raised in a gateway: the core process is gone, or stopped answering in time."""

    code = "core_unavailable"
    retry_after = 1.0


def error_body(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}})


def error_response(code: str, message: str, headers: Mapping[str, str] | None = None
                   ) -> Response:
    return Response(error_body(code, message), status_code=ERRORS[code].status,
                    headers=headers, media_type="application/json")


def retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def to_api_error(exc: BaseException) -> ApiError:
    """Translate any error raised while serving a request into what its client gets."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ClientDisconnect):  # starlette's, from reading a body
        exc = ClientClosed("the client closed the connection")
    if not isinstance(exc, BatchgateError) or exc.code not in ERRORS:
        log.error("unexpected error while serving a request", exc_info=exc)
        return ApiError("internal", "internal error")
    message = str(exc)
    if exc.code == "model_error":
        # The model's message may quote its whole batch: other callers' inputs. It goes
        # to the server log under an id; the client gets the id.
        error_id = os.urandom(6).hex()
        log.warning("model error %s: %s", error_id, exc)
        message = (f"the model raised {getattr(exc, 'error_type', 'Exception')} on this "
                   f"input (error id {error_id}, in the server log)")
    headers = None
    if ERRORS[exc.code].status in RETRIED:
        headers = retry_after(getattr(exc, "retry_after", 1.0))
    return ApiError(exc.code, message, headers)


__all__ = ["ERRORS", "RETRIED", "ApiError", "ClientClosed", "CoreUnavailable", "ErrorCode",
           "KeysFileError", "LeaderGone", "RateLimited", "Unauthorized", "error_body",
           "error_response", "retry_after", "to_api_error"]
