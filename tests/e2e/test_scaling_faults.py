"""Four workers under load, two of them SIGKILLed while their model refuses to load (a lost
device): paid is never refused, free is shed with a Retry-After that never points past the
pool's return (and, once the restarts keep failing, promises none of them), the pool is
back to four once loads succeed again and serves free again while the load goes on, and
nothing is lost.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from batcher.shared import Backoff
from loadtest.scale_outage import Outage, OutagePlan, run_outage, server_args
from loadtest.scale_step import MODEL, write_keys
from loadtest.server import running_server
from tests.models_scaling import LOAD_S, REFUSE_ENV

pytestmark = pytest.mark.e2e
PLAN = OutagePlan()
WORKERS = PLAN.workers
SLACK_S = PLAN.slack_s  # a Retry-After's rounding up to seconds, a sample's lateness


@pytest.fixture
def gateways() -> int:
    """One run, in a single process: a cell's gateways would take the generator's CPU."""
    return 1


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    tmp = tmp_path_factory.mktemp("faults")
    marker = tmp / "refuse-load"
    with running_server(WORKERS, MODEL, server_args(PLAN, write_keys(tmp)),
                        ready_timeout_s=120, env={REFUSE_ENV: str(marker)}) as srv:
        yield anyio.run(run_outage, srv.url, marker, PLAN)


def test_two_workers_were_killed_and_their_restarts_failed_until_healed(run: Outage) -> None:
    assert len(run.killed) == 2
    during = [s for s in run.seen.samples if run.killed_at + 1 < s.at < run.healed_at]
    assert during and all(s.running <= WORKERS - 2 for s in during), \
        [(round(s.at - run.killed_at, 1), s.running) for s in during]


def test_paid_is_never_refused(run: Outage) -> None:
    """Every paid request is admitted and answered 200; its latency against the budget is
    scale_outage's figure."""
    assert run.seen.refused("paid") == 0, run.seen.rejected("paid")


def test_free_is_shed_with_a_computed_retry_after(run: Outage) -> None:
    refused = [w for w in run.seen.watched
               if run.killed_at <= w.sent <= run.healed_at and w.status == 503]
    assert refused, "no free request was shed while half the pool was gone"
    assert all(w.retry_after is not None for w in refused)
    values = sorted({w.retry_after for w in refused if w.retry_after is not None})
    # While the restarts are expected up the ledger's ETA says when (the pool's backoff,
    # capped, plus a load); once the version's loads have failed FAILED_LOADS times in a row
    # no capacity is promised (issue 40, item 16) and the door says its own short wait. So
    # whether any refusal still carried the ETA depends on how fast the restarts failed:
    # never past that cap is what holds. `python -m loadtest.scale_outage` prints them.
    assert run.back_at is not None
    most = Backoff().cap + LOAD_S + SLACK_S
    assert max(values) <= most, (values, most)


def test_the_pool_is_back_to_four_and_serves_free_again_while_the_load_goes_on(
    run: Outage,
) -> None:
    assert run.back_at is not None, [s.running for s in run.seen.samples]
    refused = [w.sent for w in run.seen.watched if w.status == 503 and w.sent > run.killed_at]
    since = max([run.back_at, *refused])
    after = [w for w in run.seen.watched if w.sent > since]
    assert after and all(w.status == 200 for w in after), "refused to the end of the load"


def test_nothing_is_lost_and_every_answer_is_its_own(run: Outage) -> None:
    assert (run.seen.lost, run.seen.wrong) == (0, 0)
    assert run.seen.total("paid", "ok") > 0
