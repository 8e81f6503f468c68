"""Rate limits shared by every cell behind one Redis (`--state redis://HOST:PORT/DB`).

The buckets are `RateLimiter`'s (a key's and its account's, a token taken from both or
from neither, Retry-After the later of the two waits), kept in Redis hashes and taken by
one server-side script per frame of checks: one round trip, atomic across cells, on the
server's clock (`TIME`), so the cells' clocks need not agree. A bucket expires once it
would have refilled to its burst: an absent bucket is a full one, so idle callers cost
Redis nothing. The client is the kept answers' (`api.kept.redis_client`): one connection
pool per process, opened and closed with them.

As the door's `RateStep`, a frame waits for its check: one task (`run`, in its host's task
group) checks every frame that came meanwhile in one call. While Redis is out a check may
be the one that asks it again, which can take the whole timeout: then it runs beside the
loop, so the frames after it are decided (locally) at once.

A check waits for Redis a share (`BUDGET_SHARE`) of the smallest budget of the tiers in
its frame, at most `timeout_s`: a Redis that is slow (not only one that is down) costs a
request a small part of its budget. When Redis does not answer within that, the check
falls back to the cell's own `RateLimiter` (each cell then limits an account by itself, as
without Redis) and unkeyed requests go on being served; the outage is logged once, every
failed call counted (`batchgate_state_errors_total{part="limits"}`), and Redis asked again
at most every `retry_s`, so an outage costs one short wait a second, not one a request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from api.config import Principal, TierPolicy
from api.door.limits import Check, Checked, RateLimiter, RateStep
from api.errors import CoreUnavailable, RateLimited
from api.metrics import Metrics
from batcher import Closed, Tier

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("batchgate.limits")

TIMEOUT_S = 0.5  # a check waits at most this long for Redis before the cell's own decide
BUDGET_SHARE = 0.25  # ... and at most this share of the smallest budget in its frame
RETRY_S = 1.0  # while Redis is out, it is asked again at most this often
CHECKS_WAITING = 65_536  # checks waiting for the next round trip; a frame past it is refused
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

Waiting = tuple[Sequence[Check], Checked]  # a frame's checks and who waits for them


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
    """The door's rate step when the buckets live in Redis; `fallback` (the cell's own
    buckets) decides while Redis is out. `clock`: monotonic seconds, for the fallback's
    buckets and the retry interval."""

    def __init__(
        self, client: Redis, limits: dict[Tier, TierPolicy], fallback: RateLimiter,
        metrics: Metrics, clock: Callable[[], float] = time.monotonic,
        timeout_s: float = TIMEOUT_S, retry_s: float = RETRY_S,
    ) -> None:
        from redis.exceptions import RedisError

        self._limits, self._fallback = limits, fallback
        self._errors = metrics.state_errors.labels("limits")
        self._clock, self._timeout_s, self._retry_s = clock, timeout_s, retry_s
        self._script = client.register_script(SCRIPT)
        self._failures: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
        self._names: dict[Principal, tuple[str, str]] = {}
        self._out = False  # Redis failed its last call
        self._retry_at = -math.inf  # while out: when Redis is asked again
        self._waiting: list[Waiting] = []
        self._queued = 0  # checks in `_waiting`
        self._checking: dict[int, list[Waiting]] = {}  # round trips under way, by id()
        self._wake = asyncio.Event()

    @property
    def out(self) -> bool:
        """Whether the cell's own buckets decide (Redis failed its last call)."""
        return self._out

    @property
    def retry_in(self) -> float:
        """Seconds until Redis is asked again (0: the next check asks it)."""
        return max(0.0, self._retry_at - self._clock())

    @property
    def checking(self) -> int:
        """Checks whose round trip is under way."""
        return sum(len(checks) for frames in self._checking.values() for checks, _ in frames)

    def pass_frame(self, checks: Sequence[Check], now: float, then: Checked) -> None:
        """Queue the frame for the next round trip (`run` makes it)."""
        if self._queued + len(checks) > CHECKS_WAITING:
            then.checked([CoreUnavailable("the core is too busy to take it now")] * len(checks))
            return
        self._waiting.append((checks, then))
        self._queued += len(checks)
        self._wake.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Check the waiting frames until cancelled; those left then are refused."""
        async with anyio.create_task_group() as tg:
            task_status.started()
            try:
                while True:
                    await self._wake.wait()
                    self._wake.clear()
                    frames, self._waiting, self._queued = self._waiting, [], 0
                    self._checking[id(frames)] = frames
                    if self._out:
                        tg.start_soon(self._check_frames, frames)
                    else:
                        await self._check_frames(frames)
            finally:
                left = [frame for frames in self._checking.values() for frame in frames]
                left += self._waiting
                self._checking, self._waiting, self._queued = {}, [], 0
                closed = Closed("the server is shutting down")
                for checks, then in left:
                    then.checked([closed] * len(checks))

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
            return self._fallback.check_all(checks, now)
        if self._out:  # this call asks Redis; the others meanwhile decide locally
            self._retry_at = now + self._retry_s
        keys: list[str] = []
        args: list[float] = []
        budget = math.inf
        for principal, factor in checks:
            keys += self._bucket_names(principal)
            lim = self._limits[principal.tier]
            args += (lim.rate * factor, lim.burst, lim.account_rate * factor, lim.account_burst)
            budget = min(budget, lim.budget_ms / 1000)
        within = min(self._timeout_s, budget * BUDGET_SHARE)
        try:
            waits = await self._call(keys, args, within)
        except self._failures as exc:
            self._failed(exc, within)
            return self._fallback.check_all(checks, self._clock())
        if self._out:
            self._out, self._retry_at = False, -math.inf
            log.warning("the shared rate limits answer again: every cell's checks are shared")
        return [None if wait == 0 else RateLimited(MESSAGE, math.ceil(wait / 1e6))
                for wait in waits]

    async def _check_frames(self, frames: list[Waiting]) -> None:
        checks = [check for frame, _ in frames for check in frame]
        try:
            refusals: Sequence[BaseException | None] = await self.check_all(checks)
        except Exception as exc:  # answered, never lost: the door's refusal logs what it is
            refusals = [exc] * len(checks)
        if self._checking.pop(id(frames), None) is None:
            return  # refused already: the server is shutting down
        at = 0
        for frame, then in frames:
            then.checked(refusals[at:at + len(frame)])
            at += len(frame)

    async def _call(self, keys: list[str], args: list[float], within: float) -> list[int]:
        async with asyncio.timeout(within):
            waits: Any = await self._script(keys=keys, args=args)
        return [int(wait) for wait in waits]

    def _failed(self, exc: BaseException, within: float) -> None:
        self._errors.inc()
        self._retry_at = self._clock() + self._retry_s
        if not self._out:
            self._out = True
            log.error("the shared rate limits (Redis) do not answer (%s: %s): each cell "
                      "limits by itself until they do", type(exc).__name__,
                      str(exc) or f"nothing within {within:g} s")

    def _bucket_names(self, principal: Principal) -> tuple[str, str]:
        names = self._names.get(principal)
        if names is None:
            if len(self._names) >= NAMES_KEPT:
                self._names.clear()
            names = self._names[principal] = bucket_names(principal)
        return names


def rate_step(client: Redis | None, limits: dict[Tier, TierPolicy], metrics: Metrics,
              clock: Callable[[], float] = time.monotonic) -> RateStep:
    """The rate limits `--state` asks for: with kept answers in Redis (`client`, their
    connection), the buckets every cell shares, the cell's own deciding while Redis is out;
    otherwise (memory, SQLite: one cell's) the cell's own."""
    local = RateLimiter(limits)
    if client is None:
        return local
    return SharedLimits(client, limits, local, metrics, clock)


__all__ = ["CHECKS_WAITING", "SCRIPT", "SharedLimits", "bucket_names", "rate_step"]
