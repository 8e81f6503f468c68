"""Versions whose loads keep failing, end to end (issue 40, items 1 and 2): a real server on
two workers, a catalogue whose broken versions are `tests.models_broken:never` (its import
kills the worker). A rollout to such a version is abandoned and the old default keeps both
workers; a request naming it is refused at once; a model added by SIGHUP that cannot load
gives its worker back, and one removed while it loads frees its slot at once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from loadtest.server import fetch_metrics, metric, running_server
from tests.e2e.test_models import (
    ADMIN,
    KEYS,
    PAID,
    V1,
    ask,
    catalogue,
    version_of,
    wait_models,
    workers_holding,
)
from tests.e2e.test_models import gateways as gateways  # one process here
from tests.models_versions import v1

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
BROKEN = "tests.models_broken:never"
# Three loads dead in a row (backoffs 0.5, 1 and 2 s, each a process start): a bound for a
# busy machine; a quiet one gives up within about 5 s.
GIVE_UP_WITHIN_S = 60.0
ROLLOUT = f"""
[models.m]
default = "v1"
[models.m.versions.v1]
spec = "{V1}"
load_s = 1
[models.m.versions.v2]
spec = "{BROKEN}"
load_s = 1
"""
ONE = f"""
[models.a]
min_workers = 1
[models.a.versions.v1]
spec = "{V1}"
load_s = 1
"""
WITH_BAD = ONE + f"""
[models.bad]
min_workers = 1
[models.bad.versions.v1]
spec = "{BROKEN}"
load_s = 1
"""


async def put(url: str, path: str, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=10) as client:
        return await client.put(path, json=body)


async def test_a_rollout_to_a_version_that_cannot_load_is_abandoned_not_an_outage(
    tmp_path: Path,
) -> None:
    with running_server(workers=2, args=[*KEYS, *catalogue(tmp_path, ROLLOUT)]) as srv:
        assert await workers_holding(srv.url) == {"m@v1": 2}
        assert (await put(srv.url, "/admin/models/m", {"default": "v2"})).status_code == 200
        view = await wait_models(srv.url, lambda v: version_of(v, "m", "v2")[
            "state"] == "failing", within=GIVE_UP_WITHIN_S)
        assert view["m"]["serving_default"] == "v1"  # never a version no worker holds
        async with httpx.AsyncClient(base_url=srv.url, headers=ADMIN, timeout=10) as client:
            whole = (await client.get("/admin/models")).json()
        assert whole["rollouts_abandoned"] == {"m": "v2"}
        # The slot that crash-looped on v2 loads v1 again: both workers serve m.
        await wait_models(srv.url, lambda v: version_of(v, "m", "v1")[
            "resident_workers"] == 2, within=GIVE_UP_WITHIN_S)
        r = await ask(srv.url, "m", text="still")
        assert r.status_code == 200 and r.json()["output"] == v1(["still"])[0], r.text
        started = time.monotonic()
        named = await ask(srv.url, "m@v2", headers={**PAID, "X-Request-Timeout-Ms": "5000"})
        assert (named.status_code, named.json()["error"]["code"]) == (503, "model_failing")
        assert time.monotonic() - started < 2.5, "refused after waiting, not at once"
        assert int(named.headers["retry-after"]) > 60  # when a load is tried again
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
            assert (await client.get("/readyz")).status_code == 200
        m = fetch_metrics(srv.url)
        assert metric(m, "batchgate_model_failing", model="m", version="v2") == 1
        assert metric(m, "batchgate_model_failing", model="m", version="v1") == 0


async def test_a_model_that_cannot_load_gives_its_worker_back_and_leaves_at_once(
    tmp_path: Path,
) -> None:
    args = [*KEYS, *catalogue(tmp_path, ONE)]
    path = anyio.Path(args[-1])
    with running_server(workers=2, args=args) as srv:
        assert await workers_holding(srv.url) == {"a@v1": 2}
        await path.write_text(WITH_BAD)
        os.kill(srv.pid, signal.SIGHUP)  # bad's floor takes one of a's workers
        await wait_models(srv.url, lambda v: "bad" in v and version_of(v, "bad", "v1")[
            "state"] == "failing", within=GIVE_UP_WITHIN_S)
        await wait_models(srv.url, lambda v: version_of(v, "a", "v1")[
            "resident_workers"] == 2, within=GIVE_UP_WITHIN_S)  # given back to a
        refused = await ask(srv.url, "bad")
        assert refused.json()["error"]["code"] == "model_failing", refused.text

        await path.write_text(ONE)
        os.kill(srv.pid, signal.SIGHUP)
        await wait_models(srv.url, lambda v: "bad" not in v)
        held = await workers(srv.url)
        assert {w["version"] for w in held} == {"a@v1"}, held
        assert (await ask(srv.url, "a", text="x")).json()["output"] == v1(["x"])[0]


async def test_a_version_removed_while_its_loads_fail_frees_its_slot_at_once(
    tmp_path: Path,
) -> None:
    """Its slot died loading once (each load dies after 3 s): the SIGHUP that removes the
    model gives the slot to `a` in the same turn, not after the failures run out."""
    slow = ONE + WITH_BAD[len(ONE):].replace(BROKEN, "tests.models_broken_slow:never")
    args = [*KEYS, *catalogue(tmp_path, ONE)]
    path = anyio.Path(args[-1])
    with running_server(workers=2, args=args) as srv:
        await path.write_text(slow)
        os.kill(srv.pid, signal.SIGHUP)
        await wait_workers(srv.url, lambda ws: any(
            w["version"] == "bad@v1" and w["restarts"] >= 1 for w in ws))  # died loading once
        await path.write_text(ONE)
        os.kill(srv.pid, signal.SIGHUP)
        removed = time.monotonic()
        await wait_models(srv.url, lambda v: "bad" not in v)
        await wait_workers(srv.url, lambda ws: all(w["version"] == "a@v1" for w in ws))
        assert time.monotonic() - removed < 3.0, "the slot waited for its loads to fail"
        await wait_models(srv.url, lambda v: version_of(v, "a", "v1")[
            "resident_workers"] == 2, within=GIVE_UP_WITHIN_S)


async def workers(url: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=10) as client:
        found: list[dict[str, Any]] = (await client.get("/admin/workers")).json()["workers"]
    return found


async def wait_workers(url: str, condition: Callable[[list[dict[str, Any]]], bool]) -> None:
    """Poll GET /admin/workers (another process) until `condition` holds."""
    with anyio.fail_after(GIVE_UP_WITHIN_S):
        while True:
            if condition(await workers(url)):
                return
            await anyio.sleep(0.05)
