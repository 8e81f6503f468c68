"""The server's own start-up: its one settling collection is not counted as a pause."""

from __future__ import annotations

import asyncio
import gc

from api.http import GC_THRESHOLDS, settle_and_time
from api.metrics import Metrics

COUNTS = 'batchgate_gc_pause_seconds_count{generation="%d"} %s'


def test_start_ups_settling_collection_is_not_timed_but_the_next_is() -> None:
    metrics, thresholds = Metrics(), gc.get_threshold()

    async def main() -> None:
        unwatch = settle_and_time(metrics)  # collects everything once, untimed
        try:
            assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0
            text = metrics.render().decode()
            assert all(COUNTS % (g, "0.0") in text for g in range(3))
            gc.collect(0)  # a collection under load
            assert COUNTS % (0, "1.0") in metrics.render().decode()
        finally:
            unwatch()
            gc.unfreeze()
            gc.set_threshold(*thresholds)

    asyncio.run(main())
