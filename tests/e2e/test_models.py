"""Several models on one pool, end to end (issue 25): real servers serving a catalogue
(`--models FILE`) of the test models in `tests.models_versions` (v1 reverses and marks
"v1:", v2 upper-cases and marks "v2:"), so every answer tells which version ran it.

Also what the other `test_models_*` modules share: the catalogue file, the admin API read
from outside (polled, bounded: the server is another process) and the expected outputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from loadtest.models_rollout import send_all
from loadtest.server import running_server
from tests.e2e.helpers import EXAMPLE_KEYS
from tests.e2e.test_minilm import CASES
from tests.models_versions import v1, v2

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
PAID = {"Authorization": "Bearer paid-demo-key"}
ADMIN = {"Authorization": "Bearer admin-demo-key"}
KEYS = ["--keys", str(EXAMPLE_KEYS)]
PATIENT = {**PAID, "X-Request-Timeout-Ms": "30000"}  # waits out a load, not a hang
OUTPUT: dict[str, Callable[[list[str]], list[str]]] = {"v1": v1, "v2": v2}
V1, V2 = "tests.models_versions:v1", "tests.models_versions:v2"
TWO_MODELS = f"""
[models.a]
[models.a.versions.v1]
spec = "{V1}"
load_s = 1

[models.b]
[models.b.versions.v2]
spec = "{V2}"
load_s = 1
"""
Version = dict[str, Any]  # one version as GET /admin/models shows it


@pytest.fixture(scope="module")
def gateways() -> Iterator[int]:
    """One process here (the cell has `test_models_cell.py`): the variant per test would
    double the time; BATCHGATE_GATEWAYS is set so no outer setting changes that."""
    before = os.environ.get("BATCHGATE_GATEWAYS")
    os.environ["BATCHGATE_GATEWAYS"] = "1"
    yield 1
    if before is None:
        del os.environ["BATCHGATE_GATEWAYS"]
    else:
        os.environ["BATCHGATE_GATEWAYS"] = before


def catalogue(tmp_path: Path, text: str, name: str = "models.toml") -> list[str]:
    """`--models` with `text` written to a file of the test's own."""
    path = tmp_path / name
    path.write_text(text)
    return ["--models", str(path)]


def expected(version_key: str, text: str) -> str:
    """What the test model of `version_key`'s function ("m@v2": ...:v2) answers."""
    return OUTPUT[version_key.partition("@")[2]]([text])[0]


async def models_view(url: str) -> dict[str, dict[str, Any]]:
    """GET /admin/models, by model name."""
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=10) as client:
        r = await client.get("/admin/models")
    assert r.status_code == 200, r.text
    return {m["name"]: m for m in r.json()["models"]}


def version_of(view: dict[str, dict[str, Any]], model: str, version: str) -> Version:
    (found,) = [v for v in view[model]["versions"] if v["version"] == version]
    return dict(found)


async def wait_models(
    url: str, condition: Callable[[dict[str, dict[str, Any]]], bool], within: float = 30.0,
) -> dict[str, dict[str, Any]]:
    """Poll GET /admin/models (another process) until `condition` holds; the view."""
    with anyio.fail_after(within):
        while True:
            view = await models_view(url)
            if condition(view):
                return view
            await anyio.sleep(0.05)  # another process: poll it


async def workers_holding(url: str) -> dict[str, int]:
    """Live workers (not switching) by the version they hold, from GET /admin/workers."""
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=10) as client:
        r = await client.get("/admin/workers")
    out: dict[str, int] = {}
    for w in r.json()["workers"]:
        if w["state"] in ("ready", "busy"):
            out[w["version"]] = out.get(w["version"], 0) + 1
    return out


async def ask(url: str, model: str | None, text: str = "Hello",
              headers: dict[str, str] | None = None) -> httpx.Response:
    """One request for `model` (None: names none); the request's own deadline bounds it."""
    body: dict[str, object] = {"input": text}
    if model is not None:
        body["model"] = model
    async with httpx.AsyncClient(base_url=url, timeout=70) as client:
        return await client.post("/v1/batchstring", json=body, headers=headers or PAID)


async def test_two_models_on_one_pool_each_answer_from_its_own(tmp_path: Path) -> None:
    with running_server(workers=2, args=[*KEYS, *catalogue(tmp_path, TWO_MODELS)]) as srv:
        assert await workers_holding(srv.url) == {"a@v1": 1, "b@v2": 1}
        want = {"a": "a@v1", "b": "b@v2", "a@v1": "a@v1", "b@v2": "b@v2", None: "a@v1"}
        names = [list(want)[i % len(want)] for i in range(200)]  # None: the first model
        texts = [f"Text-{i:03d}" for i in range(200)]
        requests = [({"input": text} | ({} if name is None else {"model": name}), PAID)
                    for name, text in zip(names, texts, strict=True)]
        shots = await send_all(srv.url, requests, concurrency=40)
        assert [s.status for s in shots] == [200] * 200
        assert [s.model for s in shots] == [want[name] for name in names]
        assert [s.output for s in shots] == [expected(want[name], text)
                                             for name, text in zip(names, texts, strict=True)]
        for name, why in [("c", "is not served"), ("a@v2", "no live version"),
                          ("b@v1", "no live version"), ("a@", "model@version")]:
            r = await ask(srv.url, name)
            assert (r.status_code, r.json()["error"]["code"]) == (422, "unknown_model"), r.text
            assert why in r.json()["error"]["message"]
        view = await models_view(srv.url)
        assert [version_of(view, "a", "v1")["resident_workers"],
                version_of(view, "b", "v2")["resident_workers"]] == [1, 1]


@pytest.mark.slow
async def test_the_real_model_and_a_sim_model_on_one_pool(tmp_path: Path) -> None:
    models = """
[models.topics]
[models.topics.versions.v1]
spec = "minilm"

[models.echo]
[models.echo.versions.v1]
spec = "sim"
"""
    args = [*KEYS, *catalogue(tmp_path, models)]
    texts = list(CASES)
    with running_server(workers=2, args=args, ready_timeout_s=240,
                        env={"HF_HUB_OFFLINE": "1"}) as srv:
        assert await workers_holding(srv.url) == {"topics@v1": 1, "echo@v1": 1}
        async with httpx.AsyncClient(base_url=srv.url, headers=PAID, timeout=120) as client:
            for _ in range(2):  # each model twice, interleaved: no switch between them
                topics = await client.post("/v1/batchstring",
                                           json={"inputs": texts, "model": "topics"})
                assert topics.status_code == 200, topics.text
                assert topics.json()["outputs"] == list(CASES.values())
                assert topics.json()["model"] == "topics@v1"
                echo = await client.post("/v1/batchstring",
                                         json={"inputs": texts, "model": "echo"})
                assert echo.status_code == 200, echo.text
                assert echo.json()["outputs"] == [t[::-1] for t in texts]
                assert echo.json()["model"] == "echo@v1"
        assert await workers_holding(srv.url) == {"topics@v1": 1, "echo@v1": 1}
