"""The supervisor's end of a child's channel: what a child wrote before it died is read at
once, and a child that reads nothing never blocks the supervisor."""

from __future__ import annotations

import multiprocessing

import anyio
import pytest

from api.cell import Channel
from api.gateway import CellStatus, Order, Report

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_what_a_gone_child_wrote_is_read_at_once_by_drain() -> None:
    ours, child = multiprocessing.Pipe()
    heard: list[object] = []
    channel = Channel(ours, heard.append)
    child.send(Report.UP)
    child.close()  # the child is gone before the loop read its report
    channel.drain()
    assert heard == [Report.UP]
    channel.close()


async def test_a_child_that_reads_nothing_never_blocks_the_supervisor() -> None:
    ours, child = multiprocessing.Pipe()
    channel = Channel(ours, lambda message: None)
    big = CellStatus({"pid": 1, "note": "x" * 4096}, ())
    for _ in range(1000):  # far past what the socket holds: the rest waits in the channel
        channel.send(big)
    channel.send(Order.STOP)
    with anyio.fail_after(10):  # the rest is written as the child reads (in a thread here)
        received = await anyio.to_thread.run_sync(lambda: [child.recv() for _ in range(1001)])
    assert received[-1] is Order.STOP and received[0] == big
    channel.close()
    child.close()


async def test_a_closed_or_gone_childs_channel_takes_messages_and_drops_them() -> None:
    ours, child = multiprocessing.Pipe()
    channel = Channel(ours, lambda message: None)
    child.close()
    channel.send(Order.STOP)  # the peer is gone: nothing raised
    channel.close()
    channel.send(Order.STOP)
