"""`POST /v1/batchstring` answered as a stream (`Accept: text/event-stream` or
`application/x-ndjson`): the checks any request passes, one start at the core's door
(`StatusCall.STREAM`: the rate step once, the version, admission's judgement of all its
work), then its events as its parts are answered (`StreamRun`).

Refusals before anything is admitted (400, 401, 413, 415, 422, 429, 503, 504) are plain
JSON answers; once the head of a stream is sent, whatever happens to an input is an event.

Traced (`--otlp-endpoint`), a stream is one request span from its head to its end, with
its inputs and whether it finished; its parts are not traced on their own (a part's spans in
the core would each read as a request's).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.config import Principal
from api.errors import ApiError, error_response, to_api_error
from api.http import (
    Framing,
    HttpCall,
    Job,
    Limits,
    ReceiveWatch,
    Routes,
    StatusCall,
    hot,
    read_body,
)
from api.stream.run import StreamRun
from batcher import MAX_BATCH

STREAM_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
WINDOW_BATCHES = 2
"""Full batches per ready worker a stream keeps out: one running, one queued behind it, so
a worker that finishes finds the stream's next batch waiting."""


class StreamRoute:
    """The streamed way of `routes`' hot route (`Routes.streamed` calls it)."""

    def __init__(self, routes: Routes) -> None:
        self.routes = routes
        s = routes.settings
        self.limits = Limits(s.max_stream_inputs, s.max_input_chars, s.max_stream_body_bytes)

    async def __call__(self, request: HttpCall, principal: Principal, framing: Framing
                       ) -> Response:
        routes, headers = self.routes, request.headers
        began = time.perf_counter()
        job = None
        try:
            key = routes.check_head(principal, headers)
            after = resume_point(framing, headers.get("last-event-id"),
                                 request.scope.get("query_string", b""))
            if after and key is None:
                raise ApiError("resume_needs_key", "a stream resumes only under its "
                               "Idempotency-Key, with the same body")
            body = await read_body(headers, request.stream(), self.limits.max_body_bytes)
            # Its mark, which its parts carry: its key (the door numbers a keyed stream's
            # parts under it), or a name of its own. Its span is its own (`job.trace`).
            job = routes.job_of(principal, headers, body, key, self.limits)._replace(
                stream=key if key is not None else os.urandom(8).hex())
            opened = await routes.core.status(
                StatusCall.STREAM, job.stream, int(principal.tier), principal.account,
                principal.key, job.model, job.sticky, len(job.texts),
                sum(len(t) for t in job.texts), job.timeout)
        except Exception as exc:  # translated at the boundary, never a traceback
            err = to_api_error(exc)
            response = error_response(err.code, err.message, err.headers)
            self._refused(job, headers, principal, response.status_code, began)
            return response
        if opened[0] == "no":
            _, status, refused, refusal_headers = opened
            self._refused(job, headers, principal, status, began)
            return Response(refused, status_code=status, media_type="application/json",
                            headers=dict(refusal_headers))
        _, version, workers = opened
        window = WINDOW_BATCHES * MAX_BATCH * max(workers, 1)
        run = StreamRun(routes.core, job._replace(model=version or job.model, trace=None),
                        framing, window, after, time.perf_counter)
        return StreamResponse(run, framing,
                              lambda: self._ended(run, job, headers, principal, began))

    def _refused(self, job: Job | None, headers: Mapping[str, str], principal: Principal,
                 status: int, began: float) -> None:
        """A stream refused before it began: counted, and its span (once its job was
        made) ended, as a plain request's."""
        elapsed = time.perf_counter() - began
        self.routes.record_later(principal.tier.label, status, elapsed, ())
        if job is not None and job.trace is not None:
            self.routes.traced(job, headers, status, elapsed, more={"batchgate.stream": True})

    def _ended(self, run: StreamRun, job: Job, headers: Mapping[str, str],
               principal: Principal, began: float) -> None:
        """A stream is over: the door forgets what it did not send, and its figures are
        counted, as any request's and its own."""
        mark = run.mark
        if mark:
            task = asyncio.get_running_loop().create_task(self._forgotten(mark))
            _TELLING.add(task)
            task.add_done_callback(_TELLING.discard)
        routes, tier = self.routes, principal.tier.label
        elapsed = time.perf_counter() - began
        routes.record_later(tier, 200, elapsed, (), run.model)
        if routes.access_log is not None:  # one line, as any request's: 499 if it was left
            served = hot(principal, elapsed, rid=run.answer_id,
                         code=None if run.finished else "client_closed")
            routes.access_log.put(dataclasses.replace(served, model=run.model or None))
        first = None if run.first_sent is None else run.first_sent - began
        routes.metrics.stream_done(tier, first, elapsed, run.finished)
        if job.trace is not None:
            routes.traced(job, headers, 200, elapsed, run.model or "", more={
                "batchgate.stream": True, "batchgate.stream.inputs": len(job.texts),
                "batchgate.stream.finished": run.finished})


    async def _forgotten(self, mark: str) -> None:
        with contextlib.suppress(Exception):  # a core gone forgets by itself (deadline)
            await self.routes.core.status(StatusCall.STREAM_END, mark)


_TELLING: set[asyncio.Task[None]] = set()  # the ends being told to the door


def resume_point(framing: Framing, last_event_id: str | None, query: bytes) -> int:
    """How many events the client has: after the SSE event it names (`Last-Event-ID`), or
    as many as NDJSON's `?after=` says; 0 for a new stream."""
    if framing is Framing.SSE:
        if last_event_id is None:
            return 0
        if not last_event_id.isdigit() or len(last_event_id) > 12:
            raise ApiError("invalid_request", "Last-Event-ID must be an event's number")
        return int(last_event_id) + 1
    values = parse_qs(query.decode("latin-1")).get("after") if query else None
    if not values:
        return 0
    if not values[-1].isdigit() or len(values[-1]) > 12:
        raise ApiError("invalid_request", "?after= must be a count of events")
    return int(values[-1])


class StreamResponse(Response):
    """Writes a `StreamRun`'s events as they come, and ends it when the client leaves.

    The client's leaving is heard by a task waiting on `receive()`, not from the connection
    alone (as a plain request's is): the server reads a connection only while a handler asks
    for more of its request, and a stream's body was read long before, so a client that
    closed would be noticed only when the next write failed, after its next batch of inputs
    had gone to the workers."""

    def __init__(self, run: StreamRun, framing: Framing, ended: Callable[[], Any]) -> None:
        self.status_code = 200
        self.background = None
        self.run, self.ended = run, ended
        self.raw_headers = [(b"content-type", framing.media_type.encode()), *STREAM_HEADERS]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = self.run
        watch = ReceiveWatch(receive)
        watch.watch(run.leave)
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.raw_headers})
            async for chunk in run.events():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not run.left:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client is gone mid-write
            run.leave()
        finally:
            watch.unwatch()
            if not run.finished:
                run.leave()
            self.ended()


__all__ = ["StreamResponse", "StreamRoute", "resume_point"]
