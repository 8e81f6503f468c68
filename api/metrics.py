"""Prometheus metrics: a few counters and histograms on the hot path, and gauges read from
each component's `statistics()` at scrape time (the components hold no metric objects).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batcher import BatcherStatistics, FlushReason
from failover import DispatcherStatistics

LATENCY_BUCKETS = (
    0.05, 0.1, 0.11, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10, 30,
)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99, 100)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the gauges need, taken at scrape time."""

    batcher: BatcherStatistics
    dispatcher: DispatcherStatistics
    workers: dict[str, int]
    crashes: int
    tier_gauges: dict[str, dict[str, float]]  # metric name -> tier -> value
    batch_latency: float


class _StatsCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        depth = GaugeMetricFamily(
            "batchgate_queue_depth", "Items waiting, by lane", labels=["tier"]
        )
        for lane, n in s.batcher.depth.items():
            depth.add_metric([lane], n)
        yield depth
        workers = GaugeMetricFamily("batchgate_workers", "Workers by state", labels=["state"])
        for state, n in s.workers.items():
            workers.add_metric([state], n)
        yield workers
        flush = CounterMetricFamily(
            "batchgate_batch_flush", "Batches cut, by trigger", labels=["reason"]
        )
        for reason, n in s.batcher.flushes.items():
            flush.add_metric([reason], n)
        yield flush
        t = s.dispatcher.table
        yield CounterMetricFamily(
            "batchgate_worker_crashes", "Worker processes that died", value=s.crashes
        )
        yield CounterMetricFamily(
            "batchgate_batch_reroutes", "Batches re-routed after a crash", value=t.reroutes
        )
        yield CounterMetricFamily(
            "batchgate_bisect_runs", "Extra runs spent isolating poison inputs",
            value=t.bisect_runs,
        )
        yield CounterMetricFamily(
            "batchgate_worker_hangs", "Workers killed for a hung batch",
            value=s.dispatcher.hangs,
        )
        yield CounterMetricFamily(
            "batchgate_expired_items", "Items dropped in the queue past their deadline",
            value=s.batcher.expired,
        )
        for name, per_tier in s.tier_gauges.items():
            gauge = GaugeMetricFamily(f"batchgate_{name}", name.replace("_", " "),
                                      labels=["tier"])
            for tier, value in per_tier.items():
                gauge.add_metric([tier], value)
            yield gauge
        yield GaugeMetricFamily(
            "batchgate_batch_latency_estimate_seconds", "Measured batch latency (EWMA)",
            value=s.batch_latency,
        )


class Metrics:
    """The service's metrics; also the dispatcher's observer for batch sizes and durations."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created doubles scrapes
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "batchgate_requests", "Requests answered", ["tier", "code"], registry=r
        )
        self.duration = Histogram(
            "batchgate_request_duration_seconds", "End-to-end request time", ["tier"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.queue_wait = Histogram(
            "batchgate_queue_wait_seconds", "Time an item waited in its queue", ["tier"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            "batchgate_batch_size", "Items per batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_duration = Histogram(
            "batchgate_batch_duration_seconds", "Model time per batch",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.rejected = Counter(
            "batchgate_rejected", "Requests refused", ["tier", "reason"], registry=r
        )
        self.replays = Counter(
            "batchgate_idempotent_replays", "Answers served from the idempotency store",
            registry=r,
        )

        # Labelled children looked up once: `labels()` costs more than the observation.
        self._answered: dict[tuple[str, int], Any] = {}
        self._durations: dict[str, Any] = {}
        self._waits: dict[str, Any] = {}

    def request_done(self, tier: str, status: int, seconds: float) -> None:
        counter = self._answered.get((tier, status))
        if counter is None:
            counter = self._answered[tier, status] = self.requests.labels(tier, str(status))
        counter.inc()
        duration = self._durations.get(tier)
        if duration is None:
            duration = self._durations[tier] = self.duration.labels(tier)
        duration.observe(seconds)

    def queue_waited(self, tier: str, seconds: float) -> None:
        wait = self._waits.get(tier)
        if wait is None:
            wait = self._waits[tier] = self.queue_wait.labels(tier)
        wait.observe(seconds)

    def watch(self, snapshot: Callable[[], Snapshot]) -> None:
        self.registry.register(_StatsCollector(snapshot))

    def batch_started(self, size: int, reason: FlushReason | None) -> None:
        self.batch_size.observe(size)

    def batch_finished(self, size: int, seconds: float) -> None:
        self.batch_duration.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["Metrics", "Snapshot"]
