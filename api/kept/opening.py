"""Builds the durable layer its settings describe. Building connects to nothing:
`KeptState.open` does, in the owner's task."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api.kept.seam import KeptState
from api.kept.spec import RedisSettings, SqliteSettings
from api.kept.sqlite import SqliteState

if TYPE_CHECKING:
    from redis.asyncio import Redis


def open_state(settings: SqliteSettings | RedisSettings) -> KeptState:
    """The durable layer these settings describe; the Redis one loads the `redis` client
    (the `batchgate[redis]` extra), so only then."""
    if isinstance(settings, SqliteSettings):
        return SqliteState(settings)
    from api.kept.redis import RedisState

    return RedisState(settings)


def redis_client(state: KeptState | None) -> Redis | None:
    """The connection pool of a durable layer in Redis, for what else this process keeps
    there (the rate limits cells share): one pool per process, closed with the layer. None
    for any other layer."""
    if state is None or isinstance(state, SqliteState):
        return None  # never loads the `redis` client for a layer that does not use it
    from api.kept.redis import RedisState

    return state.client if isinstance(state, RedisState) else None


__all__ = ["open_state", "redis_client"]
