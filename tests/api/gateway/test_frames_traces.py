"""A job's trace crosses the link as the last field of its "run" message: the fields before
it keep their places."""

from __future__ import annotations

from api.config import Principal
from api.gateway import run_message
from api.http import Job
from batcher import Tier

WHO = Principal(Tier.PAID, "acct", "key")
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_run_message_carries_the_jobs_trace_then_its_stream() -> None:
    job = Job(WHO, ["a"], True, 5.0, None, "topics", TRACE, "k")
    message = run_message(7, job, now=100.0)
    assert message == ("run", 7, int(Tier.PAID), "acct", "key", ["a"], True, 105.0, None,
                       "topics", TRACE, "k")


def test_an_untraced_job_of_no_stream_sends_none_there() -> None:
    assert run_message(7, Job(WHO, ["a"], True, 5.0), now=0.0)[-2:] == (None, None)
