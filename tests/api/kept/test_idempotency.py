"""The idempotency store: lead, join, replay, refuse; only final answers kept, bounded, expiring."""

from __future__ import annotations

import asyncio
import functools
import math
import tracemalloc
from dataclasses import dataclass

import anyio
import orjson
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
)

from api.kept.errors import IdempotencyMismatch
from api.kept.idempotency import (
    ENTRY_OVERHEAD,
    Entry,
    IdempotencyStore,
    Join,
    Lead,
    MemoryIdempotencyStore,
    Replay,
    StoredResponse,
)
from tests.virtual import run_virtual

OK = StoredResponse(200, b'{"embeddings": []}')
INVALID = StoredResponse(422, b'{"error": "invalid"}')
UNAVAILABLE = StoredResponse(503, b'{"error": "unavailable"}')


def store(ttl: float = 10.0, max_entries: int = 100) -> MemoryIdempotencyStore:
    return MemoryIdempotencyStore(ttl=ttl, max_entries=max_entries)


def lead(s: IdempotencyStore, key: str, body: bytes = b"x", now: float = 0.0) -> Entry:
    begun = s.begin("acct", key, body, now)
    assert isinstance(begun, Lead)
    return begun.entry


# -- plain behaviour ----------------------------------------------------------------------
def test_first_request_leads_and_is_in_flight() -> None:
    s = store()
    entry = lead(s, "k")
    assert entry.response is None
    assert s.statistics().in_flight == 1 and s.statistics().entries == 0


def test_repeat_in_flight_joins_the_same_entry() -> None:
    s = store()
    entry = lead(s, "k")
    assert s.begin("acct", "k", b"x", 1.0) == Join(entry)


def test_repeat_after_completion_replays_the_stored_response() -> None:
    s = store()
    s.complete(lead(s, "k"), OK, 1.0, keep=True)
    assert s.begin("acct", "k", b"x", 2.0) == Replay(OK)


def test_a_4xx_is_final_and_replayed() -> None:
    s = store()
    s.complete(lead(s, "k"), INVALID, 1.0, keep=True)
    assert s.begin("acct", "k", b"x", 2.0) == Replay(INVALID)


def test_another_body_under_the_same_key_is_refused_in_flight_and_after() -> None:
    s = store()
    entry = lead(s, "k")
    with pytest.raises(IdempotencyMismatch):
        s.begin("acct", "k", b"other", 1.0)
    s.complete(entry, OK, 1.0, keep=True)
    with pytest.raises(IdempotencyMismatch):
        s.begin("acct", "k", b"other", 2.0)
    assert s.statistics().mismatches == 2


def test_scopes_do_not_share_keys() -> None:
    s = store()
    s.complete(lead(s, "k"), OK, 0.0, keep=True)
    assert isinstance(s.begin("", "k", b"other", 1.0), Lead)  # anonymous scope
    assert isinstance(s.begin("acct2", "k", b"x", 1.0), Lead)


def test_a_5xx_is_dropped_so_the_retry_leads_again() -> None:
    s = store()
    s.complete(lead(s, "k"), UNAVAILABLE, 1.0, keep=False)
    assert isinstance(s.begin("acct", "k", b"x", 2.0), Lead)
    assert s.statistics().dropped == 1


def test_a_retry_after_a_5xx_may_carry_another_body() -> None:
    s = store()
    s.complete(lead(s, "k"), UNAVAILABLE, 1.0, keep=False)
    assert isinstance(s.begin("acct", "k", b"fixed", 2.0), Lead)


def test_completed_entries_expire_after_the_ttl() -> None:
    s = store(ttl=10.0)
    s.complete(lead(s, "k"), OK, 5.0, keep=True)
    assert s.begin("acct", "k", b"x", 14.9) == Replay(OK)
    assert isinstance(s.begin("acct", "k", b"x", 15.0), Lead)
    assert s.statistics().expirations == 1


def test_in_flight_entries_never_expire() -> None:
    s = store(ttl=1.0)
    entry = lead(s, "k")
    assert s.begin("acct", "k", b"x", 1_000.0) == Join(entry)


