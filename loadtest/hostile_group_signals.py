"""Hostile: SIGTERM to the server's whole process group under load, as systemd's default
`KillMode=control-group` (or `kill -- -PGID`) sends it; and idle connections against
`--max-connections` in a cell.

    python -m loadtest.hostile_group_signals [--root DIR] [--gateways 1 2] [--clients 12]

For each `--gateways` value, runs `batchgate serve` (two `sim` workers) from this checkout or
`--root`, with `--drain-delay-s` (2 s: the server keeps serving while balancers take it out),
and `--clients` clients that each send one request per connection. Once `--signal-after`
answers came back it sends SIGTERM to the process group, and the clients go on until a
balancer polling /readyz sees it turn 503 (with `--until-refused`, until the port refuses
them: a connection that reaches a listener as it closes is reset, in any server). Prints,
per run: answers 200 with the request's own output, other answers (status and code),
connections reset or closed without an answer, connections refused before the signal,
gateways and workers that died (and were started again) during the drain, the exit status,
and processes left behind.

Then, for a cell (`--limit-gateways`, 2 unless 0), `--max-connections 20` and 30 idle
connections opened one after another, each asked GET /healthz: how many each gateway holds
and how many were refused (503 too_many_connections).

Every wait is bounded; a run takes well under a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import anyio
import httpx

from loadtest.server import gateway_of, running_server, start_server, stop_server

PAID = {"Authorization": "Bearer paid-demo-key"}


class Load:
    """Clients that send one request per connection, until a balancer polling /readyz takes
    the server out of rotation, or (`until_refused`) until the port refuses them."""

    def __init__(self, url: str, per_client: int, signal_after: int,
                 until_refused: bool) -> None:
        self.url, self.per_client, self.signal_after = url, per_client, signal_after
        self.until_refused = until_refused
        self.ok = 0
        self.other: Counter[str] = Counter()  # answers other than 200 with the own output
        self.lost: Counter[str] = Counter()  # taken connections dropped without an answer
        self.refused_early = 0
        self.signalled = False
        self.out_of_rotation = False
        self.enough = anyio.Event()

    async def client(self, n: int) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.url, timeout=30, limits=limits) as client:
            for i in range(self.per_client):
                if self.out_of_rotation:
                    return
                text = f"c{n}-{i}"
                try:
                    r = await client.post("/v1/batchstring", json={"input": text}, headers=PAID)
                except httpx.ConnectError:
                    self.refused_early += not self.signalled
                    return
                except httpx.TransportError as exc:
                    self.lost["reset" if _reset(exc) else type(exc).__name__] += 1
                    continue
                if r.status_code == 200 and r.json().get("output") == text[::-1]:
                    self.ok += 1
                    if self.ok >= self.signal_after:
                        self.enough.set()
                else:
                    self.other[f"{r.status_code} {_code(r)}"] += 1

    async def balancer(self) -> None:
        """Polls /readyz until it is not 200 (or not answered)."""
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.url, timeout=2, limits=limits) as client:
            while not self.until_refused:
                try:
                    if (await client.get("/readyz")).status_code != 200:
                        break
                except httpx.TransportError:
                    break
                await anyio.sleep(0.01)  # another process: poll it
        self.out_of_rotation = not self.until_refused


def _reset(exc: BaseException | None) -> bool:
    """Whether the connection was reset, however deep httpx and httpcore wrapped it."""
    while exc is not None:
        if isinstance(exc, ConnectionResetError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _code(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"


def patient_keys(root: Path, folder: Path) -> Path:
    keys = folder / "keys.toml"
    text = (root / "examples" / "keys.toml").read_text()
    keys.write_text(text.replace("budget_ms = 400", "budget_ms = 60000"))
    return keys


async def group_sigterm(root: Path, gateways: int, clients: int, per_client: int,
                        signal_after: int, drain_delay_s: float, until_refused: bool,
                        ) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        keys = patient_keys(root, Path(folder))
        srv = start_server(workers=2, args=["--gateways", str(gateways), "--keys", str(keys)],
                           env={"BATCHGATE_DRAIN_DELAY_S": str(drain_delay_s)}, cwd=root)
        try:
            load = Load(srv.url, per_client, signal_after, until_refused)
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for n in range(clients):
                        tg.start_soon(load.client, n)
                    await load.enough.wait()
                    load.signalled = True
                    os.killpg(srv.pid, signal.SIGTERM)
                    tg.start_soon(load.balancer)
                code = await anyio.to_thread.run_sync(lambda: srv.process.wait(timeout=60))
        finally:
            leftovers = stop_server(srv)
        log = srv.log_path.read_text(errors="replace")
        srv.log_path.unlink(missing_ok=True)
    return {
        "gateways": gateways, "ok": load.ok, "other_answers": dict(load.other),
        "lost_connections": dict(load.lost), "refused_before_signal": load.refused_early,
        "gateway_restarts": log.count("restarting in"),
        "worker_deaths": log.count(" died (exit code"),
        "exit_status": code, "left_processes": leftovers,
    }


def idle_connections(root: Path, gateways: int, limit: int, opened: int) -> dict[str, object]:
    args = ["--gateways", str(gateways), "--max-connections", str(limit)]
    held: Counter[str] = Counter()
    socks: list[socket.socket] = []
    with running_server(workers=1, args=args, cwd=root) as srv:
        try:
            for _ in range(opened):
                socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
                slot = gateway_of(socks[-1])
                held["refused" if slot is None else f"gateway {slot}"] += 1
        finally:
            for sock in socks:
                sock.close()
    return {"gateways": gateways, "limit": limit, "opened": opened, **dict(sorted(held.items()))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).parents[1],
                        help="the checkout to run the server from (default this one)")
    parser.add_argument("--gateways", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--per-client", type=int, default=60, help="requests at most")
    parser.add_argument("--signal-after", type=int, default=40, help="answers before SIGTERM")
    parser.add_argument("--drain-delay-s", type=float, default=2.0)
    parser.add_argument("--until-refused", action="store_true",
                        help="clients go on until the port refuses them, balancer or not "
                             "(connections that reach a closing listener are reset)")
    parser.add_argument("--limit-gateways", type=int, default=2, help="0: skip the limit run")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    for gateways in args.gateways:
        figures = anyio.run(group_sigterm, root, gateways, args.clients, args.per_client,
                            args.signal_after, args.drain_delay_s, args.until_refused)
        print("group SIGTERM:", json.dumps(figures), flush=True)
    if args.limit_gateways:
        print("idle connections:", json.dumps(idle_connections(root, args.limit_gateways, 20,
                                                               30)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Load", "group_sigterm", "idle_connections", "main"]
