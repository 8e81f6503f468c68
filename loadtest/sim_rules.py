"""Scaling rules to measure batchgate's against, plugged into the real core's `Capacity` in
place of its `Scaler` (the same `decide`, `next_check` and `desired`), so that the same door,
batcher, ledger and pool carry every rule's decisions out.

`RayServeDefault`: Ray Serve's default autoscaling policy, asked every control loop: the
mean over its look-back of the ongoing requests (queued and in flight) over its target per
replica, a new target only after the same decision held for its upscale (or downscale)
delay, one replica at a time here (a start not yet up taken back first).
`Oracle`: knows the day's rate ahead; each worker the rule's own planning needs
(ceil(rate / (capacity x target utilization))) is started one start-up before it is needed
and retired when it is no longer, a gap shorter than a start-up bridged: the floor of
GPU-seconds for planning at that utilization.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable

from failover.fleet import Decision, Scaler, ScaleReason, ScalerSettings

# Ray Serve's defaults: target_ongoing_requests, the control loop, look_back_period_s,
# upscale_delay_s, downscale_delay_s.
RAY_TARGET, RAY_LOOP_S, RAY_LOOK_BACK_S, RAY_UP_DELAY_S, RAY_DOWN_DELAY_S = 2, 0.1, 30, 30, 600
ORACLE_STEP_S = 0.1  # the grid the oracle reads the day's rate on


def _toward(target: int, running: int, starting: int, reason: ScaleReason) -> Decision:
    """One step from the pool (`running` up, `starting` on their way) toward `target`."""
    have = running + starting
    if target > have:
        return Decision(up=target - have, reason=reason)
    if target < have:
        return Decision(down=1, reason=ScaleReason.IDLE, take_back=starting > 0)
    return Decision()


class RayServeDefault(Scaler):
    """Ray Serve's default policy over the pool; `ongoing`: requests queued and running."""

    def __init__(self, min_workers: int, max_workers: int, ongoing: Callable[[int], int]
                 ) -> None:
        super().__init__(ScalerSettings(min_workers, max_workers))
        self._ongoing = ongoing
        self._target = min_workers
        self._counter = 0
        self._samples: deque[int] = deque(maxlen=round(RAY_LOOK_BACK_S / RAY_LOOP_S))

    def next_check(self, now: float, starting: int) -> float:
        return now + RAY_LOOP_S

    def decide(self, now: float, running: int, starting: int, queued: int,
               start_s: float, capacity: float) -> Decision:
        s = self.settings
        self._samples.append(self._ongoing(queued))
        mean = sum(self._samples) / len(self._samples)
        desired = min(max(math.ceil(mean / RAY_TARGET), s.min_workers), s.max_workers)
        # Ray's _apply_delay_logic: the same decision this many loops in a row, else reset.
        up = desired > self._target
        self._counter = 0 if desired == self._target else (
            max(self._counter, 0) + 1 if up else min(self._counter, 0) - 1)
        if abs(self._counter) > int((RAY_UP_DELAY_S if up else RAY_DOWN_DELAY_S) / RAY_LOOP_S):
            self._counter, self._target = 0, desired
        return _toward(self._target, running, starting, ScaleReason.DEMAND)

    def desired(self) -> int:
        return self._target


class Oracle(Scaler):
    """Holds, at each moment, the workers the day will need within a start-up."""

    def __init__(self, rate: Callable[[float], float], duration_s: float, capacity: float,
                 settings: ScalerSettings, start_s: float) -> None:
        super().__init__(settings)
        util = settings.target_utilization
        steps = math.ceil(duration_s / ORACLE_STEP_S)
        need = [min(max(math.ceil(rate((k + 0.5) * ORACLE_STEP_S) / (capacity * util) - 1e-9),
                        settings.min_workers), settings.max_workers) for k in range(steps)]
        gap = start_s / ORACLE_STEP_S
        spans: dict[int, list[list[float]]] = {}  # per level (a worker): [needed, not) in steps
        prev = 0
        for k, n in enumerate([*need, 0]):
            for level in range(prev + 1, n + 1):
                own = spans.setdefault(level, [])
                if own and k - own[-1][1] < gap:  # cheaper to keep it than to start again
                    own[-1][1] = math.inf
                else:
                    own.append([k, math.inf])
            for level in range(n + 1, prev + 1):
                spans[level][-1][1] = k
            prev = n
        every = [(a * ORACLE_STEP_S - start_s, b * ORACLE_STEP_S)
                 for own in spans.values() for a, b in own]
        self._opens = sorted(a for a, _ in every)
        self._closes = sorted(b for _, b in every)
        self._changes = sorted({*self._opens, *self._closes})
        self._target = self.held(0.0)

    def held(self, now: float) -> int:
        """Workers to hold (up or starting) at `now`."""
        return bisect.bisect_right(self._opens, now) - bisect.bisect_right(self._closes, now)

    def next_check(self, now: float, starting: int) -> float:
        at = bisect.bisect_right(self._changes, now)
        return self._changes[at] if at < len(self._changes) else math.inf

    def decide(self, now: float, running: int, starting: int, queued: int,
               start_s: float, capacity: float) -> Decision:
        self._target = self.held(now)
        return _toward(self._target, running, starting, ScaleReason.DEMAND)

    def desired(self) -> int:
        return self._target


__all__ = ["ORACLE_STEP_S", "RAY_LOOP_S", "RAY_TARGET", "Oracle", "RayServeDefault"]
