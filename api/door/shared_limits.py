"""Rate limits shared by every cell behind one Redis (`--state redis://HOST:PORT/DB`).

The buckets are `RateLimiter`'s (a key's and its account's, a token taken from both or
from neither, Retry-After the later of the two waits), kept in Redis hashes and taken by
one server-side script per check, or per frame of checks: one round trip, atomic across
cells, on the server's clock (`TIME`), so the cells' clocks need not agree. A bucket
expires once it would have refilled to its burst: an absent bucket is a full one, so idle
callers cost Redis nothing.

When Redis does not answer within `timeout_s`, the check falls back to the cell's own
`RateLimiter` (each cell then limits an account by itself, as without Redis) and unkeyed
requests go on being served; the outage is logged once, every failed call counted
(`batchgate_state_errors_total{part="limits"}`), and Redis asked again at most every
`retry_s`, so an outage costs one timeout a second, not one a request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from api.config import Principal, TierPolicy
from api.door.limits import RateLimiter
from api.errors import RateLimited
from api.metrics import Metrics
from batcher import Tier

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("batchgate.limits")

TIMEOUT_S = 0.5  # a check waits this long for Redis before the cell's own buckets decide
RETRY_S = 1.0  # while Redis is out, it is asked again at most this often
CONNECTIONS = 16  # concurrent script calls (a frame's checks share one)
PREFIX = "batchgate:limits:"
NAMES_KEPT = 4096  # distinct callers whose bucket names are kept
MESSAGE = "rate limit exceeded for this key or account"

# KEYS: a key's bucket and its account's bucket, per check, in order. ARGV: per check, the
# key's rate and burst, then the account's. Returns per check 0 (passed, a token taken from
# both) or the microseconds until both hold one (nothing taken). A frame's checks of one
# caller run in order on one reading of the clock, as `RateLimiter.check` run in a loop.
SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local buckets, names = {}, {}
local function bucket(name, rate, burst)
  local b = buckets[name]
  if b == nil then
    local saved = redis.call('HMGET', name, 'tokens', 'at')
    local tokens, at = tonumber(saved[1]), tonumber(saved[2])
    if tokens == nil or at == nil then
      tokens = burst
    else
      tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
    end
    b = {tokens = tokens, rate = rate, burst = burst}
    buckets[name] = b
    names[#names + 1] = name
  end
  return b
end
local waits = {}
for i = 1, #KEYS / 2 do
  local a = (i - 1) * 4
  local rate, arate = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3])
  local key = bucket(KEYS[2 * i - 1], rate, tonumber(ARGV[a + 2]))
  local account = bucket(KEYS[2 * i], arate, tonumber(ARGV[a + 4]))
  local wait = 0
  if key.tokens < 1 then wait = (1 - key.tokens) / rate end
  if account.tokens < 1 then wait = math.max(wait, (1 - account.tokens) / arate) end
  if wait > 0 then
    waits[i] = math.ceil(wait * 1000000)
  else
    key.tokens = key.tokens - 1
    account.tokens = account.tokens - 1
    waits[i] = 0
  end
end
for _, name in ipairs(names) do
  local b = buckets[name]
  redis.call('HSET', name, 'tokens', b.tokens, 'at', now)
  redis.call('PEXPIRE', name, math.ceil(b.burst / b.rate * 1000) + 1000)
end
return waits
"""

Check = tuple[Principal, float]  # a caller and its tier's pressure factor


def bucket_names(principal: Principal) -> tuple[str, str]:
    """The Redis keys of a caller's two buckets. An API key is a secret: only its hash is
    written to Redis."""
    tier = principal.tier.label
    if principal.key is None:
        key = f"{PREFIX}{tier}:anon:{principal.account}"
    else:
        digest = hashlib.sha256(principal.key.encode("utf-8", "surrogateescape")).hexdigest()
        key = f"{PREFIX}{tier}:key:{digest[:32]}"
    return key, f"{PREFIX}{tier}:account:{principal.account}"


