"""`--workers 1:4` under a step in load, on a real server whose workers take 5 s to load:
paid is never refused and stays within its budget, free is refused with a Retry-After that
ends when the capacity it waits for is up, the pool grows to four and refusals stop once they
are up, it comes back to one after the delay, and nothing is lost or answered wrongly.

One run of `loadtest.scale_step` serves the whole module. The step is the issue's (100 ->
3,000 RPS on 100-item batches: three workers' worth) scaled down to what this machine's
generator offers beside the server: batches of at most 40 items (a worker drains 400 items/s)
and 40 -> 1,200 RPS, the same load relative to one worker.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from loadtest.scale_step import (
    MODEL,
    PAID_BUDGET_S,
    StepPlan,
    StepRun,
    run_step,
    write_keys,
)
from loadtest.server import running_server

pytestmark = pytest.mark.e2e
PLAN = StepPlan(base_rps=40, peak_rps=1200, max_batch=40, before_s=3, peak_s=20,
                after_max_s=40, scale_down_delay_s=5)
# A paid answer is timed by the generator from its scheduled send: its own lateness (it shares
# two cores with the server) and loopback HTTP come on top of what admission plans for.
MARGIN_S = 0.1
SHARE = 0.2  # the rule's promise: a refusal's Retry-After within ±20 % of the real wait
# Of the refusals, the share that must keep it. A guard, not the figure: the real wait is read
# from samples of another process on two busy cores, the header rounds up to whole seconds,
# and the door's "capacity it needs" and the moment refusals stopped can differ by a worker
# when they end with the queue (CI saw 111 of 121 kept, other runs 87 of 112 to all); the
# share itself is `python -m loadtest.scale_step`'s figure. A constant Retry-After fails it.
KEPT = 0.75


@pytest.fixture
def gateways() -> int:
    """One run, in a single process: a cell's gateways would take the generator's CPU."""
    return 1


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StepRun]:
    keys = write_keys(tmp_path_factory.mktemp("keys"))
    args = [*PLAN.server_args(keys), "--gateways", "1"]
    with running_server(PLAN.min_workers, MODEL, args, ready_timeout_s=120) as srv:
        yield anyio.run(run_step, srv.url, PLAN)


def test_the_generator_offered_the_step(step: StepRun) -> None:
    peak = step.peak
    assert peak.sent >= 0.9 * PLAN.peak_rps * PLAN.peak_s, "the step was not offered"
    assert step.total("free", "sent") > 0 and step.total("paid", "sent") > 0


def test_paid_is_never_refused_and_stays_within_its_budget(step: StepRun) -> None:
    paid = step.peak.classes["paid"]
    assert step.refused("paid") == 0, step.rejected("paid")
    assert paid.latency.p99 <= PAID_BUDGET_S + MARGIN_S, paid.latency
    # By the server's own clock too, all but a few of them.
    assert step.over_budget("request_duration") <= 0.01 * step.total("paid", "ok")


def test_free_is_refused_with_a_retry_after_that_ends_when_the_capacity_came(
    step: StepRun,
) -> None:
    r = step.peak_refusals()
    assert r.refused, "no free request was refused: the step did not outrun one worker"
    assert {w.code for w in r.refused} == {"over_budget"}
    assert r.came is not None, "the capacity that ended the refusals never came"
    assert len(r.fits) == len(r.refused), "a refusal without a Retry-After"
    # Before the rule has asked for a worker, no refusal can know when one comes.
    asked = step.asked_at()
    assert asked is not None
    fits = [f for f in r.fits if f.refused >= asked]
    assert fits, "no refusal while the workers were starting"
    missed = [(round(f.refused - step.step_at, 1), f.retry_after, round(f.wait, 1))
              for f in fits if not f.within(SHARE, step.slack_s)]
    assert len(missed) <= (1 - KEPT) * len(fits), \
        f"{len(missed)} of {len(fits)} (refused at, Retry-After, real wait): {missed[:10]}"


def test_the_pool_grows_to_four_and_free_refusals_stop_once_they_are_up(
    step: StepRun,
) -> None:
    four = step.reached_max()
    assert four is not None, [s.running for s in step.samples]
    r = step.peak_refusals()
    assert r.last is not None and r.last <= four + step.slack_s
    after = [w for w in step.watched if w.sent > four + step.slack_s]
    assert after and all(w.status == 200 for w in after)


def test_the_pool_returns_to_one_only_after_the_delay(step: StepRun) -> None:
    assert step.back_to_min() is not None, [s.running for s in step.samples]
    first = step.first_retired()
    assert first is not None
    load_fell = step.step_at + PLAN.peak_s
    assert first >= load_fell + PLAN.scale_down_delay_s


def test_nothing_is_lost_and_every_answer_is_its_own(step: StepRun) -> None:
    assert (step.lost, step.wrong) == (0, 0)
    assert step.total("paid", "ok") + step.total("free", "ok") > 0
