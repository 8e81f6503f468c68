"""`--access-log json`: one JSON line per request, written once the loop turn that answered
it is over.

The hot route's two ways (the direct way, `api.http.direct`, and ASGI's, `Routes.batchstring`)
each make a `Served` record where the answer is made, from what they know there (the
principal, the outcome, the code, the answer's id), and hand it to the one `AccessLog`. The
other paths go through Starlette, where a thin wrapper (`with_access_log`) makes theirs from
what the answer says of itself. A record never holds inputs, outputs, nor an error's
message (a model's message may quote its input). With the log off there is no sink at all
(`None`): the hot route pays one comparison.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.config import KeyRing, Principal, Settings
from api.errors import ERRORS, Unauthorized
from api.http.collation import TurnEnds
from api.http.fastpath import HOT_PATH
from api.http.jobs import Answered, Outcome, all_refused

REPLAYED = "idempotent-replayed"  # the header of an answer served from the store


@dataclass(frozen=True, slots=True)
class Served:
    """One request as the log tells it: never its inputs, outputs or an error's message."""

    time: float  # wall-clock seconds when it began
    id: str | None  # the answer's id (None unless a 200 on the hot route)
    method: str
    path: str
    tier: str | None  # None: an unknown key
    account: str | None
    status: int
    code: str | None  # the error's code (None on a success)
    latency_ms: float
    queue_ms: float | None  # the slowest item's wait in its queue (None unless run)
    batch_ms: float | None
    batch_ids: tuple[int, ...] | None  # the batches that answered it (None unless run)
    attempts: int | None  # runs of its most-run item (2 or more: a worker died under it)
    replayed: bool  # served from the idempotency store
    model: str | None = None  # the version that answered it ("topics@v2"; None unless a 200)


def iso_ms(wall: float) -> str:
    """`wall` (seconds since the epoch) in ISO 8601 to the millisecond, in UTC."""
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")


class _Stamps:
    """`iso_ms` for times that mostly fall in the same second as the one before: the date
    and time of day are formatted once a second (the whole stamp cost more than the rest
    of a line)."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second, self._prefix = -1, ""

    def __call__(self, wall: float) -> str:
        second = int(wall)
        if second != self._second:
            self._second = second
            self._prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        return f"{self._prefix}{int((wall - second) * 1000):03d}+00:00"


def record(served: Served, stamp: Callable[[float], str] = iso_ms) -> str:
    """The line for one request."""
    return orjson.dumps({
        "time": stamp(served.time), "id": served.id, "method": served.method, "path": served.path,
        "tier": served.tier, "account": served.account,
        "status": served.status, "code": served.code, "latency_ms": served.latency_ms,
        "queue_ms": served.queue_ms, "batch_ms": served.batch_ms,
        "batch_ids": served.batch_ids, "attempts": served.attempts,
        "replayed": served.replayed, "model": served.model,
    }).decode()


class AccessLog:
    """The sink: one JSON line per `Served` on `stream`, written (and flushed) together once
    the loop turn that handed them is over, so a batch's hundred answers cost one write."""

    __slots__ = ("_stamps", "_stream", "_turn")

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._turn = TurnEnds[Served](self._write)
        self._stamps = _Stamps()

    @classmethod
    def of(cls, settings: Settings) -> AccessLog | None:
        """The sink `--access-log` asks for: stdout, or None when off."""
        return cls(sys.stdout) if settings.access_log == "json" else None

    def put(self, served: Served) -> None:
        """Log `served`; call it from the running loop."""
        self._turn.add(served)

    def _write(self, served: list[Served]) -> None:
        stamps = self._stamps
        self._stream.write("".join([record(s, stamps) + "\n" for s in served]))
        self._stream.flush()


