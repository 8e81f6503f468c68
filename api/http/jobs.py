"""What a route hands the core and what it gets back: the contract between the HTTP side
and the core's door, in process and across a cell's link alike."""

from __future__ import annotations

import os
from typing import NamedTuple

import orjson

from api.config import Principal
from api.errors import ERRORS, ApiError, error_body

GUARD_SKIPPED = "Guard-Skipped"  # the header naming the guards that failed open


class Job(NamedTuple):
    """One validated request, as the core sees it. The values that cross the link are
    named tuples: a frozen dataclass's `__init__` costs several times as much, and the core
    makes one per job."""

    principal: Principal
    texts: list[str]
    single: bool  # {"input": s} rather than {"inputs": [...]}
    timeout: float  # seconds
    idempotency: tuple[str, bytes] | None = None  # (Idempotency-Key, sha256 of the body)
    model: str | None = None  # as the request names it: "topics", "topics@v2"; None: first
    trace: str | None = None  # the request span's traceparent; None: tracing is off
    # A part of a streamed request (`api.stream`): its stream's mark. Its stream passed the
    # rate step once, so its parts do not. A keyed stream's mark is its Idempotency-Key: the
    # door numbers its parts' answers under it as they are decided (`api.door.positions`).
    stream: str | None = None

    @property
    def sticky(self) -> str | None:
        """What pins a weighted choice of version: the Idempotency-Key, so a retry, a
        replay and a re-route of the request run on the same version."""
        return None if self.idempotency is None else self.idempotency[0]


Refusals = tuple[tuple[int, str, str], ...]
"""The inputs guards refused: (index, guard, reason), by index."""


class Answered(NamedTuple):
    """The outputs, in order (None where a guard refused the input); the HTTP side renders
    them."""

    outputs: list[str | None]
    waits: tuple[float, ...]  # seconds each item waited in its queue
    batch: float  # seconds from the first item's dispatch to the answer
    batch_ids: tuple[int, ...] = ()  # the batches that answered it
    attempts: int = 1  # runs of its most-run item (more than 1: a worker died under it)
    model: str = ""  # the version that ran it ("topics@v2")
    refused: Refusals = ()  # the inputs a guard refused
    skipped: tuple[str, ...] = ()  # the guards that failed open for some input

    @property
    def queue(self) -> float:
        """Seconds the slowest item waited in its queue."""
        return max(self.waits)


class Rendered(NamedTuple):
    """A finished HTTP answer: a refusal, an error, or an idempotent (stored) answer. A
    keyed request's own run is rendered by the door (its answer is kept as it is sent), and
    carries what an `Answered` says of the run, for its metrics and Server-Timing; any
    other has no `waits`."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    waits: tuple[float, ...] = ()  # seconds each item waited in its queue (this run's)
    batch: float = 0.0  # seconds from the first item's dispatch to the answer
    model: str = ""  # the version that ran it


Outcome = Answered | Rendered


def answer_id() -> str:
    return os.urandom(8).hex()


def answer_body(outputs: list[str | None], single: bool, rid: str | None = None,
                model: str = "") -> bytes:
    """The body of an answer the core ran, under `rid` (a new id if none is given), with
    the version that ran it."""
    rid = rid or answer_id()
    if single:
        return orjson.dumps({"id": rid, "output": outputs[0], "model": model})
    return orjson.dumps({"id": rid, "outputs": outputs, "model": model})


def all_refused(outputs: list[str | None], refused: Refusals) -> bool:
    """Every input was refused (the one of `{"input"}` included): the answer is 422."""
    return bool(refused) and len(refused) == len(outputs)


def guarded_answer(outputs: list[str | None], single: bool, refused: Refusals,
                   skipped: tuple[str, ...], rid: str | None = None, model: str = ""
                   ) -> tuple[int, bytes, tuple[tuple[str, str], ...]]:
    """The status, body and headers of an answer the core ran where a guard refused an
    input or failed open: 422 `refused` when every input was refused, else 200 with null
    at the refused positions and their `refused` list (before `model`, which the access
    log reads as the body's last field). A refusal names its guard and reason code, never
    the guard's text; `Guard-Skipped` names the guards that failed open."""
    headers = ((GUARD_SKIPPED, ", ".join(skipped)),) if skipped else ()
    listed = [{"index": i, "guard": g, "reason": r} for i, g, r in sorted(refused)]
    if all_refused(outputs, refused):
        message = (f"refused by the guard {refused[0][1]}: {refused[0][2]}" if len(refused) == 1
                   else "every input was refused by a guard")
        return ERRORS["refused"].status, orjson.dumps({"error": {
            "code": "refused", "message": message, "refused": listed}}), headers
    if not refused:
        return 200, answer_body(outputs, single, rid, model), headers
    return 200, orjson.dumps({"id": rid or answer_id(), "outputs": outputs,
                              "refused": listed, "model": model}), headers


def rendered(err: ApiError) -> Rendered:
    """An error as the answer its client gets."""
    return Rendered(err.status, error_body(err.code, err.message), tuple(err.headers.items()))


__all__ = ["GUARD_SKIPPED", "Answered", "Job", "Outcome", "Refusals", "Rendered", "all_refused",
           "answer_body", "answer_id", "guarded_answer", "rendered"]
