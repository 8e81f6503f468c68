"""A stream's frames off the wire, bytes in and frames out, no I/O: Server-Sent Events (an
event per blank line, its `data:` lines joined, its `id:` kept) and NDJSON (an object per
line). Shared by the clients and the load test's streaming user.

Written here rather than taken from httpx (or httpx-sse): httpx's `iter_lines` splits as
`str.splitlines` does, on U+2028, U+0085 and five more characters that JSON carries
unescaped inside a string, so an output holding one would be cut in two; and NDJSON needs
a line reader anyway. An event's size is bounded, so a server that never ends a line cannot
fill the client's memory."""

from __future__ import annotations

import re
from dataclasses import dataclass

from batchgate_client.errors import ProtocolError

MAX_EVENT_BYTES = 16 << 20  # far above any output: a bound on a broken server, not a limit
SSE_EOL = re.compile(rb"\r\n|\r|\n")  # the three line ends the SSE grammar allows
NDJSON_EOL = re.compile(rb"\n")


@dataclass(frozen=True, slots=True)
class Frame:
    """One event's data, and its SSE id: the last `id:` the stream sent, as the SSE
    standard keeps it across events (always None in NDJSON, whose line is its id)."""

    data: str
    id: str | None = None


class _Lines:
    """Whole lines of UTF-8 text from chunks of bytes; a partial line waits for the rest."""

    def __init__(self, eol: re.Pattern[bytes], limit: int) -> None:
        self._eol, self._limit = eol, limit
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[str]:
        # What the buffer holds has no line end but perhaps a last CR: search from there.
        start, scan = 0, max(0, len(self._buffer) - 1)
        self._buffer += chunk
        lines: list[str] = []
        for end in self._eol.finditer(self._buffer, scan):
            if end.group() == b"\r" and end.end() == len(self._buffer):
                break  # perhaps the first half of a CRLF
            lines.append(_text(self._buffer[start:end.start()]))
            start = end.end()
        del self._buffer[:start]
        if len(self._buffer) > self._limit:
            raise _broken(f"a line longer than {self._limit} bytes")
        return lines


class SseDecoder:
    """Server-Sent Events as the WHATWG standard parses them (9.2.6), less what batchgate
    never sends and a client need not act on (`event:` types, `retry:`)."""

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self._lines, self._limit = _Lines(SSE_EOL, limit), limit
        self._data: list[str] = []
        self._size = 0
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[Frame]:
        """The events that `chunk` completes, in order."""
        frames: list[Frame] = []
        for line in self._lines.feed(chunk):
            if not line:
                if self._data:
                    frames.append(Frame("\n".join(self._data), self._id))
                self._data, self._size = [], 0
            elif not line.startswith(":"):  # a comment: a keep-alive
                name, _, value = line.partition(":")
                self._field(name, value.removeprefix(" "))
        return frames

    def _field(self, name: str, value: str) -> None:
        if name == "data":
            self._size += len(value) + 1
            if self._size > self._limit:
                raise _broken(f"an event longer than {self._limit} bytes")
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value


class NdjsonDecoder:
    """Newline-delimited JSON: each non-blank line an event's data (a blank line is no
    event, so a server may send one to keep the connection alive)."""

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self._lines = _Lines(NDJSON_EOL, limit)

    def feed(self, chunk: bytes) -> list[Frame]:
        """The events that `chunk` completes, in order."""
        return [Frame(line) for line in self._lines.feed(chunk) if line.strip()]


def _text(line: bytearray) -> str:
    try:
        return line.decode()
    except UnicodeDecodeError as exc:
        raise _broken("a line that is not UTF-8") from exc


def _broken(what: str) -> ProtocolError:
    return ProtocolError(f"the stream breaks the protocol: {what}", status=200)


__all__ = ["MAX_EVENT_BYTES", "Frame", "NdjsonDecoder", "SseDecoder"]
