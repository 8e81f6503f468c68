"""A dead gateway's metric files: folded into the cell's retired totals, not left to pile up."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from api.cell import ChildState, Gateways
from api.config import Settings
from batcher.shared import Backoff
from tests.api.cell.metering import count_and_exit

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the supervisor watches sentinels with the loop's add_reader


class Exits:
    """Says when the gateway has exited `until` times (each counted before it died), its
    files folded by then."""

    def __init__(self, until: int) -> None:
        self.until, self.exits, self.enough = until, 0, anyio.Event()
        self.gateways: Gateways | None = None

    def changed(self) -> None:
        assert self.gateways is not None
        if self.gateways.children[0].state is ChildState.RESTARTING:
            self.exits += 1
            if self.exits == self.until:
                self.enough.set()


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.db"))


def scrape(folder: Path) -> dict[str, float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))  # type: ignore[no-untyped-call]
    return {s.name: s.value for m in registry.collect() for s in m.samples if not s.labels
            or s.labels.get("le") in (None, "+Inf")}


async def test_restarts_leave_no_files_and_lose_no_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # spawned children read it
    backoff = Backoff(first=0.05, cap=0.05, stable_after=60.0)  # stop() comes first
    with socket.socket() as sock:
        exits = Exits(6)
        gateways = exits.gateways = Gateways(
            Settings(model="sim", gateways=1), str(tmp_path / "link"), [sock], backoff=backoff,
            target=count_and_exit, changed=exits.changed, metrics=tmp_path)
        await gateways.start()
        with anyio.fail_after(60):
            await exits.enough.wait()
        await gateways.stop()
    assert files(tmp_path) == ["counter_retired.db", "histogram_retired.db"]
    totals = scrape(tmp_path)
    assert totals["served_total"] == 6 and totals["took_seconds_count"] == 6
    assert "open" not in totals  # a live gauge goes with its process
