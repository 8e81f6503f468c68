"""The ASGI routes (`api.http.Routes`) against a fake core: what the headers alone decide,
the job a request becomes, how the core's outcome is rendered, and the status endpoints.
The core here is a `CoreView` that answers what the test gave it and keeps every job."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from api.config import ANONYMOUS, Settings, load_keys
from api.errors import ApiError, CoreUnavailable, to_api_error
from api.http import (
    Answered,
    ClientWatch,
    Job,
    Outcome,
    Rendered,
    Routes,
    StatusCall,
    http_app,
    rendered,
)
from api.metrics import Metrics

pytestmark = pytest.mark.anyio
EXAMPLE_KEYS = Path(__file__).parents[3] / "examples" / "keys.toml"
KEYS = load_keys(EXAMPLE_KEYS)
PAID = KEYS.identify("Bearer paid-demo-key")
FREE = KEYS.identify("Bearer free-demo-key")
MAX_TIMEOUT_MS = 30_000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeCore:
    """A `CoreView` that answers each job with `outcome` (or raises `error`) and keeps it."""

    def __init__(self, outcome: Outcome | None = None, ready: bool = True) -> None:
        self.outcome = outcome or Answered(["olleh"], (0.002,), 0.1)
        self.error: Exception | None = None
        self.jobs: list[Job] = []
        self.changes: list[bytes] = []  # the admin API's bodies, as the core got them
        self.is_ready = ready

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        self.jobs.append(job)
        if self.error is not None:
            raise self.error
        return self.outcome

    async def ready(self) -> dict[str, object]:
        return {"ready": self.is_ready, "workers_ready": int(self.is_ready), "draining": False}

    async def workers(self) -> list[dict[str, Any]]:
        return [{"id": 1, "state": "ready"}]

    async def capacity(self) -> tuple[int, int, int] | None:
        return None  # a fixed pool: counted from the workers

    async def metrics_text(self) -> bytes:
        return b"batchgate_up 1\n"

    async def cell(self) -> dict[str, Any]:
        return {"gateways": [{"slot": 0}], "core": {"pid": 7}}

    async def models(self, method: str, name: str | None, version: str | None, body: bytes
                     ) -> tuple[int, Any]:
        self.changes.append(body)
        return 200, {"models": []}

    async def status(self, call: StatusCall, *args: Any) -> Any:
        return await getattr(self, call.value)(*args)


def routes_over(core: FakeCore) -> Routes:
    settings = Settings(model="sim", max_request_timeout_ms=MAX_TIMEOUT_MS)
    return Routes(core, settings, KEYS, Metrics())


@asynccontextmanager
async def no_lifespan(app: object) -> AsyncIterator[None]:
    yield


@asynccontextmanager
async def client_of(core: FakeCore) -> AsyncIterator[httpx.AsyncClient]:
    app = http_app(routes_over(core), no_lifespan)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gateway") as client:
        yield client


def refused_code(principal: Any, headers: dict[str, str]) -> str:
    with pytest.raises(ApiError) as refused:
        routes_over(FakeCore()).check_head(principal, headers)
    return refused.value.code


# -- what the headers alone decide --------------------------------------------------------------
def test_an_idempotency_key_is_returned_and_may_be_255_characters() -> None:
    routes = routes_over(FakeCore())
    assert routes.check_head(PAID, {"idempotency-key": "k" * 255}) == "k" * 255
    assert routes.check_head(PAID, {}) is None


@pytest.mark.parametrize("key", ["", "k" * 256])
def test_an_empty_or_overlong_idempotency_key_is_refused(key: str) -> None:
    assert refused_code(PAID, {"idempotency-key": key}) == "invalid_idempotency_key"


def test_an_anonymous_caller_may_not_send_an_idempotency_key() -> None:
    """Answers are kept per account, and anonymous callers share one."""
    assert refused_code(ANONYMOUS, {"idempotency-key": "k"}) == "idempotency_needs_key"


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x"])
def test_a_body_that_is_not_json_by_its_content_type_is_refused(kind: str) -> None:
    assert refused_code(PAID, {"content-type": kind}) == "unsupported_media_type"


@pytest.mark.parametrize("kind", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_with_or_without_parameters_passes(kind: str) -> None:
    assert routes_over(FakeCore()).check_head(PAID, {"content-type": kind}) is None


# -- the job a request becomes ------------------------------------------------------------------
def test_a_job_without_a_timeout_header_takes_its_tiers_default() -> None:
    routes = routes_over(FakeCore())
    paid = routes.job_of(PAID, {}, b'{"input": "a"}', None)
    free = routes.job_of(FREE, {}, b'{"inputs": ["a", "b"]}', None)
    assert (paid.timeout, paid.texts, paid.single) == (5.0, ["a"], True)
    assert (free.timeout, free.texts, free.single) == (2.0, ["a", "b"], False)


def test_a_timeout_header_is_taken_up_to_the_servers_cap() -> None:
    routes = routes_over(FakeCore())
    asked = routes.job_of(PAID, {"x-request-timeout-ms": "250"}, b'{"input": "a"}', None)
    capped = routes.job_of(PAID, {"x-request-timeout-ms": "9000000000"}, b'{"input": "a"}', None)
    assert (asked.timeout, capped.timeout) == (0.25, MAX_TIMEOUT_MS / 1000)


def test_a_keyed_job_carries_its_key_and_the_digest_of_its_body() -> None:
    body = b'{"input": "a"}'
    job = routes_over(FakeCore()).job_of(PAID, {}, body, "key-1")
    assert job.idempotency == ("key-1", hashlib.sha256(body).digest())
    assert job.principal is PAID
    assert routes_over(FakeCore()).job_of(PAID, {}, body, None).idempotency is None


# -- the hot route through ASGI -----------------------------------------------------------------
async def test_an_answered_job_is_rendered_as_its_outputs_with_the_queue_and_batch_times(
) -> None:
    core = FakeCore(Answered(["olleh"], (0.002,), 0.1))
    async with client_of(core) as client:
        r = await client.post("/v1/batchstring", json={"input": "hello"},
                              headers={"Authorization": "Bearer paid-demo-key"})
    assert r.status_code == 200 and r.json()["output"] == "olleh" and r.json()["id"]
    assert r.headers["server-timing"] == "queue;dur=2.0, batch;dur=100.0"
    assert [j.texts for j in core.jobs] == [["hello"]] and core.jobs[0].principal == PAID


async def test_a_job_of_many_inputs_is_answered_with_a_list() -> None:
    core = FakeCore(Answered(["a", "cb"], (0.0, 0.001), 0.1))
    async with client_of(core) as client:
        r = await client.post("/v1/batchstring", json={"inputs": ["a", "bc"]})
    assert r.status_code == 200 and r.json()["outputs"] == ["a", "cb"]


async def test_a_rendered_outcome_is_sent_as_the_core_made_it() -> None:
    refusal = rendered(to_api_error(CoreUnavailable("the core process is unavailable")))
    async with client_of(FakeCore(refusal)) as client:
        r = await client.post("/v1/batchstring", json={"input": "a"})
    assert r.status_code == 503 and r.content == refusal.body
    assert r.headers["retry-after"] == "1"
    assert r.headers["server-timing"].startswith("total;dur=")


async def test_a_stored_answer_keeps_its_headers() -> None:
    replay = Rendered(200, b'{"id":"x","output":"a"}', (("Idempotent-Replayed", "true"),))
    async with client_of(FakeCore(replay)) as client:
        r = await client.post("/v1/batchstring", json={"input": "a"},
                              headers={"Authorization": "Bearer paid-demo-key",
                                       "Idempotency-Key": "k"})
    assert (r.status_code, r.json()) == (200, {"id": "x", "output": "a"})
    assert r.headers["idempotent-replayed"] == "true"


async def test_a_keyed_run_the_door_rendered_is_timed_and_counted_by_its_version() -> None:
    kept = Rendered(200, b'{"id":"x","output":"a","model":"topics@v2"}', (), (0.002,), 0.1,
                    "topics@v2")
    core = FakeCore(kept)
    routes = routes_over(core)
    app = http_app(routes, no_lifespan)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gateway") as client:
        r = await client.post("/v1/batchstring", json={"input": "a"},
                              headers={"Authorization": "Bearer paid-demo-key",
                                       "Idempotency-Key": "k"})
        await anyio.wait_all_tasks_blocked()  # counted in the loop turn after the answer
    assert r.headers["server-timing"] == "queue;dur=2.0, batch;dur=100.0"
    assert ('batchgate_requests_total{code="200",model="topics",tier="paid",version="v2"} 1.0'
            in routes.metrics.render().decode().splitlines())


async def test_an_error_the_core_raises_is_translated_never_a_traceback() -> None:
    core = FakeCore()
    core.error = RuntimeError("a bug with a secret in it")
    async with client_of(core) as client:
        r = await client.post("/v1/batchstring", json={"input": "a"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal"
    assert b"secret" not in r.content


async def test_an_unknown_key_is_refused_before_the_core_sees_the_job() -> None:
    core = FakeCore()
    async with client_of(core) as client:
        r = await client.post("/v1/batchstring", json={"input": "a"},
                              headers={"Authorization": "Bearer nobody"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert core.jobs == []


async def test_a_refused_head_or_body_never_reaches_the_core() -> None:
    core = FakeCore()
    async with client_of(core) as client:
        form = await client.post("/v1/batchstring", content=b"input=a",
                                 headers={"Content-Type": "text/plain"})
        broken = await client.post("/v1/batchstring", content=b"{not json")
    assert (form.status_code, broken.status_code) == (415, 400)
    assert core.jobs == []


async def test_a_path_with_a_slash_too_many_is_a_json_404_never_a_redirect() -> None:
    async with client_of(FakeCore()) as client:
        r = await client.post("/v1/batchstring/", json={"input": "a"},
                              headers={"Host": "evil.example"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert "location" not in r.headers


# -- the admin API's body -----------------------------------------------------------------------
ADMIN = {"Authorization": "Bearer admin-demo-key"}
LIMIT = Settings(model="sim").max_body_bytes


async def test_an_admin_body_declared_over_the_limit_is_refused_unread() -> None:
    core = FakeCore()
    async with client_of(core) as client:
        r = await client.put("/admin/models/m", content=b"{}",
                             headers={**ADMIN, "Content-Length": str(LIMIT + 1)})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert core.changes == []


async def test_a_chunked_admin_body_is_cut_off_at_the_limit() -> None:
    core, sent = FakeCore(), []

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(LIMIT // 1024 * 4):  # four times the limit, if it were all read
            sent.append(1024)
            yield b" " * 1024

    async with client_of(core) as client:
        r = await client.put("/admin/models/m", content=chunks(), headers=ADMIN)
        within = await client.put("/admin/models/m", content=b'{"default": "v2"}',
                                  headers=ADMIN)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert sum(sent) <= LIMIT + 1024 and core.changes == [b'{"default": "v2"}']
    assert within.status_code == 200


# -- the status endpoints -----------------------------------------------------------------------
async def test_the_workers_listing_needs_an_admin_key() -> None:
    async with client_of(FakeCore()) as client:
        anyone = await client.get("/admin/workers")
        paid = await client.get("/admin/workers",
                                headers={"Authorization": "Bearer paid-demo-key"})
        admin = await client.get("/admin/workers",
                                 headers={"Authorization": "Bearer admin-demo-key"})
    assert anyone.status_code == paid.status_code == 401
    assert admin.status_code == 200
    assert admin.json() == {"workers": [{"id": 1, "state": "ready"}], "desired": 1,
                            "starting": 0, "running": 1, "gateways": [{"slot": 0}],
                            "core": {"pid": 7}}


@pytest.mark.parametrize(("ready", "status"), [(True, 200), (False, 503)])
async def test_readyz_says_503_while_the_core_is_not_ready(ready: bool, status: int) -> None:
    async with client_of(FakeCore(ready=ready)) as client:
        r = await client.get("/readyz")
    assert r.status_code == status and r.json()["ready"] is ready


async def test_healthz_and_metrics_answer_from_this_process_and_the_core() -> None:
    async with client_of(FakeCore()) as client:
        health = await client.get("/healthz")
        metrics = await client.get("/metrics")
    assert orjson.loads(health.content) == {"status": "ok"}
    assert metrics.text == "batchgate_up 1\n"
    assert metrics.headers["content-type"].startswith("text/plain")