def hot(principal: Principal | None, elapsed: float, outcome: Outcome | None = None,
        rid: str | None = None, code: str | None = None, path: str = HOT_PATH) -> Served:
    """The record of a `POST /v1/batchstring` (or of another direct route's `path`): its
    `outcome` and the id its answer carries (`rid`), or the `code` of the error it was
    answered with instead."""
    status, answered, replayed, model = 200, None, False, None
    queue_ms = batch_ms = None
    if code is not None:
        status = ERRORS[code].status
    elif isinstance(outcome, Answered):
        answered, model = outcome, outcome.model or None
        if outcome.refused and all_refused(outcome.outputs, outcome.refused):  # a 422
            status, code, rid, model = ERRORS["refused"].status, "refused", None, None
    elif outcome is not None:  # rendered by the door: a refusal, an error or a kept answer
        status = outcome.status
        replayed = any(name.lower() == REPLAYED for name, _ in outcome.headers)
        if status == 200:
            rid, model = _id_of(outcome.body), _model_of(outcome.body)
        else:
            code = _code_of(outcome.body)
        if outcome.waits:  # a keyed request's own run
            queue_ms, batch_ms = _ms(max(outcome.waits)), _ms(outcome.batch)
    if answered is not None:
        queue_ms, batch_ms = _ms(answered.queue), _ms(answered.batch)
    # Milliseconds to 0.01 by hand: `round(x, n)` costs three times as much.
    return Served(
        time.time() - elapsed, rid, "POST", path,
        principal.tier.label if principal else None, principal.account if principal else None,
        status, code, int(elapsed * 100_000 + 0.5) / 100, queue_ms, batch_ms,
        answered.batch_ids if answered else None, answered.attempts if answered else None,
        replayed, model)


def _ms(seconds: float) -> float:
    """Milliseconds to 0.1."""
    return int(seconds * 10_000 + 0.5) / 10


def with_access_log(app: ASGIApp, log: AccessLog, keys: Callable[[], KeyRing]) -> ASGIApp:
    """`app`, handing `log` a record of every HTTP request it answers: for the paths
    other than the hot route, which hands its own (`hot`). `keys` gives the key ring of the
    moment (SIGHUP reloads it)."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started, seen = time.perf_counter(), _Seen()

        async def watched(message: Message) -> None:
            seen.message(message)
            await send(message)

        try:
            await app(scope, receive, watched)
        finally:
            log.put(_other(scope, keys(), seen, time.perf_counter() - started))

    return asgi


class _Seen:
    """What a response showed of itself on its way out: its status, and the head of an
    error's body (for its code)."""

    __slots__ = ("head", "status")

    def __init__(self) -> None:
        self.status, self.head = 0, b""

    def message(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body" and self.status >= 400:
            self.head += message.get("body", b"")[:1024 - len(self.head)]


def _other(scope: Scope, keys: KeyRing, seen: _Seen, elapsed: float) -> Served:
    auth = dict(scope["headers"]).get(b"authorization")
    tier: str | None
    account: str | None
    try:
        principal = keys.identify(auth.decode("latin-1") if auth else None)
        tier, account = principal.tier.label, principal.account
    except Unauthorized:
        tier = account = None
    return Served(
        time.time() - elapsed, None, scope["method"], scope["path"], tier, account,
        seen.status, _code_of(seen.head) if seen.status >= 400 else None,
        round(elapsed * 1000, 2), None, None, None, None, False)


def _code_of(body: bytes) -> str | None:
    """The code of an error's body: `{"error": {"code": ...}}` (`/v1`'s), or the Open
    Inference Protocol's `{"error": message, "code": ...}` (`/v2`'s); None for any other."""
    try:
        body_json = orjson.loads(body)
        error = body_json.get("error")
        code = error.get("code") if isinstance(error, dict) else body_json.get("code")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return code if isinstance(code, str) else None


def _id_of(body: bytes) -> str | None:
    """The id of a kept answer, at the head of its body (`api.http.jobs.answer_body`):
    read without parsing the outputs behind it."""
    head = b'{"id":"'
    end = body.find(b'"', len(head))
    return body[len(head):end].decode() if body.startswith(head) and end > 0 else None


def _model_of(body: bytes) -> str | None:
    """The version of a kept answer, its body's last field (`api.http.jobs.answer_body`):
    read without parsing the outputs before it (a quote inside a string is escaped, so
    the field's opening cannot appear in one)."""
    opening = b',"model":"'
    at = body.rfind(opening)
    if at < 0 or not body.endswith(b'"}'):
        return None
    model = body[at + len(opening):-2]
    return model.decode() if model and b'"' not in model else None


__all__ = ["AccessLog", "Served", "hot", "record", "with_access_log"]
