"""Idempotency keys: a retried request gets the first attempt's answer, and the model runs once.

Plain synchronous code, like the table: `begin` decides whether the caller leads, joins the
attempt in flight, or replays a stored answer; `complete` records the leader's answer and
wakes the joiners. The caller says whether an answer is kept (what running the request
decided): anything else is dropped so that a retry really retries, though the requests that
joined that attempt still receive it. The store reads nothing of an answer: statuses are the
front door's.

Bounds, each for `ttl` seconds: at most `max_entries` completed answers and `max_bytes` of
them in all, and at most `account_share` of either per account (a scope). Each account's
answers leave oldest first; when the whole store is over, the account holding the most bytes
gives up its oldest, so one account's traffic never evicts another's while it holds more.
Entries in flight are never evicted (their joiners would lose the leader); their number is
bounded elsewhere, by the queue caps, and they count toward `max_entries` only to decide how
many completed answers to keep. Time is passed in; nothing reads a clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import anyio

from api.kept.errors import IdempotencyMismatch

Key: TypeAlias = tuple[str, str]  # (scope, idempotency key); a scope is an account
ENTRY_OVERHEAD = 650  # bytes an entry costs beyond the lengths of its body, key and fingerprint
# (100,000 entries of ~90 bytes of text: 604 bytes each by tracemalloc, 742 by the process's
# RSS, which also pays the allocator's own overhead)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """What the door answered; opaque here."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class Entry:
    """One request under a key: in flight until `response` is set, then settled for good."""

    __slots__ = ("_settled", "expires", "fingerprint", "gone", "key", "response")

    def __init__(self, key: Key, fingerprint: bytes) -> None:
        self.key = key
        self.fingerprint = fingerprint
        self.response: StoredResponse | None = None
        self.gone = False  # abandoned without an answer (`abandon`)
        self.expires = float("inf")
        self._settled: anyio.Event | None = None  # made by the first joiner, inside the loop

    async def wait(self) -> StoredResponse | None:
        """The leader's response once it completes; None if it was abandoned unanswered."""
        while (response := self.response) is None and not self.gone:
            if self._settled is None:
                self._settled = anyio.Event()
            await self._settled.wait()
        return response

    def _settle(self, response: StoredResponse | None) -> None:
        # Sync and loop-safe: may run from a plain event-loop callback.
        self.response = response
        self.gone = response is None
        if self._settled is not None:
            self._settled.set()


@dataclass(frozen=True, slots=True)
class Lead:
    """First with this key: run the request, then `complete` (and `abandon` in `finally`)."""

    entry: Entry


@dataclass(frozen=True, slots=True)
class Join:
    """The same request is in flight: `await entry.wait()` for its response."""

    entry: Entry


@dataclass(frozen=True, slots=True)
class Replay:
    """The same request completed earlier: answer with this response."""

    response: StoredResponse


Begin: TypeAlias = Lead | Join | Replay


@dataclass(frozen=True, slots=True)
class IdempotencyStatistics:
    entries: int  # completed answers held
    in_flight: int
    leads: int
    replays: int
    joins: int
    mismatches: int
    dropped: int  # answers not kept (the caller said so, or abandoned)
    evictions: int
    expirations: int
    bytes: int = 0  # what the completed answers cost, by `ENTRY_OVERHEAD` and their sizes
    accounts: int = 0  # scopes holding completed answers


class IdempotencyStore(Protocol):
    """The seam: a shared store (e.g. Redis) can replace the in-memory one."""

    def begin(self, scope: str, key: str, fingerprint: bytes, now: float) -> Begin: ...
    def complete(self, entry: Entry, response: StoredResponse, now: float, keep: bool
                 ) -> None: ...
    def abandon(self, entry: Entry, now: float) -> None: ...
    def statistics(self) -> IdempotencyStatistics: ...


