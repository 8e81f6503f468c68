"""The media types an answer may take: JSON whole, or a stream of events
(`api.stream`), as the request's Accept asks."""

from __future__ import annotations

import enum


class Framing(enum.Enum):
    """How a streamed answer frames its events: Server-Sent Events, or one JSON object a
    line. Both carry the same events, written once (`api.stream.events`)."""

    SSE = "text/event-stream"
    NDJSON = "application/x-ndjson"

    @property
    def media_type(self) -> str:
        return self.value

    def frame(self, seq: int, event: bytes) -> bytes:
        """`event` (a JSON object) as sent, `seq` its number in its stream: an SSE event
        names it (`id:`), an NDJSON line is it (the client counts lines)."""
        if self is Framing.SSE:
            return b"id: %d\ndata: %s\n\n" % (seq, event)
        return event + b"\n"


_BY_TYPE = {framing.value: framing for framing in Framing}


def framing_of(accept: str | None) -> Framing | None:
    """The stream the Accept header asks for, or None (a JSON answer, as without one): the
    first of its media types that is a stream's, whatever its weight. A stream is asked
    for by name only: `*/*` and `application/json` get the JSON answer."""
    if accept is None:
        return None
    accept = accept.lower()  # media types are case-insensitive (RFC 9110 8.3.1)
    if "stream" not in accept and "ndjson" not in accept:
        return None  # most requests: one look, no split
    for part in accept.split(","):
        framing = _BY_TYPE.get(part.partition(";")[0].strip())
        if framing is not None:
            return framing
    return None


__all__ = ["Framing", "framing_of"]
