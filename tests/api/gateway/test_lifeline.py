"""A child's lifeline: what crosses it survives pickling, and the child's end on its loop
hears the supervisor's orders and the cell's status in order and reports UP to a plain
Connection at the other end."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import anyio
import pytest

from api.gateway import CellStatus, Lifeline, Order, Report

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("message", [*Order, *Report,
                                     CellStatus({"pid": 7, "state": "running"},
                                                ({"slot": 0, "pid": 8},))])
def test_what_crosses_a_lifeline_survives_pickling(message: object) -> None:
    assert pickle.loads(pickle.dumps(message)) == message


def test_the_cell_status_shows_as_admin_workers_does() -> None:
    assert CellStatus().shown() == {"gateways": [], "core": None}
    shown = CellStatus({"pid": 7}, ({"slot": 0},)).shown()
    assert shown == {"gateways": [{"slot": 0}], "core": {"pid": 7}}


async def test_the_childs_end_hears_in_order_and_reports_up() -> None:
    supervisor, child = multiprocessing.Pipe()
    heard: list[object] = []
    lifeline = Lifeline(os.getpid(), child, 3)
    end = await lifeline.listen(heard.append)
    status = CellStatus({"pid": 1}, ())
    for message in (status, Order.LEAVE, Order.STOP):
        supervisor.send(message)
    end.say(Report.UP)
    with anyio.fail_after(5):
        while len(heard) < 3:  # noqa: ASYNC110  # the loop reads the pipe meanwhile
            await anyio.sleep(0.01)
        assert await anyio.to_thread.run_sync(supervisor.recv) is Report.UP
    assert heard == [status, Order.LEAVE, Order.STOP] and lifeline.incarnation == 3
    end.close()
    supervisor.close()
