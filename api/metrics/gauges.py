"""What a scrape shows of the running service: a `Snapshot` taken at scrape time from each
component's `statistics()`, and the collector that renders it as gauges and counters (the
components hold no metric objects)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batcher import VersionKey

if TYPE_CHECKING:  # a gateway renders no gauges and never loads the dispatch core
    from api.kept import IdempotencyStatistics
    from failover import CoreStatistics

Labels = tuple[str, str]  # (model, version)
NONE: Labels = ("", "")

SCALE_EVENTS = (("up", "demand"), ("up", "queue"), ("up", "floor"),
                ("down", "idle"), ("down", "floor"))
"""The (direction, reason) pairs `batchgate_scale_events_total` shows from start-up, at zero:
the scaler's reasons (`failover.fleet`), written out because a gateway never loads the
core. A pair a snapshot brings beyond these gets its series too."""
NO_ACCOUNT = "anonymous"  # an item of no account: what the keys call ANONYMOUS_ACCOUNT
UP_STATES = ("ready", "busy", "switching")  # a worker up (one switching versions is one)
COMING_STATES = ("starting", "pending")  # a worker not up yet (pending: Ray finds no room)


@dataclass(frozen=True, slots=True)
class VersionGauges:
    """One version of a model at scrape time."""

    depth: dict[str, int]  # lane -> items waiting
    resident: int  # workers holding it, ready or busy
    failing: bool = False  # its loads keep failing (`failover.fleet.failing`)


@dataclass(frozen=True, slots=True)
class ScalingGauges:
    """The scaler of a pool that follows the load (`--workers MIN:MAX`) at scrape time."""

    desired: int  # the workers it last decided on, within the bounds
    starting: int  # workers asked for and not up yet, each counted once
    running: int  # workers up
    eta_s: float  # seconds until the next starting worker is expected up; 0: none starts
    events: dict[tuple[str, str], int]  # (direction, reason) -> scaling events so far


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the gauges need, taken at scrape time."""

    core: CoreStatistics
    workers: dict[str, int]
    crashes: int
    tier_gauges: dict[str, dict[str, float]]  # metric name -> tier -> value
    idempotency: IdempotencyStatistics
    replacements: int = 0  # workers replaced between batches, over their memory bound
    # By version key ("topics@v2"); empty: one core of no version (its depth is the core's).
    versions: dict[str, VersionGauges] = field(default_factory=dict)
    loads: dict[tuple[str, str], int] = field(default_factory=dict)  # (version, reason)
    scaling: ScalingGauges | None = None  # None: a fixed pool (`--workers N`)


def split(version: str) -> Labels:
    """The labels of a version key as text ("topics@v2" -> ("topics", "v2"), as a snapshot
    or an answer brings it from another process); of what is no key, its model name:
    ("", "") for none, a request's own "topics" as ("topics", "")."""
    try:
        key = VersionKey.parse(version)
    except ValueError:
        return version.partition("@")[0], ""
    return key.model, key.version


def pool_capacity(states: Mapping[str, int]) -> tuple[int, int, int]:
    """A fixed pool's (desired, starting, running) from its workers by state: it wants its
    size (every worker but a stopped one: a dead one is restarted), those coming up are
    starting, those up are running. A pool that follows the load has its scaler's."""
    desired = sum(n for state, n in states.items() if state != "stopped")
    return (desired, sum(states.get(s, 0) for s in COMING_STATES),
            sum(states.get(s, 0) for s in UP_STATES))


def _family(kind: type[GaugeMetricFamily | CounterMetricFamily], name: str, what: str,
            labels: list[str], values: Iterable[tuple[Iterable[str], float]]) -> Metric:
    family = kind(f"batchgate_{name}", what, labels=labels)
    for names, value in values:
        family.add_metric(list(names), value)
    return family


