"""End-to-end tests start the real server (uvicorn, spawned workers) on a free port."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def shared_server() -> object:
    """One sim server (2 workers, example keys) shared by a module's read-only tests."""
    from loadtest.server import running_server

    with running_server(workers=2, args=["--keys", "examples/keys.toml"]) as srv:
        yield srv.url
