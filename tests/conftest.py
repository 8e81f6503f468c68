"""Suite-wide settings: hypothesis judges properties, not speed (a busy CI machine is slow),
and how `scripts/test` spreads the suite over two processes."""

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "batchgate", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("batchgate")


SIDE = ("ray/", "failover/", "batcher/", "gpu_pool/", "loadtest/")
"""What runs beside the rest (`scripts/test`): the Ray cluster's run (tests/ray, about 4
minutes, a subprocess in a namespace of its own), then the virtual-time and pool tests."""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With `-n 2 --dist loadgroup` (scripts/test), the tests under `SIDE` go to one worker,
    in order, and everything else (the HTTP surface and the end-to-end runs) to the other:
    the suite then takes about the time of the longer of the two."""
    for item in items:
        path = item.nodeid.removeprefix("tests/")
        group = "side" if path.startswith(SIDE) else "main"
        item.add_marker(pytest.mark.xdist_group(group))
