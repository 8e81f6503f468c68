"""`/admin/workers` says how many workers the pool aims at, how many are starting and how
many run: a pool that follows the load gives its scaler's counts, a fixed pool its size and
its workers by state. The body is held to the OpenAPI document."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from api.config import Settings, load_keys
from api.http import (
    ClientWatch,
    Job,
    Limits,
    Outcome,
    Routes,
    StatusCall,
    document,
    http_app,
)
from api.metrics import Metrics
from gpu_pool import WorkerInfo

pytestmark = pytest.mark.anyio
KEYS = load_keys(Path(__file__).parents[2] / "examples" / "keys.toml")
ADMIN = {"Authorization": "Bearer admin-demo-key"}
DOC = document(Limits(max_inputs=7, max_input_chars=20, max_body_bytes=1 << 20))
BODY = "#/paths/~1admin~1workers/get/responses/200/content/application~1json/schema"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def worker(wid: int, state: str) -> dict[str, Any]:
    """A worker as the core sends it (`StatusView.workers`: plain records)."""
    return asdict(WorkerInfo(wid, wid, 100 + wid, state, "cpu", 0, 0))


class StatusCore:
    """A `CoreView` whose status endpoints show `workers` and `capacity`; it runs no job."""

    def __init__(self, workers: list[dict[str, Any]],
                 capacity: tuple[int, int, int] | None) -> None:
        self._workers, self._capacity = workers, capacity

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        raise AssertionError("no job is sent here")

    async def ready(self) -> dict[str, object]:
        return {"ready": True, "workers_ready": 1, "draining": False}

    async def workers(self) -> list[dict[str, Any]]:
        return self._workers

    async def capacity(self) -> tuple[int, int, int] | None:
        return self._capacity

    async def metrics_text(self) -> bytes:
        return b""

    async def cell(self) -> dict[str, Any]:
        return {"gateways": [], "core": None}

    async def models(self, method: str, name: str | None, version: str | None,
                     body: bytes) -> tuple[int, dict[str, Any]]:
        return 404, {}

    async def status(self, call: StatusCall, *args: Any) -> Any:
        return await getattr(self, call.value)(*args)


@asynccontextmanager
async def admin_of(core: StatusCore) -> AsyncIterator[httpx.AsyncClient]:
    routes = Routes(core, Settings(model="sim"), KEYS, Metrics())

    @asynccontextmanager
    async def no_lifespan(app: object) -> AsyncIterator[None]:
        yield

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=http_app(routes, no_lifespan)),
                                 base_url="http://gateway") as client:
        yield client


async def shown(workers: list[dict[str, Any]],
                capacity: tuple[int, int, int] | None) -> dict[str, Any]:
    async with admin_of(StatusCore(workers, capacity)) as client:
        answer = await client.get("/admin/workers", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def documented(body: dict[str, Any]) -> bool:
    schema = {"$ref": BODY, "paths": DOC["paths"], "components": DOC["components"]}
    return bool(jsonschema.Draft202012Validator(schema).is_valid(body))


async def test_a_pool_that_follows_the_load_shows_its_scalers_counts() -> None:
    workers = [worker(1, "ready"), worker(2, "starting")]
    body = await shown(workers, (4, 3, 1))  # two more asked for, not listed yet
    assert (body["desired"], body["starting"], body["running"]) == (4, 3, 1)
    assert body["workers"] == workers


async def test_a_fixed_pool_shows_its_size_and_its_workers_by_state() -> None:
    states = ["ready", "busy", "switching", "starting", "pending", "dead", "stopped"]
    body = await shown([worker(i, s) for i, s in enumerate(states)], None)
    # every worker but the stopped one is wanted (a dead one is restarted); a worker
    # switching versions is up; a Ray actor waiting for room is starting
    assert (body["desired"], body["starting"], body["running"]) == (6, 2, 3)


async def test_a_fixed_pool_at_rest_wants_what_runs() -> None:
    body = await shown([worker(1, "ready"), worker(2, "busy")], None)
    assert (body["desired"], body["starting"], body["running"]) == (2, 0, 2)


@pytest.mark.parametrize("capacity", [None, (3, 1, 2)])
async def test_the_body_is_what_the_document_says(capacity: tuple[int, int, int] | None
                                                  ) -> None:
    body = await shown([worker(1, "ready"), worker(2, "busy"), worker(3, "starting")],
                       capacity)
    assert documented(body)
    assert not documented({k: v for k, v in body.items() if k != "running"})
