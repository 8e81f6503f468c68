"""A rollout under load, end to end: the default moves from v1 to a v2 whose load takes
`LOAD_S` (`tests.models_slow`) while 300 requests a second arrive, then v1 is retired.

What the core promises (failover/models/cores.py): the serving default moves only once the
new version is resident on as many workers as the old one (loaded from the old one's idle
workers once past their minimum residency), so no request waits on a cold version; a
request is resolved to a version when it arrives, so once a v2 answer has come back, every
request sent after it runs on v2.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.models_rollout import Request, Shot, offer
from loadtest.server import running_server
from tests.e2e.test_models import (
    ADMIN,
    KEYS,
    PAID,
    V1,
    catalogue,
    expected,
    models_view,
    version_of,
    wait_models,
    workers_holding,
)
from tests.e2e.test_models import gateways as gateways  # one process here
from tests.models_slow import LOAD_S

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
RPS = 300
MAX_LOAD_S = 45.0  # the load's bound, should the rollout never end
ROLLING = f"""
[models.m]
default = "v1"
[models.m.versions.v1]
spec = "{V1}"
load_s = 1
[models.m.versions.v2]
spec = "tests.models_slow:v2"
load_s = {LOAD_S + 1}
"""


def request(i: int) -> Request:
    return {"input": f"Roll-{i:05d}", "model": "m"}, PAID


async def test_a_rollout_under_load_never_waits_on_the_new_version_then_retires_the_old(
    tmp_path: Path,
) -> None:
    args = [*KEYS, *catalogue(tmp_path, ROLLING), "--batch-latency-ms", "100"]
    with running_server(workers=2, args=args) as srv:
        assert await workers_holding(srv.url) == {"m@v1": 2}
        stop = asyncio.Event()
        shots: list[Shot] = []
        marks: dict[str, float] = {}

        async def load() -> None:
            shots.extend(await offer(srv.url, RPS, request, max_s=MAX_LOAD_S, stop=stop))

        async with (httpx.AsyncClient(base_url=srv.url, headers=ADMIN, timeout=10) as admin,
                    anyio.create_task_group() as tg):
            tg.start_soon(load)
            await anyio.sleep(1.0)  # the schedule: a second of v1 under load first
            marks["put"] = time.monotonic()
            put = await admin.put("/admin/models/m", json={"default": "v2"})
            marks["put_done"] = time.monotonic()
            assert put.status_code == 200, put.text
            m = {x["name"]: x for x in put.json()["models"]}["m"]
            assert (m["default"], m["serving_default"]) == ("v2", "v1")  # not yet
            with anyio.fail_after(MAX_LOAD_S - 5):
                while True:  # poll the other process until the default has moved
                    asked = time.monotonic()
                    view = await models_view(srv.url)
                    if view["m"]["serving_default"] == "v2":
                        break
                    marks["still_v1"] = asked  # the switch came after this was asked
                    await anyio.sleep(0.05)
            assert version_of(view, "m", "v2")["resident_workers"] >= max(
                1, version_of(view, "m", "v1")["resident_workers"])
            await anyio.sleep(1.5)  # the schedule: v2 alone under load
            retire = await admin.delete("/admin/models/m/versions/v1")
            assert retire.status_code == 200, retire.text
            await anyio.sleep(0.5)  # the schedule: load through the retirement
            stop.set()
        view = await wait_models(srv.url, lambda v: version_of(v, "m", "v1")[
            "resident_workers"] == 0)
        assert version_of(view, "m", "v1")["state"] == "retired"
        assert version_of(view, "m", "v2")["state"] == "resident"
        assert version_of(view, "m", "v2")["load_s"] >= LOAD_S  # it was slow to load
        assert "m@v1" not in await workers_holding(srv.url)
        async with httpx.AsyncClient(base_url=srv.url, headers=ADMIN, timeout=10) as admin:
            listed = (await admin.get("/admin/workers")).json()["workers"]
        assert all(w["version"] != "m@v1" for w in listed)  # none holds it, none loads it

    assert len(shots) >= RPS * 4  # the load ran through all of it
    assert Counter(s.status for s in shots) == {200: len(shots)}, [  # 0 non-200
        s for s in shots if s.status != 200][:3]
    assert all(s.output == expected(s.model or "", f"Roll-{s.index:05d}") for s in shots)
    by_model = Counter(s.model for s in shots)
    assert set(by_model) == {"m@v1", "m@v2"} and min(by_model.values()) >= RPS
    # Answers from v1 until v2 was resident: every request sent before the switch was
    # asked for (and answered before the last look that still saw v1) ran on v1, and v1
    # kept answering through v2's load.
    assert all(s.model == "m@v1" for s in shots if s.sent < marks["put"])
    assert all(s.model == "m@v1" for s in shots if s.done < marks["still_v1"])
    assert max(s.sent for s in shots if s.model == "m@v1") >= marks["put_done"] + LOAD_S * 0.8
    # ...then from v2: once a v2 answer has come back, nothing sent later runs on v1.
    first_v2 = min(s.done for s in shots if s.model == "m@v2")
    assert all(s.model == "m@v2" for s in shots if s.sent > first_v2)
    # No request waited on the cold version: the default moved once v2 was resident (above),
    # and nothing that v2 answered was sent before a load of it could have ended. (How long
    # the slowest took is a figure, printed: on a quiet machine far less than the load.)
    assert all(s.sent >= marks["put"] + LOAD_S for s in shots if s.model == "m@v2")
    print(f"slowest: {max(shots, key=lambda s: s.latency)}")
