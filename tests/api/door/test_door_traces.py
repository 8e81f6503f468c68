"""The core's spans of a traced job (`--otlp-endpoint`): the door shares one record of
its trace among the job's items, and once the job ends emits its admission, its wait in the
queue and each batch attempt (a refusal, a kept answer), all children of the request span.
Over a core that queues what it admits until the test answers it."""

from __future__ import annotations

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api.door import Door, RateLimiter
from api.http import Job, Rendered
from api.kept import MemoryIdempotencyStore
from api.metrics import Metrics
from batcher import MonotonicClock, QueueFull
from batcher.tracing import BATCH, Tracing, parse_traceparent
from tests.api.door.fakes import ROOMY, WHO, QueueCore, keyed

pytestmark = pytest.mark.anyio
REQUEST = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # the request span's
SPAN = parse_traceparent(REQUEST)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # a request waits on an asyncio future


def door_over(core: QueueCore, exporter: InMemorySpanExporter | None) -> Door:
    tracing = None if exporter is None else Tracing.over(exporter, "core", batched=False)
    return Door(core, MonotonicClock(), RateLimiter(ROOMY),
                MemoryIdempotencyStore(ttl=60, max_entries=100), lambda tier: 0.0, Metrics(),
                tracing=tracing)


def traced(job: Job) -> Job:
    return job._replace(trace=REQUEST)


async def spans_of(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    await anyio.wait_all_tasks_blocked()  # made in the loop turn after the answer
    spans = exporter.get_finished_spans()
    assert SPAN is not None
    assert all(s.context.trace_id == SPAN.trace_id and s.parent is not None
               and s.parent.span_id == SPAN.span_id for s in spans)
    return {s.name: s for s in spans}


async def test_a_traced_job_ends_with_its_admission_queue_and_batch_spans() -> None:
    core, exporter = QueueCore(), InMemorySpanExporter()
    door = door_over(core, exporter)
    async with anyio.create_task_group() as tg:
        tg.start_soon(door.run, traced(Job(WHO, ["ab", "cd"], False, 10.0)))
        await anyio.wait_all_tasks_blocked()
        first, second = core.queued
        assert first.trace is not None and first.trace is second.trace
        attempt = first.trace.sent(7, 3, first.arrived + 0.01, BATCH, 2)
        assert attempt is not None
        first.trace.landed(3, 7)
        core.answer()
    spans = await spans_of(exporter)
    assert set(spans) == {"admission", "queue", "batch"}
    batch = spans["batch"]
    assert batch.context.span_id == attempt.span_id
    assert dict(batch.attributes or {}) == {
        "batchgate.worker": 3, "batchgate.batch_id": 7, "batchgate.attempt": 1,
        "batchgate.batch_size": 2, "batchgate.kind": "batch", "batchgate.outcome": "answered"}
    assert spans["queue"].end_time == batch.start_time


async def test_with_tracing_off_the_core_records_nothing_of_a_traced_job() -> None:
    core = QueueCore()
    door = door_over(core, None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(door.run, traced(Job(WHO, ["ab"], True, 10.0)))
        await anyio.wait_all_tasks_blocked()
        assert [item.trace for item in core.queued] == [None]
        core.answer()


async def test_a_job_the_core_refuses_has_an_admission_span_saying_why() -> None:
    core, exporter = QueueCore(), InMemorySpanExporter()
    core.refusing = QueueFull("full", retry_after=1.0)
    answer = await door_over(core, exporter).run(traced(Job(WHO, ["ab"], True, 10.0)))
    assert isinstance(answer, Rendered) and answer.status == 503
    spans = await spans_of(exporter)
    assert dict(spans["admission"].attributes or {}) == {"batchgate.outcome": "queue_full"}


async def test_a_replayed_answer_shows_as_a_kept_answer_span() -> None:
    core, exporter = QueueCore(), InMemorySpanExporter()
    door = door_over(core, exporter)
    async with anyio.create_task_group() as tg:
        tg.start_soon(door.run, traced(keyed()))
        await anyio.wait_all_tasks_blocked()
        core.answer()
    exporter.clear()
    replay = await door.run(traced(keyed()))
    assert isinstance(replay, Rendered) and replay.status == 200
    spans = await spans_of(exporter)
    assert list(spans) == ["kept answer"]
    assert dict(spans["kept answer"].attributes or {}) == {"http.response.status_code": 200}
