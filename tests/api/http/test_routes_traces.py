"""The request span (`--otlp-endpoint`): the job a traced request becomes carries its
span's traceparent, both ways in emit the span, and with tracing off nothing changes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from api.config import Settings, load_keys
from api.http import Answered, ClientWatch, Job, Outcome, Routes, http_app, trace_job
from api.metrics import Metrics
from batcher.tracing import Tracing, parse_traceparent

pytestmark = pytest.mark.anyio
KEYS = load_keys(Path(__file__).parents[3] / "examples" / "keys.toml")
PAID = {"Authorization": "Bearer paid-demo-key"}
HEADER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CALLER = parse_traceparent(HEADER)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Core:
    """Answers every job alike and keeps it."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        self.jobs.append(job)
        return Answered(["olleh"], (0.002,), 0.1, model="default@1")

    async def status(self, call: object, *args: object) -> object:
        raise NotImplementedError


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


def routes(core: Core, exporter: InMemorySpanExporter | None) -> Routes:
    tracing = None if exporter is None else Tracing.over(exporter, "server", batched=False)
    return Routes(core, Settings(), KEYS, Metrics(), tracing=tracing)


@asynccontextmanager
async def no_lifespan(app: object) -> AsyncIterator[None]:
    yield


async def post(r: Routes, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=http_app(r, no_lifespan))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post("/v1/batchstring", json={"input": "hello"},
                                 headers={**PAID, **headers})


def the_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


async def test_tracing_off_leaves_the_job_untraced_and_the_answer_as_it_was(
        exported: InMemorySpanExporter) -> None:
    plain, traced = Core(), Core()
    off = await post(routes(plain, None), {"traceparent": HEADER})
    on = await post(routes(traced, exported), {"traceparent": HEADER})
    assert plain.jobs[0].trace is None and traced.jobs[0].trace is not None
    assert plain.jobs[0] == traced.jobs[0]._replace(trace=None)
    assert off.status_code == on.status_code == 200
    assert {k for k in off.headers} == {k for k in on.headers}  # no traceparent answered
    assert "traceparent" not in on.headers
    body_off, body_on = orjson.loads(off.content), orjson.loads(on.content)
    assert body_off.keys() == body_on.keys() and body_off["output"] == body_on["output"]


async def test_a_request_span_is_a_child_of_the_callers_traceparent(
        exported: InMemorySpanExporter) -> None:
    core = Core()
    await post(routes(core, exported), {"traceparent": HEADER})
    own = parse_traceparent(core.jobs[0].trace)
    span = the_span(exported)
    assert CALLER is not None and own is not None
    assert (span.context.trace_id, span.context.span_id) == (CALLER.trace_id, own.span_id)
    assert span.parent is not None and span.parent.span_id == CALLER.span_id
    assert span.name == "POST /v1/batchstring" and span.kind is SpanKind.SERVER
    assert span.attributes == {"batchgate.tier": "paid", "http.response.status_code": 200,
                               "batchgate.model": "default@1"}
    assert span.resource.attributes["service.name"] == "batchgate"
    assert span.resource.attributes["batchgate.process"] == "server"


@pytest.mark.parametrize("header", [None, "00-junk", HEADER.upper()])
async def test_without_a_good_traceparent_a_request_starts_its_own_trace(
        exported: InMemorySpanExporter, header: str | None) -> None:
    core = Core()
    response = await post(routes(core, exported), {} if header is None
                          else {"traceparent": header})
    assert response.status_code == 200
    own = parse_traceparent(core.jobs[0].trace)
    span = the_span(exported)
    assert own is not None and span.parent is None
    assert (span.context.trace_id, span.context.span_id) == (own.trace_id, own.span_id)


async def test_a_request_whose_caller_does_not_sample_its_trace_is_not_traced(
        exported: InMemorySpanExporter) -> None:
    core = Core()
    response = await post(routes(core, exported), {"traceparent": HEADER[:-2] + "00"})
    assert response.status_code == 200 and core.jobs[0].trace is None
    assert exported.get_finished_spans() == ()


def test_trace_job_is_none_while_tracing_is_off(exported: InMemorySpanExporter) -> None:
    assert trace_job(routes(Core(), None), {"traceparent": HEADER}) is None
    made = trace_job(routes(Core(), exported), {"traceparent": HEADER})
    assert made is not None and made.startswith(HEADER[:36])


def test_otlp_sample_starts_that_share_of_traces_and_follows_a_callers(
        exported: InMemorySpanExporter) -> None:
    """`--otlp-sample`: of requests without a traceparent, that share starts a trace; a
    caller's sampled traceparent is followed whatever the share."""
    r = routes(Core(), exported)
    assert r.tracing is not None
    r.tracing.sample = 0.0
    assert [trace_job(r, {}) for _ in range(50)] == [None] * 50
    assert trace_job(r, {"traceparent": HEADER}) is not None
    r.tracing.sample = 0.5
    started = sum(trace_job(r, {}) is not None for _ in range(2000))
    assert 800 < started < 1200  # a binomial(2000, 0.5): 8 standard deviations either way
