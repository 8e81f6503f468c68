"""Parallel guard stages in step (`failover.fleet.staging.PACE`): the real core in virtual
time, a model and its pre guard on two workers each at 800 requests/s. An input's answer
waits for the later of its two stages' batches, so two stages whose batches take a little
different time (as real ones do) drift out of step and cost inputs up to half a batch
unless each stage's timed cut waits for a partner about to cut."""

from __future__ import annotations

import pytest

from batcher import FlushPolicy, Tier
from failover import CoreSettings
from failover.sim import Model, Stream, World, constant, simulate

MODEL, GUARD = "topics", "safety"


def p50_ms(model_s: float, guard_s: float, parallel: bool) -> float:
    """The model with its guard beside it (`parallel`), or alone, for 10 s after 2 s."""
    models = (
        Model(MODEL, model_s, min_workers=2, max_workers=2, pre=(GUARD,) if parallel else (),
              guard_mode="parallel"),
        Model(GUARD, guard_s, min_workers=2, max_workers=2, verdict=lambda text: "allow"),
    )
    stream = Stream(constant(800), MODEL, Tier.FREE, timeout_s=10.0)
    core = CoreSettings.unbounded(FlushPolicy(), 0.1, 1_000_000)
    outcome = simulate(World((stream,), 12.0, core, models, workers=4, measure_from=2.0))
    return outcome.tally().percentile(0.5) * 1e3


@pytest.mark.parametrize(("model_s", "guard_s"), [(0.103, 0.1), (0.1, 0.103)])
def test_parallel_stages_of_unequal_batch_times_answer_as_the_slower_one_alone(
        model_s: float, guard_s: float) -> None:
    # Out of step the median was 137.8 ms against 128.9 for the model alone at 103 ms.
    alone = p50_ms(max(model_s, guard_s), guard_s, parallel=False)
    assert p50_ms(model_s, guard_s, parallel=True) == pytest.approx(alone, abs=0.5)
