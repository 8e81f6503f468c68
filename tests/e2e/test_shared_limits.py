"""An account's rate limit holds across two servers (two cells) sharing one real Redis
(`--state redis://`, issue 27): hammered on both at once, they admit together at most the
account's burst plus its rate over the window, though each alone was offered more than that.
While Redis is out, unkeyed requests go on being answered (each cell's own buckets decide);
once it is back, the buckets are shared again.

Both gateway counts run: a single process checks the direct way's frames of one, a cell a
gateway's frames in the core, each through the door's one way in with the shared rate step."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.server import fetch_metrics, metric, running_server
from tests.redis_server import running_redis

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

RATE, BURST = 20, 20  # the account's, per second and at once, on every cell together
WINDOW_S = 3.0  # how long both servers are hammered
CLIENTS = 8  # concurrent connections per server
MAX_REQUESTS = 3000  # per server: the load is bounded in count as well as time
KEYS = f"""
anonymous = true

[admin]
keys = ["admin-demo-key"]

[[keys]]
key = "cell-one-key"
tier = "paid"
account = "shared"

[[keys]]
key = "cell-two-key"
tier = "paid"
account = "shared"

[tiers.paid]
rate = 1000
burst = 1000
account_rate = {RATE}
account_burst = {BURST}
budget_ms = 4000
"""
# A check waits for Redis a quarter of its tier's budget, at most 0.5 s, then the cell's own
# buckets decide for a second. The paid default (400 ms) gives 0.1 s, which a server's loop
# held up on a busy machine (the whole suite on two cores) can overrun though Redis answered:
# the patient budget keeps the test about sharing, not about a slow loop.


def keys_file(folder: Path) -> Path:
    path = folder / "keys.toml"
    path.write_text(KEYS)
    return path


async def hammer(url: str, key: str, until: float) -> Counter[int]:
    """POST as fast as `CLIENTS` connections allow until `until`; the statuses counted."""
    statuses: Counter[int] = Counter()
    sent = 0
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as client:
        async def one_client() -> None:
            nonlocal sent
            while time.monotonic() < until and sent < MAX_REQUESTS:
                sent += 1
                r = await client.post("/v1/batchstring", json={"input": "ab"},
                                      headers=headers)
                statuses[r.status_code] += 1

        async with anyio.create_task_group() as tg:
            for _ in range(CLIENTS):
                tg.start_soon(one_client)
    return statuses


async def test_an_accounts_rate_limit_holds_across_two_cells_sharing_redis(
    tmp_path: Path
) -> None:
    with running_redis(tmp_path / "redis") as redis:
        args = ["--keys", str(keys_file(tmp_path)), "--state", redis.url]
        with running_server(args=args) as one, running_server(args=args) as two:
            got: list[Counter[int]] = []

            async def run(url: str, key: str, until: float) -> None:
                got.append(await hammer(url, key, until))

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, one.url, "cell-one-key", started + WINDOW_S)
                tg.start_soon(run, two.url, "cell-two-key", started + WINDOW_S)
            window = time.monotonic() - started
            errors = [metric(fetch_metrics(srv.url), "batchgate_state_errors_total",
                             part="limits") for srv in (one, two)]
    allowed = BURST + RATE * window  # every check's server time lies inside the window
    admitted = [c[200] for c in got]
    assert {s for c in got for s in c} <= {200, 429}, got
    # +1: the script's refill is in floating point; a whole extra request would be a leak.
    assert sum(admitted) <= allowed + 1, (admitted, allowed, "Redis calls failed:", errors)
    # The bucket was used: the burst at least. How much of the refill is admitted depends on
    # how much of the window the servers' loops checked (on two busy cores a loop starts
    # late: 48 of 85 once); the refill itself is pinned against Redis in
    # tests/api/door/test_shared_limits.py.
    assert sum(admitted) >= BURST, (admitted, allowed)
    # Each server alone was offered more than the account's whole allowance and admitted
    # some of it: with a bucket per cell, each would have admitted about `allowed`.
    assert all(sum(c.values()) > allowed and c[200] > 0 for c in got), (got, allowed)


async def test_with_redis_out_unkeyed_requests_are_served_and_the_limits_come_back(
    tmp_path: Path
) -> None:
    with running_redis(tmp_path / "redis") as redis:
        args = ["--keys", str(keys_file(tmp_path)), "--state", redis.url]
        with running_server(args=args) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
                async def statuses(n: int) -> list[int]:
                    return [(await client.post("/v1/batchstring", json={"input": "ab"})
                             ).status_code for _ in range(n)]

                assert await statuses(3) == [200] * 3
                redis.stop()
                assert await statuses(10) == [200] * 10  # the cell's own buckets decide
                assert metric(fetch_metrics(srv.url), "batchgate_state_errors_total",
                              part="limits") >= 1
                redis.start()  # empty: the buckets it held are gone
                with anyio.fail_after(15):  # the limits ask Redis again within RETRY_S
                    while not await shared_buckets(redis.url):
                        assert await statuses(1) == [200]
                        await anyio.sleep(0.05)  # another process: poll it


async def shared_buckets(url: str) -> bool:
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        return bool(await client.keys("batchgate:limits:*"))
    finally:
        await client.aclose()
