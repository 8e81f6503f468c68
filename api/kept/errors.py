"""Errors of kept answers: the idempotency store and the durable layer behind it (`--state`).

    BatchgateError (batcher.errors)
    ├── IdempotencyMismatch                 idempotency, sqlite, redis: the same key came
    │                                       back (or was kept elsewhere) with another body
    ├── StateUnavailable (ConnectionError)  sqlite, redis: the store did not answer in time,
    │                                       refused the connection, or failed the call
    └── StateLocked (RuntimeError)          sqlite: another server holds the file (one
                                            server per file); raised when opening, never
                                            answered to a client

"""

from __future__ import annotations

from batcher import BatchgateError


class IdempotencyMismatch(BatchgateError):
    """An Idempotency-Key was reused with a different request body."""

    code = "idempotency_key_reused"


class StateUnavailable(BatchgateError, ConnectionError):
    """The durable store cannot be reached or failed the call: a keyed request is refused
    (its promise cannot be kept or checked); a request without a key is not affected."""

    code = "state_unavailable"
    retry_after = 1.0


class StateLocked(BatchgateError, RuntimeError):
    """Raised by `SqliteState.open`: another live server holds the file's lock."""

    code = "internal"


__all__ = ["IdempotencyMismatch", "StateLocked", "StateUnavailable"]
