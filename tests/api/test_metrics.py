"""The collector's pauses in `batchgate_gc_pause_seconds`: they reach the histogram, and a
collection that begins inside prometheus-client's multiprocess lock (one lock for every
value of a cell's process) does not deadlock the process."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from api.metrics import Metrics

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
from api.metrics import Metrics

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
    assert 'batchgate_requests_total{code="499",tier="paid"} 1.0' in lines


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
