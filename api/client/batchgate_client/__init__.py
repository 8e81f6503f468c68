"""A Python client for batchgate, sync (`Client`) and async (`AsyncClient`), over httpx.

A distribution of its own (`batchgate-client`, `pip install ./api/client` from a clone), so a
client installs httpx and this package alone, never the server.

    with Client("http://127.0.0.1:8000", api_key="paid-demo-key", timeout=10) as client:
        outputs = client.batchstring(texts)  # any number of inputs, outputs in order
        outputs = client.batchstring(texts, model="topics")  # outputs.model: "topics@v2"
        outputs.refused  # {index: Refusal(guard, reason)}: inputs a guard refused (None)
        with client.stream(texts) as results:  # up to 10,000 inputs, as they complete
            for result in results:  # Output(index, output) | Failure(index, error)
                ...
        results.done  # Done(id, model, outputs, errors)

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

A stream is one request whose results come as each input's batch lands, in completion
order. With an Idempotency-Key (given, or made when the client has an API key) a dropped
stream resumes from the last event taken (SSE's Last-Event-ID, NDJSON's ?after=) and yields
nothing twice; without one a drop raises `StreamBroken` after what came.

Rooms: `errors` (the tree), `answers` (what an answer means), `call` (one request and its
retries, no I/O), `clients` (the I/O, blocking and async); for streams `framing` (SSE and
NDJSON frames, bytes in), `events` (what an event means), `resume` (a streamed request, its
count and resumes, no I/O) and `streams` (their I/O). It loads httpx and the standard
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
    StreamBroken,
    Unauthorized,
    Unavailable,
    UnknownModel,
    Unprocessable,
    UnsupportedMediaType,
)
from batchgate_client.events import Done, Failure, Output, Result, event_from
from batchgate_client.framing import Frame, NdjsonDecoder, SseDecoder
from batchgate_client.resume import MAX_STREAM_INPUTS, Format
from batchgate_client.streams import AsyncStream, Stream

__all__ = [
    "BY_CODE", "BY_STATUS", "MAX_INPUTS", "MAX_STREAM_INPUTS", "PATH", "RETRIED",
    "AsyncClient", "AsyncStream", "BadRequest", "BatchgateError", "Client", "ConnectionFailed",
    "DeadlineExceeded", "Done", "Failure", "Format", "Frame", "GuardUnavailable",
    "HeadersTooLarge", "IdempotencyKeyReused", "ModelError", "ModelLoading", "NdjsonDecoder",
    "NoHealthyWorker", "Output", "Outputs", "Overloaded", "PayloadTooLarge", "ProtocolError",
    "RateLimited", "Refusal", "Refused", "RequestTimeout", "Result", "RetryPolicy",
    "ServerError", "SseDecoder", "Stream", "StreamBroken", "Unauthorized", "Unavailable",
    "UnknownModel", "Unprocessable", "UnsupportedMediaType", "error_from", "event_from",
    "outputs_from", "parse_retry_after", "refusals_from",
]
