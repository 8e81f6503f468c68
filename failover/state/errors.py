"""Errors of the durable layer behind the idempotency store (`--state`).

    BatchgateError (batcher.errors)
    ├── StateUnavailable (ConnectionError)  sqlite, redis: the store did not answer in time,
    │                                       refused the connection, or failed the call
    └── StateLocked (RuntimeError)          sqlite: another server holds the file (one
                                            server per file); raised when opening, never
                                            answered to a client

`IdempotencyMismatch` (failover.errors) is raised by the durable layer too: the same key
was stored or claimed elsewhere with another body.
"""

from __future__ import annotations

from batcher import BatchgateError


class StateUnavailable(BatchgateError, ConnectionError):
    """The durable store cannot be reached or failed the call: a keyed request is refused
    (its promise cannot be kept or checked); a request without a key is not affected."""

    code = "state_unavailable"
    retry_after = 1.0


class StateLocked(BatchgateError, RuntimeError):
    """Raised by `SqliteState.open`: another live server holds the file's lock."""

    code = "internal"


__all__ = ["StateLocked", "StateUnavailable"]
