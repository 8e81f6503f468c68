"""A fake streaming batchgate for the client's stream tests (a handler for httpx.MockTransport):
it answers each input in a completion order of its own, keeps every stream's events under
its Idempotency-Key, resumes one from Last-Event-ID (SSE) or ?after= (NDJSON) as the server
does, and drops connections where told. `collect` reads either client's stream the same way."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

import batchgate_client as c
from tests.api.client_fakes import FakeClock

MEDIA = {"text/event-stream": "sse", "application/x-ndjson": "ndjson"}


def sse(events: list[dict[str, Any]], first: int = 0) -> bytes:
    return b"".join(f"id: {first + n}\ndata: {json.dumps(e)}\n\n".encode()
                    for n, e in enumerate(events))


def ndjson(events: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body sent in small chunks (every event split across some), then, if `error`, a
    dropped connection."""

    def __init__(self, content: bytes, error: Exception | None = None, size: int = 7) -> None:
        self.chunks = [content[i:i + size] for i in range(0, len(content), size)]
        self.error = error

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.error is not None:
            raise self.error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.error is not None:
            raise self.error


@dataclass
class StreamServer:
    """Answers input i with its reverse, or with `errors[i]`, in `order` (default: a shuffle
    of the inputs); then the done event. `cuts`: per connection, in turn, how many events it
    sends before it drops (None: all of them); `ends` instead ends the body cleanly there."""

    order: list[int] | None = None
    errors: dict[int, dict[str, Any]] = field(default_factory=dict)
    cuts: list[int | None] = field(default_factory=list)
    ends: bool = False
    requests: list[httpx.Request] = field(default_factory=list)

    def events(self, inputs: list[str]) -> list[dict[str, Any]]:
        order = self.order or random.Random(7).sample(range(len(inputs)), len(inputs))
        events = [{"index": i, "error": self.errors[i]} if i in self.errors
                  else {"index": i, "output": inputs[i][::-1]} for i in order]
        counts = {"outputs": len(inputs) - len(self.errors), "errors": len(self.errors)}
        return [*events, {"done": True, "id": "a1", "model": "topics@v1", "counts": counts}]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        media = request.headers["accept"]
        start = (int(request.headers["last-event-id"]) + 1 if "last-event-id" in request.headers
                 else int(request.url.params.get("after", 0)))
        events = self.events(json.loads(request.content)["inputs"])[start:]
        cut = self.cuts.pop(0) if self.cuts else None
        sent = events if cut is None else events[:cut]
        content = sse(sent, start) if MEDIA[media] == "sse" else ndjson(sent)
        error = httpx.ReadError("reset") if cut is not None and not self.ends else None
        return httpx.Response(200, headers={"Content-Type": media}, stream=Body(content, error))


def client(handler: Any, clock: FakeClock, api_key: str | None = "k", timeout: float = 30.0,
           **kwargs: Any) -> c.Client:
    return c.Client("http://batchgate", api_key, timeout=timeout,
                    transport=httpx.MockTransport(handler), clock=clock, sleep=clock.sleep,
                    rng=random.Random(1), **kwargs)


def async_client(handler: Any, clock: FakeClock, api_key: str | None = "k",
                 timeout: float = 30.0, **kwargs: Any) -> c.AsyncClient:
    return c.AsyncClient("http://batchgate", api_key, timeout=timeout,
                         transport=httpx.MockTransport(handler), clock=clock,
                         sleep=clock.asleep, rng=random.Random(1), **kwargs)


@dataclass
class Read:
    """What a stream yielded, its done event, and what it raised at the end (None: none)."""

    results: list[c.Result]
    done: c.Done | None
    error: c.BatchgateError | None


def collect(kind: str, handler: Any, texts: list[str], *, clock: FakeClock | None = None,
            api_key: str | None = "k", **stream: Any) -> Read:
    """Reads `stream(texts, **stream)` of a blocking (`kind` "sync") or async client of
    `handler` to its end, keeping what it yielded before any BatchgateError."""
    clock = clock or FakeClock()
    results: list[c.Result] = []
    if kind == "sync":
        with client(handler, clock, api_key) as blocking, \
                blocking.stream(texts, **stream) as sync_results:
            try:
                results.extend(sync_results)
            except c.BatchgateError as exc:
                return Read(results, sync_results.done, exc)
            return Read(results, sync_results.done, None)

    async def read() -> Read:
        async with async_client(handler, clock, api_key) as ac, \
                ac.stream(texts, **stream) as async_results:
            try:
                async for result in async_results:
                    results.append(result)
            except c.BatchgateError as exc:
                return Read(results, async_results.done, exc)
            return Read(results, async_results.done, None)

    return anyio.run(read)
