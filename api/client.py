"""A Python client for batchgate, sync (`Client`) and async (`AsyncClient`), over httpx.

    with Client("http://127.0.0.1:8000", api_key="paid-demo-key", timeout=10) as client:
        outputs = client.batchstring(texts)  # any number of inputs, outputs in order

More than `max_inputs` (100) inputs go as several requests at once, collated in order. Each
request carries an Idempotency-Key of its own, kept across its retries, so a retry never
runs the model twice (with an API key: the server keeps answers per account and refuses the
header from anonymous callers, whose retries after a dropped connection may run again).
Connection errors, 429 and 503 are retried (Retry-After honoured, plus jitter, so refused
clients do not come back in step) until `max_attempts` or the call's deadline, which every
attempt passes on as `X-Request-Timeout-Ms`. Anything else raises at once, as the exception
that mirrors its error code:

    BatchgateError                   .status, .code, .message, .retry_after
    ├── BadRequest              400  malformed_json, invalid_request, invalid_timeout, ...
    ├── Unauthorized            401
    ├── RequestTimeout          408  request_timeout: the upload stalled; retried
    ├── PayloadTooLarge         413  body_too_large, input_too_large
    ├── UnsupportedMediaType    415  unsupported_media_type
    ├── HeadersTooLarge         431  headers_too_large
    ├── Unprocessable           422  empty_inputs, too_many_inputs, unknown_model
    │   └── IdempotencyKeyReused     idempotency_key_reused
    ├── RateLimited             429  retried
    ├── ServerError             500  internal
    │   └── ModelError               model_error, contract_violation, query_of_death
    ├── Unavailable             503  retried
    │   ├── Overloaded               over_budget, deadline_unreachable, queue_full,
    │   │                            too_many_connections
    │   └── NoHealthyWorker          no_healthy_worker, worker_crashed, retry, shutting_down,
    │                                core_unavailable
    ├── DeadlineExceeded        504, or the call's deadline passed here (also a TimeoutError)
    └── ConnectionFailed             no answer (refused, reset) after the retries
"""

from __future__ import annotations

import concurrent.futures
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import anyio
import httpx

PATH = "/v1/batchstring"
MAX_INPUTS = 100


class BatchgateError(Exception):
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


class NoHealthyWorker(Unavailable):
    pass


class DeadlineExceeded(BatchgateError, TimeoutError):
    status = 504


class ConnectionFailed(BatchgateError):
    pass


BY_STATUS: dict[int, type[BatchgateError]] = {
    c.status: c for c in (BadRequest, Unauthorized, RequestTimeout, PayloadTooLarge,
                          UnsupportedMediaType, HeadersTooLarge, Unprocessable, RateLimited,
                          ServerError, Unavailable, DeadlineExceeded)}
BY_CODE: dict[str, type[BatchgateError]] = {
    "idempotency_key_reused": IdempotencyKeyReused,
    **dict.fromkeys(("model_error", "contract_violation", "query_of_death"), ModelError),
    **dict.fromkeys(("over_budget", "deadline_unreachable", "queue_full",
                     "too_many_connections"), Overloaded),
    **dict.fromkeys(("no_healthy_worker", "worker_crashed", "retry", "shutting_down",
                     "core_unavailable"), NoHealthyWorker),
}
RETRIED = (ConnectionFailed, RequestTimeout, RateLimited, Unavailable)


def error_from(response: httpx.Response) -> BatchgateError:
    """The typed exception for an error answer (any body, even one that is not ours)."""
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "", response.text[:200] or response.reason_phrase
    header = response.headers.get("retry-after")
    retry_after = float(header) if header and header.isdigit() else None
    status = response.status_code
    kind = BY_CODE.get(code) or BY_STATUS.get(status) or (
        ServerError if status >= 500 else BadRequest)
    return kind(message, code, status, retry_after)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a call retries: at most `max_attempts` per request; after a refusal, its
    Retry-After times 1 to 1 + `jitter`; after a connection error, exponential backoff
    from `backoff` to `backoff_max` seconds with full jitter."""

    max_attempts: int = 5
    backoff: float = 0.05
    backoff_max: float = 2.0
    jitter: float = 0.25

    def wait(self, error: BatchgateError, attempt: int, rng: random.Random) -> float | None:
        """Seconds to wait before attempt `attempt + 1`; None: give up and raise `error`."""
        if not isinstance(error, RETRIED) or attempt >= self.max_attempts:
            return None
        if error.retry_after is not None:
            return error.retry_after * (1 + rng.uniform(0, self.jitter))
        return rng.uniform(0, min(self.backoff_max, self.backoff * 2 ** (attempt - 1)))


class _Call:
    """One request and its retries: decides, does no I/O (the two clients do)."""

    def __init__(self, body: dict[str, Any], deadline: float, policy: RetryPolicy,
                 rng: random.Random, keyed: bool) -> None:
        self.body, self.deadline, self.policy, self.rng = body, deadline, policy, rng
        self.key = uuid.uuid4().hex if keyed else None
        self.attempt = 0

    def request(self, now: float) -> dict[str, Any]:
        """The keyword arguments of the next attempt's POST."""
        remaining = self.deadline - now
        if remaining <= 0:
            raise DeadlineExceeded("the call's deadline passed before an answer", status=0)
        self.attempt += 1
        headers = {"X-Request-Timeout-Ms": str(max(1, math.floor(remaining * 1000)))}
        if self.key is not None:
            headers["Idempotency-Key"] = self.key
        return {"json": self.body, "headers": headers, "timeout": remaining + 1.0}

    def answered(self, response: httpx.Response, now: float) -> list[str] | float:
        """The outputs, or seconds to wait before retrying; raises the answer's error."""
        if response.status_code == 200:
            outputs: list[str] = response.json()["outputs"]
            return outputs
        return self.failed(error_from(response), now)

    def failed(self, error: BatchgateError, now: float) -> float:
        wait = self.policy.wait(error, self.attempt, self.rng)
        if wait is None or now + wait >= self.deadline:
            raise error
        if isinstance(error, RateLimited) and self.key is not None:
            # Refused before anything ran, so a new key is safe (older servers stored the
            # 429 under its key and replayed it to every retry).
            self.key = uuid.uuid4().hex
        return wait


