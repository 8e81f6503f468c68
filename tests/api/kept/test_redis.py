"""`redis://`: cells share one Redis. A claim of another cell is waited out (its lease);
one left by this cell's own core, this incarnation or an older one, is taken over at once;
a claim is given up or extended only by its token. A Redis that is gone, or stopped, is a
fast `StateUnavailable`, never a hang, and its return needs no restart."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator

import anyio
import pytest

from api.kept import Busy, Claimed, KeptState, StateUnavailable, Stored, StoredResponse
from tests.api.kept.conftest import redis_at
from tests.redis_server import RedisServer

pytestmark = pytest.mark.anyio
FP = b"f" * 32
ANSWER = StoredResponse(200, b'{"id":"a1","output":"olleh"}')


@pytest.fixture
async def made() -> AsyncIterator[list[KeptState]]:
    """The states a test opened, closed after it."""
    states: list[KeptState] = []
    yield states
    for state in states:
        await state.close()


async def opened(made: list[KeptState], *states: KeptState) -> None:
    for state in states:
        await state.open()
        made.append(state)


async def claimed(state: KeptState, lease: float = 5.0) -> Claimed:
    got = await state.claim("acme", "k-1", FP, lease)
    assert isinstance(got, Claimed)
    return got


async def test_a_claim_of_another_cell_is_busy_until_its_answer_is_stored(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    a, b = redis_at(redis_server, "cell-a"), redis_at(redis_server, "cell-b")
    await opened(made, a, b)
    await claimed(a)
    assert await b.claim("acme", "k-1", FP, 5.0) == Busy()
    await a.store("acme", "k-1", FP, ANSWER)
    assert await b.claim("acme", "k-1", FP, 5.0) == Stored(ANSWER)


async def test_a_claim_of_an_older_core_of_the_same_cell_is_taken_over_at_once(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    dead, restarted = redis_at(redis_server, "cell-a", 0), redis_at(redis_server, "cell-a", 1)
    await opened(made, dead, restarted)
    await claimed(dead)
    await claimed(restarted)
    assert await dead.claim("acme", "k-1", FP, 5.0) == Busy()  # the newer one's holds


async def test_a_claim_of_this_core_asked_about_again_is_taken_over(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    """The memory store in front leads one request per key: a claim of ours that it asks
    about again was left by a leader that is gone."""
    state, other = redis_at(redis_server, "cell-a"), redis_at(redis_server, "cell-b")
    await opened(made, state, other)
    first = await claimed(state)
    again = await claimed(state)
    assert again.token != first.token
    await state.release("acme", "k-1", first.token)  # the old token frees nothing
    assert await other.claim("acme", "k-1", FP, 5.0) == Busy()


async def test_a_released_claim_lets_another_cell_run_the_key_at_once(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    a, b = redis_at(redis_server, "cell-a"), redis_at(redis_server, "cell-b")
    await opened(made, a, b)
    claim = await claimed(a)
    await a.release("acme", "k-1", claim.token)
    await claimed(b)


async def test_a_claim_ends_with_its_lease_and_extending_it_holds_it(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    a, b = redis_at(redis_server, "cell-a"), redis_at(redis_server, "cell-b")
    await opened(made, a, b)
    claim = await claimed(a, lease=0.3)
    await a.extend("acme", "k-1", claim.token, 30.0)
    with anyio.move_on_after(0.6):
        while await b.claim("acme", "k-1", FP, 5.0) == Busy():  # noqa: ASYNC110
            await anyio.sleep(0.05)  # polls Redis, the other process
    assert await b.claim("acme", "k-1", FP, 5.0) == Busy()  # held past its first lease
    await a.extend("acme", "k-1", claim.token, 0.2)
    with anyio.fail_after(5):
        while await b.claim("acme", "k-1", FP, 5.0) == Busy():  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_an_answer_stored_while_another_cell_holds_the_claim_wins(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    a, b = redis_at(redis_server, "cell-a"), redis_at(redis_server, "cell-b")
    await opened(made, a, b)
    await claimed(a)
    assert await b.store("acme", "k-1", FP, ANSWER) == ANSWER  # first stored
    late = StoredResponse(200, b'{"id":"b2","output":"olleh"}')
    assert await a.store("acme", "k-1", FP, late) == ANSWER


async def test_an_answer_is_kept_for_its_ttl(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    state = redis_at(redis_server, ttl=0.3)
    await opened(made, state)
    await state.store("acme", "k-1", FP, ANSWER)
    assert await state.claim("acme", "k-1", FP, 5.0) == Stored(ANSWER)
    with anyio.fail_after(5):
        while not isinstance(await state.claim("acme", "k-1", FP, 5.0), Claimed):  # noqa: ASYNC110
            await anyio.sleep(0.05)  # polls Redis, the other process


async def test_a_redis_that_is_gone_is_unavailable_fast_and_its_return_needs_no_restart(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    state = redis_at(redis_server)
    await opened(made, state)
    await state.store("acme", "k-1", FP, ANSWER)
    redis_server.stop()
    for call in range(3):  # a pooled connection found dead, then refused connections
        started = time.monotonic()
        with pytest.raises(StateUnavailable):
            await state.claim("acme", f"k-{call}", FP, 5.0)
        assert time.monotonic() - started < 1.0
    redis_server.start()  # the same port, empty: it persists nothing
    assert isinstance(await state.claim("acme", "k-1", FP, 5.0), Claimed)
    assert await state.store("acme", "k-1", FP, ANSWER) == ANSWER


async def test_a_redis_that_stops_answering_is_unavailable_within_the_timeout(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    state = redis_at(redis_server)
    await opened(made, state)
    assert isinstance(await state.claim("acme", "k-1", FP, 5.0), Claimed)  # connected
    assert redis_server.process is not None
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StateUnavailable):
            await state.store("acme", "k-1", FP, ANSWER)
        assert time.monotonic() - started < 1.5
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    with anyio.fail_after(5):
        assert await state.store("acme", "k-2", FP, ANSWER) == ANSWER


async def test_a_slow_redis_is_waited_for_as_long_as_the_request_can_give(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    state = redis_at(redis_server)
    await opened(made, state)
    assert isinstance(await state.claim("acme", "k-0", FP, 5.0), Claimed)  # connected
    assert redis_server.process is not None
    pid = redis_server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(StateUnavailable):  # a request with little time left
            await state.claim("acme", "k-1", FP, 5.0, within=0.05)
        handle = asyncio.get_running_loop().call_later(0.7, os.kill, pid, signal.SIGCONT)
        with anyio.fail_after(5):  # before: StateUnavailable past the fixed 0.5 s timeout
            assert isinstance(await state.claim("acme", "k-2", FP, 5.0, within=3.0), Claimed)
        handle.cancel()
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_a_state_opened_while_redis_is_down_serves_once_it_is_up(
        redis_server: RedisServer, made: list[KeptState]) -> None:
    redis_server.stop()
    state = redis_at(redis_server)
    await opened(made, state)  # logged, not raised: the server starts
    with pytest.raises(StateUnavailable):
        await state.claim("acme", "k-1", FP, 5.0)
    redis_server.start()
    await claimed(state)
