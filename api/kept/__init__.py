"""Kept answers: a retried request gets the first attempt's answer and the model runs once.

The idempotency store (`MemoryIdempotencyStore`: lead, join or replay, bounded per account),
the durable layer behind it that outlives processes (`--state`: the `KeptState` seam,
`SqliteState` for an embedded file, `RedisState` for a server cells share, loaded only by
`open_state` since it needs the `redis` client) and `BackedStore`, which puts one in front
of the other. Only the front door (`api.door`) uses them; the rate limits cells share take
the Redis layer's connection (`redis_client`): one per process.
"""

from api.kept.backed import BUSY_POLL_S, CHECK_S, LEASE_MARGIN_S, BackedStore
from api.kept.errors import IdempotencyMismatch, StateLocked, StateUnavailable
from api.kept.idempotency import (
    Begin,
    Entry,
    IdempotencyStatistics,
    IdempotencyStore,
    Join,
    Lead,
    MemoryIdempotencyStore,
    Replay,
    StoredResponse,
)
from api.kept.opening import open_state, redis_client
from api.kept.seam import Busy, Claim, Claimed, KeptState, Stored
from api.kept.spec import Owner, RedisSettings, SqliteSettings
from api.kept.sqlite import SqliteState, check_state_file

__all__ = [
    "BUSY_POLL_S",
    "CHECK_S",
    "LEASE_MARGIN_S",
    "BackedStore",
    "Begin",
    "Busy",
    "Claim",
    "Claimed",
    "Entry",
    "IdempotencyMismatch",
    "IdempotencyStatistics",
    "IdempotencyStore",
    "Join",
    "KeptState",
    "Lead",
    "MemoryIdempotencyStore",
    "Owner",
    "RedisSettings",
    "Replay",
    "SqliteSettings",
    "SqliteState",
    "StateLocked",
    "StateUnavailable",
    "Stored",
    "StoredResponse",
    "check_state_file",
    "open_state",
    "redis_client",
]