class MemoryIdempotencyStore:
    """The embedded default, for a single process. Not thread-safe: call it from the loop."""

    def __init__(self, *, ttl: float, max_entries: int, max_bytes: int = 256 << 20,
                 account_share: float = 0.25) -> None:
        if not ttl > 0:  # also refuses NaN
            raise ValueError(f"ttl must be > 0 seconds, got {ttl}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        if not 0 < account_share <= 1:
            raise ValueError(f"account_share must be in (0, 1], got {account_share}")
        self._ttl = ttl
        self._max_entries, self._max_bytes = max_entries, max_bytes
        self._account_entries = max(1, int(max_entries * account_share))
        self._account_bytes = max(1, int(max_bytes * account_share))
        self._in_flight: dict[Key, Entry] = {}
        self._completed: OrderedDict[Key, Entry] = OrderedDict()  # completion order
        self._accounts: dict[str, _Account] = {}
        self._bytes = 0
        self._leads = self._replays = self._joins = self._mismatches = 0
        self._dropped = self._evictions = self._expirations = 0

    def begin(self, scope: str, key: str, fingerprint: bytes, now: float) -> Begin:
        """Lead, join or replay the request under (scope, key).

        Raises IdempotencyMismatch if the live entry under that key has another fingerprint.
        """
        self._expire(now)
        k = (scope, key)
        entry = self._in_flight.get(k) or self._completed.get(k)
        if entry is None:
            entry = self._in_flight[k] = Entry(k, fingerprint)
            self._leads += 1
            self._evict()
            return Lead(entry)
        if entry.fingerprint != fingerprint:
            self._mismatches += 1
            raise IdempotencyMismatch("this idempotency key was used with another request")
        if entry.response is None:
            self._joins += 1
            return Join(entry)
        self._replays += 1
        return Replay(entry.response)

    def complete(self, entry: Entry, response: StoredResponse, now: float, keep: bool
                 ) -> None:
        """Settle a lead: wake its joiners with `response`; keep it for replays if `keep`.

        Raises ValueError if `entry` is not in flight in this store (e.g. completed twice).
        """
        if self._in_flight.get(entry.key) is not entry:
            raise ValueError("entry is not in flight in this store (completed twice?)")
        self._settle(entry, response, now, keep)

    def abandon(self, entry: Entry, now: float) -> None:
        """The leader is going away unanswered: its joiners get None, nothing is kept.

        Safe to call in a `finally:` after `complete`, so no joiner can wait forever.
        """
        if entry.response is None and not entry.gone:
            if self._in_flight.get(entry.key) is not entry:
                raise ValueError("entry is not in flight in this store")
            self._settle(entry, None, now, False)

    def _settle(self, entry: Entry, response: StoredResponse | None, now: float, keep: bool
                ) -> None:
        self._expire(now)
        del self._in_flight[entry.key]
        if response is not None and keep:
            # A copy of exactly its size: orjson's output sits in a 4 KiB block whatever its
            # length, so a kept answer would hold far more memory than it counts.
            response = StoredResponse(response.status, bytes(memoryview(response.body)),
                                      response.headers)
        entry._settle(response)
        if response is not None and keep:
            entry.expires = now + self._ttl
            self._completed[entry.key] = entry
            account = self._accounts.get(entry.key[0])
            if account is None:
                account = self._accounts[entry.key[0]] = _Account()
            account.entries[entry.key] = entry
            cost = _cost(entry)
            account.bytes += cost
            self._bytes += cost
            while len(account.entries) > self._account_entries \
                    or account.bytes > self._account_bytes:
                self._evict_oldest(account)
            self._evict()
        else:
            self._dropped += 1

    def _expire(self, now: float) -> None:
        # Completion order is expiry order (one ttl, monotonic now): sweep from the front.
        while self._completed:
            oldest = next(iter(self._completed.values()))
            if oldest.expires > now:
                return
            self._remove(oldest)
            self._expirations += 1

    def _evict(self) -> None:
        """The whole store is over: the account holding the most bytes gives up its oldest."""
        while self._completed and (
            len(self._completed) + len(self._in_flight) > self._max_entries
            or self._bytes > self._max_bytes
        ):
            self._evict_oldest(max(self._accounts.values(), key=lambda a: a.bytes))

    def _evict_oldest(self, account: _Account) -> None:
        self._remove(next(iter(account.entries.values())))
        self._evictions += 1

    def _remove(self, entry: Entry) -> None:
        del self._completed[entry.key]
        scope = entry.key[0]
        account = self._accounts[scope]
        del account.entries[entry.key]
        cost = _cost(entry)
        account.bytes -= cost
        self._bytes -= cost
        if not account.entries:
            del self._accounts[scope]

    def statistics(self) -> IdempotencyStatistics:
        return IdempotencyStatistics(
            entries=len(self._completed),
            in_flight=len(self._in_flight),
            leads=self._leads,
            replays=self._replays,
            joins=self._joins,
            mismatches=self._mismatches,
            dropped=self._dropped,
            evictions=self._evictions,
            expirations=self._expirations,
            bytes=self._bytes,
            accounts=len(self._accounts),
        )


class _Account:
    """One scope's completed answers, oldest first, and what they cost."""

    __slots__ = ("bytes", "entries")

    def __init__(self) -> None:
        self.entries: OrderedDict[Key, Entry] = OrderedDict()
        self.bytes = 0


def _cost(entry: Entry) -> int:
    response = entry.response
    body = len(response.body) if response is not None else 0
    return ENTRY_OVERHEAD + body + len(entry.key[0]) + len(entry.key[1]) \
        + len(entry.fingerprint)


__all__ = [
    "Begin",
    "Entry",
    "IdempotencyStatistics",
    "IdempotencyStore",
    "Join",
    "Lead",
    "MemoryIdempotencyStore",
    "Replay",
    "StoredResponse",
]
