"""The client's error tree, one class per meaning of an answer, drawn here:

    BatchgateError                   .status, .code, .message, .retry_after
    ├── BadRequest              400  malformed_json, invalid_request, invalid_timeout, ...
    ├── Unauthorized            401
    ├── RequestTimeout          408  request_timeout: the upload stalled; retried
    ├── PayloadTooLarge         413  body_too_large, input_too_large
    ├── UnsupportedMediaType    415  unsupported_media_type
    ├── HeadersTooLarge         431  headers_too_large
    ├── Unprocessable           422  empty_inputs, too_many_inputs
    │   ├── IdempotencyKeyReused     idempotency_key_reused
    │   ├── UnknownModel             unknown_model: no such model or version served now
    │   └── Refused                  refused: a guard refused every input of the call
    │                                (.refused; some refused: `Outputs.refused`, no error)
    ├── RateLimited             429  retried
    ├── ServerError             500  internal
    │   └── ModelError               model_error, contract_violation, query_of_death
    ├── Unavailable             503  retried
    │   ├── Overloaded               over_budget, deadline_unreachable, queue_full,
    │   │                            too_many_connections
    │   ├── ModelLoading             model_loading: the version is loading, and Retry-After
    │   │                            says when it should be up
    │   ├── GuardUnavailable         guard_unavailable: a guard could not answer in time
    │   │                            and the model fails closed
    │   └── NoHealthyWorker          no_healthy_worker, worker_crashed, retry, shutting_down,
    │                                model_failing, model_unplaceable, core_unavailable,
    │                                state_unavailable
    ├── DeadlineExceeded        504, or the call's deadline passed here (also a TimeoutError)
    ├── ConnectionFailed             no answer (refused, reset) after the retries
    │   └── StreamBroken             a stream ended before its done event and could not be
    │                                resumed (no Idempotency-Key, or no resume or time left)
    └── ProtocolError                the answer breaks batchgate's protocol (also a ValueError)

In a stream (`Client.stream`) an input's error is one of these too, by its code alone (no
status travels with it; `.status` is then the class's): `deadline_exceeded` a DeadlineExceeded,
`refused` a Refused naming that one input, a code the client does not know a BatchgateError.

These mirror the server's codes (api/errors.py's ERRORS, which this module cannot import: it
would load the server into every client); `ProtocolError` is the client's own.
"""

from __future__ import annotations

from dataclasses import dataclass


class BatchgateError(Exception):
    """The root: whatever a call raises is one of these (a bug aside)."""

    status = 0

    def __init__(self, message: str, code: str = "", status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.message, self.code, self.retry_after = message, code, retry_after
        if status is not None:
            self.status = status


class BadRequest(BatchgateError):
    status = 400


class Unauthorized(BatchgateError):
    status = 401


class RequestTimeout(BatchgateError):
    status = 408


class PayloadTooLarge(BatchgateError):
    status = 413


class UnsupportedMediaType(BatchgateError):
    status = 415


class HeadersTooLarge(BatchgateError):
    status = 431


class Unprocessable(BatchgateError):
    status = 422


class IdempotencyKeyReused(Unprocessable):
    pass


class UnknownModel(Unprocessable):
    """The model, or model@version, the call named is not served (now: the server's
    catalogue changes while it serves)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A guard's verdict on one input: the guard (a model of the server's catalogue) and
    its reason code; never the guard's text."""

    guard: str
    reason: str


class Refused(Unprocessable):
    """A guard refused every input of the call; `refused` says which guard and why, by the
    input's index in the call. (A call of which only some inputs were refused returns its
    outputs, None at those, with the same record in `Outputs.refused`.) Never retried: the
    same inputs get the same verdicts."""

    def __init__(self, message: str, code: str = "", status: int | None = None,
                 retry_after: float | None = None,
                 refused: dict[int, Refusal] | None = None) -> None:
        super().__init__(message, code, status, retry_after)
        self.refused = refused if refused is not None else {}


class RateLimited(BatchgateError):
    status = 429


class ServerError(BatchgateError):
    status = 500


class ModelError(ServerError):
    pass


class Unavailable(BatchgateError):
    status = 503


class Overloaded(Unavailable):
    pass


class ModelLoading(Unavailable):
    """The version holds no worker yet and its load would end past the request's deadline;
    `retry_after` is the load's expected end. Retried, as every 503, while the call's
    deadline allows."""


class NoHealthyWorker(Unavailable):
    pass


class GuardUnavailable(Unavailable):
    """A guard of the model could not answer an input in time and the model fails closed
    (its output is never given unguarded). Retried, as every 503, while the deadline
    allows."""


class DeadlineExceeded(BatchgateError, TimeoutError):
    """A 504, or the call's deadline passed here: before an attempt, or during one (the
    attempt's timeouts are what was left of the deadline)."""

    status = 504


class ConnectionFailed(BatchgateError):
    """No answer (refused, reset) and no time or attempt left to try again."""


class StreamBroken(ConnectionFailed):
    """A stream's connection dropped, or its body ended, before its done event, and it could
    not be resumed: it had no Idempotency-Key (a keyless request is never sent twice once
    its stream has begun: its inputs would run again), or its resumes or its deadline ran
    out. Raised by the stream's iterator after it has yielded every event that came."""


class ProtocolError(BatchgateError, ValueError):
    """The server answered, but not as batchgate does: a 200 that is not JSON, or not
    `{"outputs": [...]}` with one string per input (null only at the inputs its `refused`
    names), or a status batchgate never sends (1xx, 2xx but 200, 3xx). `.status` is the
    answer's. Never retried: a keyed retry would be given the same answer again, and a
    server that breaks the contract once may again."""


BY_STATUS: dict[int, type[BatchgateError]] = {
    c.status: c for c in (BadRequest, Unauthorized, RequestTimeout, PayloadTooLarge,
                          UnsupportedMediaType, HeadersTooLarge, Unprocessable, RateLimited,
                          ServerError, Unavailable, DeadlineExceeded)}
BY_CODE: dict[str, type[BatchgateError]] = {
    "idempotency_key_reused": IdempotencyKeyReused,
    "unknown_model": UnknownModel,
    "model_loading": ModelLoading,
    "refused": Refused,
    "guard_unavailable": GuardUnavailable,
    "deadline_exceeded": DeadlineExceeded,  # as its status says: read by code in a stream
    "internal": ServerError,
    **dict.fromkeys(("model_error", "contract_violation", "query_of_death"), ModelError),
    **dict.fromkeys(("over_budget", "deadline_unreachable", "queue_full",
                     "too_many_connections"), Overloaded),
    **dict.fromkeys(("no_healthy_worker", "worker_crashed", "retry", "shutting_down",
                     "model_failing", "model_unplaceable", "core_unavailable",
                     "state_unavailable"),
                    NoHealthyWorker),
}
RETRIED = (ConnectionFailed, RequestTimeout, RateLimited, Unavailable)

__all__ = [
    "BY_CODE", "BY_STATUS", "RETRIED", "BadRequest", "BatchgateError", "ConnectionFailed",
    "DeadlineExceeded", "GuardUnavailable", "HeadersTooLarge", "IdempotencyKeyReused",
    "ModelError", "ModelLoading", "NoHealthyWorker", "Overloaded", "PayloadTooLarge",
    "ProtocolError", "RateLimited", "Refusal", "Refused", "RequestTimeout", "ServerError",
    "StreamBroken", "Unauthorized", "Unavailable", "UnknownModel", "Unprocessable",
    "UnsupportedMediaType",
]
