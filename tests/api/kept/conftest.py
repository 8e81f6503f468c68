"""The durable layers under test: a real SQLite file in the test's folder, and a real
redis-server (tests/redis_server.py) started for the test and ended by its pid."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from api.kept import KeptState, Owner, RedisSettings, SqliteSettings, open_state
from tests.redis_server import RedisServer, running_redis


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the redis client's asyncio API


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path / "redis") as server:
        yield server


def sqlite_at(path: Path, max_entries: int = 100, max_bytes: int = 1 << 20,
              ttl: float = 60.0) -> KeptState:
    return open_state(SqliteSettings(path, ttl=ttl, max_entries=max_entries,
                                     max_bytes=max_bytes, lock_wait=0.2))


def redis_at(server: RedisServer, cell: str = "cell-a", incarnation: int = 0,
             ttl: float = 60.0) -> KeptState:
    return open_state(RedisSettings("127.0.0.1", server.port, 0, Owner(cell, incarnation),
                                    ttl=ttl))


@pytest.fixture(params=["sqlite", "redis"])
async def state(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KeptState]:
    """Each backend, opened, behind the same seam."""
    if request.param == "sqlite":
        opened = sqlite_at(tmp_path / "kept.db")
        await opened.open()
        yield opened
        await opened.close()
        return
    with running_redis(tmp_path / "redis") as server:
        opened = redis_at(server)
        await opened.open()
        yield opened
        await opened.close()
