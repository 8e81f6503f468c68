"""How many workers the pool should have: a pure rule over offered arrivals, the queue and
the starts in flight, with time passed in.

Demand is predicted over the next start-up time, because a worker asked for now serves only
from then on: the higher of a short and a long decaying arrival rate (the short one sees a
rise first, the long one remembers a peak through a lull), plus the rise the two imply
carried forward over the start-up time (at most the short rate again: a step looks like a
steep ramp at first),
plus the queue spread over the start-up time. The pool is sized so that demand fills
`target_utilization` of it, at the capacity of a worker the caller measures and passes in
with each decision (items/s one worker drains at full batches: `DispatchCore.throughput`,
over several versions `failover.fleet.capacity.pool_throughput`): no setting guesses it.
The workers on their way are an input (the ledger of starts,
`failover.fleet.ledger`, counts each once from the moment it is asked for until it comes up
or is taken back; a failed start stays counted), so a failure never asks for a second
worker, and the rule keeps no copy of them.

A start still on its way that demand no longer needs (one fewer would stay under
`down_utilization`, for `down_step_s`, and as long after a scale-up) is taken back: it holds a
GPU while it loads and would serve nobody (a burst shorter than a start-up asks for workers
that come too late); that `down` says `take_back`, and never retires a worker that serves.

Shrinking is slow and one worker at a time: only after `scale_down_delay_s` in which the
pool held more workers than desired and one fewer would still stay under
`down_utilization`, and never within that delay of a scale-up. Once retiring began, the
surplus episode lasts until a scale-up or until the pool is no longer above the desired
size; inside it the next worker goes after `down_step_s` more of the condition, so a
falling load is followed without waiting the whole delay again for each worker.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from batcher import RateMeter


class ScaleReason(enum.StrEnum):
    """Why the pool grows or shrinks (the metrics' `reason` label)."""

    DEMAND = "demand"  # up: the predicted demand needs more workers
    QUEUE = "queue"  # up: the queue alone does
    FLOOR = "floor"  # up or down: back within the bounds
    IDLE = "idle"  # down: capacity well above demand for the delay


SCALE_REASONS = tuple(ScaleReason)

# The rise carried forward adds at most this fraction of the short rate: a step makes the
# two windows diverge as a steep ramp would, and should not be planned for twice over.
_TREND_CAP = 1.0


@dataclass(frozen=True, slots=True)
class ScalerSettings:
    min_workers: int  # >= 0 (0: a model that may sleep; the models issue wakes it)
    max_workers: int  # >= min_workers, >= 1
    target_utilization: float = 0.7  # plan so predicted demand <= this x capacity of the pool
    down_utilization: float = 0.6  # one worker fewer must stay under this to retire one
    scale_down_delay_s: float = 300.0
    down_step_s: float = 30.0  # once retiring began, the next one after this much more of it
    short_window_s: float = 10.0  # arrival-rate windows (decaying averages)
    long_window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.min_workers < 0 or self.max_workers < max(1, self.min_workers):
            raise ValueError("scaling bounds need 0 <= min_workers <= max_workers, max >= 1")
        # down <= target: right after a retirement the same demand must not ask for it back.
        if not 0 < self.down_utilization <= self.target_utilization <= 1:
            raise ValueError("need 0 < down_utilization <= target_utilization <= 1")
        if self.scale_down_delay_s < 0 or self.down_step_s < 0:
            raise ValueError("scale-down delays must be >= 0 seconds")
        if not 0 < self.short_window_s <= self.long_window_s:
            raise ValueError("need 0 < short_window_s <= long_window_s")


@dataclass(frozen=True, slots=True)
class Decision:
    up: int = 0  # workers to start now
    down: int = 0  # workers to retire now (0 or 1)
    reason: ScaleReason | None = None
    take_back: bool = False  # the down takes back a start not yet up, never a worker serving


class Scaler:
    """Decides the pool's size; the caller starts and retires workers and says how many
    are on their way at each decision."""

    def __init__(self, settings: ScalerSettings) -> None:
        self.settings = settings
        self._short = RateMeter(settings.short_window_s)
        self._long = RateMeter(settings.long_window_s)
        self._desired = settings.min_workers
        self._last_up = -math.inf
        self._calm_since: float | None = None  # the retire condition holds since
        self._retiring = False  # an episode of retiring is under way
        self._last_down = -math.inf

    def arrived(self, items: int, now: float, paid: bool) -> None:
        """Items offered at the door, admitted or refused: refused demand is demand too, and
        both tiers are drained by the same workers."""
        self._short.add(items, now)
        self._long.add(items, now)

    def rates(self, now: float) -> tuple[float, float]:
        """(short, long) offered items/s, all tiers."""
        return self._short.rate(now), self._long.rate(now)

    def predicted(self, now: float, queued: int, start_s: float) -> float:
        """Items/s the pool should drain once a worker asked for now is up."""
        s = self.settings
        short, long = self.rates(now)
        trend = 0.0
        if short > long and s.long_window_s > s.short_window_s:
            # Each window lags a ramp by its time constant: their gap gives the slope, and
            # the short one is short_window_s behind now, start_s behind the need.
            slope = (short - long) / (s.long_window_s - s.short_window_s)
            trend = min(slope * (s.short_window_s + start_s), _TREND_CAP * short)
        return max(short, long) + trend + queued / max(start_s, 1.0)

    def _need(self, demand: float, capacity: float) -> int:
        s = self.settings  # demand exactly at the target fills the pool: no worker more
        return math.ceil(demand / (capacity * s.target_utilization) - 1e-9)

    def decide(self, now: float, running: int, starting: int, queued: int,
               start_s: float, capacity: float) -> Decision:
        """What to do now: start `up` workers, or retire `down` (0 or 1). The `starting`
        workers on their way count as present, so asking again before they come up asks
        for nothing more. `capacity`: items/s one worker drains at full batches, as
        measured now (ValueError unless > 0)."""
        if not capacity > 0:
            raise ValueError(f"a worker's capacity must be > 0 items/s, not {capacity}")
        s = self.settings
        demand = self.predicted(now, queued, start_s)
        need = self._need(demand, capacity)
        self._desired = min(max(need, s.min_workers), s.max_workers)
        pool = running + starting
        if pool > s.max_workers:
            self._end_episode()
            return Decision(down=1, reason=ScaleReason.FLOOR)
        if pool < self._desired:
            self._end_episode()
            self._last_up = now
            if need <= s.min_workers:
                reason = ScaleReason.FLOOR
            elif self._need(self.predicted(now, 0, start_s), capacity) <= pool:
                reason = ScaleReason.QUEUE
            else:
                reason = ScaleReason.DEMAND
            return Decision(up=self._desired - pool, reason=reason)
        return self._maybe_down(now, pool, demand, starting, capacity)

    def _maybe_down(self, now: float, pool: int, demand: float, starting: int,
                    capacity: float) -> Decision:
        s = self.settings
        if pool <= self._desired:
            self._end_episode()
            return Decision()
        calm = demand < s.down_utilization * capacity * (pool - 1)
        if not calm:
            self._calm_since = None
            return Decision()
        if self._calm_since is None:
            self._calm_since = now
        if now < self._ready_at(starting):
            return Decision()
        if starting:  # a start demand no longer needs holds a GPU and would serve nobody
            return Decision(down=1, reason=ScaleReason.IDLE, take_back=True)
        self._retiring = True
        self._last_down = now
        return Decision(down=1, reason=ScaleReason.IDLE)

    def _ready_at(self, starting: int) -> float:
        """When the running calm streak would allow a retirement, or with starts on their
        way taking one back (inf: no streak)."""
        s = self.settings
        if self._calm_since is None:
            return math.inf
        if starting:
            return max(self._calm_since, self._last_up) + s.down_step_s
        after_up = self._last_up + s.scale_down_delay_s
        if not self._retiring:
            return max(self._calm_since + s.scale_down_delay_s, after_up)
        return max(self._calm_since + s.down_step_s, self._last_down + s.down_step_s, after_up)

    def _end_episode(self) -> None:
        self._calm_since = None
        self._retiring = False

    def desired(self) -> int:
        """The last decided target, within the bounds."""
        return self._desired

    def next_check(self, now: float, starting: int) -> float:
        """When the scale-down condition would mature with no other event, `starting`
        workers on their way (inf: never)."""
        return self._ready_at(starting)
