"""A waiting handler hears its client hang up: from the connection itself (`Departure`)
under the real uvicorn server with batchgate's protocol, from `receive()` under another."""

from __future__ import annotations

import anyio
import pytest
from starlette.types import Message, Receive, Scope, Send

from api.http import CONNECTION, Departure, PendingRequest, ReceiveWatch
from batcher import Item, ItemId, Tier
from tests.api.serving import serving

pytestmark = pytest.mark.anyio
REQUEST = b"POST /wait HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"


def test_leave_is_called_once_when_the_connection_goes_while_watched() -> None:
    departure, calls = Departure(), []
    departure.watch(lambda: calls.append("left"))
    departure.lost()
    departure.lost()
    assert calls == ["left"]


def test_a_watch_begun_after_the_connection_went_hears_it_at_once() -> None:
    departure, calls = Departure(), []
    departure.lost()
    departure.watch(lambda: calls.append("left"))
    assert calls == ["left"]


def test_nothing_is_heard_once_unwatched() -> None:
    departure, calls = Departure(), []
    departure.watch(lambda: calls.append("left"))
    departure.unwatch()
    departure.lost()
    assert calls == []


class Waiting:
    """An app whose requests wait, each on its connection's watch, until the client goes."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.left: list[str] = []
        self.heard = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        gone = anyio.Event()
        scope[CONNECTION].watch(gone.set)
        self.started.set()
        await gone.wait()
        self.left.append(scope["path"])
        self.heard.set()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves on asyncio


@pytest.mark.parametrize("pipelined", [False, True])
async def test_a_handler_waiting_on_its_connection_hears_the_client_hang_up(
    pipelined: bool,
) -> None:
    app = Waiting()
    async with serving(app) as port:
        stream = await anyio.connect_tcp("127.0.0.1", port)
        # A pipelined second request makes uvicorn mark only *it* disconnected: the first
        # handler's `receive()` would never have returned.
        await stream.send(REQUEST + REQUEST.replace(b"/wait", b"/next") * pipelined)
        await app.started.wait()
        await stream.aclose()
        with anyio.fail_after(10):
            await app.heard.wait()
    assert app.left == ["/wait"]


async def test_under_another_server_a_disconnect_from_receive_ends_the_wait() -> None:
    async def receive() -> Message:
        return {"type": "http.disconnect"}

    pending = PendingRequest(1)
    await pending.wait(10, ReceiveWatch(receive))  # unheard, it would end at the deadline
    assert pending.client_left and not pending.timed_out


async def test_an_answer_landing_after_its_waiter_was_cancelled_raises_nothing() -> None:
    """A waiter cancelled mid-wait (a gRPC handler whose client left) leaves an item in a
    batch behind it: when that item lands, settling it must not raise into the core."""
    pending = PendingRequest(1)
    item = Item(ItemId(1), "a", Tier.PAID, 0.0, 10.0, pending)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pending.wait, 10.0, None)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert pending.done.cancelled()
    item.settle("a")  # the core settles what its batch answered
    assert pending.outputs == ["a"]
