"""The two clients, blocking and async: each splits a call into requests, runs them at once
and collates their outputs in order. Either raises the first failure of a call, as itself,
and the call's other requests start no new attempt. A streamed call is one request, read as
it comes (`streams`)."""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self

import anyio
import httpx

from batchgate_client.answers import Outputs
from batchgate_client.call import MAX_INPUTS, PATH, Call, RetryPolicy, chunks
from batchgate_client.errors import Unprocessable
from batchgate_client.resume import MAX_STREAM_INPUTS, MEDIA, Format, StreamCall
from batchgate_client.streams import AsyncStream, Stream


class _Abandoned(Exception):
    """Another request of the same call failed: this one starts no new attempt."""


class _Base:
    def __init__(self, api_key: str | None, timeout: float, max_inputs: int,
                 max_stream_inputs: int, model: str | None, retry: RetryPolicy | None,
                 clock: Callable[[], float], rng: random.Random | None) -> None:
        if not 1 <= max_inputs <= MAX_INPUTS:
            raise ValueError(f"max_inputs must be within 1..{MAX_INPUTS}")
        if max_stream_inputs < 1:
            raise ValueError("max_stream_inputs must be at least 1")
        self.keyed = bool(api_key)
        self.timeout, self.max_inputs, self.model = timeout, max_inputs, model
        self.max_stream_inputs = max_stream_inputs
        self.retry, self.clock = retry or RetryPolicy(), clock
        self.rng = rng or random.Random()

    def _calls(self, inputs: Sequence[str], model: str | None) -> list[Call]:
        deadline = self.clock() + self.timeout
        model = self.model if model is None else model
        parts = chunks(list(inputs), self.max_inputs)
        return [Call(chunk, model, deadline, self.retry, self.rng, self.keyed, len(parts) > 1)
                for chunk in parts]

    def _stream_call(self, inputs: Sequence[str], model: str | None, key: str | None,
                     format: Format, max_resumes: int) -> StreamCall:
        """The call `stream()` reads; raises what is wrong with it before anything is sent:
        Unprocessable (`too_many_inputs`, status 0) past `max_stream_inputs`, as the server
        would answer, ValueError for a key without an API key or an unknown format."""
        if len(inputs) > self.max_stream_inputs:
            raise Unprocessable(f"{len(inputs)} inputs, more than max_stream_inputs "
                                f"({self.max_stream_inputs}) in one stream",
                                "too_many_inputs", status=0)
        if key is not None and not self.keyed:
            raise ValueError("an Idempotency-Key needs an API key (the server keeps answers "
                             "per account)")
        if format not in MEDIA:
            raise ValueError(f"format must be one of {sorted(MEDIA)}")
        if key is None and self.keyed:
            key = uuid.uuid4().hex
        return StreamCall(list(inputs), self.model if model is None else model,
                          self.clock() + self.timeout, self.retry, self.rng, key, format,
                          max_resumes)

    @staticmethod
    def _headers(api_key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class Client(_Base):
    """Blocking client; one connection pool, safe to share between threads. `clock` and
    `sleep` are seams for tests; without `sleep`, a wait between attempts ends as soon as
    another request of the same call has failed."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 30.0,
                 max_inputs: int = MAX_INPUTS, max_stream_inputs: int = MAX_STREAM_INPUTS,
                 model: str | None = None, retry: RetryPolicy | None = None,
                 transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] | None = None,
                 rng: random.Random | None = None) -> None:
        super().__init__(api_key, timeout, max_inputs, max_stream_inputs, model, retry, clock,
                         rng)
        self._sleep = sleep
        self._http = httpx.Client(base_url=base_url, headers=self._headers(api_key),
                                  transport=transport)

    def batchstring(self, inputs: Sequence[str], model: str | None = None) -> Outputs:
        """One output per input, in order (`.model`: the version that ran them; None where
        a guard refused the input, `.refused` says why); raises a BatchgateError (see
        batchgate_client.errors): of several, the first to fail; `Refused` when a guard
        refused every input. `model`: "topics" or "topics@v2" (None: the client's, else the
        server's first model)."""
        calls, stop = self._calls(inputs, model), threading.Event()
        if len(calls) <= 1:
            return Outputs.joined([self._run(call, stop) for call in calls]).whole()
        with concurrent.futures.ThreadPoolExecutor(min(len(calls), 8)) as pool:
            futures = [pool.submit(self._run, call, stop) for call in calls]
            try:
                for future in concurrent.futures.as_completed(futures):
                    future.result()
            except BaseException:
                stop.set()
                for future in futures:
                    future.cancel()
                raise
        return Outputs.joined([future.result() for future in futures]).whole()

    def stream(self, inputs: Sequence[str], model: str | None = None, *,
               idempotency_key: str | None = None, format: Format = "sse",
               max_resumes: int = 5) -> Stream:
        """The inputs as one streamed request (at most `max_stream_inputs`), its results
        yielded as they complete: an `Output` or a `Failure` per input, by its index; then
        `.done` holds the done event (the answer's id, version and counts). With a key
        (`idempotency_key`, else a fresh one when the client has an API key) a dropped
        stream resumes by itself, up to `max_resumes` times within the deadline, and yields
        only what it had not; without one a drop raises `StreamBroken`. A refusal before
        the stream opens is retried, then raised, as `batchstring`'s is. `format`: "sse" or
        "ndjson" (the same results either way). Nothing is sent before the first `next`."""
        call = self._stream_call(inputs, model, idempotency_key, format, max_resumes)
        return Stream(self._http, call, self.clock, self._sleep or time.sleep)

    def _run(self, call: Call, stop: threading.Event) -> Outputs:
        while not stop.is_set():
            try:
                response = self._http.post(PATH, **call.request(self.clock()))
            except httpx.TransportError as exc:
                wait = call.broke(exc, self.clock())
            else:
                result = call.answered(response, self.clock())
                if isinstance(result, Outputs):
                    return result
                wait = result
            if self._sleep is None:
                stop.wait(wait)
            else:
                self._sleep(wait)
        raise _Abandoned

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AsyncClient(_Base):
    """The same on anyio (asyncio or trio); the requests of a split call run concurrently,
    and each attempt is also bounded as a whole by what is left of the deadline."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 30.0,
                 max_inputs: int = MAX_INPUTS, max_stream_inputs: int = MAX_STREAM_INPUTS,
                 model: str | None = None, retry: RetryPolicy | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
                 rng: random.Random | None = None) -> None:
        super().__init__(api_key, timeout, max_inputs, max_stream_inputs, model, retry, clock,
                         rng)
        self._sleep = sleep
        self._http = httpx.AsyncClient(base_url=base_url, headers=self._headers(api_key),
                                       transport=transport)

    async def batchstring(self, inputs: Sequence[str], model: str | None = None) -> Outputs:
        """One output per input, in order (`.model`: the version that ran them); raises a
        BatchgateError (see batchgate_client.errors): of several, the first to fail, never an
        ExceptionGroup. `model` as the blocking client's."""
        calls = self._calls(inputs, model)
        if len(calls) <= 1:
            return Outputs.joined([await self._run(call) for call in calls]).whole()
        results: list[Outputs] = [Outputs() for _ in calls]
        failures: list[Exception] = []

        async def run(i: int, scope: anyio.CancelScope) -> None:
            try:
                results[i] = await self._run(calls[i])
            except Exception as exc:  # kept, and raised alone below
                failures.append(exc)
                scope.cancel()

        async with anyio.create_task_group() as tg:
            for i in range(len(calls)):
                tg.start_soon(run, i, tg.cancel_scope)
        if failures:
            raise failures[0]
        return Outputs.joined(results).whole()

    def stream(self, inputs: Sequence[str], model: str | None = None, *,
               idempotency_key: str | None = None, format: Format = "sse",
               max_resumes: int = 5) -> AsyncStream:
        """As the blocking client's `stream()`: read it with `async for` (in `async with`,
        or to its end, so its connection is closed)."""
        call = self._stream_call(inputs, model, idempotency_key, format, max_resumes)
        return AsyncStream(self._http, call, self.clock, self._sleep)

    async def _run(self, call: Call) -> Outputs:
        while True:
            attempt = call.request(self.clock())
            try:
                with anyio.fail_after(attempt["timeout"]):
                    response = await self._http.post(PATH, **attempt)
            except (httpx.TransportError, TimeoutError) as exc:
                wait = call.broke(exc, self.clock())
            else:
                result = call.answered(response, self.clock())
                if isinstance(result, Outputs):
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


__all__ = ["AsyncClient", "Client"]
