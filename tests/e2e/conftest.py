"""End-to-end tests start the real server (uvicorn, spawned workers) on a free port."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", params=[1, 2], ids=["gateways=1", "gateways=2"], autouse=True)
def gateways(request: pytest.FixtureRequest) -> Iterator[int]:
    """Every end-to-end test runs against a single process and against a cell of two
    gateways in front of one core (the servers read BATCHGATE_GATEWAYS)."""
    before = os.environ.get("BATCHGATE_GATEWAYS")
    os.environ["BATCHGATE_GATEWAYS"] = str(request.param)
    yield int(request.param)
    if before is None:
        del os.environ["BATCHGATE_GATEWAYS"]
    else:
        os.environ["BATCHGATE_GATEWAYS"] = before


@pytest.fixture(scope="module")
def shared_server(gateways: int) -> object:
    """One sim server (2 workers, example keys) shared by a module's read-only tests."""
    from loadtest.server import running_server

    with running_server(workers=2, args=["--keys", "examples/keys.toml"]) as srv:
        yield srv.url