def test_the_oldest_completed_entry_is_evicted_first() -> None:
    s = store(max_entries=2)
    s.complete(lead(s, "a"), OK, 0.0, keep=True)
    s.complete(lead(s, "b"), OK, 1.0, keep=True)
    s.complete(lead(s, "c"), OK, 2.0, keep=True)
    assert isinstance(s.begin("acct", "a", b"x", 3.0), Lead)
    assert s.begin("acct", "c", b"x", 3.0) == Replay(OK)
    assert s.statistics().evictions >= 1


def test_one_accounts_traffic_never_evicts_another_accounts_answers() -> None:
    s = MemoryIdempotencyStore(ttl=100.0, max_entries=100, account_share=0.25)
    quiet = s.begin("quiet", "order-1", b"x", 0.0)
    assert isinstance(quiet, Lead)
    s.complete(quiet.entry, OK, 0.0, keep=True)
    for i in range(1_000):  # unique keys at the free rate, for ever
        flood = s.begin("flood", f"k{i}", b"x", 1.0)
        assert isinstance(flood, Lead)
        s.complete(flood.entry, OK, 1.0, keep=True)
    assert s.begin("quiet", "order-1", b"x", 2.0) == Replay(OK)
    assert s.statistics().entries == 1 + 25  # the flood keeps its own share only


def test_the_store_is_bounded_in_bytes_heaviest_account_first() -> None:
    big = StoredResponse(200, b"x" * 10_000)
    s = MemoryIdempotencyStore(ttl=100.0, max_entries=1_000, max_bytes=50_000,
                               account_share=1.0)
    small = s.begin("small", "k", b"x", 0.0)
    assert isinstance(small, Lead)
    s.complete(small.entry, OK, 0.0, keep=True)
    for i in range(20):
        heavy = s.begin("heavy", f"k{i}", b"x", 1.0)
        assert isinstance(heavy, Lead)
        s.complete(heavy.entry, big, 1.0, keep=True)
        assert s.statistics().bytes <= 50_000
    assert s.begin("small", "k", b"x", 2.0) == Replay(OK)  # the heavy one paid for it
    assert s.statistics().entries == 1 + 4


def test_what_the_store_counts_is_what_its_answers_take() -> None:
    """Bodies as the server makes them (orjson, which leaves each in a 4 KiB block): the kept
    answers take no more memory than the store counts toward --idempotency-max-bytes."""
    n = 5_000
    store = MemoryIdempotencyStore(ttl=60.0, max_entries=n)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            key = f"r{i}-{i:08x}"
            begin = store.begin(f"acct-{i % 8}", key, key.encode()[:16], 0.0)
            assert isinstance(begin, Lead)
            body = orjson.dumps({"id": f"{i:016x}", "output": key[::-1]})
            store.complete(begin.entry, StoredResponse(200, body), 0.0, keep=True)
        del begin, body
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = store.statistics().bytes
    assert store.statistics().entries == n
    assert used <= counted <= 1.5 * used, (used / n, counted / n)


def test_in_flight_entries_are_never_evicted_but_push_completed_ones_out() -> None:
    s = store(max_entries=1)
    s.complete(lead(s, "done"), OK, 0.0, keep=True)
    first, second = lead(s, "a"), lead(s, "b")
    assert s.statistics().entries == 0 and s.statistics().in_flight == 2
    assert s.begin("acct", "a", b"x", 1.0) == Join(first)
    assert s.begin("acct", "b", b"x", 1.0) == Join(second)


def test_abandon_after_complete_changes_nothing() -> None:
    s = store()
    entry = lead(s, "k")
    s.complete(entry, OK, 1.0, keep=True)
    s.abandon(entry, 2.0)
    assert s.begin("acct", "k", b"x", 3.0) == Replay(OK)


def test_abandon_drops_the_entry_so_the_retry_leads() -> None:
    s = store()
    entry = lead(s, "k")
    s.abandon(entry, 1.0)
    assert entry.response is None and entry.gone
    assert isinstance(s.begin("acct", "k", b"x", 2.0), Lead)


def test_completing_twice_is_refused() -> None:
    s = store()
    entry = lead(s, "k")
    s.complete(entry, OK, 1.0, keep=True)
    with pytest.raises(ValueError, match="not in flight"):
        s.complete(entry, OK, 2.0, keep=True)


