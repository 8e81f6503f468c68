"""Domain errors -> HTTP. The only place that knows status codes.

Every error leaves as `{"error": {"code", "message"}}`; a refusal carries `Retry-After`.
Anything unexpected becomes a 500 with a generic message: no traceback reaches a client.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from api.auth import Unauthorized
from api.limits import RateLimited
from batcher import BatchgateError, Closed, DeadlineExceeded, Overloaded, QueueFull
from failover import IdempotencyMismatch, ModelError, NoHealthyWorker, WorkerCrashed

log = logging.getLogger("batchgate.api")


class ApiError(Exception):
    """A request the API itself refuses (malformed, too large, invalid)."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    return Response(body, status_code=status, headers=headers, media_type="application/json")


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
        case ModelError():
            return ApiError(500, exc.code, str(exc))
        case BatchgateError():
            return ApiError(500, exc.code, str(exc))
    log.error("unexpected error while serving a request", exc_info=exc)
    return ApiError(500, "internal", "internal error")


__all__ = ["ApiError", "error_response", "retry_after", "to_api_error"]
