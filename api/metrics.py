"""Prometheus metrics: a few counters and histograms on the hot path, and gauges read from
each component's `statistics()` at scrape time (the components hold no metric objects).
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from api.errors import ERRORS, RETRIED
from batcher import FlushReason, Tier

if TYPE_CHECKING:  # a gateway renders no gauges and never loads the dispatch core
    from failover import CoreStatistics, IdempotencyStatistics

LATENCY_BUCKETS = (
    0.05, 0.1, 0.11, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10, 30,
)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99, 100)
GC_OBSERVE_S = 1.0  # how late a collector pause may reach its histogram (`watch_gc`)
PAUSE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05,
    0.1, 0.25, 1.0,
)
"""Idle gaps and collector pauses are read against 1 and 2 ms: the buckets around them are
close enough that a quantile interpolated inside one says how far off it is (a wide bucket
above 2 ms reads a pause just over it as one near its top)."""

TIERS = tuple(tier.label for tier in Tier)
REFUSALS = tuple(code for code, error in ERRORS.items() if error.status in RETRIED)
"""Every reason a client is refused for (429, 503): `batchgate_rejected_total`'s reasons."""
USUAL_STATUSES = (200, 429, 500, 503, 504)
"""The statuses `batchgate_requests_total` shows from start-up: a success, and what the
server decides (client errors come and go with the clients)."""
GC_GENERATIONS = ("0", "1", "2")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the gauges need, taken at scrape time."""

    core: CoreStatistics
    workers: dict[str, int]
    crashes: int
    tier_gauges: dict[str, dict[str, float]]  # metric name -> tier -> value
    idempotency: IdempotencyStatistics
    replacements: int = 0  # workers replaced between batches, over their memory bound


class _StatsCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot
        self._last = (time.monotonic(), 0.0)  # (when, busy seconds) at the previous scrape

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        b, t = s.core.batcher, s.core.table
        depth = GaugeMetricFamily(
            "batchgate_queue_depth", "Items waiting, by lane", labels=["tier"]
        )
        for lane, n in b.depth.items():
            depth.add_metric([lane], n)
        yield depth
        workers = GaugeMetricFamily("batchgate_workers", "Workers by state", labels=["state"])
        for state, n in s.workers.items():
            workers.add_metric([state], n)
        yield workers
        flush = CounterMetricFamily(
            "batchgate_batch_flush", "Batches cut, by trigger", labels=["reason"]
        )
        for reason, n in b.flushes.items():
            flush.add_metric([reason], n)
        yield flush
        yield from self._busy(s)
        yield CounterMetricFamily(
            "batchgate_worker_crashes", "Worker processes that died", value=s.crashes
        )
        yield CounterMetricFamily(
            "batchgate_worker_replacements",
            "Workers replaced between batches for holding more than --worker-max-rss-mb",
            value=s.replacements,
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
            value=s.core.hangs,
        )
        yield CounterMetricFamily(
            "batchgate_batch_hedges", "Stalled batches re-run on another worker",
            value=t.hedges,
        )
        yield CounterMetricFamily(
            "batchgate_expired_items", "Items dropped in the queue past their deadline",
            value=b.expired,
        )
        for name, per_tier in s.tier_gauges.items():
            gauge = GaugeMetricFamily(f"batchgate_{name}", name.replace("_", " "),
                                      labels=["tier"])
            for tier, value in per_tier.items():
                gauge.add_metric([tier], value)
            yield gauge
        yield GaugeMetricFamily(
            "batchgate_batch_latency_estimate_seconds", "Measured batch latency (EWMA)",
            value=s.core.batch_latency,
        )
        yield GaugeMetricFamily(
            "batchgate_arrival_rate", "Items per second arriving (decaying average)",
            value=b.arrival_rate,
        )
        store = s.idempotency
        yield GaugeMetricFamily(
            "batchgate_idempotency_entries", "Idempotent answers kept", value=store.entries)
        yield GaugeMetricFamily(
            "batchgate_idempotency_bytes", "What the kept idempotent answers cost, in bytes",
            value=store.bytes)
        yield CounterMetricFamily(
            "batchgate_idempotency_evictions", "Idempotent answers evicted by the bounds",
            value=store.evictions)

    def _busy(self, s: Snapshot) -> Iterator[Metric]:
        """Busy seconds as a counter, and the busy ratio of the ready workers since the
        previous scrape (the share of GPU time spent on batches)."""
        now, busy = time.monotonic(), s.core.busy_seconds
        then, before = self._last
        self._last = (now, busy)
        ready = s.workers.get("ready", 0) + s.workers.get("busy", 0)
        ratio = (busy - before) / ((now - then) * ready) if ready and now > then else 0.0
        yield CounterMetricFamily(
            "batchgate_worker_busy_seconds", "Seconds workers spent holding a batch",
            value=busy,
        )
        yield GaugeMetricFamily(
            "batchgate_worker_busy_ratio",
            "Share of the ready workers' time spent on batches since the previous scrape",
            value=min(1.0, ratio),
        )


class Metrics:
    """The service's metrics; also the core owner's observer of every batch."""

    def __init__(self, multiprocess: bool = False) -> None:
        """`multiprocess`: this process renders the metrics of a whole cell (its own, its
        gateways' and its gauges) from prometheus-client's multiprocess folder."""
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created doubles scrapes
        self.registry = CollectorRegistry(auto_describe=True)
        self._view = self.registry
        if multiprocess:
            self._view = CollectorRegistry()
            MultiProcessCollector(self._view)  # type: ignore[no-untyped-call]
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
        self.resubmitted = Counter(
            "batchgate_resubmitted",
            "Jobs a gateway sent again to a restarted core (a keyless one may run twice)",
            registry=r,
        )
        self.state_errors = Counter(
            "batchgate_state_errors",
            "Calls to the shared state (--state) that failed; part: kept answers or limits",
            ["part"], registry=r,
        )
        self.idle_gap = Histogram(
            "batchgate_worker_idle_gap_seconds",
            "From a worker's reply to its next batch, when work was waiting for it",
            buckets=PAUSE_BUCKETS, registry=r,
        )
        self.gc_pause = Histogram(
            "batchgate_gc_pause_seconds", "Cyclic garbage collector pauses in this process",
            ["generation"], buckets=PAUSE_BUCKETS, registry=r,
        )

        self._observe_gc: Callable[[], None] = _nothing  # the pauses noted since the last
        # Labelled children looked up once: `labels()` costs more than the observation.
        # Those a dashboard queries exist from start-up, at zero: a series that appears only
        # with its first event reads as no data, and its first increase is never seen.
        self._answered: dict[tuple[str, int], Any] = {
            (t, s): self.requests.labels(t, str(s)) for t in TIERS for s in USUAL_STATUSES}
        self._durations: dict[str, Any] = {t: self.duration.labels(t) for t in TIERS}
        self._waits: dict[str, Any] = {t: self.queue_wait.labels(t) for t in TIERS}
        for tier in TIERS:
            for reason in REFUSALS:
                self.rejected.labels(tier, reason)
        for generation in GC_GENERATIONS:
            self.gc_pause.labels(generation)

    def request_done(self, tier: str, status: int, seconds: float) -> None:
        counter = self._answered.get((tier, status))
        if counter is None:
            counter = self._answered[tier, status] = self.requests.labels(tier, str(status))
        counter.inc()
        duration = self._durations.get(tier)
        if duration is None:
            duration = self._durations[tier] = self.duration.labels(tier)
        duration.observe(seconds)

    def queue_waited(self, tier: str, waits: Iterable[float]) -> None:
        """Each item's time in its queue."""
        wait = self._waits.get(tier)
        if wait is None:
            wait = self._waits[tier] = self.queue_wait.labels(tier)
        for seconds in waits:
            wait.observe(seconds)

    def watch(self, snapshot: Callable[[], Snapshot]) -> None:
        self._view.register(_StatsCollector(snapshot))

    def batch_sent(self, size: int, reason: FlushReason | None, idle_gap: float | None) -> None:
        self.batch_size.observe(size)
        if idle_gap is not None:
            self.idle_gap.observe(idle_gap)

    def batch_done(self, seconds: float) -> None:
        self.batch_duration.observe(seconds)

    def watch_gc(self) -> Callable[[], None]:
        """Time every collection of this process; returns the function that stops it. Call
        it from the running loop.

        A collection can begin at any allocation, inside prometheus-client's own code too.
        In multiprocess mode every value of the process shares one lock, and a pause
        observed from the collector's callback deadlocked the process whenever its
        collection began under that lock (as when a labelled child is first made): a
        cell's gateway hung for good, twice in about thirty benchmark starts of a cell. So the
        callback only notes each pause, and the loop observes them every
        `GC_OBSERVE_S` (and a scrape of this process first)."""
        pauses = [self.gc_pause.labels(g) for g in GC_GENERATIONS]
        noted: list[tuple[int, float]] = []
        started = 0.0

        def on_gc(phase: str, info: dict[str, int]) -> None:
            nonlocal started
            if phase == "start":
                started = time.perf_counter()
            else:
                noted.append((info["generation"], time.perf_counter() - started))

        def observe() -> None:
            while noted:  # what a collection during this loop notes is observed too
                generation, seconds = noted.pop()
                pauses[generation].observe(seconds)

        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def tick() -> None:
            nonlocal timer
            observe()
            timer = loop.call_later(GC_OBSERVE_S, tick)

        def unwatch() -> None:
            gc.callbacks.remove(on_gc)
            if timer is not None:
                timer.cancel()
            self._observe_gc = _nothing
            observe()

        tick()
        self._observe_gc = observe
        gc.callbacks.append(on_gc)
        return unwatch

    def render(self) -> bytes:
        self._observe_gc()
        if self._view is self.registry:
            return generate_latest(self._view)
        with files_locked():  # a dead process's files may be being folded (`api.cell`)
            return generate_latest(self._view)


@contextmanager
def files_locked(folder: str | None = None) -> Iterator[None]:
    """Hold the lock on the multiprocess folder's metric files: a scrape reads them all
    while no dead process's files are folded into the retired totals, so it never sees a
    value twice or misses one. Without the folder (a single process), nothing to hold."""
    folder = folder or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not folder:
        yield
        return
    with open(os.path.join(folder, ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _nothing() -> None:
    pass


__all__ = ["GC_GENERATIONS", "REFUSALS", "TIERS", "USUAL_STATUSES", "Metrics", "Snapshot",
           "files_locked"]
