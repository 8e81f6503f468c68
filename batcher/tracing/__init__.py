"""Traces of each request across batchgate's processes (`--otlp-endpoint`).

`context` is plain Python (W3C `traceparent`, what the core records of a traced request);
`export` is the OpenTelemetry SDK's glue, which imports the SDK only once a process starts
tracing. Nothing here is imported by `batcher` itself: a process with tracing off loads
neither.
"""

from batcher.tracing.context import (
    ANSWERED,
    BATCH,
    HEDGE,
    RERAN,
    RERUN,
    SAMPLED,
    TWIN_ANSWERED,
    Attempt,
    RequestTrace,
    Traced,
    TraceParent,
    format_traceparent,
    new_span_id,
    new_trace_id,
    parse_traceparent,
    request_context,
    trace_sent,
)
from batcher.tracing.export import PROCESS, ROLES, SERVICE, Attributes, Tracing, error_code

__all__ = [
    "ANSWERED",
    "BATCH",
    "HEDGE",
    "PROCESS",
    "RERAN",
    "RERUN",
    "ROLES",
    "SAMPLED",
    "SERVICE",
    "TWIN_ANSWERED",
    "Attempt",
    "Attributes",
    "RequestTrace",
    "TraceParent",
    "Traced",
    "Tracing",
    "error_code",
    "format_traceparent",
    "new_span_id",
    "new_trace_id",
    "parse_traceparent",
    "request_context",
    "trace_sent",
]