def _chunks(inputs: Sequence[str], size: int) -> list[list[str]]:
    return [list(inputs[i:i + size]) for i in range(0, len(inputs), size)]


class _Base:
    def __init__(self, api_key: str | None, timeout: float, max_inputs: int,
                 model: str | None, retry: RetryPolicy | None, clock: Callable[[], float],
                 rng: random.Random | None) -> None:
        if not 1 <= max_inputs <= MAX_INPUTS:
            raise ValueError(f"max_inputs must be within 1..{MAX_INPUTS}")
        self.keyed = bool(api_key)
        self.timeout, self.max_inputs, self.model = timeout, max_inputs, model
        self.retry, self.clock = retry or RetryPolicy(), clock
        self.rng = rng or random.Random()

    def _calls(self, inputs: Sequence[str]) -> list[_Call]:
        deadline = self.clock() + self.timeout
        calls = []
        for chunk in _chunks(inputs, self.max_inputs):
            body: dict[str, Any] = {"inputs": chunk}
            if self.model is not None:
                body["model"] = self.model
            calls.append(_Call(body, deadline, self.retry, self.rng, self.keyed))
        return calls

    @staticmethod
    def _headers(api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class Client(_Base):
    """Blocking client; one connection pool, safe to share between threads."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 30.0,
                 max_inputs: int = MAX_INPUTS, model: str | None = None,
                 retry: RetryPolicy | None = None, transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        super().__init__(api_key, timeout, max_inputs, model, retry, clock, rng)
        self._sleep = sleep
        self._http = httpx.Client(base_url=base_url, headers=self._headers(api_key),
                                  transport=transport)

    def batchstring(self, inputs: Sequence[str]) -> list[str]:
        """One output per input, in order; raises a BatchgateError (see the module)."""
        calls = self._calls(inputs)
        if len(calls) <= 1:
            return [out for call in calls for out in self._run(call)]
        with concurrent.futures.ThreadPoolExecutor(min(len(calls), 8)) as pool:
            return [out for outs in pool.map(self._run, calls) for out in outs]

    def _run(self, call: _Call) -> list[str]:
        while True:
            try:
                response = self._http.post(PATH, **call.request(self.clock()))
            except httpx.TransportError as exc:
                wait = call.failed(ConnectionFailed(repr(exc)), self.clock())
            else:
                result = call.answered(response, self.clock())
                if isinstance(result, list):
                    return result
                wait = result
            self._sleep(wait)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AsyncClient(_Base):
    """The same on anyio (asyncio or trio); the requests of a split call run concurrently."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 30.0,
                 max_inputs: int = MAX_INPUTS, model: str | None = None,
                 retry: RetryPolicy | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
                 rng: random.Random | None = None) -> None:
        super().__init__(api_key, timeout, max_inputs, model, retry, clock, rng)
        self._sleep = sleep
        self._http = httpx.AsyncClient(base_url=base_url, headers=self._headers(api_key),
                                       transport=transport)

    async def batchstring(self, inputs: Sequence[str]) -> list[str]:
        """One output per input, in order; raises a BatchgateError (see the module)."""
        calls = self._calls(inputs)
        results: list[list[str]] = [[] for _ in calls]

        async def run(i: int) -> None:
            results[i] = await self._run(calls[i])

        if len(calls) == 1:
            await run(0)
        else:
            async with anyio.create_task_group() as tg:
                for i in range(len(calls)):
                    tg.start_soon(run, i)
        return [out for outs in results for out in outs]

    async def _run(self, call: _Call) -> list[str]:
        while True:
            try:
                response = await self._http.post(PATH, **call.request(self.clock()))
            except httpx.TransportError as exc:
                wait = call.failed(ConnectionFailed(repr(exc)), self.clock())
            else:
                result = call.answered(response, self.clock())
                if isinstance(result, list):
                    return result
                wait = result
            await self._sleep(wait)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


__all__ = [
    "AsyncClient", "BadRequest", "BatchgateError", "Client", "ConnectionFailed",
    "DeadlineExceeded", "HeadersTooLarge", "IdempotencyKeyReused", "ModelError",
    "NoHealthyWorker", "Overloaded", "PayloadTooLarge", "RateLimited", "RequestTimeout",
    "RetryPolicy", "ServerError", "Unauthorized", "Unavailable", "Unprocessable",
    "UnsupportedMediaType", "error_from",
]
