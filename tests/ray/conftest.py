"""Every test here needs Ray and a loopback-only network namespace: `test_namespace.py` runs
them all inside one it makes. Outside one the others are not collected (they run, and are
counted, inside), and a test named on the command line skips and says why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loadtest.netns import loopback_only

if TYPE_CHECKING:
    from tests.ray.lab import Lab


NEEDS_RAY = "Ray is not installed: pip install 'batchgate[ray]'"
HERE = Path(__file__).parent
RUNNER = "test_namespace.py"


def inside_only(path: Path) -> bool:
    """A test module of this folder that runs only inside the namespace."""
    return path.parent == HERE and path.name.startswith("test_") and path.name != RUNNER


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Outside a loopback-only namespace, a walk of the tree leaves the namespace's tests to
    the runner (pytest still collects a module named on the command line)."""
    return True if inside_only(collection_path) and not loopback_only() else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Outside a loopback-only namespace, a namespace's test named on the command line
    skips (each module also skips where Ray is not installed: `pytest.importorskip`)."""
    if loopback_only():
        return
    skip = pytest.mark.skip(reason="Ray here runs on loopback only: test_namespace.py runs "
                                   "this test inside a network namespace of its own")
    for item in items:
        if inside_only(item.path):
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
