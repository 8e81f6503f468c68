"""Every test here needs Ray and a loopback-only network namespace; outside one they skip,
and `test_namespace.py` runs them all again inside one it makes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loadtest.netns import loopback_only

if TYPE_CHECKING:
    from tests.ray.lab import Lab


NEEDS_RAY = "Ray is not installed: pip install 'batchgate[ray]'"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Outside a loopback-only namespace, skip all but the runner (each module also skips
    where Ray is not installed: `pytest.importorskip`)."""
    if loopback_only():
        return
    skip = pytest.mark.skip(reason="Ray here runs on loopback only: test_namespace.py runs "
                                   "this test inside a namespace of its own")
    here = Path(__file__).parent
    for item in items:
        if item.path.parent == here and item.path.name != "test_namespace.py":
            item.add_marker(skip)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def whole_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that lost a node and failed before adding one back, the cluster is
    made whole again as the next tests expect it: one failure, never a cascade of them."""
    yield
    if "lab" in request.fixturenames:
        lab: Lab = request.getfixturevalue("lab")
        while len(lab.worker_nodes()) < lab.size:
            lab.add_node()


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """The cluster, shared by every test of the run (it starts in ~6 s)."""
    from tests.ray.lab import Lab

    cluster = Lab()
    try:
        yield cluster
    finally:
        cluster.shutdown()
