"""The simulator's one-model world against the contract's own limits: the real core and
owner, contract workers that take exactly one batch latency, a seeded Poisson process, so
every figure below is exact and repeatable, not a measurement that may flake."""

from __future__ import annotations

import functools
import random

import pytest

from batcher import FlushPolicy
from failover import CoreSettings
from failover.sim import Model, Stream, Tally, World, given, simulate

LATENCY = 0.1
EPS = 1e-9  # float noise in virtual time: a 100 ms batch may read 99.99999999 ms


def poisson(rps: float, duration: float, seed: int = 1) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    while (t := t + rng.expovariate(rps)) < duration:
        out.append(t)
    return out


def run(rps: float, workers: int, policy: FlushPolicy, duration: float = 10.0,
        warmup: float = 1.0) -> tuple[Tally, float]:
    """Every request's latency past `warmup`, and the mean fill of the batches."""
    settings = CoreSettings.unbounded(policy, LATENCY, 1_000_000)
    outcome = simulate(World((Stream(given(poisson(rps, duration))),), duration, settings,
                             models=(Model(batch_s=LATENCY),), workers=workers,
                             measure_from=warmup))
    requests = outcome.tally()
    assert requests.unanswered == 0 and not requests.refused and not requests.failed
    return requests, outcome.pool.fill


@pytest.mark.parametrize(("rps", "workers"), [(800, 1), (100, 10), (2_500, 3), (100, 30)])
def test_no_request_is_answered_before_one_batch_latency(rps: float, workers: int) -> None:
    requests, _ = run(rps, workers, FlushPolicy(), duration=3.0, warmup=0.0)
    assert requests.answered > 0.8 * rps * 3.0
    assert requests.percentile(0.0) >= LATENCY - EPS


def test_with_a_worker_always_idle_every_request_takes_exactly_one_latency() -> None:
    requests, _ = run(100, 30, FlushPolicy())
    assert requests.answered > 800
    assert requests.percentile(0.0) == pytest.approx(LATENCY, abs=EPS)
    assert requests.percentile(1.0) == pytest.approx(LATENCY, abs=EPS)


def test_one_worker_at_800_rps_stays_within_the_flush_policys_bound() -> None:
    # One batch runs while the next fills: max_wait (50 ms) plus at most one batch ahead.
    requests, fill = run(800, 1, FlushPolicy())
    assert 0.15 <= requests.percentile(0.95) <= 0.2
    assert requests.percentile(0.5) <= 0.150
    assert fill == pytest.approx(79, abs=1)


def test_at_low_load_the_idle_trigger_answers_almost_at_once() -> None:
    idle, _ = run(100, 10, FlushPolicy())
    assert idle.percentile(0.5) <= 0.105 and idle.percentile(0.95) <= 0.125
    plain, _ = run(100, 10, FlushPolicy(idle_trigger=False))  # waits for max_wait instead
    assert plain.percentile(0.5) > 0.12


@functools.cache
def heavy_p99(idle_trigger: bool, spare: float) -> float:
    """20,000 items/s on 22 workers (20 needed at full batches): P99 past a 1 s warm-up."""
    policy = FlushPolicy(idle_trigger=idle_trigger, spare=spare)
    return run(20_000, 22, policy, duration=3.0)[0].percentile(0.99)


def test_under_heavy_load_the_load_aware_idle_trigger_costs_nothing() -> None:
    size_or_time = heavy_p99(idle_trigger=False, spare=1.5)
    assert abs(heavy_p99(idle_trigger=True, spare=1.5) - size_or_time) <= 0.003


def test_under_heavy_load_the_old_idle_rule_cuts_batches_too_small() -> None:
    # spare=0: any moment with two idle workers cuts a small batch that holds one for 100 ms.
    size_or_time = heavy_p99(idle_trigger=False, spare=1.5)
    assert heavy_p99(idle_trigger=True, spare=0.0) > size_or_time + 0.010


def test_a_step_from_idle_to_heavy_load_costs_the_idle_trigger_nothing() -> None:
    """Counted from the first request: an idle pool must not spend itself on one-item
    batches while the decaying average still reads the step as a trickle."""
    size_or_time, _ = run(20_000, 22, FlushPolicy(idle_trigger=False), duration=3.0, warmup=0.0)
    idle, _ = run(20_000, 22, FlushPolicy(), duration=3.0, warmup=0.0)
    assert idle.percentile(0.99) - size_or_time.percentile(0.99) <= 0.003
