"""`--state redis://HOST:PORT/DB`: kept answers in a Redis server that several cells share,
so a key answered on one cell is replayed on another, and runs on one cell at a time.

One hash per key (`bgk:<len(scope)>:<scope>:<key>`) holds either a claim (the body's
fingerprint, the owner's cell and incarnation, the claim's token; expiring with its lease)
or an answer (fingerprint, status, body, headers; expiring with the ttl). `claim` and
`store` are each one round trip: a server-side Lua script (EVALSHA; the client loads it
again after a Redis restart), so the check and the write are one atomic step.

Whose claim is stale: one of the same cell with this incarnation or an older one was left
by this process (the memory store in front lets one request per key lead here, so a claim
of ours that it asks about again was abandoned) or by a core of this cell that died; it is
taken over at once. A claim of another cell is waited out: its lease is the request's
timeout plus a margin, extended while its leader lingers on a batch left running.

Every call is bounded, by the time its request can give it (`within`: a slow Redis makes
keyed requests slower, not refused while their deadline allows) or, for the writes nobody
waits for, by twice `timeout`; connecting times out after `timeout`, the pool hands out at
most `max_connections` (waiting for one within the call's bound), and nothing is retried
here. Any failure raises `StateUnavailable`; the next call connects again, so the store
coming back needs no restart.

The client (`connect`: the one place this process builds one) is the process's one
connection pool to that Redis: the rate limits cells share there take it
(`api.kept.redis_client`), and it is closed with the store.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable
from typing import Any

import anyio
import orjson
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from api.kept.errors import IdempotencyMismatch, StateUnavailable
from api.kept.idempotency import StoredResponse
from api.kept.seam import Busy, Claim, Claimed, Stored
from api.kept.spec import RedisSettings

log = logging.getLogger("batchgate.state")

CLAIM = """
local v = redis.call('HMGET', KEYS[1], 'f', 's', 'b', 'h', 'c', 'i')
if v[1] then
  if v[1] ~= ARGV[1] then return {'mismatch'} end
  if v[2] then return {'stored', v[2], v[3], v[4]} end
  if v[5] ~= ARGV[2] or tonumber(v[6]) > tonumber(ARGV[3]) then return {'busy'} end
end
redis.call('HSET', KEYS[1], 'f', ARGV[1], 'c', ARGV[2], 'i', ARGV[3], 't', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {'claimed'}
"""
STORE = """
local v = redis.call('HMGET', KEYS[1], 'f', 's', 'b', 'h')
if v[2] then
  if v[1] ~= ARGV[1] then return {'mismatch'} end
  return {'stored', v[2], v[3], v[4]}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'f', ARGV[1], 's', ARGV[2], 'b', ARGV[3], 'h', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {'kept'}
"""
RELEASE = """
if redis.call('HGET', KEYS[1], 't') == ARGV[1] and redis.call('HEXISTS', KEYS[1], 's') == 0
then return redis.call('DEL', KEYS[1]) end
return 0
"""
EXTEND = """
if redis.call('HGET', KEYS[1], 't') == ARGV[1] and redis.call('HEXISTS', KEYS[1], 's') == 0
then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


def connect(settings: RedisSettings) -> Redis:
    """A client of the Redis `settings` names, connecting on its first call within
    `timeout`, at most `max_connections` at once, no retries inside the client (a failed
    call fails at once; the caller asks again later). Its calls have no time limit of
    their own: each caller bounds its own (a cancelled call closes its connection)."""
    s = settings
    pool = BlockingConnectionPool(
        host=s.host, port=s.port, db=s.db, max_connections=s.max_connections,
        timeout=None, socket_timeout=None, socket_connect_timeout=s.timeout,
        retry=Retry(NoBackoff(), 0))
    return Redis(connection_pool=pool)


class RedisState:
    """`KeptState` on a Redis server, through the `redis` client's asyncio API. `client`:
    its connection pool, made here and connecting on its first call."""

    def __init__(self, settings: RedisSettings) -> None:
        self._settings = settings
        self._tokens = itertools.count(1)
        self.client = connect(settings)
        self._scripts: dict[str, Any] = {
            name: self.client.register_script(text) for name, text in
            (("claim", CLAIM), ("store", STORE), ("release", RELEASE), ("extend", EXTEND))}
        self._open = False

    async def open(self) -> None:
        """Start serving (the client connects lazily). A store that is down now is only
        logged: keyed requests get 503 until it answers."""
        self._open = True
        s = self._settings
        try:
            await self._call(self.client.ping())
        except StateUnavailable as exc:
            log.warning("the state store %s:%d is not answering (%s); keyed requests are "
                        "refused until it does", s.host, s.port, exc)

    async def claim(self, scope: str, key: str, fingerprint: bytes, lease: float,
                    within: float | None = None) -> Claim:
        owner = self._settings.owner
        token = f"{owner.cell}:{owner.incarnation}:{next(self._tokens)}"
        reply = await self._run("claim", within, scope, key, fingerprint, owner.cell,
                                owner.incarnation, token, _ms(lease))
        what = reply[0]
        if what == b"claimed":
            return Claimed(token)
        if what == b"busy":
            return Busy()
        return Stored(_answer(reply))

    async def store(self, scope: str, key: str, fingerprint: bytes,
                    response: StoredResponse, within: float | None = None) -> StoredResponse:
        reply = await self._run("store", within, scope, key, fingerprint, response.status,
                                response.body, orjson.dumps(response.headers),
                                _ms(self._settings.ttl))
        if reply[0] == b"kept":
            return response
        return _answer(reply)

    async def release(self, scope: str, key: str, token: str) -> None:
        await self._run("release", None, scope, key, token)

    async def extend(self, scope: str, key: str, token: str, lease: float) -> None:
        await self._run("extend", None, scope, key, token, _ms(lease))

    async def check(self) -> None:
        """Nothing to look at between calls: a call that fails says so."""

    async def close(self) -> None:
        """Close the client's connections (the shared rate limits' too: the server is
        draining)."""
        if self._open:
            self._open = False
            with anyio.move_on_after(self._settings.timeout):
                await self.client.aclose(close_connection_pool=True)

    async def _run(self, script: str, within: float | None, scope: str, key: str,
                   *args: Any) -> Any:
        if not self._open:
            raise StateUnavailable("the state store is not open")
        name = f"bgk:{len(scope)}:{scope}:{key}"
        return await self._call(self._scripts[script](keys=[name], args=list(args)), within)

    async def _call(self, call: Awaitable[Any], within: float | None = None) -> Any:
        # Loading a script after a restart is a second trip: twice the timeout by default.
        limit = 2 * self._settings.timeout + 0.1 if within is None else within
        try:
            with anyio.fail_after(max(limit, 0.0)):
                return await call
        except (RedisError, OSError) as exc:  # TimeoutError is an OSError
            raise StateUnavailable(f"the state store failed: {type(exc).__name__}: {exc}"
                                   ) from exc


def _answer(reply: list[Any]) -> StoredResponse:
    if reply[0] == b"mismatch":
        raise IdempotencyMismatch("this idempotency key was used with another request")
    headers = tuple((str(k), str(v)) for k, v in orjson.loads(reply[3]))
    return StoredResponse(int(reply[1]), bytes(reply[2]), headers)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


__all__ = ["RedisState", "connect"]