class StatsCollector(Collector):
    """Renders the snapshot a scrape takes (`Metrics.watch`)."""

    def __init__(self, snapshot: Callable[[], Snapshot],
                 noted: Callable[[Snapshot], None]) -> None:
        self._snapshot, self._noted = snapshot, noted
        self._taken: Snapshot | None = None
        self._last = (time.monotonic(), 0.0)  # (when, busy seconds) at the previous scrape

    def take(self) -> Snapshot:
        """Before a scrape renders: its snapshot, noted first (the series it makes show)."""
        self._taken = taken = self._snapshot()
        self._noted(taken)
        return taken

    def collect(self) -> Iterator[Metric]:
        s, self._taken = self._taken or self.take(), None
        b, t, store = s.core.batcher, s.core.table, s.idempotency
        yield from self._versions(s)
        yield _family(GaugeMetricFamily, "workers", "Workers by state", ["state"],
                      (((state,), n) for state, n in s.workers.items()))
        yield from self._scaling(s)
        yield _family(CounterMetricFamily, "batch_flush", "Batches cut, by trigger", ["reason"],
                      (((reason,), n) for reason, n in b.flushes.items()))
        yield _family(CounterMetricFamily, "account_batch_slots",
                      "Items cut into batches, by tier and account: each account's share",
                      ["tier", "account"],
                      (((tier, account or NO_ACCOUNT), n)
                       for (tier, account), n in b.slots.items()))
        yield from self._busy(s)
        for name, what, value in (
            ("worker_crashes", "Worker processes that died", s.crashes),
            ("worker_replacements", "Workers replaced between batches for holding more "
                                    "than --worker-max-rss-mb", s.replacements),
            ("batch_reroutes", "Batches re-routed after a crash", t.reroutes),
            ("bisect_runs", "Extra runs spent isolating poison inputs", t.bisect_runs),
            ("worker_hangs", "Workers killed for a hung batch", s.core.hangs),
            ("batch_hedges", "Stalled batches re-run on another worker", t.hedges),
            ("expired_items", "Items dropped in the queue past their deadline", b.expired),
            ("idempotency_evictions", "Idempotent answers evicted by the bounds",
             store.evictions),
        ):
            yield CounterMetricFamily(f"batchgate_{name}", what, value=value)
        for name, per_tier in s.tier_gauges.items():
            yield _family(GaugeMetricFamily, name, name.replace("_", " "), ["tier"],
                          (((tier,), level) for tier, level in per_tier.items()))
        for name, what, level in (
            ("batch_latency_estimate_seconds", "Measured batch latency (EWMA)",
             s.core.batch_latency),
            ("arrival_rate", "Items per second arriving (decaying average)", b.arrival_rate),
            ("idempotency_entries", "Idempotent answers kept", store.entries),
            ("idempotency_bytes", "What the kept idempotent answers cost, in bytes",
             store.bytes),
        ):
            yield GaugeMetricFamily(f"batchgate_{name}", what, value=level)

    @staticmethod
    def _versions(s: Snapshot) -> Iterator[Metric]:
        """Queue depth by lane and version; each version's resident workers and loads."""
        by = ["model", "version"]
        depth = [((lane, *split(v)), n) for v, g in s.versions.items()
                 for lane, n in g.depth.items()]
        if not s.versions:  # one core of no version
            depth = [((lane, *NONE), n) for lane, n in s.core.batcher.depth.items()]
        yield _family(GaugeMetricFamily, "queue_depth", "Items waiting, by lane and version",
                      ["tier", *by], depth)
        yield _family(GaugeMetricFamily, "model_resident_workers",
                      "Workers holding the version (ready or busy)", by,
                      ((split(v), g.resident) for v, g in s.versions.items()))
        yield _family(GaugeMetricFamily, "model_failing",
                      "1 while the version's loads keep failing: none is tried for a while", by,
                      ((split(v), int(g.failing)) for v, g in s.versions.items()))
        yield _family(CounterMetricFamily, "model_loads",
                      "Loads of a version onto a worker, by what asked for it",
                      [*by, "reason"],
                      (((*split(v), why), n) for (v, why), n in s.loads.items()))

    @staticmethod
    def _scaling(s: Snapshot) -> Iterator[Metric]:
        """What the pool aims at, when the capacity it started comes, and why it changed. A
        fixed pool shows its size, nothing coming and no event, so that one dashboard
        reads both."""
        scaling = s.scaling
        events = dict.fromkeys(SCALE_EVENTS, 0)
        if scaling is None:
            desired, eta = pool_capacity(s.workers)[0], 0.0
        else:
            desired, eta = scaling.desired, max(0.0, scaling.eta_s)
            events.update(scaling.events)
        yield GaugeMetricFamily("batchgate_workers_desired",
                                "Workers the pool aims at (a fixed pool: its size)",
                                value=desired)
        yield GaugeMetricFamily("batchgate_capacity_eta_seconds",
                                "Seconds until the next starting worker is expected up "
                                "(0: none is starting)", value=eta)
        yield _family(CounterMetricFamily, "scale_events",
                      "Workers the scaler asked for (up), or retired or took back before "
                      "they came up (down), by reason",
                      ["direction", "reason"], events.items())

    def _busy(self, s: Snapshot) -> Iterator[Metric]:
        """Busy seconds as a counter, and the busy ratio of the ready workers since the
        previous scrape (the share of GPU time spent on batches)."""
        now, busy = time.monotonic(), s.core.busy_seconds
        then, before = self._last
        self._last = (now, busy)
        ready = s.workers.get("ready", 0) + s.workers.get("busy", 0)
        ratio = (busy - before) / ((now - then) * ready) if ready and now > then else 0.0
        yield CounterMetricFamily("batchgate_worker_busy_seconds",
                                  "Seconds workers spent holding a batch", value=busy)
        yield GaugeMetricFamily("batchgate_worker_busy_ratio", "Share of the ready workers' "
                                "time spent on batches since the previous scrape",
                                value=min(1.0, ratio))


__all__ = ["COMING_STATES", "NONE", "SCALE_EVENTS", "UP_STATES", "Labels", "ScalingGauges",
           "Snapshot", "StatsCollector", "VersionGauges", "pool_capacity", "split"]
