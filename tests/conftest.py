"""Suite-wide settings: hypothesis judges properties, not speed (a busy CI machine is slow),
and how `scripts/test` spreads the suite over four processes."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "batchgate", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("batchgate")


RAY = ("ray/", "e2e/test_streaming", "e2e/test_scaling", "e2e/test_scale_latency",
       "e2e/test_cell.py")
"""The Ray cluster's run (tests/ray, a subprocess in a namespace of its own) and the
end-to-end runs that wait out long streams, steps of load and scale-downs; with them, to
even the shares out, the cell's own end-to-end runs."""

WAITING = ("e2e/test_models", "e2e/test_serve_startup", "e2e/test_core_death_keyed",
           "e2e/test_core_faults", "e2e/test_minilm", "docs/test_examples_minilm",
           "api/test_metrics_models", "docs/test_examples.py", "test_packaging", "api/oip/")
"""The runs that wait on loads: models loaded, failing, parked, rolled out and weighed, the
real model's, start-ups and a core's restarts; with them the docs' examples and packaging,
and, to even the shares out, the Open Inference Protocol's runs."""

POOLS = ("failover/", "batcher/", "gpu_pool/", "api/cell/")
"""The virtual-time, pool and link tests; with them, the end-to-end tests' runs against a
cell (`CELL`). The HTTP surface, the other single-process runs and loadtest/ are the fourth
share. Drawn from the tests' own seconds in a run of the shares before (`scripts/test
--durations=0`, pytest 9:00): http 525 s, pools 519, waiting 451, ray 445; moved since: the
cell's own runs (37 s) to ray, the Open Inference Protocol's (44 s) to waiting."""

CELL = "[gateways=2"  # tests/e2e/conftest.py's `gateways` parameter, first in an id's brackets


def side_of(nodeid: str) -> str:
    """Which of the four shares a test runs in (`scripts/test`): "ray" for a path under
    `RAY`, "waiting" under `WAITING`, "pools" under `POOLS` or a run against a cell, "http"
    for the rest."""
    path = nodeid.removeprefix("tests/")
    if path.startswith(RAY):
        return "ray"
    if path.startswith(WAITING):
        return "waiting"
    return "pools" if path.startswith(POOLS) or CELL in nodeid else "http"


def pytest_configure(config: pytest.Config) -> None:
    reap_orphans_here()


def reap_orphans_here() -> None:
    """Make this process the reaper of its descendants' orphans (Linux's child subreaper).
    A server's children that outlive it (the multiprocessing resource tracker leaves just
    after it) are then this process's, and whoever waits for them (psutil, as
    `loadtest.server.stop_server` does) reaps them at once; left to the container's init they
    stay zombies until it reaps, which here took 1.5 s at every server's stop. Not in the Ray
    namespace's run (tests/ray/test_namespace.py): Ray's processes there keep their parents."""
    from loadtest.netns import loopback_only

    if sys.platform != "linux" or loopback_only():
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:  # pragma: no cover - old kernels
        warnings.warn(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}",
                      stacklevel=1)


PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `-n 4 --dist loadgroup` (scripts/test) the groups are the suite's four shares,
    drawn from the path: each runs whole, in order, on a worker of its own, and the suite
    takes about the time of the longest. xdist's own loadgroup reads `xdist_group` marks and
    appends `@group` to every node id, which pytest cannot take back: a failure's printed id
    would not run again when pasted. Other `--dist` modes are xdist's."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class Shares(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduling whose scopes are the four shares (as its `loadfile` mode
        is the same scheduling with files for scopes)."""

        def _split_scope(self, nodeid: str) -> str:
            return side_of(nodeid)

    return Shares(config, log)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What ran inside another run (tests/ray/test_namespace.py), counted by that run: one
    line each, where the outer run reports one test."""
    from tests.ray.test_namespace import INSIDE

    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            for name, told in getattr(report, "user_properties", ()):
                if name == INSIDE:
                    terminalreporter.write_line(str(told))
