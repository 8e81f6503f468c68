"""A traced worker's "worker.run" spans: one per traced request of a batch, each the child
of its attempt's span in the core, made off the batch loop."""

from __future__ import annotations

import pickle

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from batcher.tracing import Tracing, format_traceparent
from gpu_pool import BatchId, Ok, Run
from gpu_pool.worker import RunSpans, WorkerConfig, run_batch

TRACE_A, TRACE_B = 0xA1, 0xB2
ATTEMPT_A, ATTEMPT_B = 0x1111, 0x2222
TRACES = (format_traceparent(TRACE_A, ATTEMPT_A), format_traceparent(TRACE_B, ATTEMPT_B))


def reverse(inputs: list[str]) -> list[str]:
    return [s[::-1] for s in inputs]


def test_a_run_with_traces_crosses_the_pipe_whole() -> None:
    run = Run(BatchId(3), ("a", "b"), None, TRACES)
    assert pickle.loads(pickle.dumps(run)) == run
    assert Run(BatchId(3), ("a",)).traces is None


def test_a_worker_is_untraced_unless_given_an_endpoint() -> None:
    assert WorkerConfig("sim", None, 1, 0.0).otlp_endpoint is None
    assert RunSpans.of(None) is None


def test_each_traced_request_of_a_batch_gets_a_span_under_its_attempt() -> None:
    exporter = InMemorySpanExporter()
    spans = RunSpans(Tracing.over(exporter, "worker", batched=False))
    outcome = spans.run(lambda msg: run_batch(reverse, msg, 0.0),
                        Run(BatchId(3), ("ab", "cd"), None, TRACES))
    spans.close()
    assert isinstance(outcome, Ok) and outcome.outputs == ("ba", "dc")
    got = {(s.context.trace_id, s.parent.span_id if s.parent else None)
           for s in exporter.get_finished_spans()}
    assert got == {(TRACE_A, ATTEMPT_A), (TRACE_B, ATTEMPT_B)}
    (span, _) = exporter.get_finished_spans()
    assert span.name == "worker.run"
    assert (span.attributes or {})["batchgate.batch_size"] == 2
    assert span.resource.attributes["batchgate.process"] == "worker"


def test_an_untraced_batch_makes_no_span() -> None:
    exporter = InMemorySpanExporter()
    spans = RunSpans(Tracing.over(exporter, "worker", batched=False))
    spans.run(lambda msg: run_batch(reverse, msg, 0.0), Run(BatchId(4), ("x",)))
    spans.close()
    assert exporter.get_finished_spans() == ()
