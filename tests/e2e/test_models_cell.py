"""Several models in a cell (`--gateways 2`), end to end: each gateway passes the request's
model to the one core and answers from the version that ran it; the admin API of the models
is the core's, answered through either gateway; SIGHUP to the supervisor reaches the core."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from loadtest.server import running_server
from tests.e2e.test_cell import pinned_clients
from tests.e2e.test_models import (
    ADMIN,
    KEYS,
    PAID,
    TWO_MODELS,
    V1,
    catalogue,
    expected,
    workers_holding,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
CELL = ["--gateways", "2"]


@pytest.fixture(scope="module")
def gateways() -> Iterator[int]:
    """This module starts its own cell: no single-process variant."""
    before = os.environ.get("BATCHGATE_GATEWAYS")
    os.environ["BATCHGATE_GATEWAYS"] = "2"
    yield 2
    if before is None:
        del os.environ["BATCHGATE_GATEWAYS"]
    else:
        os.environ["BATCHGATE_GATEWAYS"] = before


async def test_two_models_in_a_cell_and_their_admin_api_through_either_gateway(
    tmp_path: Path,
) -> None:
    args = [*KEYS, *CELL, *catalogue(tmp_path, TWO_MODELS)]
    path = anyio.Path(args[-1])
    with running_server(workers=2, args=args) as srv:
        assert await workers_holding(srv.url) == {"a@v1": 1, "b@v2": 1}
        async with pinned_clients(srv.url, 1) as by_gateway:
            first, second = by_gateway[0][0], by_gateway[1][0]
            for client in (first, second):
                for name, version in [("a", "a@v1"), ("b", "b@v2"), ("b@v2", "b@v2")]:
                    text = f"{name}-{id(client)}"
                    r = await client.post("/v1/batchstring", headers=PAID,
                                          json={"input": text, "model": name})
                    assert r.status_code == 200, r.text
                    assert r.json()["output"] == expected(version, text)
                    assert r.json()["model"] == version
                r = await client.post("/v1/batchstring", headers=PAID,
                                      json={"input": "x", "model": "a@v9"})
                assert (r.status_code, r.json()["error"]["code"]) == (422, "unknown_model")

            # A change through one gateway is what the other one shows: one core holds it.
            put = await first.put("/admin/models/b", headers=ADMIN, json={"max_workers": 1})
            assert put.status_code == 200, put.text
            shown = (await second.get("/admin/models", headers=ADMIN)).json()["models"]
            assert {m["name"]: m["max_workers"] for m in shown} == {"a": None, "b": 1}
            assert {m["name"]: [v["resident_workers"] for v in m["versions"]]
                    for m in shown} == {"a": [1], "b": [1]}
            # The core's refusals cross the link whole.
            bad = await second.delete("/admin/models/a/versions/v1", headers=ADMIN)
            assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_change")
            assert "last live version" in bad.json()["error"]["message"]
            missing = await first.put("/admin/models/zz", headers=ADMIN, json={"min_workers": 0})
            assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
            denied = await second.get("/admin/models", headers=PAID)
            assert denied.status_code == 401

            # SIGHUP to the supervisor: the core re-reads the file (b's floor dropped: with
            # a's and b's holding both workers, c could never get one and it would be refused).
            await path.write_text(TWO_MODELS.replace("[models.b]", "[models.b]\nmin_workers = 0")
                                  + f"""
[models.c]
min_workers = 0
[models.c.versions.v1]
spec = "{V1}"
""")
            os.kill(srv.pid, signal.SIGHUP)
            with anyio.fail_after(30):
                while True:
                    listed = (await first.get("/admin/models", headers=ADMIN)).json()["models"]
                    if [m["name"] for m in listed] == ["a", "b", "c"]:
                        break
                    await anyio.sleep(0.05)  # another process: poll it
            assert [v["state"] for v in listed[2]["versions"]] == ["cold"]