class SharedLimits:
    """The door's rate check when the buckets live in Redis; `fallback` (the cell's own
    buckets) decides while Redis is out. `clock`: monotonic seconds, for the fallback's
    buckets and the retry interval."""

    def __init__(
        self, client: Redis, limits: dict[Tier, TierPolicy], fallback: RateLimiter,
        metrics: Metrics, clock: Callable[[], float] = time.monotonic,
        timeout_s: float = TIMEOUT_S, retry_s: float = RETRY_S,
    ) -> None:
        from redis.exceptions import RedisError

        self._client, self._limits, self._fallback = client, limits, fallback
        self._errors = metrics.state_errors.labels("limits")
        self._clock, self._timeout_s, self._retry_s = clock, timeout_s, retry_s
        self._script = client.register_script(SCRIPT)
        self._failures: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
        self._names: dict[Principal, tuple[str, str]] = {}
        self._out = False  # Redis failed its last call
        self._retry_at = -math.inf  # while out: when Redis is asked again

    @property
    def out(self) -> bool:
        """Whether the cell's own buckets decide (Redis failed its last call)."""
        return self._out

    @property
    def retry_in(self) -> float:
        """Seconds until Redis is asked again (0: the next check asks it)."""
        return max(0.0, self._retry_at - self._clock())

    async def check(self, principal: Principal, factor: float = 1.0) -> None:
        """Raise RateLimited if the key or its account is over its (scaled) rate."""
        refusal = (await self.check_all(((principal, factor),)))[0]
        if refusal is not None:
            raise refusal

    async def check_all(self, checks: Sequence[Check]) -> list[RateLimited | None]:
        """Each check's refusal, or None where it passed (its tokens taken): in order, as
        `check` called for each in turn would decide, in one round trip."""
        now = self._clock()
        if now < self._retry_at:
            return self._locally(checks, now)
        if self._out:  # this call asks Redis; the others meanwhile decide locally
            self._retry_at = now + self._retry_s
        keys: list[str] = []
        args: list[float] = []
        for principal, factor in checks:
            keys += self._bucket_names(principal)
            lim = self._limits[principal.tier]
            args += (lim.rate * factor, lim.burst, lim.account_rate * factor, lim.account_burst)
        try:
            waits = await self._call(keys, args)
        except self._failures as exc:
            self._failed(exc)
            return self._locally(checks, self._clock())
        if self._out:
            self._out, self._retry_at = False, -math.inf
            log.warning("the shared rate limits answer again: every cell's checks are shared")
        return [None if wait == 0 else RateLimited(MESSAGE, math.ceil(wait / 1e6))
                for wait in waits]

    async def aclose(self) -> None:
        """Close the client's connections (the server is draining)."""
        await self._client.aclose()

    async def _call(self, keys: list[str], args: list[float]) -> list[int]:
        async with asyncio.timeout(self._timeout_s):
            waits: Any = await self._script(keys=keys, args=args)
        return [int(wait) for wait in waits]

    def _failed(self, exc: BaseException) -> None:
        self._errors.inc()
        self._retry_at = self._clock() + self._retry_s
        if not self._out:
            self._out = True
            log.error("the shared rate limits (Redis) do not answer (%s: %s): each cell "
                      "limits by itself until they do", type(exc).__name__,
                      str(exc) or f"nothing within {self._timeout_s} s")

    def _locally(self, checks: Sequence[Check], now: float) -> list[RateLimited | None]:
        out: list[RateLimited | None] = []
        for principal, factor in checks:
            try:
                self._fallback.check(principal, now, factor)
            except RateLimited as refusal:
                out.append(refusal)
            else:
                out.append(None)
        return out

    def _bucket_names(self, principal: Principal) -> tuple[str, str]:
        names = self._names.get(principal)
        if names is None:
            if len(self._names) >= NAMES_KEPT:
                self._names.clear()
            names = self._names[principal] = bucket_names(principal)
        return names


def connect(url: str, limits: dict[Tier, TierPolicy], fallback: RateLimiter,
            metrics: Metrics, clock: Callable[[], float] = time.monotonic) -> SharedLimits:
    """Shared limits on the Redis at `url` (connected on the first check). No retries
    inside the client: a failed call falls back at once, and Redis is asked again later."""
    from redis.asyncio import BlockingConnectionPool, Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    pool = BlockingConnectionPool.from_url(
        url, max_connections=CONNECTIONS, timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S,
        socket_connect_timeout=TIMEOUT_S, retry=Retry(NoBackoff(), 0),
    )
    return SharedLimits(Redis.from_pool(pool), limits, fallback, metrics, clock)


def shared_limits(state: str, limits: dict[Tier, TierPolicy], fallback: RateLimiter,
                  metrics: Metrics, clock: Callable[[], float] = time.monotonic
                  ) -> SharedLimits | None:
    """The shared limits `--state` asks for: only Redis is shared between cells (memory and
    SQLite are one cell's, whose own `RateLimiter` decides: None)."""
    if not state.startswith(("redis://", "rediss://")):
        return None
    return connect(state, limits, fallback, metrics, clock)


__all__ = ["SCRIPT", "Check", "SharedLimits", "bucket_names", "connect", "shared_limits"]
