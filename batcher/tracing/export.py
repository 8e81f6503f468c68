"""The OpenTelemetry SDK's side: spans made after the fact and exported over OTLP/HTTP.

Loaded only where `--otlp-endpoint` is given (`Tracing.of` imports the SDK on first use);
a process with tracing off never imports OpenTelemetry. Every span is made finished, with
the times batchgate measured on the monotonic clock (converted once per process to the
epoch), and with the span id chosen when the work began where a child in another process
had to name it first (a batch attempt's, a request's). Export runs in the SDK's batch
processor thread: a collector that is down costs a log line, never a request.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from batcher.tracing.context import (
    RequestTrace,
    TraceParent,
    parse_traceparent,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

log = logging.getLogger("batchgate.tracing")

SERVICE = "batchgate"
PROCESS = "batchgate.process"  # the resource attribute naming the process's role
ROLES = ("server", "gateway", "core", "worker")
Attributes = Mapping[str, str | int | float | bool]
ADMITTED = "admitted"  # an admission span's outcome, else the refusal's code


class Tracing:
    """One process's tracer: `start` it with the collector's base URL and the process's
    role, `emit` finished spans, `shutdown` (flush) on exit."""

    def __init__(self, provider: TracerProvider, exporter: SpanExporter, ids: Any,
                 role: str) -> None:
        self._provider, self._exporter, self._ids, self.role = provider, exporter, ids, role
        # The share of requests without a caller's traceparent that start a trace (the door
        # decides: `api.http.trace_job`); what a trace costs is per request.
        self.sample = 1.0
        self._tracer: Tracer = provider.get_tracer("batchgate")
        self._lock = threading.Lock()  # the chosen ids are the next span's, one at a time
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    @classmethod
    def of(cls, endpoint: str | None, role: str, sample: float = 1.0) -> Tracing | None:
        """`start`ed when an endpoint is given; None (tracing off) otherwise, or when the
        SDK is missing (installed with `batchgate[otel]`): logged, never fatal. `sample`:
        the share of requests without a caller's trace that start one (`--otlp-sample`)."""
        if endpoint is None:
            return None
        try:
            tracing = cls.start(endpoint, role)
            tracing.sample = sample
            return tracing
        except ImportError as exc:
            log.error("--otlp-endpoint needs batchgate[otel] (the OpenTelemetry SDK): %s; "
                      "traces are off", exc)
            return None

    @classmethod
    def start(cls, endpoint: str, role: str) -> Tracing:
        """A tracer provider naming this process (`service.name` batchgate, its role as
        `batchgate.process`), exporting in batches (the SDK's `OTEL_BSP_*` settings) to
        `endpoint` + /v1/traces with the SDK's OTLP/HTTP protobuf exporter."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return cls.over(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces"), role)

    @classmethod
    def over(cls, exporter: SpanExporter, role: str, batched: bool = True) -> Tracing:
        """`start` with any exporter (`batched` False: each span exported as it ends, as
        a test's in-memory exporter wants)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        ids = _chosen_ids()
        resource = Resource.create({"service.name": SERVICE, PROCESS: role,
                                    "process.pid": os.getpid()})
        provider = TracerProvider(resource=resource, id_generator=ids)
        processor = BatchSpanProcessor(exporter) if batched else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
        return cls(provider, exporter, ids, role)

    def ns(self, monotonic: float) -> int:
        """A monotonic reading (seconds) as epoch nanoseconds."""
        return int(monotonic * 1e9) + self._offset_ns

    def emit(self, name: str, parent: str | TraceParent | None, start: float, end: float,
             attributes: Attributes, span_id: int | None = None, trace_id: int | None = None,
             server: bool = False) -> None:
        """A finished span from `start` to `end` (monotonic seconds), child of `parent`
        (a traceparent; None: a root, of `trace_id` if given), with the id `span_id` if
        chosen earlier. `server`: kind SERVER (a request), else INTERNAL. Never raises."""
        try:
            self._emit(name, parent, start, end, attributes, span_id, trace_id, server)
        except Exception:  # a trace is never worth a request
            log.warning("span %s not recorded", name, exc_info=True)

    def _emit(self, name: str, parent: str | TraceParent | None, start: float, end: float,
              attributes: Attributes, span_id: int | None, trace_id: int | None,
              server: bool) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

        if isinstance(parent, str):
            parent = parse_traceparent(parent)
        context = None
        if parent is not None:
            remote = SpanContext(parent.trace_id, parent.span_id, is_remote=True,
                                 trace_flags=TraceFlags(parent.flags))
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        kind = SpanKind.SERVER if server else SpanKind.INTERNAL
        with self._lock:
            self._ids.span_id, self._ids.trace_id = span_id, trace_id
            try:
                span = self._tracer.start_span(name, context, kind, dict(attributes),
                                               start_time=self.ns(start))
            finally:
                self._ids.span_id = self._ids.trace_id = None
        span.end(end_time=self.ns(max(start, end)))

    def request_spans(self, trace: RequestTrace, arrived: float, now: float,
                      outcome: str) -> None:
        """The core's spans of a job that ended with `outcome` at `now`: its admission,
        its wait in the queue (from `arrived` to its first batch, or to its end), and one
        span per batch attempt in the order they were sent, all children of the request
        span."""
        trace.settled(now, outcome)
        parent = trace.parent
        self.emit("admission", parent, trace.received, trace.admitted,
                  {"batchgate.outcome": ADMITTED})
        first = trace.first_sent()
        self.emit("queue", parent, arrived, now if math.isnan(first) else first, {})
        for number, attempt in enumerate(trace.in_order(), 1):
            attributes: dict[str, str | int] = {
                "batchgate.worker": attempt.worker, "batchgate.batch_id": attempt.batch_id,
                "batchgate.attempt": number, "batchgate.batch_size": attempt.size,
                "batchgate.kind": attempt.kind, "batchgate.outcome": attempt.outcome}
            if attempt.model:  # the version it ran on; a guard's, for a guard stage's batch
                attributes["batchgate.model"] = attempt.model
            self.emit("batch", parent, attempt.start, attempt.end, attributes,
                      span_id=attempt.span_id)

    def refused(self, trace: RequestTrace, code: str) -> None:
        """A job the core refused at admission: its admission span says why."""
        self.emit("admission", trace.parent, trace.received, trace.admitted,
                  {"batchgate.outcome": code})

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Flush what is buffered (at most `timeout_s`: a collector that is down delays an
        exit no longer) and stop exporting."""
        # The SDK's flush waits out the exporter's retries (about 10 s); the exporter's
        # own shutdown ends them.
        cut = threading.Timer(timeout_s, self._exporter.shutdown)
        cut.daemon = True
        cut.start()
        try:
            self._provider.force_flush(int(timeout_s * 1000))
            cut.cancel()
            self._provider.shutdown()
        except Exception:
            log.warning("traces not flushed", exc_info=True)


def _chosen_ids() -> Any:
    """An id generator that hands out the ids `Tracing.emit` chose for the next span, and
    random ones otherwise (OpenTelemetry's own)."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class ChosenIds(RandomIdGenerator):
        span_id: int | None = None
        trace_id: int | None = None

        def generate_span_id(self) -> int:
            return self.span_id or super().generate_span_id()

        def generate_trace_id(self) -> int:
            return self.trace_id or super().generate_trace_id()

    return ChosenIds()


def error_code(exc: BaseException) -> str:
    """An error's code as a span's outcome (`BatchgateError.code`, else its class)."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) else type(exc).__name__


__all__ = ["PROCESS", "ROLES", "SERVICE", "Attributes", "Tracing", "error_code"]
