"""Suite-wide settings: hypothesis judges properties, not speed (a busy CI machine is slow),
and how `scripts/test` spreads the suite over two processes."""

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "batchgate", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("batchgate")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With `-n 2 --dist loadgroup` (scripts/test), the Ray cluster's run (tests/ray, about
    100 s, a subprocess in a namespace of its own) goes to one worker and everything else,
    in order, to the other: the suite then takes about the time of the rest alone."""
    for item in items:
        group = "ray" if "tests/ray/" in item.nodeid or item.nodeid.startswith("ray/") \
            else "main"
        item.add_marker(pytest.mark.xdist_group(group))
