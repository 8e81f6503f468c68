"""Inputs that killed their worker when run alone, remembered for a while by a hash of their
text, so that sending one again is refused at once instead of crash-looping the pool."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class Quarantine:
    """Bounded and expiring; the texts themselves are never kept. Time is passed in."""

    def __init__(self, *, ttl: float = 600.0, max_entries: int = 10_000) -> None:
        if not ttl > 0 or max_entries < 1:
            raise ValueError("a quarantine needs ttl > 0 and max_entries >= 1")
        self._ttl, self._max = ttl, max_entries
        self._until: OrderedDict[bytes, float] = OrderedDict()  # insertion = expiry order

    def __len__(self) -> int:
        return len(self._until)

    def add(self, text: str, now: float) -> None:
        key = _digest(text)
        self._until.pop(key, None)
        self._until[key] = now + self._ttl
        while len(self._until) > self._max:
            self._until.popitem(last=False)

    def holds(self, texts: Iterable[str], now: float) -> bool:
        """Whether any of `texts` is in quarantine now (cheap while it is empty)."""
        until = self._until
        while until and next(iter(until.values())) <= now:
            until.popitem(last=False)
        return bool(until) and any(_digest(t) in until for t in texts)


__all__ = ["Quarantine"]
