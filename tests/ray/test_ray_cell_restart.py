"""A cell (`--gateways 2`) on the Ray pool whose core process is SIGKILLed under load: the
supervisor starts another, which attaches to the live actors (the same actor processes, no
model loaded again), and the gateways' resubmitted jobs are all answered."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

from loadtest.core_faults import admin_workers, run_faults
from loadtest.server import running_server, stop_server
from tests.e2e.helpers import patient_keys
from tests.ray.lab import Lab, up, wait_workers

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def test_a_killed_core_s_successor_attaches_to_the_live_actors_and_loses_nothing(
    lab: Lab, tmp_path: Path
) -> None:
    args = [*lab.serve_args(), *patient_keys(tmp_path), "--gateways", "2"]
    with running_server(2, "sim", args) as srv:
        before = await wait_workers(srv.url, lambda ws: len(up(ws)) == 2)
        plain, keyed, away = await run_faults(srv, rps=100, duration=5, faults=1, every=2)
        for probe in (plain, keyed):
            assert probe.sent > 0
            assert (probe.ok, probe.wrong, probe.lost) == (probe.sent, 0, 0), probe
            assert dict(probe.statuses) == {200: probe.sent}
        after = admin_workers(srv.url)
        workers = after["workers"]
        assert isinstance(workers, list)
        assert sorted(w["pid"] for w in workers) == sorted(w["pid"] for w in before)
        core = after["core"]
        assert isinstance(core, dict) and core["restarts"] == 1
        assert len(away) == 1
        assert stop_server(srv) == []
        assert srv.process.returncode == 0
