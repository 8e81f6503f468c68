"""The memory store in front of a durable layer: a key running in another cell is waited
for within the request's time (polled), then replayed or run; writes asked for by a
synchronous callback run in the store's own task group, and a drain waits for them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from api.kept import (
    BackedStore,
    Claimed,
    KeptState,
    Lead,
    MemoryIdempotencyStore,
    StateUnavailable,
    Stored,
    StoredResponse,
)
from batcher import DeadlineExceeded, MonotonicClock
from tests.api.kept.conftest import redis_at, sqlite_at
from tests.redis_server import RedisServer

pytestmark = pytest.mark.anyio
FP = b"f" * 32
ANSWER = StoredResponse(200, b'{"id":"a1","output":"olleh"}')


def backed(durable: KeptState) -> BackedStore:
    return BackedStore(MemoryIdempotencyStore(ttl=60, max_entries=100), durable,
                       MonotonicClock(), poll=0.02)


@pytest.fixture
async def cells(redis_server: RedisServer) -> AsyncIterator[tuple[BackedStore, BackedStore]]:
    """Two cells' stores over one Redis, running."""
    a, b = backed(redis_at(redis_server, "cell-a")), backed(redis_at(redis_server, "cell-b"))
    async with anyio.create_task_group() as tg:
        await tg.start(a.run)
        await tg.start(b.run)
        yield a, b
        tg.cancel_scope.cancel()


async def test_a_key_running_in_another_cell_is_replayed_once_it_is_stored(
        cells: tuple[BackedStore, BackedStore]) -> None:
    a, b = cells
    assert isinstance(await a.claim("acme", "k-1", FP, 5.0), Claimed)
    got: list[Claimed | Stored] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async def wait() -> None:
                got.append(await b.claim("acme", "k-1", FP, 5.0))

            tg.start_soon(wait)
            await anyio.sleep(0.1)  # b is polling: a still runs it
            assert got == []
            await a.keep("acme", "k-1", FP, ANSWER)
    assert got == [Stored(ANSWER)]


async def test_a_key_whose_claim_is_given_up_elsewhere_is_then_run_here(
        cells: tuple[BackedStore, BackedStore]) -> None:
    a, b = cells
    claim = await a.claim("acme", "k-1", FP, 5.0)
    assert isinstance(claim, Claimed)
    assert a.soon(lambda: a.durable.release("acme", "k-1", claim.token))
    with anyio.fail_after(5):
        assert isinstance(await b.claim("acme", "k-1", FP, 5.0), Claimed)


async def test_a_key_still_running_elsewhere_at_the_deadline_is_504(
        cells: tuple[BackedStore, BackedStore]) -> None:
    a, b = cells
    await a.claim("acme", "k-1", FP, 5.0)
    started = anyio.current_time()
    with pytest.raises(DeadlineExceeded):
        await b.claim("acme", "k-1", FP, 0.2)
    assert 0.15 <= anyio.current_time() - started < 1.0


async def test_the_memory_store_in_front_answers_alone(tmp_path: Path) -> None:
    store = backed(sqlite_at(tmp_path / "kept.db"))
    begin = store.begin("acme", "k-1", FP, 0.0)
    assert isinstance(begin, Lead)
    store.complete(begin.entry, ANSWER, 0.0, keep=True)
    assert store.statistics().entries == 1 and store.memory.statistics().entries == 1


async def test_a_drain_waits_for_the_writes_under_way_then_closes(tmp_path: Path) -> None:
    store = backed(sqlite_at(tmp_path / "kept.db"))
    async def early() -> None:
        await store.keep("acme", "k-0", FP, ANSWER)

    async def late() -> None:
        await anyio.sleep(0.05)
        await store.keep("acme", "k-1", FP, ANSWER)

    assert not store.soon(early)  # not running yet
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)

        assert store.soon(late)
        await store.drain()
        assert not store.soon(late)  # draining: no more
    reopened = sqlite_at(tmp_path / "kept.db")
    await reopened.open()  # the drain closed the file and let go of its lock
    assert await reopened.claim("acme", "k-1", FP, 5.0) == Stored(ANSWER)
    assert isinstance(await reopened.claim("acme", "k-0", FP, 5.0), Claimed)
    await reopened.close()


async def test_a_file_broken_before_it_opens_fails_the_store_and_opens_once_mended(
        tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    path.write_bytes(b"not a database at all" * 100)
    store = BackedStore(MemoryIdempotencyStore(ttl=60, max_entries=100), sqlite_at(path),
                        MonotonicClock(), poll=0.02, check=0.02)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)  # before: StateUnavailable out of `run` (a core exits)
        assert store.failing is not None and "cannot open the state file" in store.failing
        with pytest.raises(StateUnavailable):
            await store.claim("acme", "k-1", FP, 1.0)
        path.unlink()  # mended: a new file
        with anyio.fail_after(5):
            while True:  # opened again at its next check
                if store.failing is None:
                    break
                await anyio.sleep(0.02)
        assert isinstance(await store.claim("acme", "k-1", FP, 1.0), Claimed)
        tg.cancel_scope.cancel()
