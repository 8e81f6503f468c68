"""Who calls: streams of requests, each a seeded schedule of arrival times for one model
and tier, merged in time order.

A schedule is a function of a random generator and the run's length that yields sorted
arrival times in `[0, duration)`: `constant` (a Poisson process), `varying` (a Poisson
process whose rate follows a function of time, by thinning one at its top rate) or `given`
(the times themselves). Each stream draws from a generator of its own, seeded by the run's
seed and the stream's place, so adding a stream changes no other stream's arrivals.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from batcher import Tier

Schedule = Callable[[random.Random, float], Iterator[float]]
"""(generator, duration) -> sorted arrival times in [0, duration)."""


def constant(rate: float) -> Schedule:
    """A Poisson process of `rate` arrivals/s (ValueError unless > 0)."""
    if not 0 < rate < math.inf:
        raise ValueError(f"a rate must be > 0 and finite, not {rate}")

    def times(rng: random.Random, duration: float) -> Iterator[float]:
        t, expo = 0.0, rng.expovariate
        while (t := t + expo(rate)) < duration:
            yield t

    return times


def varying(rate: Callable[[float], float], top: float) -> Schedule:
    """A Poisson process whose rate at t is `rate(t)`, never above `top` (thinning: a
    candidate at `top` is kept with probability rate(t) / top)."""
    if not 0 < top < math.inf:
        raise ValueError(f"a top rate must be > 0 and finite, not {top}")

    def times(rng: random.Random, duration: float) -> Iterator[float]:
        t, expo, draw = 0.0, rng.expovariate, rng.random
        while (t := t + expo(top)) < duration:
            r = rate(t)
            if r > top * (1 + 1e-9):
                raise ValueError(f"the rate at {t:g} s is {r:g}, above its top {top:g}")
            if draw() * top < r:
                yield t

    return times


def given(at: Sequence[float]) -> Schedule:
    """Exactly the times `at` (sorted) that fall within the run."""
    def times(rng: random.Random, duration: float) -> Iterator[float]:
        return (t for t in at if 0 <= t < duration)

    return times


@dataclass(frozen=True, slots=True)
class Stream:
    """Requests of one kind: when they come, for which model (None: the first) and tier,
    with how many inputs each, and how long each may take (its deadline from arrival)."""

    schedule: Schedule
    model: str | None = None
    tier: Tier = Tier.PAID
    inputs: int = 1
    timeout_s: float = math.inf

    def __post_init__(self) -> None:
        if not 1 <= self.inputs <= 100:
            raise ValueError(f"a request holds 1..100 inputs, not {self.inputs}")
        if not self.timeout_s > 0:
            raise ValueError(f"a timeout must be > 0 seconds, not {self.timeout_s}")


def merged(streams: Sequence[Stream], duration: float, seed: int
           ) -> Iterator[tuple[float, int]]:
    """(time, stream index) of every arrival of `streams`, in time order (ties: the stream
    listed first)."""
    sources = [s.schedule(random.Random(f"{seed}/{index}"), duration)
               for index, s in enumerate(streams)]
    heads: list[tuple[float, int]] = []
    for index, source in enumerate(sources):
        first = next(source, None)
        if first is not None:
            heads.append((first, index))
    heapq.heapify(heads)
    while heads:
        t, index = heads[0]
        yield t, index
        after = next(sources[index], None)
        if after is None:
            heapq.heappop(heads)
        else:
            heapq.heapreplace(heads, (after, index))


__all__ = ["Schedule", "Stream", "constant", "given", "merged", "varying"]
