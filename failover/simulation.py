"""An exact event simulation of the contract, driving the real dispatch core.

Workers take exactly `latency` per batch, one batch at a time; requests arrive at given
times. Time is a number that jumps from one event to the next (an arrival, a batch's end,
the core's own `next_deadline`), so a minute at 20,000 items/s runs in seconds and every
figure is exact and repeatable. The planner and the flush-rule experiments stand on it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from batcher import FlushPolicy, Item, ItemId, Tier
from failover.build import CoreSettings, build_core
from failover.core import CoreActions, DispatchCore
from gpu_pool import Ok, WorkerId


@dataclass(frozen=True, slots=True)
class SimResult:
    """Per request, arrival to last output, seconds; requests arriving before `warmup`
    are left out (they find an empty pool)."""

    latencies: list[float]  # sorted
    batches: int
    items: int
    unanswered: int

    @property
    def mean_fill(self) -> float:
        return self.items / self.batches if self.batches else 0.0

    def percentile(self, q: float) -> float:
        lat = self.latencies
        if not lat:
            return math.nan
        return lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))]


class _Requests:
    """The sink of every item: request n is items n*inputs .. n*inputs+inputs-1."""

    def __init__(self, arrivals: list[float], inputs: int, warmup: float) -> None:
        self.arrivals, self.inputs, self.warmup = arrivals, inputs, warmup
        self.left = [inputs] * len(arrivals)
        self.latencies: list[float] = []
        self.now = 0.0

    def item_done(self, item: Item, result: str | BaseException) -> None:
        n = item.id // self.inputs
        self.left[n] -= 1
        if self.left[n] == 0 and self.arrivals[n] >= self.warmup:
            self.latencies.append(self.now - self.arrivals[n])


def core_for(workers: int, policy: FlushPolicy, latency: float, capacity: int) -> DispatchCore:
    """A core as the service builds one, admission past reach (this measures batching)."""
    return build_core(CoreSettings.unbounded(policy, latency, capacity))


def simulate(
    arrivals: list[float], workers: int, policy: FlushPolicy, latency: float,
    inputs: int = 1, warmup: float = 0.0,
) -> SimResult:
    """Run `arrivals` (sorted seconds) through a core with `workers` contract workers."""
    core = core_for(workers, policy, latency, max(1, len(arrivals) * inputs))
    sink = _Requests(arrivals, inputs, warmup)
    ends: list[tuple[float, int, WorkerId, Ok]] = []  # heap of batch ends
    seq = 0

    def perform(actions: CoreActions, now: float) -> None:
        nonlocal seq
        for send in actions.send:
            outputs = tuple(send.run.inputs)
            heapq.heappush(ends, (now + latency, seq, send.worker,
                                  Ok(send.run.batch_id, outputs, latency)))
            seq += 1
        sink.now = now
        for item, result in actions.settle:
            item.settle(result)

    for w in range(workers):
        perform(core.worker_ready(WorkerId(w + 1), 0.0), 0.0)
    i, n = 0, len(arrivals)
    while i < n or ends or core.next_deadline() < math.inf:
        t = min(arrivals[i] if i < n else math.inf, ends[0][0] if ends else math.inf,
                core.next_deadline())
        actions = CoreActions()
        while ends and ends[0][0] <= t:
            _, _, worker, ok = heapq.heappop(ends)
            actions.extend(core.reply(worker, ok, t, t))
        while i < n and arrivals[i] <= t:
            items = [Item(ItemId(i * inputs + k), "x", Tier.PAID, arrivals[i], math.inf,
                          sink, k) for k in range(inputs)]
            core.admit(items, math.inf, t)
            i += 1
        actions.extend(core.poll(t))
        perform(actions, t)
    stats = core.statistics(0.0).batcher
    return SimResult(sorted(sink.latencies), stats.batches, stats.items,
                     sum(1 for left in sink.left if left))


__all__ = ["SimResult", "core_for", "simulate"]
