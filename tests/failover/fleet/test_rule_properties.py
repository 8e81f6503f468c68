"""The scaling rule under random traces of arrivals, starts that come up or fail, deaths and
time steps, carried out by a caller that does what it is told and counts the workers on
their way (as the ledger does), at a measured capacity per worker drawn per trace. A model
beside it keeps the timings the rule promises (the calm streak, the last scale-up, the
retiring episode) and checks every decision against them."""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from failover.fleet import SCALE_REASONS, Decision, Scaler, ScalerSettings


class ScalerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.running = 0
        self.starting = 0  # workers on their way, as the caller's ledger counts them
        self.start_s = 5.0
        self.capacity = 1000.0
        self.scaler = Scaler(ScalerSettings(1, 3))
        self.last_up = -math.inf
        self.calm_since: float | None = None
        self.retiring = False
        self.last_down = -math.inf
        self.surplus_since = math.inf

    @initialize(
        bounds=st.sampled_from([(1, 1), (1, 4), (2, 6), (0, 3)]),
        start_s=st.sampled_from([0.5, 5.0, 120.0]),
        delay=st.sampled_from([0.0, 10.0, 300.0]),
        step=st.sampled_from([0.0, 5.0, 30.0]),
        capacity=st.sampled_from([250.0, 1000.0, 4000.0]),
    )
    def setup(self, bounds: tuple[int, int], start_s: float, delay: float, step: float,
              capacity: float) -> None:
        self.settings = ScalerSettings(*bounds, scale_down_delay_s=delay, down_step_s=step)
        self.scaler = Scaler(self.settings)
        self.running = bounds[0]
        self.start_s = start_s
        self.capacity = capacity

    @property
    def pool(self) -> int:
        return self.running + self.starting

    # Time passes in quarter seconds, so every sum is exact and "the delay has passed" has
    # one answer for the rule and for the model.
    @rule(quarters=st.integers(0, 1600))
    def wait(self, quarters: int) -> None:
        self.now += quarters / 4

    @rule(items=st.integers(0, 20_000), paid=st.booleans())
    def arrive(self, items: int, paid: bool) -> None:
        self.scaler.arrived(items, self.now, paid)

    @rule(queued=st.sampled_from([0, 0, 0, 50, 2_000, 100_000]))
    def decide(self, queued: int) -> None:
        s = self.settings
        demand = self.scaler.predicted(self.now, queued, self.start_s)
        floor = max(self.scaler.rates(self.now)) + queued / max(self.start_s, 1.0)
        assert floor <= demand <= floor + self.scaler.rates(self.now)[0] + 1e-9  # trend bounded
        desired = min(max(self._need(demand), s.min_workers), s.max_workers)
        pool = self.pool
        self._observe(pool, desired, demand)

        decision = self.scaler.decide(self.now, self.running, self.starting, queued,
                                      self.start_s, self.capacity)

        assert self.scaler.desired() == desired
        assert decision.up == max(0, desired - pool)  # starts in flight are counted once
        assert decision.down == int(self._matured()), (decision, self.calm_since, self.now)
        if decision.up:
            assert decision.reason in SCALE_REASONS[:3] and not decision.down
            self.last_up = self.now
            self.starting += decision.up
        elif decision.down and self.starting:  # a start nobody needs, taken back
            assert decision.reason == "idle" and decision.take_back
            assert self.now - self.last_up >= s.down_step_s
            assert self.calm_since is not None and self.now - self.calm_since >= s.down_step_s
            self.starting -= 1
        elif decision.down:
            assert decision.reason == "idle"
            assert self.now - self.last_up >= s.scale_down_delay_s  # no flapping
            assert self.now - self.surplus_since >= s.scale_down_delay_s
            self.retiring = True
            self.last_down = self.now
            self.running -= 1
        else:
            assert decision == Decision()

    def _need(self, demand: float) -> int:
        s = self.settings
        return math.ceil(demand / (self.capacity * s.target_utilization) - 1e-9)

    def _observe(self, pool: int, desired: int, demand: float) -> None:
        """The streaks as seen at this decision: above the desired size, and calm (one
        worker fewer would stay under down_utilization)."""
        s = self.settings
        if pool <= desired:  # no surplus: any retiring episode is over
            self.surplus_since = math.inf
            self.calm_since = None
            self.retiring = False
            return
        self.surplus_since = min(self.surplus_since, self.now)
        calm = demand < s.down_utilization * self.capacity * (pool - 1)
        if not calm:
            self.calm_since = None
        elif self.calm_since is None:
            self.calm_since = self.now

    def _matured(self) -> bool:
        s = self.settings
        if self.calm_since is not None and self.starting:  # take one back
            return (self.now - self.calm_since >= s.down_step_s
                    and self.now - self.last_up >= s.down_step_s)
        if self.calm_since is None or self.now - self.last_up < s.scale_down_delay_s:
            return False
        if not self.retiring:  # the first of an episode waits the whole delay
            return self.now - self.calm_since >= s.scale_down_delay_s
        return (self.now - self.calm_since >= s.down_step_s
                and self.now - self.last_down >= s.down_step_s)

    @precondition(lambda self: self.starting > 0)
    @rule()
    def come_up(self) -> None:
        self.starting -= 1
        self.running += 1

    # A start that fails stays on its way (the ledger retries it after the pool's backoff):
    # the count the rule is given does not change, so it asks for no second worker.

    @precondition(lambda self: self.running > 0)
    @rule(restart=st.booleans())
    def die(self, restart: bool) -> None:
        self.running -= 1
        if restart:  # the slot starts it again: the same pool, one more start
            self.starting += 1

    @invariant()
    def bounded(self) -> None:
        s = self.settings
        assert s.min_workers <= self.scaler.desired() <= s.max_workers
        assert self.pool <= s.max_workers


ScalerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50,
                                           deadline=None)
test_scaler = ScalerMachine.TestCase
