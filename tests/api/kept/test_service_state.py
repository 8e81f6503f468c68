"""`--state` from the settings to the running service: the spec is checked where the
settings are built, memory stays the plain memory store, a durable one is opened as the
service runs (a file held by another server stops the start) and closed by its drain."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from api.cli import cell_identity
from api.config import DEFAULT_TIERS, Settings, Workers, check_files
from api.door import Service
from api.door.state import build_state, state_owner
from api.kept import BackedStore, MemoryIdempotencyStore, RedisSettings, SqliteState, StateLocked
from api.metrics import Metrics
from tests.api.door.fakes import FakePool
from tests.api.kept.conftest import sqlite_at

SETTINGS = Settings(workers=Workers(1), batch_latency_ms=10, max_wait_ms=1, ready_timeout_s=5)


@pytest.mark.parametrize("spec", ["memory", "sqlite:kept.db", "redis://127.0.0.1:6379/0",
                                  "redis://cache.internal/3", "redis://[::1]:7000/1"])
def test_the_state_takes_its_three_forms(spec: str) -> None:
    assert Settings(state=spec).state_spec().kind == spec.split(":")[0]


@pytest.mark.parametrize("spec", ["", "mem", "sqlite:", "sqlite:/no/such/folder/kept.db",
                                  "redis://", "redis://h:port/0", "redis://h:1/db",
                                  "redis://h:1/0?x=1", "redis://user:pw@h:1/0", "postgres://h"])
def test_a_bad_state_is_refused_with_a_message_naming_it(spec: str) -> None:
    with pytest.raises(ValueError, match="state"):
        check_files(Settings(state=spec))  # the folder: at the edge, as the files are read


def test_the_settings_read_no_file_to_validate_themselves() -> None:
    settings = Settings(state="sqlite:/no/such/folder/kept.db", keys=Path("/no/such.toml"))
    with pytest.raises(ValueError, match="not found"):
        check_files(settings)


def test_the_memory_state_is_the_memory_store_alone() -> None:
    service = Service(SETTINGS, Metrics(), DEFAULT_TIERS, pool=FakePool())
    assert isinstance(service.idempotency, MemoryIdempotencyStore) and service.kept is None


def test_a_redis_state_names_its_owner_from_the_cell_identity_it_is_given() -> None:
    settings = Settings(state="redis://127.0.0.1:6390/2", idempotency_ttl_s=30)
    env = {"BATCHGATE_CELL_ID": "east-1", "BATCHGATE_CORE_INCARNATION": "3"}
    identity = cell_identity(env)  # read at the edge; a cell's supervisor gives its own
    built = build_state(settings, identity)
    assert built is not None
    assert built._settings == RedisSettings(  # type: ignore[attr-defined]
        "127.0.0.1", 6390, 2, state_owner(identity), ttl=30)
    assert (state_owner(identity).cell, state_owner(identity).incarnation) == ("east-1", 3)
    assert state_owner(None).cell != state_owner(None).cell  # a random cell per process
    with pytest.raises(ValueError, match="BATCHGATE_CORE_INCARNATION"):
        cell_identity({"BATCHGATE_CELL_ID": "east-1", "BATCHGATE_CORE_INCARNATION": "two"})


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_sqlite_state_is_held_while_the_service_runs_and_let_go_by_its_drain(
        tmp_path: Path) -> None:
    settings = Settings(workers=Workers(1), batch_latency_ms=10, max_wait_ms=1, ready_timeout_s=5,
                        state=f"sqlite:{tmp_path / 'kept.db'}")
    service = Service(settings, Metrics(), DEFAULT_TIERS, pool=FakePool())
    assert isinstance(service.idempotency, BackedStore)
    assert isinstance(service.idempotency.durable, SqliteState)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await tg.start(service.run)
            with pytest.raises(StateLocked):
                await sqlite_at(tmp_path / "kept.db").open()
            await service.drain()
        tg.cancel_scope.cancel()
    again = sqlite_at(tmp_path / "kept.db")
    await again.open()
    await again.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_service_waits_for_the_state_file_of_a_server_that_is_exiting(
        tmp_path: Path) -> None:
    holder = sqlite_at(tmp_path / "kept.db")
    await holder.open()
    settings = Settings(workers=Workers(1), state=f"sqlite:{tmp_path / 'kept.db'}")
    service = Service(settings, Metrics(), DEFAULT_TIERS, pool=FakePool())
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            tg.start_soon(service.run)
            await anyio.sleep(0.2)  # the service polls the lock meanwhile
            assert not service.ready()
            await holder.close()  # the old server is gone
            assert await service.pool.wait_ready(1, 5) == 1 and service.ready()
            await service.drain()
        tg.cancel_scope.cancel()
