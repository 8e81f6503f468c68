"""Builds the durable layer its settings describe. Building connects to nothing:
`KeptState.open` does, in the owner's task."""

from __future__ import annotations

from api.kept.seam import KeptState
from api.kept.spec import RedisSettings, SqliteSettings
from api.kept.sqlite import SqliteState


def open_state(settings: SqliteSettings | RedisSettings) -> KeptState:
    """The durable layer these settings describe; the Redis one loads the `redis` client
    (the `batchgate[redis]` extra), so only then."""
    if isinstance(settings, SqliteSettings):
        return SqliteState(settings)
    from api.kept.redis import RedisState

    return RedisState(settings)


__all__ = ["open_state"]
