"""A stream's parts at the door: they skip the rate step (their stream passed it once), and
a keyed stream's are numbered as they are answered, the number kept with each answer.

A streamed request runs as parts (`api.stream`), and its events are sent in the order its
parts are answered. A client that reconnects with the stream's Idempotency-Key and the last
event it has (`Last-Event-ID`) must get exactly what it missed, in the order first sent:
the parts come back from the kept answers in whatever order they land, and each carries its
place (`STREAM_POSITION`: the sequence number of its first event), so that every
connection to the stream, on any gateway of a cell, sends the same events under the same
numbers.

The counters live in the core's memory, one per stream, the least recently used dropped
past `most`: a stream resumed after its core restarted counts again from 0 for the parts
not yet kept (docs/streaming.md says what that costs).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from api.door.limits import Checked
from batcher import Item

STREAM_POSITION = "Stream-Position"
"""The header of a keyed stream part's answer: the sequence number of its first event."""


class StreamPositions:
    """The next free place in each keyed stream, by (account, Idempotency-Key)."""

    def __init__(self, most: int = 100_000) -> None:
        self._next: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._most = most

    def take(self, account: str, stream: str, events: int) -> int:
        """Reserve `events` places for a part just answered; the first of them."""
        name = (account, stream)
        at = self._next.pop(name, 0)
        self._next[name] = at + events
        if len(self._next) > self._most:
            self._next.popitem(last=False)
        return at

    def __len__(self) -> int:
        return len(self._next)


class PartsSkipped:
    """A frame holding a stream's parts, which skip the rate step: the verdicts of its other
    jobs (`rated`: which those are), spread back among them for the frame (`frame`)."""

    __slots__ = ("frame", "rated")

    def __init__(self, frame: Checked, rated: list[bool]) -> None:
        self.frame, self.rated = frame, rated

    def checked(self, refusals: Sequence[BaseException | None]) -> None:
        verdicts = iter(refusals)
        self.frame.checked([next(verdicts) if rated else None for rated in self.rated])


class Promised:
    """The inputs each running stream has yet to send, by its mark (`Job.stream`): a stream
    that starts is judged with them ahead of it (`api.door.StreamStart`), as the queue's
    own items are. An entry ends once all of it was sent, when its stream ends (`forget`),
    or at its stream's deadline (a gateway that died never says)."""

    def __init__(self) -> None:
        # mark -> [version, tier, inputs, characters, deadline]
        self._left: dict[str, list[Any]] = {}

    def promise(self, stream: str, version: str, tier: int, items: int, chars: int,
                deadline: float) -> None:
        self._left[stream] = [version, tier, items, chars, deadline]

    def sent(self, stream: str, items: Sequence[Item]) -> None:
        """A part of `stream` admitted: its items are the queue's now (and, judged whole
        with it, not judged again against the tier's budget: `Item.streamed`)."""
        for item in items:
            item.streamed = True
        left = self._left.get(stream)
        if left is not None:
            left[2] -= len(items)
            left[3] -= sum(len(item.text) for item in items)
            if left[2] <= 0:
                del self._left[stream]

    def forget(self, stream: str) -> None:
        """`stream` ended (sent all, or its client left): what it did not send never comes."""
        self._left.pop(stream, None)

    def ahead(self, version: str, tier: int, now: float, but: str = "") -> tuple[int, int]:
        """(inputs, characters) the streams of `version` in `tier` or above have yet to
        send, but stream `but` (one resumed); those past their deadline are forgotten on
        the way."""
        items = chars = 0
        for stream, (of, at, n, c, deadline) in list(self._left.items()):
            if deadline <= now:
                del self._left[stream]
            elif of == version and at <= tier and stream != but:
                items, chars = items + n, chars + c
        return items, chars

    def __len__(self) -> int:
        return len(self._left)


__all__ = ["STREAM_POSITION", "PartsSkipped", "Promised", "StreamPositions"]
