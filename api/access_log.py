"""`--access-log json`: one JSON line per request, written after its answer is sent.

An ASGI wrapper installed only when the log is on, so with it off the hot route pays
nothing at all. It reads what the answer already says (status, `Server-Timing`, the id at
the head of a 200 body, the code of an error body, the batches and attempts the route
left in the scope) and never the inputs or outputs, nor an error's message (a model's
message may quote its input).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import KeyRing, Unauthorized

_TIMING = re.compile(rb"(queue|batch|total);dur=([0-9.]+)")
_ID = re.compile(rb'^\{"id":"([0-9a-f]{1,64})"')
_CODE = re.compile(rb'"code":"([a-z_]{1,64})"')


class _Seen:
    """What one response showed of itself on its way out."""

    __slots__ = ("head", "replayed", "status", "timing")

    def __init__(self) -> None:
        self.status, self.head, self.timing, self.replayed = 0, b"", b"", False

    def message(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            for name, value in message.get("headers", ()):
                if name.lower() == b"server-timing":
                    self.timing = value
                elif name.lower() == b"idempotent-replayed":
                    self.replayed = True
        elif message["type"] == "http.response.body" and not self.head:
            self.head = message.get("body", b"")[:512]


def with_access_log(app: ASGIApp, keys: Callable[[], KeyRing],
                    stream: TextIO | None = None) -> ASGIApp:
    """`app`, writing one JSON line per HTTP request to `stream` (stdout by default);
    `keys` gives the key ring of the moment (SIGHUP reloads it)."""
    out = stream or sys.stdout

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started, wall, seen = time.perf_counter(), time.time(), _Seen()

        async def watched(message: Message) -> None:
            seen.message(message)
            await send(message)

        try:
            await app(scope, receive, watched)
        finally:
            latency = time.perf_counter() - started
            out.write(record(scope, keys(), seen, wall, latency) + "\n")
            out.flush()

    return asgi


def record(scope: Scope, keys: KeyRing, seen: _Seen, wall: float, latency: float) -> str:
    """The line for one request."""
    headers = dict(scope["headers"])
    auth = headers.get(b"authorization")
    tier: str | None
    account: str | None
    try:
        principal = keys.identify(auth.decode("latin-1") if auth else None)
        tier, account = principal.tier.label, principal.account
    except Unauthorized:
        tier = account = None
    timing = {k.decode(): float(v) for k, v in _TIMING.findall(seen.timing)}
    ran = scope.get("batchgate")  # (batch ids, attempts), set by the route when it ran
    rid = _ID.match(seen.head) if seen.status == 200 else None
    code = _CODE.search(seen.head) if seen.status >= 400 else None
    return orjson.dumps({
        "time": datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds"),
        "id": rid.group(1).decode() if rid else None,
        "method": scope["method"], "path": scope["path"],
        "tier": tier, "account": account,
        "status": seen.status, "code": code.group(1).decode() if code else None,
        "latency_ms": round(latency * 1000, 2),
        "queue_ms": timing.get("queue"), "batch_ms": timing.get("batch"),
        "batch_ids": list(ran[0]) if ran else None, "attempts": ran[1] if ran else None,
        "replayed": seen.replayed,
    }).decode()


__all__ = ["record", "with_access_log"]
