"""The dispatch core assembled from one record: the service, the cell, the planner's
simulation and the tests all build it here, so a core under test is the core that serves."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from batcher import Admission, AdmissionSettings, Batcher, FlushPolicy, Tier, TierQueues, VersionKey
from failover.core import DispatchCore
from failover.hang import BatchTimes, HangSettings
from failover.table import InFlightTable


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """What the core is built from; each part validates its own values."""

    budgets: Mapping[Tier, float]  # admission: seconds of expected completion, per tier
    policy: FlushPolicy = field(default_factory=FlushPolicy)
    queue_capacity: int = 20_000  # items per tier: the memory bound
    initial_latency: float = 0.1  # batch latency assumed until one is measured
    max_attempts: int = 12
    bisect_budget: int = 16
    hang: HangSettings = field(default_factory=HangSettings)
    fair_share: bool = True  # share each tier between its accounts (`batcher.fair`)
    weights: Mapping[str, float] = field(default_factory=dict)  # account -> weight; else 1

    @classmethod
    def unbounded(cls, policy: FlushPolicy, latency: float, capacity: int) -> CoreSettings:
        """Admission past reach and workers that never stall: what a simulation of batching
        alone needs."""
        return cls(dict.fromkeys(Tier, math.inf), policy, capacity, latency,
                   hang=HangSettings(hedge=False, kill_after=math.inf))


def longest_batch(settings: CoreSettings) -> float | None:
    """What a batch of long inputs may take: half of what the top tier's budget leaves after
    the wait for a fuller batch, so that a top-tier item that waits for one such batch and
    runs in another is still answered within it (None when the budget is past reach)."""
    budget = settings.budgets[min(Tier)]
    room = (budget - settings.policy.max_wait) / 2
    return room if 0 < room < math.inf else None


def build_core(settings: CoreSettings, times: BatchTimes | None = None,
               version: VersionKey | None = None) -> DispatchCore:
    """A dispatch core serving `version` (None: the only one); `times` replaces the
    batch-time record built from `settings.hang` (a test's, primed as if batches had
    run)."""
    admission = Admission(AdmissionSettings(
        budgets=dict(settings.budgets), max_batch=settings.policy.max_batch,
        initial_latency=settings.initial_latency,
        max_batch_chars=settings.policy.max_batch_chars,
        longest_batch=longest_batch(settings),
    ))
    queues = TierQueues(dict.fromkeys(Tier, settings.queue_capacity), settings.fair_share,
                        settings.weights)
    table = InFlightTable(max_attempts=settings.max_attempts,
                          bisect_budget=settings.bisect_budget,
                          times=times or BatchTimes(settings.hang))
    return DispatchCore(Batcher(queues, settings.policy, admission), table, admission, version)


__all__ = ["CoreSettings", "build_core", "longest_batch"]
