"""SIGTERM to the server's whole process group, as systemd's default `KillMode=control-group`
and `kill -- -PGID` send it: the signal reaches every worker and gateway at the same moment
as the main process, and only the main process drains. Run against a single process and a
cell of two gateways (the module's `gateways` fixture)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.server import start_server, stop_server
from tests.e2e.helpers import PAID, patient_keys

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
CLIENTS = 12  # more than two workers' batches hold: a batch is always running
MAX_REQUESTS = 60  # per client: the load is bounded whatever the server does
SIGNAL_AFTER = 40  # answers before the signal


class Load:
    """Clients that each send one request per connection, and sort what came back; and a
    balancer that takes the server out of rotation once its /readyz says so, after which
    the clients send nothing new (a connection that reaches a closing listener is reset,
    in one process as in a cell: the drain delay is there for balancers to stop sending)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ok = 0
        self.wrong: list[str] = []  # an answer other than 200 with the request's own output
        self.lost: list[str] = []  # a connection taken and then dropped without an answer
        self.refused = 0  # the port refused a connection
        self.out_of_rotation = False
        self.enough = anyio.Event()

    async def client(self, n: int) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)  # a connection per request
        async with httpx.AsyncClient(base_url=self.url, timeout=30, limits=limits) as client:
            for i in range(MAX_REQUESTS):
                if self.out_of_rotation:
                    return
                text = f"c{n}-{i}"
                try:
                    r = await client.post("/v1/batchstring", json={"input": text}, headers=PAID)
                except httpx.ConnectError:
                    self.refused += 1
                    return
                except httpx.TransportError as exc:
                    self.lost.append(f"{text}: {exc!r}")
                    continue
                if r.status_code == 200 and r.json()["output"] == text[::-1]:
                    self.ok += 1
                    if self.ok >= SIGNAL_AFTER:
                        self.enough.set()
                else:
                    self.wrong.append(f"{text}: {r.status_code} {r.text}")

    async def balancer(self) -> None:
        """Polls /readyz until it is not 200 (or not answered)."""
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.url, timeout=2, limits=limits) as client:
            while True:
                try:
                    if (await client.get("/readyz")).status_code != 200:
                        break
                except httpx.TransportError:
                    break
                await anyio.sleep(0.01)  # another process: poll it
        self.out_of_rotation = True


async def test_sigterm_to_the_process_group_drains_without_a_lost_request(
    gateways: int, tmp_path: Path
) -> None:
    # Served through a drain delay too: balancers are still taking it out of rotation.
    srv = start_server(workers=2, args=patient_keys(tmp_path),
                       env={"BATCHGATE_DRAIN_DELAY_S": "2"})
    try:
        load = Load(srv.url)
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for n in range(CLIENTS):
                    tg.start_soon(load.client, n)
                await load.enough.wait()
                os.killpg(srv.pid, signal.SIGTERM)  # the server runs in its own session
                tg.start_soon(load.balancer)
            code = await anyio.to_thread.run_sync(lambda: srv.process.wait(timeout=30))
    finally:
        leftovers = stop_server(srv)
    assert load.wrong == [] and load.lost == [] and load.refused == 0
    assert load.ok >= SIGNAL_AFTER
    assert leftovers == []
    log = srv.log_path.read_text()
    if gateways > 1:
        assert code == 0
        assert "restarting in" not in log  # no gateway died, none was started again
    else:  # uvicorn re-raises SIGTERM once its graceful shutdown is done
        assert code in (0, -signal.SIGTERM)
    assert " died (exit code" not in log  # no worker died either
    srv.log_path.unlink()  # read; a failure above keeps it
