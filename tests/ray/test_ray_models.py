"""Several models with the Ray pool (issue 25), through real HTTP: actors start holding the
versions placement gives them and answer from them; a rollout switches an actor (stopped,
and another started under a new id holding the new version) while both models serve."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

from loadtest.server import running_server
from tests.models_versions import v1, v2
from tests.ray.lab import ADMIN, Lab, up, wait_workers

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
PAID = {"Authorization": "Bearer paid-demo-key"}
MODELS = """
[models.a]
default = "v1"
[models.a.versions.v1]
spec = "tests.models_versions:v1"
load_s = 2
[models.a.versions.v2]
spec = "tests.models_versions:v2"
load_s = 2

[models.b]
[models.b.versions.v1]
spec = "tests.models_versions:v2"
load_s = 2
"""


async def answer(client: httpx.AsyncClient, model: str, text: str) -> tuple[str, str]:
    r = await client.post("/v1/batchstring", json={"input": text, "model": model})
    assert r.status_code == 200, r.text
    return r.json()["output"], r.json()["model"]


async def test_two_models_on_ray_actors_and_a_rollout_switches_an_actor(
    lab: Lab, tmp_path: Path,
) -> None:
    with running_server(3, "sim", lab.serve_models(tmp_path, MODELS)) as srv:
        before = await wait_workers(srv.url, lambda ws: len(up(ws)) == 3)
        assert sorted(w["version"] for w in before) == ["a@v1", "a@v1", "b@v1"]
        assert {w["node"] for w in before} <= set(lab.worker_nodes())
        async with httpx.AsyncClient(base_url=srv.url, headers=PAID, timeout=30) as client:
            assert await answer(client, "a", "ray") == (v1(["ray"])[0], "a@v1")
            assert await answer(client, "b", "ray") == (v2(["ray"])[0], "b@v1")

            put = await client.put("/admin/models/a", json={"default": "v2"}, headers=ADMIN)
            assert put.status_code == 200, put.text
            after = await wait_workers(srv.url, lambda ws: len(up(ws)) == 3 and any(
                w["version"] == "a@v2" for w in up(ws)))
            switched = [w for w in after if w["version"] == "a@v2"]
            assert len(switched) == 1
            assert switched[0]["id"] not in {w["id"] for w in before}  # a new incarnation
            assert switched[0]["pid"] not in {w["pid"] for w in before}  # a new actor
            assert sorted(w["version"] for w in up(after)) == ["a@v1", "a@v2", "b@v1"]
            assert all(w["restarts"] == 0 for w in after)  # a switch, not a death

            assert await answer(client, "a", "now") == (v2(["now"])[0], "a@v2")
            assert await answer(client, "a@v1", "old") == (v1(["old"])[0], "a@v1")
            assert await answer(client, "b", "still") == (v2(["still"])[0], "b@v1")
            view = (await client.get("/admin/models", headers=ADMIN)).json()["models"]
            assert [m["serving_default"] for m in view] == ["v2", "v1"]
