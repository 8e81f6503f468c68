"""The `/v2` routes in process, against a fake core: the job an infer becomes, what the
answer holds (a guard's refusals, skipped guards), readiness by model and version, and every
refusal in the protocol's shape with the door's status and headers."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import tritonclient.http as th
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api.config import Settings, load_keys
from api.errors import CoreUnavailable
from api.http import Answered, ClientWatch, Job, Outcome, Routes, StatusCall, http_app
from api.metrics import Metrics
from api.oip import oip_routes
from batcher.tracing import Tracing, parse_traceparent

pytestmark = pytest.mark.anyio
KEYS = load_keys(Path(__file__).parents[3] / "examples" / "keys.toml")
PAID = {"Authorization": "Bearer paid-demo-key"}
STATES = {"topics@v1": "resident", "topics@v2": "cold", "topics@v0": "retired"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeCore:
    """A `CoreView` answering each job with `outcome` (or raising `error`); keeps the jobs."""

    def __init__(self, outcome: Outcome | None = None, ready: bool = True,
                 models: dict[str, str] | None = None) -> None:
        self.outcome = outcome or Answered(["cba"], (0.001,), 0.1, model="topics@v1")
        self.error: Exception | None = None
        self.jobs: list[Job] = []
        self.is_ready, self.models = ready, models

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        self.jobs.append(job)
        if self.error is not None:
            raise self.error
        return self.outcome

    async def status(self, call: StatusCall, *args: Any) -> Any:
        assert call is StatusCall.READY
        if self.error is not None:
            raise self.error
        body: dict[str, Any] = {"ready": self.is_ready, "workers_ready": 1, "draining": False}
        return body if self.models is None else {**body, "models": self.models}


@asynccontextmanager
async def no_lifespan(app: object) -> AsyncIterator[None]:
    yield


@asynccontextmanager
async def client_of(core: FakeCore, tracing: Tracing | None = None,
                    **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    routes = Routes(core, Settings(model="sim", **settings), KEYS, Metrics(), tracing=tracing)
    app = http_app(routes, no_lifespan, oip_routes(routes))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gateway") as client:
        yield client


def infer_body(texts: list[str], **kwargs: Any) -> tuple[bytes, dict[str, str]]:
    """tritonclient's own body for `texts` (binary), and the headers it would send."""
    tensor = th.InferInput("INPUT", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(th.np.array([t.encode() for t in texts], dtype=object))
    body, length = th.InferenceServerClient.generate_request_body([tensor], **kwargs)
    return body, {**PAID, "Inference-Header-Content-Length": str(length)}


def result_of(r: httpx.Response) -> th.InferResult:
    length = r.headers.get("Inference-Header-Content-Length")
    return th.InferenceServerClient.parse_response_body(
        r.content, header_length=None if length is None else int(length))


async def test_an_infer_is_the_doors_job_and_its_outputs_come_back_in_binary() -> None:
    core = FakeCore()
    async with client_of(core) as client:
        body, headers = infer_body(["abc"], timeout=2_500_000)
        r = await client.post("/v2/models/topics/versions/v2/infer", content=body,
                              headers=headers)
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert list(result_of(r).as_numpy("OUTPUT")) == [b"cba"]
    job = core.jobs[0]
    assert (job.texts, job.model, job.timeout) == (["abc"], "topics@v2", 2.5)
    assert job.principal.account == "acme"


async def test_a_guards_refusals_are_a_tensor_of_their_own() -> None:
    refused = Answered(["ok", None], (0.001, 0.001), 0.1, model="topics@v1",
                       refused=((1, "safety", "toxic"),), skipped=("pii",))
    async with client_of(FakeCore(refused)) as client:
        body, headers = infer_body(["fine", "nasty"])
        r = await client.post("/v2/models/topics/infer", content=body, headers=headers)
    assert r.status_code == 200 and r.headers["Guard-Skipped"] == "pii"
    assert list(result_of(r).as_numpy("REFUSED")) == [b"", b"safety:toxic"]
    assert list(result_of(r).as_numpy("OUTPUT")) == [b"ok", b""]


async def test_the_doors_refusals_keep_their_status_and_retry_after() -> None:
    core = FakeCore()
    core.error = CoreUnavailable("the core is gone")
    async with client_of(core) as client:
        body, headers = infer_body(["a"])
        r = await client.post("/v2/models/topics/infer", content=body, headers=headers)
        ready = await client.get("/v2/health/ready")
    assert (r.status_code, r.headers["Retry-After"]) == (503, "1")
    assert r.json() == {"error": "the core is gone", "code": "core_unavailable"}
    assert ready.status_code == 503 and ready.json()["code"] == "core_unavailable"


async def test_a_body_over_the_limit_or_compressed_is_refused_unread() -> None:
    async with client_of(FakeCore(), max_body_bytes=1024) as client:
        body, headers = infer_body(["x" * 1100])
        big = await client.post("/v2/models/topics/infer", content=body, headers=headers)
        body, headers = infer_body(["x"])
        packed = await client.post("/v2/models/topics/infer", content=gzip.compress(body),
                                   headers={**headers, "Content-Encoding": "gzip"})
    assert (big.status_code, big.json()["code"]) == (413, "body_too_large")
    assert (packed.status_code, packed.json()["code"]) == (415, "unsupported_media_type")


async def test_readiness_of_the_server_and_of_each_version() -> None:
    async with client_of(FakeCore(models=STATES)) as client:
        assert (await client.get("/v2/health/live")).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200
        assert (await client.get("/v2/models/topics/ready")).status_code == 200
        assert (await client.get("/v2/models/topics/versions/v1/ready")).status_code == 200
        cold = await client.get("/v2/models/topics/versions/v2/ready")
        assert (cold.status_code, cold.json()) == (400, {"error": "Model version not ready"})
        for path in ["/v2/models/topics/versions/v0/ready", "/v2/models/other/ready"]:
            assert (await client.get(path)).status_code == 404
    async with client_of(FakeCore(ready=False)) as client:
        assert (await client.get("/v2/health/ready")).status_code == 503
        assert (await client.get("/v2/models/default/ready")).status_code == 400


async def test_metadata_names_the_live_versions_and_the_tensors() -> None:
    async with client_of(FakeCore(models=STATES)) as client:
        meta = (await client.get("/v2/models/topics")).json()
        one = (await client.get("/v2/models/topics/versions/v2")).json()
        missing = await client.get("/v2/models/topics/versions/v0")
        server = (await client.get("/v2")).json()
    assert meta["versions"] == ["v1", "v2"] and one["versions"] == ["v2"]
    assert meta["inputs"][0]["name"] == "INPUT" and meta["outputs"][0]["name"] == "OUTPUT"
    assert missing.status_code == 404 and isinstance(missing.json()["error"], str)
    assert server["extensions"] == ["binary_tensor_data"]


async def test_the_document_holds_the_v2_routes() -> None:
    async with client_of(FakeCore()) as client:
        paths = orjson.loads((await client.get("/openapi.json")).content)["paths"]
    assert "post" in paths["/v2/models/{name}/versions/{version}/infer"]
    assert "get" in paths["/v2/health/ready"] and "post" in paths["/v1/batchstring"]


async def test_a_traced_infer_carries_its_span_to_the_core_and_ends_it() -> None:
    """`traceparent` joins the caller's trace, as on `/v1`: the job names the request span,
    which is emitted once the answer is known, a child of the caller's span."""
    exporter = InMemorySpanExporter()
    core = FakeCore()
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with client_of(core, Tracing.over(exporter, "server", batched=False)) as client:
        body, headers = infer_body(["abc"])
        r = await client.post("/v2/models/topics/infer", content=body,
                              headers={**headers, "traceparent": caller})
    assert r.status_code == 200
    job_trace = parse_traceparent(core.jobs[0].trace or "")
    (span,) = exporter.get_finished_spans()
    assert span.name == "POST /v2/models/{name}/infer" and job_trace is not None
    assert span.context.trace_id == job_trace.trace_id == int(caller[3:35], 16)
    assert span.context.span_id == job_trace.span_id
    assert span.parent is not None and span.parent.span_id == int(caller[36:52], 16)