@pytest.mark.parametrize(("ttl", "max_entries", "max_bytes", "share"), [
    (0.0, 1, 1, 1.0), (-1.0, 1, 1, 1.0), (math.nan, 1, 1, 1.0), (1.0, 0, 1, 1.0),
    (1.0, 1, 0, 1.0), (1.0, 1, 1, 0.0), (1.0, 1, 1, 1.5),
])
def test_settings_are_validated(ttl: float, max_entries: int, max_bytes: int,
                                share: float) -> None:
    with pytest.raises(ValueError, match=r"ttl|max_entries|max_bytes|account_share"):
        MemoryIdempotencyStore(ttl=ttl, max_entries=max_entries, max_bytes=max_bytes,
                               account_share=share)


def test_statistics_count_each_outcome() -> None:
    s = store()
    entry = lead(s, "k")
    s.begin("acct", "k", b"x", 0.0)
    s.complete(entry, OK, 0.0, keep=True)
    s.begin("acct", "k", b"x", 0.0)
    stats = s.statistics()
    assert (stats.leads, stats.joins, stats.replays, stats.entries) == (1, 1, 1, 1)


# -- joiners, concurrently ----------------------------------------------------------------
async def join_all(s: MemoryIdempotencyStore, n: int, results: list[StoredResponse | None]
                   ) -> None:
    async def joiner() -> None:
        begun = s.begin("acct", "k", b"x", 0.0)
        assert isinstance(begun, Join)
        results.append(await begun.entry.wait())

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(joiner)


def test_twenty_joiners_get_the_leaders_response() -> None:
    async def main() -> list[StoredResponse | None]:
        s, results = store(), list[StoredResponse | None]()
        entry = lead(s, "k")
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(join_all, s, 20, results)
                await anyio.wait_all_tasks_blocked()  # the joiners are all waiting
                s.complete(entry, OK, 0.05, keep=True)
        return results

    assert run_virtual(main) == [OK] * 20


def test_joiners_of_a_5xx_attempt_get_that_5xx() -> None:
    async def main() -> list[StoredResponse | None]:
        s, results = store(), list[StoredResponse | None]()
        entry = lead(s, "k")
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(join_all, s, 3, results)
                await anyio.wait_all_tasks_blocked()
                s.complete(entry, UNAVAILABLE, 0.05, keep=False)
        assert isinstance(s.begin("acct", "k", b"x", 1.0), Lead)
        return results

    assert run_virtual(main) == [UNAVAILABLE] * 3


def test_a_cancelled_leader_wakes_its_joiners() -> None:
    async def main() -> list[StoredResponse | None]:
        s, results = store(), list[StoredResponse | None]()
        client = anyio.CancelScope()

        async def leader() -> None:
            entry = lead(s, "k")
            with client:
                try:
                    await anyio.sleep_forever()  # the model, never answering
                finally:
                    s.abandon(entry, 1.0)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(leader)
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(join_all, s, 5, results)
                await anyio.wait_all_tasks_blocked()
                client.cancel()  # the leader's client went away
        return results

    assert run_virtual(main) == [None] * 5  # the leader is gone: nothing to answer


def test_waiting_on_a_completed_entry_returns_at_once() -> None:
    s = store()
    entry = lead(s, "k")
    s.complete(entry, OK, 0.0, keep=True)
    assert run_virtual(entry.wait) == OK


def test_completion_from_a_plain_asyncio_callback_wakes_joiners() -> None:
    async def main() -> StoredResponse | None:
        s = store()
        entry = lead(s, "k")
        asyncio.get_running_loop().call_later(
            0.01, functools.partial(s.complete, entry, OK, 0.01, keep=True))
        with anyio.fail_after(5):
            return await entry.wait()

    assert anyio.run(main, backend="asyncio") == OK


# -- every interleaving, in virtual time --------------------------------------------------
MAX_ENTRIES, TTL = 3, 10.0
MAX_BYTES, SHARE = 3 * (ENTRY_OVERHEAD + 8), 0.67  # per account: 2 entries, ~2 entries' bytes


@dataclass
class Expected:
    fingerprint: bytes
    response: StoredResponse | None = None  # None while in flight
    expires: float = math.inf

    def cost(self, key: tuple[str, str]) -> int:
        assert self.response is not None
        return ENTRY_OVERHEAD + len(self.response.body) + len(key[0]) + len(key[1]) \
            + len(self.fingerprint)


