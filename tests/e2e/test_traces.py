"""One request's trace across a cell (`--otlp-endpoint`): the gateway's request span, the
core's admission, queue and batch attempts, and the worker's run, one trace id, as a
collector receives them over OTLP/HTTP (decoded here with OpenTelemetry's own protobuf
definitions, as any collector reads them)."""

from __future__ import annotations

import gzip
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from loadtest.server import running_server
from tests.e2e.helpers import PAID, patient_keys, workers_in_state

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
HEADER = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
SOON = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # each process exports within 0.1 s


@pytest.fixture
def gateways() -> int:
    """This module starts its own cell: no single-process variant."""
    return 2


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent: str
    start: int  # epoch ns
    end: int
    attributes: dict[str, Any]
    process: str  # the `batchgate.process` of its resource: gateway, core, worker


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


class Receiver:
    """A collector's OTLP/HTTP traces endpoint on 127.0.0.1, keeping every span it gets."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name for it
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.got(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def got(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                with self.lock:
                    self.spans += [Span(
                        s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                        s.start_time_unix_nano, s.end_time_unix_nano,
                        {a.key: _value(a.value) for a in s.attributes},
                        str(resource.get("batchgate.process"))) for s in scope.spans]
                    assert resource["service.name"] == "batchgate"

    async def wait_for(self, done: Callable[[list[Span]], bool]) -> list[Span]:
        """Every span received once `done` says they are all there; polls, bounded."""
        with anyio.fail_after(30):
            while True:
                with self.lock:
                    spans = list(self.spans)
                if done(spans):
                    return spans
                await anyio.sleep(0.05)  # other processes export on their own schedule


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
        thread.join()


def complete(spans: list[Span]) -> bool:
    names = [s.name for s in spans]
    return ("POST /v1/batchstring" in names and names.count("batch") >= 2
            and "worker.run" in names)


async def test_one_trace_shows_a_request_through_a_cell_and_the_worker_killed_under_it(
        tmp_path: Path) -> None:
    args = [*patient_keys(tmp_path), "--gateways", "2", "--batch-latency-ms", "2000",
            "--hedge-after-ms", "0"]  # no hedge: the re-run comes from the death alone
    with receiving() as otlp, running_server(
            workers=2, args=[*args, "--otlp-endpoint", otlp.url], env=SOON) as srv:
        answers: list[httpx.Response] = []

        async def send() -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                answers.append(await client.post("/v1/batchstring", json={"input": "traced"},
                                                 headers={**PAID, "traceparent": HEADER}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            (pid,) = await workers_in_state(srv.url, "busy", 1)
            os.kill(pid, signal.SIGKILL)
        (answer,) = answers
        assert answer.status_code == 200 and answer.json()["output"] == "decart"
        assert "traceparent" not in answer.headers
        spans = await otlp.wait_for(complete)

    assert {s.trace_id for s in spans} == {TRACE_ID}
    (request,) = [s for s in spans if s.name == "POST /v1/batchstring"]
    assert (request.process, request.parent) == ("gateway", CALLER_SPAN)
    assert request.attributes["http.response.status_code"] == 200
    core = [s for s in spans if s.process == "core"]
    assert {s.name for s in core} == {"admission", "queue", "batch"}
    assert all(s.parent == request.span_id for s in core)
    first, second = sorted((s for s in core if s.name == "batch"), key=lambda s: s.start)
    assert [first.attributes["batchgate.attempt"], second.attributes["batchgate.attempt"]] \
        == [1, 2]
    assert first.attributes["batchgate.worker"] != second.attributes["batchgate.worker"]
    assert first.attributes["batchgate.outcome"] == "worker died / re-run"
    assert (first.attributes["batchgate.kind"], second.attributes["batchgate.kind"]) \
        == ("batch", "rerun")
    assert second.attributes["batchgate.outcome"] == "answered"
    assert first.start <= first.end <= second.start <= second.end <= request.end
    runs = [s for s in spans if s.name == "worker.run"]
    assert runs and all(s.process == "worker" for s in runs)
    assert {s.parent for s in runs} <= {first.span_id, second.span_id}
    assert second.span_id in {s.parent for s in runs}  # the killed worker said nothing


async def test_a_single_process_starts_a_trace_for_a_request_that_brought_none(
        tmp_path: Path) -> None:
    args = [*patient_keys(tmp_path), "--gateways", "1"]
    with receiving() as otlp, running_server(
            workers=1, args=[*args, "--otlp-endpoint", otlp.url], env=SOON) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            answer = await client.post("/v1/batchstring", json={"input": "plain"},
                                       headers=PAID)
        assert answer.status_code == 200 and answer.json()["output"] == "nialp"
        spans = await otlp.wait_for(
            lambda got: {"POST /v1/batchstring", "batch", "worker.run"} <= {s.name for s in got})

    assert len({s.trace_id for s in spans}) == 1
    (request,) = [s for s in spans if s.name == "POST /v1/batchstring"]
    assert (request.process, request.parent) == ("server", "")  # a root
    (batch,) = [s for s in spans if s.name == "batch"]
    assert (batch.process, batch.parent) == ("server", request.span_id)
    (run,) = [s for s in spans if s.name == "worker.run"]
    assert (run.process, run.parent) == ("worker", batch.span_id)


async def test_a_stream_is_one_request_span_and_its_parts_make_none(tmp_path: Path) -> None:
    args = [*patient_keys(tmp_path), "--gateways", "2"]
    streamed = {**PAID, "traceparent": HEADER, "Accept": "application/x-ndjson"}
    later = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # a plain request's
    with receiving() as otlp, running_server(
            workers=1, args=[*args, "--otlp-endpoint", otlp.url], env=SOON) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            answer = await client.post("/v1/batchstring", json={"inputs": ["a", "bc", "def"]},
                                       headers=streamed)
            assert answer.status_code == 200
            assert [line for line in answer.text.splitlines() if '"output"' in line]
            plain = await client.post("/v1/batchstring", json={"input": "plain"},
                                      headers={**PAID, "traceparent": later})
            assert plain.status_code == 200
        # The plain request's batch span comes from the core after any of the stream's parts.
        spans = await otlp.wait_for(lambda got: any(
            s.name == "batch" and s.trace_id == later.split("-")[1] for s in got))

    stream = [s for s in spans if s.trace_id == TRACE_ID]
    (request,) = stream
    assert (request.name, request.process, request.parent) == (
        "POST /v1/batchstring", "gateway", CALLER_SPAN)
    assert {k: v for k, v in request.attributes.items() if k.startswith("batchgate.stream")} \
        == {"batchgate.stream": True, "batchgate.stream.inputs": 3,
            "batchgate.stream.finished": True}
    assert request.attributes["http.response.status_code"] == 200
