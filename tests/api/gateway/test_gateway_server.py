"""A gateway's uvicorn server leaves shutdown to its supervisor: the signals a process group's kill
brings (SIGTERM, SIGINT) change nothing, the supervisor's STOP stops it, and no signal is
raised again once uvicorn is done (which would end the gateway by the signal's default)."""

from __future__ import annotations

import inspect
import signal
from collections.abc import Iterator
from types import FrameType

import pytest
import uvicorn

from api.gateway import GatewayServer


async def app(scope: object, receive: object, send: object) -> None:
    """Never called: the server is not started."""


@pytest.fixture
def raised_again() -> Iterator[list[int]]:
    """The signals uvicorn raises again as it leaves `capture_signals`, caught here by the
    handlers it restores (left alone, they would end the test run)."""
    seen: list[int] = []

    def record(sig: int, frame: FrameType | None) -> None:
        seen.append(sig)

    before = {sig: signal.signal(sig, record) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield seen
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_sigterm_and_sigint_leave_a_gateway_serving(raised_again: list[int]) -> None:
    server = GatewayServer(uvicorn.Config(app))
    with server.capture_signals():  # uvicorn's own handlers, as while serving
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
        assert not server.should_exit and not server.force_exit
    assert raised_again == []


def test_the_supervisors_stop_stops_a_gateway(raised_again: list[int]) -> None:
    server = GatewayServer(uvicorn.Config(app))
    with server.capture_signals():
        server.stop()  # as the gateway does on its lifeline's STOP
        assert server.should_exit and not server.force_exit
    assert raised_again == []


def test_handle_exit_keeps_uvicorns_parameters() -> None:
    ours, theirs = (tuple(inspect.signature(cls.handle_exit).parameters)
                    for cls in (GatewayServer, uvicorn.Server))
    assert ours == theirs == ("self", "sig", "frame")