class StoreMachine(RuleBasedStateMachine):
    """Drives the store against a plain model of the contract: every account's answers in
    completion order, the heaviest account evicted first when the whole store is over."""

    leaders = Bundle("leaders")

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryIdempotencyStore(ttl=TTL, max_entries=MAX_ENTRIES,
                                            max_bytes=MAX_BYTES, account_share=SHARE)
        self.now = 0.0
        self.serial = 0
        self.model: dict[tuple[str, str], Expected] = {}
        self.accounts: dict[str, list[tuple[str, str]]] = {}  # completed keys, oldest first

    def drop(self, key: tuple[str, str]) -> None:
        del self.model[key]
        keys = self.accounts[key[0]]
        keys.remove(key)
        if not keys:
            del self.accounts[key[0]]

    def bytes_of(self, scope: str) -> int:
        return sum(self.model[k].cost(k) for k in self.accounts[scope])

    def expire(self) -> None:
        for k in [k for keys in self.accounts.values() for k in keys]:
            if self.model[k].expires <= self.now:
                self.drop(k)

    def evict_over_the_whole(self) -> None:
        def over() -> bool:
            total = sum(self.bytes_of(a) for a in self.accounts)
            return len(self.model) > MAX_ENTRIES or total > MAX_BYTES

        while self.accounts and over():
            heaviest = max(self.accounts, key=self.bytes_of)
            self.drop(self.accounts[heaviest][0])

    @rule(
        target=leaders,
        scope=st.sampled_from(["", "a", "b"]),
        key=st.sampled_from(["k1", "k2"]),
        body=st.sampled_from([b"x", b"y"]),
    )
    def begin(self, scope: str, key: str, body: bytes) -> object:
        self.expire()
        live = self.model.get((scope, key))
        if live is not None and live.fingerprint != body:
            with pytest.raises(IdempotencyMismatch):
                self.store.begin(scope, key, body, self.now)
            return multiple()
        begun = self.store.begin(scope, key, body, self.now)
        if live is None:
            assert isinstance(begun, Lead), "a second leader for a live key"
            self.model[(scope, key)] = Expected(body)
            self.evict_over_the_whole()
            return begun.entry
        if live.response is None:
            assert isinstance(begun, Join)
        else:
            assert begun == Replay(live.response) and live.expires > self.now
            assert live.response.status < 500
        return multiple()

    @rule(entry=consumes(leaders), status=st.sampled_from([200, 422, 503, 504]))
    def complete(self, entry: Entry, status: int) -> None:
        self.serial += 1
        response = StoredResponse(status, str(self.serial).encode())
        keep = status < 500  # the door keeps what running the request decided
        self.store.complete(entry, response, self.now, keep=keep)
        assert entry.response == response  # what every joiner wakes up to
        self.expire()
        expected = self.model.pop(entry.key)
        if keep:
            self.model[entry.key] = Expected(expected.fingerprint, response, self.now + TTL)
            scope = entry.key[0]
            keys = self.accounts.setdefault(scope, [])
            keys.append(entry.key)
            while len(keys) > int(MAX_ENTRIES * SHARE) \
                    or self.bytes_of(scope) > int(MAX_BYTES * SHARE):
                self.drop(keys[0])
            self.evict_over_the_whole()

    @rule(entry=consumes(leaders))
    def abandon(self, entry: Entry) -> None:
        self.store.abandon(entry, self.now)
        assert entry.response is None and entry.gone
        self.expire()
        del self.model[entry.key]

    @rule(dt=st.sampled_from([0.0, 1.0, 4.0, 11.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def completed_entries_stay_bounded(self) -> None:
        stats = self.store.statistics()
        assert stats.entries <= MAX_ENTRIES and stats.bytes <= MAX_BYTES
        assert stats.in_flight == sum(e.response is None for e in self.model.values())
        assert stats.entries == sum(len(keys) for keys in self.accounts.values())
        assert stats.accounts == len(self.accounts)


StoreMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_store_matches_the_model_over_random_interleavings = StoreMachine.TestCase


def test_only_what_the_caller_keeps_is_replayed() -> None:
    store = MemoryIdempotencyStore(ttl=60.0, max_entries=10)
    for keep in (False, True):
        lead = store.begin("acme", f"k{keep}", b"f", 0.0)
        assert isinstance(lead, Lead)
        store.complete(lead.entry, StoredResponse(200, b"{}"), 0.0, keep=keep)
        again = store.begin("acme", f"k{keep}", b"f", 1.0)
        assert isinstance(again, Replay if keep else Lead)
