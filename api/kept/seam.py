"""The seam behind the idempotency store: a durable layer that kept answers outlive a
process in (`sqlite:PATH`) or that several cells share (`redis://`).

The in-memory store stays in front (`BackedStore`): it joins and replays within the
process, and the durable layer is asked only when it says Lead. `claim` then says whether
this process runs the request (`Claimed`), another one already answered it (`Stored`), or
another one is running it now (`Busy`: ask again shortly). `store` keeps an answer, and the
first stored wins: a later `store` for the same key returns the winner's answer, so every
answer for a key is the same one. `release` gives a claim up when its request ends with
nothing kept, so the next one runs it at once instead of waiting out the lease.

Every call raises `StateUnavailable` when the store cannot be reached, and `claim` and
`store` raise `IdempotencyMismatch` when the key belongs to another body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeAlias

from api.kept.idempotency import StoredResponse


@dataclass(frozen=True, slots=True)
class Claimed:
    """This process runs the request; `token` names its claim (for `release`, `extend`)."""

    token: str


@dataclass(frozen=True, slots=True)
class Stored:
    """The request was answered (by any process): replay this."""

    response: StoredResponse


@dataclass(frozen=True, slots=True)
class Busy:
    """Another process holds the claim: its answer, or the claim's end, is yet to come."""


Claim: TypeAlias = Claimed | Stored | Busy


class KeptState(Protocol):
    """A durable layer (`SqliteState`, `RedisState`). `open` before the first call,
    `close` after the last; both are the owner's (`BackedStore.run`)."""

    async def open(self) -> None: ...

    async def claim(self, scope: str, key: str, fingerprint: bytes, lease: float,
                    within: float | None = None) -> Claim:
        """Claim (scope, key) for `lease` seconds, unless answered or held elsewhere;
        `within`: how long the call may take (the request's; None: the store's own)."""
        ...

    async def store(self, scope: str, key: str, fingerprint: bytes,
                    response: StoredResponse, within: float | None = None) -> StoredResponse:
        """Keep `response` unless an answer is kept already; the one kept either way."""
        ...

    async def release(self, scope: str, key: str, token: str) -> None:
        """Give up the claim `token` (a no-op if it is gone, taken over, or answered)."""
        ...

    async def extend(self, scope: str, key: str, token: str, lease: float) -> None:
        """Hold the claim `token` for `lease` more seconds (a leader lingering on a batch)."""
        ...

    async def check(self) -> None:
        """Raise StateUnavailable if the store is known to be broken between calls (its
        owner asks every second, so that /readyz says so before a request finds out)."""
        ...

    async def close(self) -> None: ...


__all__ = ["Busy", "Claim", "Claimed", "KeptState", "Stored"]
