"""One streamed request: its retries before the stream opens, the events it has taken, and
its resumes after a drop. Decides and keeps count, does no I/O (the streams do).

Before a 200 it is a call's request like any other (`Call`: the same retries, Retry-After
and deadline). After one, every event is counted: its sequence number is how many came
before it, on every connection of the stream. A drop, or a body that ends before the done
event, resumes the stream on a new connection with the same body and Idempotency-Key from
the next event (SSE: `Last-Event-ID`, the last id taken; NDJSON: `?after=`, the events
taken), at most `max_resumes` times and within the deadline. Without a key it raises
`StreamBroken`: the server would run the inputs again."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, Literal

import httpx

from batchgate_client.answers import error_from
from batchgate_client.call import Call, RetryPolicy
from batchgate_client.errors import DeadlineExceeded, ProtocolError, StreamBroken
from batchgate_client.events import Done, Failure, Output, event_from
from batchgate_client.framing import Frame, NdjsonDecoder, SseDecoder

Format = Literal["sse", "ndjson"]
MEDIA: dict[str, str] = {"sse": "text/event-stream", "ndjson": "application/x-ndjson"}
MAX_STREAM_INPUTS = 10_000  # the server's --max-stream-inputs default


class StreamCall(Call):
    """A streamed request of `inputs`; `done` is its done event once taken."""

    renews_key = False  # the key names the stream a resume picks up, whatever refused it

    def __init__(self, inputs: list[str], model: str | None, deadline: float,
                 policy: RetryPolicy, rng: random.Random, key: str | None, format: Format,
                 max_resumes: int) -> None:
        super().__init__(inputs, model, deadline, policy, rng, keyed=False)
        self.key, self.format, self.max_resumes = key, format, max_resumes
        self.taken = 0  # events taken: the next one's sequence number
        self.resumes = 0
        self.outputs = self.errors = 0
        self.done: Done | None = None
        self._answered = bytearray(len(inputs))  # 1 at each input an event has answered
        self._decoder: SseDecoder | NdjsonDecoder | None = None  # the open stream's

    def request(self, now: float) -> dict[str, Any]:
        """The next attempt's keyword arguments (`Call.request`'s), asking for the format
        and, on a resume, for the events after those taken."""
        kwargs = super().request(now)
        # Identity: a compressor holds events back until its block fills.
        kwargs["headers"].update({"Accept": MEDIA[self.format], "Accept-Encoding": "identity"})
        if self.taken and self.format == "sse":
            kwargs["headers"]["Last-Event-ID"] = str(self.taken - 1)
        elif self.taken:
            kwargs["params"] = {"after": str(self.taken)}
        self._decoder = None
        return kwargs

    def opened(self, response: httpx.Response, now: float) -> float | None:
        """None when `response` opens the stream (a 200 of the format asked for: read it
        with `feed`); else seconds to wait before trying again. Raises the answer's error
        (its body read) as a call does, or ProtocolError for another media type."""
        if response.status_code != 200:
            return self.failed(error_from(response, self.count), now)
        media = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media != MEDIA[self.format]:
            raise ProtocolError(f"a stream of {media or 'no media type'}, not "
                                f"{MEDIA[self.format]}", status=200)
        self.attempt = 0  # each resume has the policy's attempts again
        self._decoder = SseDecoder() if self.format == "sse" else NdjsonDecoder()
        return None

    def feed(self, chunk: bytes) -> Iterator[Output | Failure]:
        """The results that `chunk` completes, in the order sent, each taken as it is
        yielded (so those before a broken event are given); the done event sets `done`,
        and nothing after it is read. Raises ProtocolError for an event that breaks the
        contract: an SSE id out of sequence, an input answered twice, a done event before
        every input was answered or whose counts are not the stream's."""
        if self._decoder is None:
            raise RuntimeError("feed() before a stream opened")
        for frame in self._decoder.feed(chunk):
            if self.done is not None:
                return
            result = self._take(frame)
            if result is not None:
                yield result

    def broke(self, exc: Exception | None, now: float) -> float:
        """Seconds to wait after an attempt that broke: before its stream opened, as a
        call's request (`Call.broke`); after, none: it resumes at once. `exc`: httpx's
        transport error, a TimeoutError, or None when the body ended before the done
        event. Raises DeadlineExceeded for a timeout (every read's is what was left of the
        deadline), StreamBroken when the stream cannot resume."""
        if self._decoder is None:
            if exc is None:
                raise RuntimeError("a body ended before a stream opened")
            return super().broke(exc, now)
        self._decoder = None
        if isinstance(exc, httpx.TimeoutException | TimeoutError):
            raise DeadlineExceeded("no event by the call's deadline", status=0) from exc
        why = repr(exc) if exc is not None else "the body ended before the done event"
        if self.key is None:
            raise StreamBroken(f"{why}, and a stream without an Idempotency-Key is not "
                               f"resumed ({self.taken} events taken)") from exc
        if self.resumes >= self.max_resumes:
            raise StreamBroken(f"{why} after {self.resumes} resumes") from exc
        self.resumes += 1
        return 0.0

    def _take(self, frame: Frame) -> Output | Failure | None:
        if self.format == "sse" and frame.id != str(self.taken):
            raise _broken(f"event id {frame.id!r} where {self.taken} was next")
        event = event_from(frame.data, self.count)
        self.taken += 1
        if isinstance(event, Done):
            self.done = self._checked(event)
            return None
        if self._answered[event.index]:
            raise _broken(f"input {event.index} answered twice")
        self._answered[event.index] = 1
        if isinstance(event, Output):
            self.outputs += 1
        else:
            self.errors += 1
        return event

    def _checked(self, done: Done) -> Done:
        if self.outputs + self.errors != self.count:
            raise _broken(f"done after {self.outputs + self.errors} of {self.count} inputs")
        if (done.outputs, done.errors) != (self.outputs, self.errors):
            raise _broken(f"done counts {done.outputs} outputs and {done.errors} errors, "
                          f"the stream held {self.outputs} and {self.errors}")
        return done


def _broken(what: str) -> ProtocolError:
    return ProtocolError(f"the stream breaks the protocol: {what}", status=200)


__all__ = ["MAX_STREAM_INPUTS", "MEDIA", "Format", "StreamCall"]
