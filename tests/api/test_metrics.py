"""The collector's pauses in `batchgate_gc_pause_seconds`: they reach the histogram, and a
collection that begins inside prometheus-client's multiprocess lock (one lock for every
value of a cell's process) does not deadlock the process."""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from api.metrics import REFUSALS, Metrics, VersionGauges
from tests.api.metrics_snapshots import snapshot

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).parents[2]
PAUSES = "batchgate_gc_pause_seconds_count"

# A cell's process, with a collection at every allocation while its first requests make
# their labelled children (each made under the multiprocess lock).
CELL_PROCESS = """
import asyncio, gc, sys
from pathlib import Path
from api.cell import multiprocess_metrics
multiprocess_metrics(Path(sys.argv[1]))
from api.metrics import REFUSALS, Metrics

async def main() -> None:
    metrics = Metrics(multiprocess=True)
    unwatch = metrics.watch_gc()
    gc.set_threshold(1)
    for status in (200, 429, 499, 503):
        metrics.request_done("paid", status, 0.01)
    gc.set_threshold(700)
    print(metrics.render().decode())
    unwatch()

asyncio.run(main())
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_collection_inside_the_multiprocess_lock_does_not_deadlock(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", CELL_PROCESS, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)  # hung before
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(float(line.split()[-1]) for line in lines if line.startswith(PAUSES)) > 0
    assert 'batchgate_requests_total{code="499",model="",tier="paid",version=""} 1.0' in lines


async def test_pauses_reach_the_histogram_without_a_scrape() -> None:
    """A gateway's pauses are never scraped there: the loop observes them on its own."""
    metrics = Metrics()
    unwatch = metrics.watch_gc()
    try:
        gc.collect()
        with anyio.fail_after(10):
            while not metrics.registry.get_sample_value(  # noqa: ASYNC110
                    PAUSES, {"generation": "2"}):
                await anyio.sleep(0.05)  # observed by the loop's timer
    finally:
        unwatch()


async def test_a_scrape_observes_the_pauses_noted_before_it() -> None:
    metrics = Metrics()
    unwatch = metrics.watch_gc()
    try:
        gc.collect()
        assert f'{PAUSES}{{generation="2"}} 1.0' in metrics.render().decode()
    finally:
        unwatch()


def test_every_labelled_series_the_dashboard_queries_exists_from_start_up() -> None:
    """Prometheus' "avoid missing metrics": a series that first appears with its first event
    reads as no data, and `rate()` never sees that first increase."""
    lines = Metrics().render().decode().splitlines()
    for wanted in ('batchgate_rejected_total{reason="over_budget",tier="free"} 0.0',
                   'batchgate_rejected_total{reason="rate_limited",tier="paid"} 0.0',
                   'batchgate_requests_total{code="200",model="",tier="paid",version=""} 0.0',
                   'batchgate_requests_total{code="503",model="",tier="free",version=""} 0.0',
                   'batchgate_request_duration_seconds_count{model="",tier="free",version=""}'
                   ' 0.0',
                   'batchgate_model_load_seconds_count 0.0',
                   'batchgate_gc_pause_seconds_count{generation="0"} 0.0'):
        assert wanted in lines


def test_every_series_of_its_own_the_dashboard_queries_is_there_before_any_event() -> None:
    """The counters and histograms the dashboard reads, not the gauges read at scrape time;
    a served version's from the moment the metrics watch what serves it."""
    dashboard = json.loads((ROOT / "examples/grafana/batchgate.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    wanted = {name for e in exprs for name in re.findall(r"\bbatchgate_[a-z0-9_]+", e)}
    metrics = Metrics()
    metrics.watch(lambda: snapshot(versions={"default@v1": VersionGauges({"paid": 0}, 1)},
                                   loads={("default@v1", "cold"): 0}))
    metrics.name_guards(["safety"])  # a catalogue's guards, as the door names them
    families = list(metrics.registry.collect())
    own = {w for w in wanted for f in families if w == f.name or w.startswith(f.name + "_")}
    present = {sample.name for f in families for sample in f.samples}
    assert len(own) >= 10 and own - present == set()


def test_every_refusal_of_every_tier_is_a_series() -> None:
    lines = Metrics().render().decode().splitlines()
    rejected = {line for line in lines if line.startswith("batchgate_rejected_total{")}
    assert len(rejected) == 2 * len(REFUSALS)
    assert {"over_budget", "queue_full", "rate_limited", "no_healthy_worker"} <= set(REFUSALS)


def test_a_cell_renders_each_series_once_whatever_its_processes(tmp_path: Path) -> None:
    """Every process of a cell writes its zeros into its own file; the core sums them."""
    def run(role: str) -> list[str]:
        done = subprocess.run([sys.executable, "-c", CELL_ZEROS, str(tmp_path), role],
                              cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    run("gateway")
    lines = run("core")
    assert 'batchgate_rejected_total{reason="over_budget",tier="free"} 0.0' in lines
    assert 'batchgate_requests_total{code="200",model="",tier="paid",version=""} 2.0' in lines
    assert len(lines) == len(set(lines))


# A gateway's process, then the core's, in one cell's folder: the core renders both.
CELL_ZEROS = """
import sys
from pathlib import Path
from api.cell import multiprocess_metrics
multiprocess_metrics(Path(sys.argv[1]))
from api.metrics import Metrics

metrics = Metrics(multiprocess=sys.argv[2] == "core")
metrics.request_done("paid", 200, 0.1)
if sys.argv[2] == "core":
    print(metrics.render().decode())
"""
