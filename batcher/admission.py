"""Admission control: refuse at the door what the queue cannot serve in time.

For an arriving item, the expected completion is estimated from the work queued ahead of it
(its own tier and every tier above, retry lane included), the pool's measured throughput
(ready workers x max batch / measured batch latency) less what higher tiers keep arriving
with (they will overtake it while it waits), and one batch latency for its own run.
Over the tier's budget, the item is refused at once, with a Retry-After from the time the
queue needs to drain. Free traffic has the smaller budget, so it is shed first; paid traffic
is refused only when the paid queue alone cannot be served in time. This is throttling tied
to the observed queue, not a static token bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batcher.errors import DeadlineUnreachable, NoWorkerReady, OverBudget
from batcher.types import MAX_BATCH, Tier


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    budgets: dict[Tier, float]  # seconds of expected completion time, per tier
    max_batch: int = MAX_BATCH
    initial_latency: float = 0.1  # batch latency assumed until one is measured
    smoothing: float = 0.2  # weight of the newest batch in the latency average

    def __post_init__(self) -> None:
        if set(self.budgets) != set(Tier):
            raise ValueError("an admission budget is needed for every tier")
        if any(b <= 0 for b in self.budgets.values()):
            raise ValueError("admission budgets must be > 0 seconds")
        if not 0 < self.smoothing <= 1:
            raise ValueError("smoothing must be within (0, 1]")


MIN_SHARE = 0.05  # a tier is never assumed to get less than this share of the pool


class RateMeter:
    """Arrivals per second, decaying exponentially with time constant `tau` seconds."""

    __slots__ = ("_last", "_rate", "tau")

    def __init__(self, tau: float = 1.0) -> None:
        self.tau = tau
        self._rate = 0.0
        self._last = -math.inf

    def add(self, n: int, now: float) -> None:
        if now == self._last:  # the same instant (a gateway's frame): nothing decayed
            self._rate += n / self.tau
            return
        self._rate = self.rate(now) + n / self.tau
        self._last = now

    def rate(self, now: float) -> float:
        if self._last == -math.inf:
            return 0.0
        return self._rate * math.exp(-(now - self._last) / self.tau)


class Admission:
    def __init__(self, settings: AdmissionSettings) -> None:
        self._settings = settings
        self._latency = settings.initial_latency

    @property
    def batch_latency(self) -> float:
        return self._latency

    def observe_batch(self, seconds: float) -> None:
        """Fold a measured batch time into the latency estimate (an EWMA)."""
        a = self._settings.smoothing
        self._latency = (1 - a) * self._latency + a * seconds

    def throughput(self, workers: int) -> float:
        """Items per second the pool can serve with full batches."""
        return workers * self._settings.max_batch / self._latency

    def estimate(self, ahead: int, workers: int, overtaking: float = 0.0) -> float:
        """Expected seconds until an item with `ahead` items before it is answered, while
        higher tiers arrive at `overtaking` items/s (they are served first)."""
        if workers <= 0:
            return math.inf
        full = self.throughput(workers)
        left = max(full - overtaking, MIN_SHARE * full)
        return ahead / left + self._latency

    def budget(self, tier: Tier) -> float:
        return self._settings.budgets[tier]

    def admits(
        self, tier: Tier, ahead: int, workers: int, deadline_in: float, overtaking: float = 0.0
    ) -> bool:
        """Whether an item with `ahead` items before it is admitted; counts no refusal."""
        if workers <= 0:
            return False
        if ahead <= 0:  # nothing queued ahead: refusing it would protect nobody
            return True
        expected = self.estimate(ahead, workers, overtaking)
        return expected <= self._settings.budgets[tier] and expected <= deadline_in

    def check(
        self, tier: Tier, ahead: int, workers: int, deadline_in: float, overtaking: float = 0.0
    ) -> None:
        """Admit, or raise the `Overloaded` of the limit hit (with a Retry-After)."""
        if self.admits(tier, ahead, workers, deadline_in, overtaking):
            return
        if workers <= 0:
            raise NoWorkerReady("no worker is ready", 1.0)
        expected = self.estimate(ahead, workers, overtaking)
        retry = expected - self._latency  # the time the queue ahead needs to drain
        budget = self._settings.budgets[tier]
        if expected > budget:
            raise OverBudget(
                f"expected wait {expected * 1000:.0f} ms exceeds the {tier.label} "
                f"tier's budget of {budget * 1000:.0f} ms",
                retry,
            )
        raise DeadlineUnreachable(
            f"expected wait {expected * 1000:.0f} ms exceeds the request's deadline", retry
        )


__all__ = ["Admission", "AdmissionSettings", "RateMeter"]
