"""Guard stages on Ray actors (issue 36), through real HTTP: a guard is a model like any
other, so its batches run on actors of its own; an input it refuses never reaches the
model's actors, and a post guard's refusal replaces an output."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

from loadtest.server import running_server
from tests.ray.lab import Lab, up, wait_workers

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
PAID = {"Authorization": "Bearer paid-demo-key"}
MODELS = """
[models.topics]
pre = ["safety"]
post = ["leak"]
[models.topics.versions.v1]
spec = "tests.models_guards:leak_model"

[models.safety.versions.v1]
spec = "tests.models_guards:refuse_marker"

[models.leak.versions.v1]
spec = "tests.models_guards:refuse_output_marker"
"""


async def test_guards_run_on_actors_of_their_own_and_refuse_per_input(
    lab: Lab, tmp_path: Path,
) -> None:
    with running_server(3, "sim", lab.serve_models(tmp_path, MODELS)) as srv:
        workers = await wait_workers(srv.url, lambda ws: len(up(ws)) == 3)
        assert sorted(w["version"] for w in workers) == ["leak@v1", "safety@v1", "topics@v1"]
        async with httpx.AsyncClient(base_url=srv.url, headers=PAID, timeout=30) as client:
            r = await client.post("/v1/batchstring",
                                  json={"inputs": ["a", "BLOCKME b", "secret c"]})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == ["ok:a", None, None]
    assert r.json()["refused"] == [{"index": 1, "guard": "safety", "reason": "marker"},
                                   {"index": 2, "guard": "leak", "reason": "leak"}]
