"""W3C trace context and what the core records of one traced request, in plain Python.

A request's trace context arrives as a `traceparent` header (or is started at the door)
and crosses every process as that text: the link carries the request span's, a `Run` the
attempt spans' (`format_traceparent`). In the core process one `RequestTrace` per traced
job, shared by its items, records each batch attempt as the in-flight table sends it
(`sent`), sees its worker die (`died`) or its answer land (`landed`); the door turns it into
spans once the job ends (`batcher.tracing.export`). Nothing here imports OpenTelemetry: a
process with tracing off never loads it.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Protocol

_HEADER = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_FORBIDDEN_VERSION = "ff"

BATCH, RERUN, HEDGE = "batch", "rerun", "hedge"
"""An attempt's kind: a fresh batch, a re-run (after a death, an isolation run), a hedge."""
ANSWERED = "answered"
RERAN = "worker died / re-run"
TWIN_ANSWERED = "twin answered"
SAMPLED = 0x01


class TraceParent(NamedTuple):
    """One span's context: its trace, its own id, the trace flags (bit 0: sampled)."""

    trace_id: int  # 128 bits, never 0
    span_id: int  # 64 bits, never 0
    flags: int = SAMPLED

    def __str__(self) -> str:
        return format_traceparent(self.trace_id, self.span_id, self.flags)


def parse_traceparent(text: str | None) -> TraceParent | None:
    """The context a `traceparent` header names; None for anything that is not one (a bad
    header never fails a request: the request starts a trace of its own). Version 00 is
    exactly 55 characters; a later version may carry more after a `-`."""
    if text is None:
        return None
    text = text.strip()
    if len(text) < 55:
        return None
    match = _HEADER.match(text)
    if match is None:
        return None
    version, trace, span, flags = match.groups()
    if version == _FORBIDDEN_VERSION:
        return None
    if len(text) != 55 and (version == "00" or text[55] != "-"):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


def format_traceparent(trace_id: int, span_id: int, flags: int = SAMPLED) -> str:
    """The version-00 header of a context."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def new_span_id() -> int:
    """A random, non-zero 64-bit span id (as OpenTelemetry's own generator makes one)."""
    return random.getrandbits(64) or 1


def new_trace_id() -> int:
    return random.getrandbits(128) or 1


def request_context(header: str | None) -> tuple[TraceParent | None, TraceParent]:
    """A request span's parent (the header's, None when absent or bad) and its own
    context: the parent's trace, or a new one, and a span id of its own."""
    parent = parse_traceparent(header)
    if parent is None:
        return None, TraceParent(new_trace_id(), new_span_id())
    return parent, TraceParent(parent.trace_id, new_span_id(), parent.flags)


@dataclass(slots=True, eq=False)
class Attempt:
    """One batch that ran (some of) a request's inputs: where, when, which kind, how it
    ended. Its span id is chosen when it is sent, so that the worker's span can name it as
    its parent before the core has emitted it."""

    batch_id: int
    worker: int
    start: float
    kind: str
    size: int
    span_id: int
    model: str = ""  # the version it ran on ("" : the only one)
    end: float = math.nan  # nan while it runs
    outcome: str = ""  # set once it ended, or its answer landed (`ANSWERED`)

    @property
    def open(self) -> bool:
        return math.isnan(self.end)


class RequestTrace:
    """What the core process records of one traced job: its request span's context
    (`parent`), when the core received and admitted it (core clock), and its attempts by
    (worker, batch id), in the order they were sent: batch ids count per model version,
    and a guarded input's stages run on several."""

    __slots__ = ("admitted", "attempts", "parent", "received")

    def __init__(self, parent: TraceParent, received: float, admitted: float) -> None:
        self.parent, self.received, self.admitted = parent, received, admitted
        self.attempts: dict[tuple[int, int], Attempt] = {}

    def sent(self, batch_id: int, worker: int, now: float, kind: str, size: int,
             model: str = "") -> Attempt | None:
        """A batch carrying inputs of this request went to `worker`; None when another
        input of it in the same batch already recorded it."""
        if (worker, batch_id) in self.attempts:
            return None
        attempt = self.attempts[worker, batch_id] = Attempt(batch_id, worker, now, kind, size,
                                                    new_span_id(), model)
        return attempt

    def died(self, worker: int, batch_id: int, now: float) -> None:
        """`worker` died under `batch_id`: its inputs run again elsewhere."""
        attempt = self.attempts.get((worker, batch_id))
        if attempt is not None and attempt.open:
            attempt.end, attempt.outcome = now, RERAN

    def landed(self, worker: int, batch_id: int) -> None:
        """`batch_id`'s answer from `worker` settled inputs of this request (a twin's
        answer that came second settles none, and is not told)."""
        attempt = self.attempts.get((worker, batch_id))
        if attempt is not None and attempt.open:
            attempt.outcome = ANSWERED

    def settled(self, now: float, outcome: str) -> None:
        """The request ended with `outcome`: every attempt still open closes now, with
        its own answer if it landed, else with `outcome`; a hedge's twin whose answer
        came second as `TWIN_ANSWERED`."""
        answered = any(a.outcome == ANSWERED for a in self.attempts.values())
        for attempt in self.attempts.values():
            if attempt.open:
                attempt.end = now
                if not attempt.outcome:
                    attempt.outcome = (TWIN_ANSWERED if answered and outcome == ANSWERED
                                       else outcome)

    def traceparent(self, attempt: Attempt) -> str:
        """The context an attempt's worker parents its span on."""
        return format_traceparent(self.parent.trace_id, attempt.span_id, self.parent.flags)

    def first_sent(self) -> float:
        """When its first batch was sent (nan: none was)."""
        return min((a.start for a in self.attempts.values()), default=math.nan)

    def in_order(self) -> list[Attempt]:
        return sorted(self.attempts.values(), key=lambda a: (a.start, a.batch_id))


class Traced(Protocol):
    """An input as `trace_sent` reads it (`batcher.Item`)."""

    @property
    def trace(self) -> RequestTrace | None: ...

    @property
    def version(self) -> str | None: ...


def trace_sent(items: Sequence[Traced], batch_id: int, worker: int, now: float,
                  rerun: Enum | None) -> tuple[str, ...]:
    """Record a batch (`items`) as an attempt of each traced request it carries; the
    attempts' traceparents, one per request, for the worker's spans. `rerun`: why the
    batch runs again (the table's `Rerun`, whose values are "hedge", "retry" and
    "isolate"), or None for a fresh batch."""
    kind = BATCH if rerun is None else HEDGE if rerun.value == HEDGE else RERUN
    model = items[0].version or ""  # a batch runs on one version
    out: list[str] = []
    for item in items:
        trace = item.trace
        if trace is not None:
            attempt = trace.sent(batch_id, worker, now, kind, len(items), model)
            if attempt is not None:
                out.append(trace.traceparent(attempt))
    return tuple(out)


__all__ = [
    "ANSWERED",
    "BATCH",
    "HEDGE",
    "RERAN",
    "RERUN",
    "SAMPLED",
    "TWIN_ANSWERED",
    "Attempt",
    "RequestTrace",
    "TraceParent",
    "Traced",
    "format_traceparent",
    "new_span_id",
    "new_trace_id",
    "parse_traceparent",
    "request_context",
    "trace_sent",
]
