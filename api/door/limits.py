"""Per-key and per-account rate limits: token buckets whose rate tightens under pressure, and
the rate step every frame of requests passes on its way in.

Each tier sets a rate and a burst for every key and for every account (keys file,
`[tiers.<tier>]`). While the queue ahead of a tier grows toward that tier's admission
budget, its rates are scaled down (free first: its budget is smaller; paid only when the
pool cannot keep up) and they relax as the queue drains. The factor is exported as a metric.

The door (`api.door.Door.submit`) hands a frame's checks to one `RateStep`: this cell's own
buckets (`RateLimiter`), which decide at once, or the buckets cells share in Redis
(`api.door.SharedLimits`), which decide after a round trip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import anyio
from anyio.abc import TaskStatus

from api.config import Principal, TierPolicy
from api.errors import RateLimited
from batcher import Tier

Check = tuple[Principal, float]  # a caller and its tier's pressure factor


class Checked(Protocol):
    """Who waits for a frame's rate verdicts (the door, admitting the frame)."""

    def checked(self, refusals: Sequence[BaseException | None]) -> None:
        """Each check's refusal, or None where it passed (its tokens taken); must not raise."""


class RateStep(Protocol):
    """The rate limits a frame passes before admission."""

    def pass_frame(self, checks: Sequence[Check], now: float, then: Checked) -> None:
        """Decide `checks` in order, as one by one, and call `then.checked` once with the
        verdicts: within this call (this cell's buckets) or once they are known (shared)."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """What the step waits in, in its host's task group (the door's lifespan, the link):
        until cancelled, or at once when it waits in nothing."""


def pressure_factor(pressure: float) -> float:
    """Rate multiplier for a tier whose expected wait is `pressure` x its budget:
    1 up to half the budget, then down linearly to 0.1 at the budget and beyond."""
    if pressure <= 0.5:
        return 1.0
    return max(0.1, 1.0 - 1.8 * (pressure - 0.5))


class TokenBucket:
    __slots__ = ("last", "tokens")

    def __init__(self, burst: float, now: float) -> None:
        self.tokens = burst
        self.last = now

    def refill(self, now: float, rate: float, burst: float) -> None:
        self.tokens = min(burst, self.tokens + (now - self.last) * rate)
        self.last = now

    def wait(self, now: float, rate: float, burst: float) -> float:
        """Refill; 0 if a token is there (none is taken), else the seconds until one is."""
        self.tokens = min(burst, self.tokens + (now - self.last) * rate)  # `refill`, inlined
        self.last = now
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / rate

    def take(self, now: float, rate: float, burst: float) -> float:
        """Take one token; 0 if allowed, else the seconds until one is available."""
        wait = self.wait(now, rate, burst)
        if wait == 0.0:
            self.tokens -= 1
        return wait


class RateLimiter:
    """One bucket per key and per account: bounded by the keys file (anonymous is one). As
    a `RateStep` it decides a frame within the call."""

    def __init__(self, limits: dict[Tier, TierPolicy]) -> None:
        if set(limits) != set(Tier):
            raise ValueError("rate limits are needed for every tier")
        self._limits = limits
        self._keys: dict[tuple[Tier, str], TokenBucket] = {}
        self._accounts: dict[tuple[Tier, str], TokenBucket] = {}

    def pass_frame(self, checks: Sequence[Check], now: float, then: Checked) -> None:
        then.checked(self.check_all(checks, now))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()  # nothing waits: every frame is decided as it comes

    def check_all(self, checks: Sequence[Check], now: float) -> list[RateLimited | None]:
        """Each check's refusal, or None where it passed: as `check` called for each in
        turn decides. A frame often holds a run of one caller's checks: the run's first
        ones take their tokens at once (`allow`), the rest are checked one by one."""
        if len(checks) == 1:  # most frames: a direct call
            principal, factor = checks[0]
            if self.allow(principal, 1, now, factor):
                return [None]
        out: list[RateLimited | None] = []
        start, end = 0, len(checks)
        while start < end:
            principal, factor = checks[start]
            stop = start + 1
            while stop < end and checks[stop][0] is principal:
                stop += 1
            passed = self.allow(principal, stop - start, now, factor)
            out += [None] * passed
            for _ in range(start + passed, stop):
                try:
                    self.check(principal, now, factor)
                except RateLimited as refusal:
                    out.append(refusal)
                else:
                    out.append(None)
            start = stop
        return out

    def check(self, principal: Principal, now: float, factor: float = 1.0) -> None:
        """Raise RateLimited if the key or its account is over its (scaled) rate. A token is
        taken from both or from neither: a refusal by one bucket spends nothing of the
        other's (a key refused by its busy account keeps its own rate for later)."""
        lim = self._limits[principal.tier]
        key = self._bucket(self._keys, (principal.tier, principal.key or principal.account),
                           now, lim.burst)
        account = self._bucket(self._accounts, (principal.tier, principal.account), now,
                               lim.account_burst)
        wait = max(key.wait(now, lim.rate * factor, lim.burst),
                   account.wait(now, lim.account_rate * factor, lim.account_burst))
        if wait > 0.0:  # the later of the two: a retry sooner is refused again
            raise RateLimited("rate limit exceeded for this key or account", math.ceil(wait))
        key.tokens -= 1
        account.tokens -= 1

    def allow(self, principal: Principal, n: int, now: float, factor: float = 1.0) -> int:
        """How many of `n` requests of `principal` at `now` pass: the first ones, as `check`
        called `n` times would pass them, their tokens taken at once."""
        lim = self._limits[principal.tier]
        key = self._bucket(self._keys, (principal.tier, principal.key or principal.account),
                           now, lim.burst)
        account = self._bucket(self._accounts, (principal.tier, principal.account), now,
                               lim.account_burst)
        key.refill(now, lim.rate * factor, lim.burst)
        account.refill(now, lim.account_rate * factor, lim.account_burst)
        passed = min(n, int(key.tokens), int(account.tokens))
        key.tokens -= passed
        account.tokens -= passed
        return passed

    @staticmethod
    def _bucket(buckets: dict[tuple[Tier, str], TokenBucket], name: tuple[Tier, str],
                now: float, burst: float) -> TokenBucket:
        bucket = buckets.get(name)
        if bucket is None:
            bucket = buckets[name] = TokenBucket(burst, now)
        return bucket


__all__ = ["Check", "Checked", "RateLimiter", "RateStep", "TokenBucket", "pressure_factor"]
