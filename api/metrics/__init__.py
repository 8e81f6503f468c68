"""Prometheus metrics: a few counters and histograms on the hot path (`registry`), and
gauges read from each component's `statistics()` at scrape time (`gauges`: the components
hold no metric objects).

The request, queue and batch series carry `model` and `version` labels, the version that
ran's ("topics@v2": "topics", "v2"). A request answered otherwise (refused, failed, replayed)
carries what it named if served (a model: version ""), else "" and "": a name from the
network never makes a series of its own.

A pool that follows the load (`--workers MIN:MAX`) shows its scaler (`ScalingGauges`): the
workers it aims at, when the next one it started is expected up, and why it scaled; a fixed
pool shows its size, nothing coming and no event, so one dashboard reads both."""

from api.metrics.gauges import (
    SCALE_EVENTS,
    ScalingGauges,
    Snapshot,
    VersionGauges,
    pool_capacity,
    split,
)
from api.metrics.registry import (
    GC_GENERATIONS,
    REFUSALS,
    TIERS,
    USUAL_STATUSES,
    Metrics,
    files_locked,
)

__all__ = ["GC_GENERATIONS", "REFUSALS", "SCALE_EVENTS", "TIERS", "USUAL_STATUSES", "Metrics",
           "ScalingGauges", "Snapshot", "VersionGauges", "files_locked", "pool_capacity",
           "split"]
