"""A Python client for batchgate, sync (`Client`) and async (`AsyncClient`), over httpx.

A distribution of its own (`batchgate-client`, `pip install ./api/client` from a clone), so a
client installs httpx and this package alone, never the server.

    with Client("http://127.0.0.1:8000", api_key="paid-demo-key", timeout=10) as client:
        outputs = client.batchstring(texts)  # any number of inputs, outputs in order
        outputs = client.batchstring(texts, model="topics")  # outputs.model: "topics@v2"
        outputs.refused  # {index: Refusal(guard, reason)}: inputs a guard refused (None)

More than `max_inputs` (100) inputs go as several requests at once, collated in order. Each
request carries an Idempotency-Key of its own, kept across its retries, so a retry never
runs the model twice (with an API key: the server keeps answers per account and refuses the
header from anonymous callers, whose retries after a dropped connection may run again).
Connection errors, 408, 429 and 503 are retried (Retry-After honoured, with a floor, plus
jitter, so refused clients do not come back in step) until `max_attempts` or the call's
deadline, which every attempt passes on as `X-Request-Timeout-Ms` and stays within.
Anything else raises at once, as the exception that mirrors its error code (the tree is in
`batchgate_client.errors`); an answer that breaks the contract raises `ProtocolError`. Sync
and async raise the same exceptions, a split call the first of its requests' failures.

Rooms: `errors` (the tree), `answers` (what an answer means), `call` (one request and its
retries, no I/O), `clients` (the I/O, blocking and async). It loads httpx and the standard
library alone (a test holds it to that).
"""

from batchgate_client.answers import (
    Outputs,
    error_from,
    outputs_from,
    parse_retry_after,
    refusals_from,
)
from batchgate_client.call import MAX_INPUTS, PATH, RetryPolicy
from batchgate_client.clients import AsyncClient, Client
from batchgate_client.errors import (
    BY_CODE,
    BY_STATUS,
    RETRIED,
    BadRequest,
    BatchgateError,
    ConnectionFailed,
    DeadlineExceeded,
    GuardUnavailable,
    HeadersTooLarge,
    IdempotencyKeyReused,
    ModelError,
    ModelLoading,
    NoHealthyWorker,
    Overloaded,
    PayloadTooLarge,
    ProtocolError,
    RateLimited,
    Refusal,
    Refused,
    RequestTimeout,
    ServerError,
    Unauthorized,
    Unavailable,
    UnknownModel,
    Unprocessable,
    UnsupportedMediaType,
)

__all__ = [
    "BY_CODE", "BY_STATUS", "MAX_INPUTS", "PATH", "RETRIED", "AsyncClient", "BadRequest",
    "BatchgateError", "Client", "ConnectionFailed", "DeadlineExceeded", "GuardUnavailable",
    "HeadersTooLarge", "IdempotencyKeyReused", "ModelError", "ModelLoading", "NoHealthyWorker",
    "Outputs", "Overloaded", "PayloadTooLarge", "ProtocolError", "RateLimited", "Refusal",
    "Refused", "RequestTimeout", "RetryPolicy", "ServerError", "Unauthorized", "Unavailable",
    "UnknownModel", "Unprocessable", "UnsupportedMediaType", "error_from", "outputs_from",
    "parse_retry_after", "refusals_from",
]
