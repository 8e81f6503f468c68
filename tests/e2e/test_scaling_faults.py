"""Four workers under load, two of them SIGKILLed while their model refuses to load (a lost
device): paid stays within its budget, free is shed with a computed Retry-After, the pool is
back to four once loads succeed again, and nothing is lost.

The issue's 2,000 RPS on four workers of 1,000 items/s, scaled to this machine's generator:
batches of at most 40 items (400 items/s a worker) and 800 RPS, half the pool's capacity; with
two workers gone the load is all two can drain, so free must be shed for paid to keep its
budget.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.scale_step import (
    ADMIN,
    MODEL,
    PAID_BUDGET_S,
    Observed,
    mix,
    model_args,
    offer_watching,
    up_at,
    write_keys,
)
from loadtest.server import running_server
from tests.models_scaling import REFUSE_ENV

pytestmark = pytest.mark.e2e
WORKERS, MAX_BATCH, RPS = 4, 40, 800.0
BEFORE_S = 3.0  # load before the fault
OUTAGE_S = 8.0  # the marker file stays this long: every restart meanwhile fails
LOAD_S = 26.0  # the whole load: the outage and the restarts after it
SAMPLE_S = 0.5
MARGIN_S = 0.1  # the generator's lateness and loopback HTTP, on top of the budget
SLACK_S = 1.0 + SAMPLE_S  # a Retry-After's rounding up to seconds, a sample's lateness


@dataclass
class Outage:
    seen: Observed
    began: float  # the load's first send (monotonic)
    killed: list[int]
    killed_at: float
    healed_at: float  # the marker removed: loads succeed again
    back_at: float | None  # four workers running again


@pytest.fixture
def gateways() -> int:
    """One run, in a single process: a cell's gateways would take the generator's CPU."""
    return 1


async def pids_up(url: str) -> list[int]:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=5) as client:
        workers = (await client.get("/admin/workers")).json()["workers"]
    return [int(w["pid"]) for w in workers if w["state"] in ("ready", "busy")]


async def outage(url: str, marker: Path) -> Outage:
    times: dict[str, float] = {}
    killed: list[int] = []

    async def fault() -> None:
        await anyio.sleep(BEFORE_S)
        await anyio.Path(marker).touch()  # from now on the model refuses to load
        pids = await pids_up(url)
        assert len(pids) == WORKERS, pids
        for pid in pids[:2]:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        times["killed"] = time.monotonic()
        await anyio.sleep(OUTAGE_S)
        await anyio.Path(marker).unlink()
        times["healed"] = time.monotonic()

    seen, began = await offer_watching(url, mix(url, RPS, LOAD_S), fault, SAMPLE_S)
    back = up_at(seen.samples, WORKERS, times["healed"])
    return Outage(seen, began, killed, times["killed"], times["healed"], back)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    tmp = tmp_path_factory.mktemp("faults")
    marker = tmp / "refuse-load"
    args = ["--workers", str(WORKERS), *model_args(MAX_BATCH, write_keys(tmp)),
            "--gateways", "1"]
    with running_server(WORKERS, MODEL, args, ready_timeout_s=120,
                        env={REFUSE_ENV: str(marker)}) as srv:
        yield anyio.run(outage, srv.url, marker)


def test_two_workers_were_killed_and_their_restarts_failed_until_healed(run: Outage) -> None:
    assert len(run.killed) == 2
    during = [s for s in run.seen.samples if run.killed_at + 1 < s.at < run.healed_at]
    assert during and all(s.running <= WORKERS - 2 for s in during), \
        [(round(s.at - run.killed_at, 1), s.running) for s in during]


def test_paid_is_never_refused_and_stays_within_its_budget(run: Outage) -> None:
    paid = run.seen.probes[0].classes["paid"]
    assert run.seen.refused("paid") == 0, run.seen.rejected("paid")
    assert paid.latency.p99 <= PAID_BUDGET_S + MARGIN_S, paid.latency


def test_free_is_shed_with_a_computed_retry_after(run: Outage) -> None:
    refused = [w for w in run.seen.watched
               if run.killed_at <= w.sent <= run.healed_at and w.status == 503]
    assert refused, "no free request was shed while half the pool was gone"
    assert all(w.retry_after is not None for w in refused)
    values = sorted({w.retry_after for w in refused if w.retry_after is not None})
    # Computed from when the failed restarts are expected up, not a constant second; and
    # never pointing past the time the pool was back.
    assert values != [1.0], f"every Retry-After was 1 s: {len(refused)} refusals"
    assert run.back_at is not None
    late = [(round(w.answered - run.killed_at, 1), w.retry_after) for w in refused
            if w.retry_after is not None and w.answered + w.retry_after > run.back_at + SLACK_S]
    assert not late, late


def test_the_pool_is_back_to_four_once_loads_succeed_again(run: Outage) -> None:
    assert run.back_at is not None, [s.running for s in run.seen.samples]
    after = [w for w in run.seen.watched if w.sent > run.back_at + SLACK_S]
    assert after and all(w.status == 200 for w in after)


def test_nothing_is_lost_and_every_answer_is_its_own(run: Outage) -> None:
    assert (run.seen.lost, run.seen.wrong) == (0, 0)
    assert run.seen.total("paid", "ok") > 0
