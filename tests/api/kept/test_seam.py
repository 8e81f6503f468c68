"""What every durable layer promises, held against a real SQLite file and a real Redis:
a key is claimed until an answer is stored; the first answer stored wins, and every later
`store` or `claim` gets that one; a key belongs to one body."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.kept import Claimed, IdempotencyMismatch, KeptState, Stored, StoredResponse

pytestmark = pytest.mark.anyio
FP = b"f" * 32
ANSWER = StoredResponse(200, b'{"id":"a1","output":"olleh"}', (("Server-Timing", "q;dur=1"),))


async def test_a_new_key_is_claimed_and_its_stored_answer_is_then_replayed(
        state: KeptState) -> None:
    assert isinstance(await state.claim("acme", "k-1", FP, 5.0), Claimed)
    assert await state.store("acme", "k-1", FP, ANSWER) == ANSWER
    assert await state.claim("acme", "k-1", FP, 5.0) == Stored(ANSWER)


async def test_the_first_answer_stored_wins_and_a_later_store_gets_it(state: KeptState) -> None:
    await state.claim("acme", "k-1", FP, 5.0)
    assert await state.store("acme", "k-1", FP, ANSWER) == ANSWER
    later = StoredResponse(200, b'{"id":"b2","output":"olleh"}')
    assert await state.store("acme", "k-1", FP, later) == ANSWER
    assert await state.claim("acme", "k-1", FP, 5.0) == Stored(ANSWER)


async def test_of_many_stores_at_once_every_one_gets_the_same_answer(state: KeptState) -> None:
    answers = [StoredResponse(200, f'{{"id":"{n}"}}'.encode()) for n in range(20)]
    got: list[StoredResponse] = []

    async def store(answer: StoredResponse) -> None:
        got.append(await state.store("acme", "k-1", FP, answer))

    async with anyio.create_task_group() as tg:
        for answer in answers:
            tg.start_soon(store, answer)
    assert len(got) == 20 and len(set(got)) == 1 and got[0] in answers
    assert await state.claim("acme", "k-1", FP, 5.0) == Stored(got[0])


async def test_a_key_stored_for_one_body_refuses_another(state: KeptState) -> None:
    await state.store("acme", "k-1", FP, ANSWER)
    with pytest.raises(IdempotencyMismatch):
        await state.claim("acme", "k-1", b"g" * 32, 5.0)
    with pytest.raises(IdempotencyMismatch):
        await state.store("acme", "k-1", b"g" * 32, ANSWER)


async def test_keys_are_per_account_and_a_colon_in_either_part_does_not_mix_them(
        state: KeptState) -> None:
    await state.store("a:b", "c", FP, ANSWER)
    assert isinstance(await state.claim("a", "b:c", FP, 5.0), Claimed)
    assert isinstance(await state.claim("other", "c", FP, 5.0), Claimed)


async def test_releasing_a_stored_key_keeps_its_answer(state: KeptState) -> None:
    claimed = await state.claim("acme", "k-1", FP, 5.0)
    assert isinstance(claimed, Claimed)
    await state.store("acme", "k-1", FP, ANSWER)
    await state.release("acme", "k-1", claimed.token)
    await state.extend("acme", "k-1", claimed.token, 5.0)
    assert await state.claim("acme", "k-1", FP, 5.0) == Stored(ANSWER)


BODIES = st.binary(max_size=300)
HEADERS = st.lists(st.tuples(st.text(max_size=20), st.text(max_size=40)), max_size=3)


@settings(max_examples=30, deadline=None)
@given(status=st.sampled_from([200, 400, 413, 422]), body=BODIES, headers=HEADERS)
def test_an_answer_comes_back_exactly_as_stored(status: int, body: bytes,
                                                headers: list[tuple[str, str]]) -> None:
    """Any bytes, any headers: what the door answered is what a replay answers."""
    import tempfile
    from pathlib import Path

    from tests.api.kept.conftest import sqlite_at

    answer = StoredResponse(status, body, tuple(headers))

    async def round_trip() -> StoredResponse | None:
        with tempfile.TemporaryDirectory() as folder:
            state = sqlite_at(Path(folder) / "kept.db")
            await state.open()
            try:
                await state.store("acme", "k", FP, answer)
                got = await state.claim("acme", "k", FP, 5.0)
            finally:
                await state.close()
        return got.response if isinstance(got, Stored) else None

    assert anyio.run(round_trip) == answer
