"""A catalogue the pool cannot serve, end to end (issue 40, items 8, 20, 21): the shipped
example on the default single worker is refused at start-up in one line; on the workers it
says it needs, start-up names only what is resident; a change that leaves a version no
worker is refused (422), and a request for a version no placement can reach is told so
at once (503 `model_unplaceable`), not "loading" for ever; a version that still serves
traffic is not retired (409 `version_serving`), and serving goes on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from loadtest.server import running_server
from tests.e2e.test_models import KEYS, ask, wait_models, workers_holding
from tests.e2e.test_models import gateways as gateways  # one process: placement is the core's

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
ROOT = Path(__file__).parents[2]
EXAMPLE = ["--models", str(ROOT / "examples" / "models.toml")]
BATCHGATE = str(Path(sys.executable).parent / "batchgate")
ADMIN = {"Authorization": "Bearer admin-demo-key"}


def test_the_example_on_one_worker_is_refused_at_start_up_in_one_line() -> None:
    proc = subprocess.run([BATCHGATE, "serve", *EXAMPLE, *KEYS], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "could never get a worker" in proc.stderr and "--workers 2" in proc.stderr


async def test_the_example_on_its_workers_serves_each_model_and_says_what_is_resident(
) -> None:
    with running_server(workers=2, args=[*EXAMPLE, *KEYS]) as srv:
        assert await workers_holding(srv.url) == {"topics@v1": 1, "sentiment@v1": 1}
        for model in ("topics@v1", "sentiment"):
            answer = await ask(srv.url, model)
            assert answer.status_code == 200, answer.text
        (line,) = [x for x in srv.log_path.read_text().splitlines() if "workers ready" in x]
        held = line.partition("holding ")[2]
        assert held.startswith("topics@v1, sentiment@v1 (loaded when asked: topics@v2)")


async def test_a_change_or_a_request_no_placement_can_serve_is_refused_at_once() -> None:
    with running_server(workers=2, args=[*EXAMPLE, *KEYS]) as srv:
        async with httpx.AsyncClient(base_url=srv.url, headers=ADMIN, timeout=10) as admin:
            put = await admin.put("/admin/models/topics", json={"min_workers": 2})
            assert put.status_code == 422 and "could never get a worker" in put.text
            assert (await admin.put("/admin/models/topics", json={"weights": {}})).is_success
            put = await admin.put("/admin/models/sentiment", json={"min_workers": 1})
            assert put.status_code == 200, put.text  # topics@v2 is named only now
        answer = await ask(srv.url, "topics@v2")
        body = answer.json()["error"]
        assert (answer.status_code, body["code"]) == (503, "model_unplaceable"), body
        assert "loading" not in body["message"]
        assert (await ask(srv.url, "topics")).status_code == 200


async def test_a_version_that_still_serves_is_not_retired_and_serving_goes_on() -> None:
    """README's sequence: a new default, then the old one retired while it still serves."""
    with running_server(workers=2, args=[*EXAMPLE, *KEYS]) as srv:
        async with httpx.AsyncClient(base_url=srv.url, headers=ADMIN, timeout=10) as admin:
            put = await admin.put("/admin/models/topics",
                                  json={"default": "v2", "weights": {}})
            assert put.status_code == 200, put.text
            gone = await admin.delete("/admin/models/topics/versions/v1")
            body = gone.json()["error"]
            assert (gone.status_code, body["code"]) == (409, "version_serving"), body
            assert "serving_default v2" in body["message"]
            ready = await admin.get("/readyz")
        view = await wait_models(srv.url, lambda v: v["topics"]["serving_default"] == "v1")
        assert view["topics"]["versions"][0]["state"] == "resident"  # v1: it still serves
        answer = await ask(srv.url, "topics")
        assert answer.status_code == 200 and answer.json()["model"] == "topics@v1"
        assert ready.status_code == 200
