"""`ModelCores` with the pool's size following the load, as a hypothesis state machine in
exact virtual time.

Two models on a pool of 1 to 4 workers (b capped at 2): requests in both tiers, one at a
time, in bursts and at steady rates; cancellations and waiters timing out; workers
answering, failing, dying (reported at once or later, so the cores may retire a worker
already dead); loads finishing or failing; time passing. The real owner carries out every
grow, retire and take-back on the contract pool, the world (`scaled_world`) checking each:
a retired worker was idle and is sent nothing after, the pool stays within its bounds and
each model within its own, and after every step each start is counted once by the ledger
(the very starts the pool carries out, by identity) and each version's core is told
exactly when its starts are expected up (`joining`). After every step each item is
answered at most once with its own version's output; after a healthy while and the drain,
every request not cancelled exactly once.
"""

from __future__ import annotations

import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from batcher import Tier
from batcher.shared import Backoff
from failover.fleet.catalogue import Catalogue
from tests.failover.fleet.scaled_world import ScaledWorld, scaling


def version(load_s: float) -> dict[str, object]:
    return {"spec": "sim", "load_s": load_s}


ONE = Catalogue.from_dict({"models": {"a": {"min_workers": 1, "versions": {"v1": version(0.4)}}}})
TWO = Catalogue.from_dict({"models": {
    "a": {"min_workers": 1, "versions": {"v1": version(0.4)}},
    "b": {"min_workers": 0, "max_workers": 2, "idle_unload_s": 3, "versions": {"v1": version(0.8)}},
}})
RULE = scaling(1, 4, short_window_s=0.5, long_window_s=2.0, scale_down_delay_s=2.0,
               down_step_s=0.5)
BACKOFF = Backoff(first=0.2, cap=1.0)
TIMEOUTS = [0.3, 2.0, 5.0]


class ScalingMachine(RuleBasedStateMachine):
    catalogue = ONE
    models: tuple[str | None, ...] = (None, "a")  # what a request names (None: the first)
    late_reports = False  # may the cores hear of a death only after their next turn

    def __init__(self) -> None:
        super().__init__()
        self.w = ScaledWorld(self.catalogue, RULE.min_workers, scaling=RULE, backoff=BACKOFF)

    def model(self, pick: int) -> str | None:
        return self.models[pick % len(self.models)]

    # -- requests ------------------------------------------------------------------------
    @rule(pick=st.integers(0, 2), tier=st.sampled_from(Tier), n=st.integers(1, 3),
          timeout=st.sampled_from(TIMEOUTS))
    def admit(self, pick: int, tier: Tier, n: int, timeout: float) -> None:
        self.w.submit(self.model(pick), n, tier, timeout)

    @rule(pick=st.integers(0, 2), tier=st.sampled_from(Tier), count=st.integers(5, 40),
          timeout=st.sampled_from(TIMEOUTS))
    def burst(self, pick: int, tier: Tier, count: int, timeout: float) -> None:
        """A step of load: many requests at one instant."""
        for _ in range(count):
            self.w.submit(self.model(pick), 1, tier, timeout)

    @rule(pick=st.integers(0, 2), free=st.sampled_from([0, 10, 60, 150]),
          paid=st.sampled_from([0, 5, 40]), seconds=st.sampled_from([0.5, 2.0]))
    def offer(self, pick: int, free: float, paid: float, seconds: float) -> None:
        """A steady rate on a healthy pool for a while."""
        self.w.offer(self.w.now + seconds, free=free, paid=paid, model=self.model(pick))

    @precondition(lambda self: self.w.requests)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.w.cancel(self.w.requests[data.draw(st.integers(0, len(self.w.requests) - 1))])

    @rule()
    def waiters_time_out(self) -> None:
        self.w.time_out_waiters()

    # -- the pool ------------------------------------------------------------------------
    @precondition(lambda self: any(self.w.up(w) for w in self.w.flights))
    @rule(data=st.data(), kind=st.sampled_from(["ok", "ok", "ok", "error"]))
    def reply(self, data: st.DataObject, kind: str) -> None:
        worker = data.draw(st.sampled_from(sorted(w for w in self.w.flights if self.w.up(w))))
        self.w.answer(worker, kind)

    @precondition(lambda self: any(s.state == "up" for s in self.w.slots))
    @rule(data=st.data(), report=st.booleans())
    def die(self, data: st.DataObject, report: bool) -> None:
        """A worker dies; with `report` False (and `late_reports`) the cores hear of it only
        later, and may meanwhile send it a batch or retire it."""
        slot = data.draw(st.sampled_from([s for s in self.w.slots if s.state == "up"]))
        self.w.die(slot.worker)
        if report or not self.late_reports:
            self.w.report_deaths()

    @precondition(lambda self: self.w.deaths)
    @rule()
    def report_deaths(self) -> None:
        self.w.report_deaths()

    @precondition(lambda self: any(s.state == "loading" for s in self.w.slots))
    @rule(data=st.data(), fails=st.sampled_from([False, False, True]))
    def load_ends(self, data: st.DataObject, fails: bool) -> None:
        slot = data.draw(st.sampled_from([s for s in self.w.slots if s.state == "loading"]))
        if fails:
            self.w.load_failed(slot)
        else:
            self.w.ready(slot)

    @rule(dt=st.sampled_from([0.001, 0.05, 0.3, 1.0, 3.0]))
    def tick(self, dt: float) -> None:
        self.w.advance(self.w.now + dt)

    @rule(seconds=st.sampled_from([0.5, 3.0]))
    def healthy_while(self, seconds: float) -> None:
        self.w.run(self.w.now + seconds)

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def answered_at_most_once_with_its_versions_output(self) -> None:
        self.w.check_settled()

    @invariant()
    def the_pool_within_bounds_and_each_start_counted_once_at_its_eta(self) -> None:
        self.w.check_capacity()

    def teardown(self) -> None:
        """A healthy pool past every deadline, then the drain: every request not
        cancelled is answered exactly once."""
        try:
            self.w.report_deaths()
            self.w.run(self.w.now + max(TIMEOUTS) + 1.0)
            self.w.check_capacity()
            self.w.drain()
            left = self.w.unanswered()
            assert not left, f"{len(left)} items never answered, e.g. {left[0]}"
            self.w.check_settled()
        finally:
            self.w.close()


class TwoModelsMachine(ScalingMachine):
    """Two models sharing the pool, placement switching between them, deaths heard late."""

    catalogue = TWO
    models = (None, "a", "b")
    late_reports = True


TestScaling = ScalingMachine.TestCase
TestScaling.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)

# A random search, as the one-model machine's: every event names its start, so nothing is
# matched by guessing. BATCHGATE_LONG_SEARCH=1 makes it a long one: 1,000 examples x 40 steps.
LONG = os.environ.get("BATCHGATE_LONG_SEARCH") == "1"
TestTwoModels = TwoModelsMachine.TestCase
TestTwoModels.settings = settings(max_examples=1000 if LONG else 30,
                                  stateful_step_count=40 if LONG else 30, deadline=None)
