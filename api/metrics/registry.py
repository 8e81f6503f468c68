"""The service's metric objects: a few counters and histograms on the hot path, the
registry a scrape renders (with a cell's multiprocess folder), and the collector pauses."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from api.errors import ERRORS, RETRIED
from api.metrics.gauges import NONE, Labels, Snapshot, StatsCollector, split
from batcher import FlushReason, Tier, VersionKey

LATENCY_BUCKETS = (0.05, 0.1, 0.11, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1,
                   2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99, 100)
STREAM_BUCKETS = (0.1, 0.2, 0.5, 1, 1.5, 2, 3, 5, 10, 20, 30, 60, 120)
LOAD_BUCKETS = (0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600)
GC_OBSERVE_S = 1.0  # how late a collector pause may reach its histogram (`watch_gc`)
PAUSE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01,
                 0.02, 0.05, 0.1, 0.25, 1.0)
"""Idle gaps and collector pauses are read against 1 and 2 ms: the buckets around them are
close enough that a quantile interpolated inside one says how far off it is (a wide bucket
above 2 ms reads a pause just over it as one near its top)."""

TIERS = tuple(tier.label for tier in Tier)
REFUSALS = tuple(code for code, error in ERRORS.items() if error.status in RETRIED)
"""Every reason a client is refused for (429, 503): `batchgate_rejected_total`'s reasons."""
USUAL_STATUSES = (200, 429, 500, 503, 504)
"""The statuses `batchgate_requests_total` shows from start-up (client errors come and go)."""
GC_GENERATIONS = ("0", "1", "2")


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
        by_version = ["model", "version"]
        self.requests = Counter(
            "batchgate_requests", "Requests answered", ["tier", "code", *by_version],
            registry=r)
        self.duration = Histogram(
            "batchgate_request_duration_seconds", "End-to-end request time",
            ["tier", *by_version], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "batchgate_queue_wait_seconds", "Time an item waited in its queue",
            ["tier", *by_version], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("batchgate_batch_size", "Items per batch", by_version,
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batch_duration = Histogram(
            "batchgate_batch_duration_seconds", "Model time per batch", by_version,
            buckets=LATENCY_BUCKETS, registry=r)
        self.load_seconds = Histogram(
            "batchgate_model_load_seconds",
            "Measured loads of a version onto a worker: from the switch to the worker ready",
            buckets=LOAD_BUCKETS, registry=r)
        self.rejected = Counter("batchgate_rejected", "Requests refused", ["tier", "reason"],
                                registry=r)
        self.replays = Counter("batchgate_idempotent_replays",
                               "Answers served from the idempotency store", registry=r)
        self.resubmitted = Counter(
            "batchgate_resubmitted",
            "Jobs a gateway sent again to a restarted core (a keyless one may run twice)",
            registry=r)
        self.state_errors = Counter(
            "batchgate_state_errors",
            "Calls to the shared state (--state) that failed; part: kept answers or limits",
            ["part"], registry=r)
        self.idle_gap = Histogram(
            "batchgate_worker_idle_gap_seconds",
            "From a worker's reply to its next batch, when work was waiting for it",
            buckets=PAUSE_BUCKETS, registry=r)
        self.gc_pause = Histogram(
            "batchgate_gc_pause_seconds", "Cyclic garbage collector pauses in this process",
            ["generation"], buckets=PAUSE_BUCKETS, registry=r)
        self.guard_verdicts = Counter(
            "batchgate_guard_verdicts",
            "Verdicts of guard models on inputs and outputs: reason allow, or the refusal's",
            ["guard", "reason"], registry=r)
        self.guard_failures = Counter(
            "batchgate_guard_failures",
            "Inputs a guard could not answer in time; mode: on_guard_failure (closed "
            "refused the input 503 guard_unavailable, open let it through unguarded)",
            ["guard", "mode"], registry=r)
        self.stream_first = Histogram(
            "batchgate_stream_first_event_seconds",
            "A streamed request's time to its first event", ["tier"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.stream_duration = Histogram(
            "batchgate_stream_duration_seconds", "A streamed request's time to its last event",
            ["tier"], buckets=STREAM_BUCKETS, registry=r)
        self.streams = Counter(
            "batchgate_streams", "Streamed requests that began; outcome: done, or left (its "
            "client went first)", ["tier", "outcome"], registry=r)
        self._verdicts: dict[tuple[str, str], Any] = {}  # labelled children, made once
        self._failures: dict[tuple[str, str], Any] = {}
        self._observe_gc: Callable[[], None] = _nothing  # the pauses noted since the last
        self._stats: StatsCollector | None = None
        # Labelled children looked up once (`labels()` costs more than the observation), by
        # the model string as it comes: only served versions and models are keys.
        self._answered: dict[tuple[str, int, str], tuple[Any, Any]] = {}
        self._waits: dict[tuple[str, str], Any] = {}
        self._batches: dict[VersionKey | None, tuple[Any, Any]] = {}
        self._labels: dict[str, Labels] = {"": NONE}  # served version keys, and ""
        self._names: set[str] = set()  # served model names
        # Those a dashboard queries exist from start-up, at zero (a series that appears with
        # its first event reads as no data, its first increase never seen); a version's
        # from the first scrape that knows it (`_noted`).
        for tier in TIERS:
            for status in USUAL_STATUSES:
                self._request_children(tier, status, "", True)
            for reason in REFUSALS:
                self.rejected.labels(tier, reason)
        for generation in GC_GENERATIONS:
            self.gc_pause.labels(generation)

    def request_done(self, tier: str, status: int, seconds: float, model: str = "",
                     ran: bool = True) -> None:
        """`model`: the version that ran it ("topics@v2") when `ran`, else what the
        request named ("topics", "topics@v2"; "": nothing)."""
        children = self._answered.get((tier, status, model))
        if children is None:
            children = self._request_children(tier, status, model, ran)
        children[0].inc()
        children[1].observe(seconds)

    def stream_done(self, tier: str, first: float | None, seconds: float, done: bool) -> None:
        """A stream ended: `first`, seconds to its first event (None: none was sent),
        `seconds` to its end; `done`: it sent its last event (else its client left)."""
        if first is not None:
            self.stream_first.labels(tier).observe(first)
        self.stream_duration.labels(tier).observe(seconds)
        self.streams.labels(tier, "done" if done else "left").inc()

    def queue_waited(self, tier: str, waits: Iterable[float], model: str = "") -> None:
        """Each item's time in its queue; `model`: the version that ran them."""
        wait = self._waits.get((tier, model))
        if wait is None:
            labels = self._labels_of(model, True)
            wait = self._waits[tier, model] = self.queue_wait.labels(tier, *labels)
        for seconds in waits:
            wait.observe(seconds)

    def batch_sent(self, size: int, reason: FlushReason | None, idle_gap: float | None,
                   version: VersionKey | None = None) -> None:
        (self._batches.get(version) or self._batch_children(version))[0].observe(size)
        if idle_gap is not None:
            self.idle_gap.observe(idle_gap)

    def batch_done(self, seconds: float, version: VersionKey | None = None) -> None:
        (self._batches.get(version) or self._batch_children(version))[1].observe(seconds)

    def load_done(self, version: VersionKey, seconds: float) -> None:
        self.load_seconds.observe(seconds)

    def guard_verdict(self, guard: str, reason: str, count: int = 1) -> None:
        """`count` verdicts of `guard` (a model of the catalogue): `reason` "allow", or the
        reason code of its refusal."""
        child = self._verdicts.get((guard, reason))
        if child is None:
            child = self._verdicts[guard, reason] = self.guard_verdicts.labels(guard, reason)
        child.inc(count)

    def guard_failed(self, guard: str, mode: str, count: int = 1) -> None:
        """`guard` could not answer `count` inputs in time; `mode`: the model's
        on_guard_failure for them, "closed" or "open"."""
        child = self._failures.get((guard, mode))
        if child is None:
            child = self._failures[guard, mode] = self.guard_failures.labels(guard, mode)
        child.inc(count)

    def name_guards(self, guards: Iterable[str]) -> None:
        """The catalogue's guards: their series are there before any verdict (at zero),
        so a dashboard's rate reads 0 rather than nothing."""
        for guard in guards:
            self.guard_verdict(guard, "allow", 0)
            for mode in ("closed", "open"):
                self.guard_failed(guard, mode, 0)

    def _request_children(self, tier: str, status: int, model: str, ran: bool
                          ) -> tuple[Any, Any]:
        labels = self._labels_of(model, ran)
        children = (self.requests.labels(tier, str(status), *labels),
                    self.duration.labels(tier, *labels))
        if model in self._labels or model in self._names:  # never a name from the network
            self._answered[tier, status, model] = children
        return children

    def _batch_children(self, version: VersionKey | None) -> tuple[Any, Any]:
        labels = self._labels_of(version or "", True)
        self._batches[version] = children = (self.batch_size.labels(*labels),
                                             self.batch_duration.labels(*labels))
        return children

    def _labels_of(self, model: str, ran: bool) -> Labels:
        """A served version's labels (one that ran is served); what a request named gets
        a served version's, a served model's with version "", else none."""
        labels = self._labels.get(model)
        if labels is None and ran:
            labels = self._labels[model] = split(model)
            self._names.add(labels[0])
        elif labels is None:
            name = split(model)[0]
            labels = (name, "") if name in self._names else NONE
        return labels

    def _noted(self, s: Snapshot) -> None:
        """What a snapshot brings: its versions' series (at zero if new), the loads timed."""
        for version in s.versions:
            for tier in TIERS:
                for status in USUAL_STATUSES:
                    self._request_children(tier, status, version, True)
                self.queue_waited(tier, (), version)
            self._batch_children(VersionKey.parse(version))

    def watch(self, snapshot: Callable[[], Snapshot]) -> None:
        """Show `snapshot`'s gauges; the versions it serves have their series from now."""
        self._noted(snapshot())
        self._stats = StatsCollector(snapshot, self._noted)
        self._view.register(self._stats)

    def watch_gc(self) -> Callable[[], None]:
        """Time every collection of this process; returns the function that stops it. Call
        it from the running loop.

        A collection can begin at any allocation, inside prometheus-client's own code too.
        In multiprocess mode every value of the process shares one lock, and a pause
        observed from the collector's callback deadlocked the process whenever its
        collection began under that lock (as when a labelled child is first made). So the
        callback only notes each pause, and the loop observes them every `GC_OBSERVE_S`
        (and a scrape of this process first)."""
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
        if self._stats is not None:
            self._stats.take()
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


__all__ = ["BATCH_BUCKETS", "GC_GENERATIONS", "LATENCY_BUCKETS", "LOAD_BUCKETS",
           "PAUSE_BUCKETS", "REFUSALS", "TIERS", "USUAL_STATUSES", "Metrics", "files_locked"]
