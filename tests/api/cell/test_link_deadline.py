"""A job crosses the link with its deadline, counted from when its gateway sent it: the core
gives it only the time it has left when it reads it. One whose time ran out on the way (the
core stood still: stopped, a long turn) gets the 504 `deadline_exceeded` a single process
gives a request whose deadline passed, and never runs.

The core is real but for its pool (`test_link_properties`'s held pool: a batch waits until
the test answers it); the gateway's connection is tapped, and the test back-dates a job's
sending, as a core that read it late would find it.
"""

from __future__ import annotations

import itertools

import anyio
import orjson
import pytest

from api.gateway.frames import HOST_CLOCK, run_message
from api.http import Job, Rendered
from tests.api.cell.test_link_properties import CALLERS, Cell, Got, cell

pytestmark = pytest.mark.anyio
RIDS = itertools.count(2 * 10**9)  # never one of RemoteCore's own


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def send_late(c: Cell, job: Job, sent_ago: float) -> Got:
    """`job` as its gateway sent it `sent_ago` seconds ago."""
    got, rid = Got(c.tap), next(RIDS)
    c.remote.jobs[rid] = ((), got)
    c.tap.send(run_message(rid, job, now=HOST_CLOCK() - sent_ago))
    return got


def is_deadline_exceeded(outcome: object) -> bool:
    return isinstance(outcome, Rendered) and outcome.status == 504 \
        and orjson.loads(outcome.body)["error"]["code"] == "deadline_exceeded"


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
async def test_a_job_whose_time_ran_out_before_the_core_read_it_gets_504_and_never_runs(
    keyed: bool,
) -> None:
    idempotency = ("late-1", b"body") if keyed else None
    async with cell() as c:
        got = send_late(c, Job(CALLERS[0], ["late"], True, 1.0, idempotency), sent_ago=2.0)
        with anyio.fail_after(5):
            await c.tap.wait_until(lambda: bool(got.answers))
        assert len(got.answers) == 1 and is_deadline_exceeded(got.answers[0]), got.answers
        assert all(run is None for run in c.pool.held.values())  # nothing was sent to run
        assert c.service.core.statistics().batcher.pending == 0


async def test_a_job_read_late_has_only_the_time_it_had_left() -> None:
    async with cell() as c:
        got = send_late(c, Job(CALLERS[0], ["held"], True, 1.0), sent_ago=0.9)
        with anyio.fail_after(0.6):  # its own second would end far later
            await c.tap.wait_until(lambda: bool(got.answers))
        assert len(got.answers) == 1 and is_deadline_exceeded(got.answers[0]), got.answers
