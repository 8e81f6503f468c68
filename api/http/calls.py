"""The status calls: what the routes ask of the core besides running jobs, named once.

A call is a `StatusCall` and its plain arguments. The core answers it from one table of
handlers (`StatusTable`, built by `api.door.StatusView`), looked up the same way in a
single process (`api.door.LocalCore`) and across a cell's link (`api.gateway.RemoteCore`
sends the call's name, `api.cell.LinkServer` looks it up in the same table). A new call is
a member here, its handler in the table, and the route that makes it.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import Any


class StatusCall(enum.Enum):
    """Each call, its arguments and what it answers: plain values, which cross the link."""

    READY = "ready"  # () -> {"ready", "workers_ready", "draining"[, "models"]}
    WORKERS = "workers"  # () -> [each worker as a plain record]
    CAPACITY = "capacity"  # () -> (desired, starting, running), or None: a fixed pool
    MODELS = "models"  # (method, name, version, body) -> (HTTP status, body): the admin API
    CELL = "cell"  # () -> {"gateways": [...], "core": {...} or None}
    METRICS_TEXT = "metrics_text"  # () -> the Prometheus text of every process
    # (stream, tier, account, key, model, sticky, items, chars, timeout) -> ("ok", version,
    # workers)
    # or ("no", status, body, headers): a streamed request's start (`api.door.StreamStart`)
    STREAM = "stream"
    STREAM_END = "stream_end"  # (stream) -> None: it ended (`api.door.StreamStart.ended`)

    @classmethod
    def named(cls, name: str) -> StatusCall:
        """The call `name` stands for on the link; LookupError if none does."""
        try:
            return cls(name)
        except ValueError:
            raise LookupError(f"no call named {name!r}") from None


StatusHandler = Callable[..., Awaitable[Any]]
StatusTable = Mapping[StatusCall, StatusHandler]
"""Every call's handler: the core's one answer to it, in process or across the link."""


async def answer(table: StatusTable, call: StatusCall, args: tuple[Any, ...] = ()) -> Any:
    """`call`'s answer from `table` (whatever its handler raises, raised)."""
    return await table[call](*args)


__all__ = ["StatusCall", "StatusHandler", "StatusTable", "answer"]
