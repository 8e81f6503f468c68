"""The link's messages between a gateway and the core process over a Unix socket.

Both ends speak `batcher.Framed` (coalescing: what a side sends during one event-loop turn
is one frame, so a batch of 100 answers leaves the core as one write, not 100); this module
holds what the frames carry.

Messages are tuples of plain values (`run_message`, `outcome_message`): unpickling a
dataclass calls back into Python for every object, and that cost the core process more
per job than admitting it. Nothing that crosses names a class of the core's packages, so a
gateway unpickles without loading them.

Gateway -> core: ("run", rid, tier, account, key, texts, single, deadline, idempotency,
model, trace, stream),
("cancel", rid), ("call", rid, name, *args). A job's deadline is when its time runs out on
`HOST_CLOCK`, counted from when the gateway sent it: a core that reads it late (stopped, a
long turn) gives it only the time it has left, as a single process would have.
Core -> gateway: ("ok", rid, outputs, waits, batch, batch_ids, attempts, model) for an
`Answered`, with (refused, skipped) after `model` when a guard refused an input or failed
open for one (a plain answer's frame stays as it was),
("no", rid, status, body, headers, waits, batch, model) for a `Rendered`, ("value", rid,
value) for a call's value, ("error", rid, message) for a call that failed.
"""

from __future__ import annotations

import time
from typing import Any

from api.http import Answered, Job, Outcome, Rendered
from batcher.shared import Framed

GATEWAY_FRAME_SPACING_S = 0.005
GATEWAY_BUSY_RATE = 1000.0
"""A gateway sending more than `GATEWAY_BUSY_RATE` messages a second to the core spaces
its frames `GATEWAY_FRAME_SPACING_S` apart. Every frame wakes the core, and a wake-up with
its frame's bookkeeping costs the core about as much CPU as admitting several jobs: at
thousands of requests a second a gateway would send a frame of one or two jobs every loop
turn. Spaced, the frames carry more jobs each, for at most the spacing in latency; below
the rate, where the core has CPU to spare, nothing waits."""

Message = tuple[Any, ...]

HOST_CLOCK = time.monotonic
"""The clock both ends of a link read a job's deadline on: CLOCK_MONOTONIC is one clock for
every process of a host, and a cell's gateways and core share one."""


def run_message(rid: int, job: Job, now: float | None = None) -> Message:
    """`job` as sent at `now` on `HOST_CLOCK` (read when not given)."""
    p = job.principal
    sent = HOST_CLOCK() if now is None else now
    return ("run", rid, int(p.tier), p.account, p.key, job.texts, job.single,
            sent + job.timeout, job.idempotency, job.model, job.trace, job.stream)


def outcome_message(rid: int, outcome: Outcome) -> Message:
    if isinstance(outcome, Answered):
        if outcome.refused or outcome.skipped:
            return ("ok", rid, *outcome[:6], outcome.refused, outcome.skipped)
        return ("ok", rid, outcome.outputs, outcome.waits, outcome.batch, outcome.batch_ids,
                outcome.attempts, outcome.model)
    return ("no", rid, outcome.status, outcome.body, outcome.headers, outcome.waits,
            outcome.batch, outcome.model)


def outcome_of(message: Message) -> Any:
    """The value a core -> gateway message carries: an `Outcome`, or a call's value."""
    kind = message[0]
    if kind == "ok":
        return Answered(*message[2:])
    if kind == "no":
        return Rendered(*message[2:])
    return message[2]


__all__ = ["GATEWAY_BUSY_RATE", "GATEWAY_FRAME_SPACING_S", "HOST_CLOCK", "Framed", "Message",
           "outcome_message", "outcome_of", "run_message"]
