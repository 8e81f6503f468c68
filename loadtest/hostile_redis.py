"""Hostile: the Redis of `--state redis://` turns slow (`DEBUG SLEEP`) under paid traffic.

    python -m loadtest.hostile_redis [--root DIR] [--rate 40] [--sleep-s 0.4] [--for-s 5]

Starts a redis-server (with DEBUG enabled) on a free loopback port and `batchgate serve
--state redis://...` (two `sim` workers, the example keys) from this checkout or `--root`,
sends paid requests at `--rate` a second, every other one with an Idempotency-Key of its
own, and after 2 s of calm a thread sends `DEBUG SLEEP --sleep-s` back to back for
`--for-s` seconds. Prints, for the requests sent while Redis slept, the statuses by code and
the P50/P95 of the keyed and of the plain ones (the paid budget is 400 ms), and the same
for the 2 s after. Every wait is bounded; a run takes about `--for-s` + 10 s.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from loadtest.server import running_server
from tests.redis_server import free_port, redis_server_binary

PAID = {"Authorization": "Bearer paid-demo-key"}
CALM_S = 2.0  # before the sleeps, and measured after them


@dataclass(frozen=True, slots=True)
class Sent:
    at: float  # seconds from the start of the load
    keyed: bool
    status: int
    code: str
    took: float


def redis(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A redis-server that takes DEBUG, answering on a free port."""
    port = free_port()
    process = subprocess.Popen(
        [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", str(folder), "--enable-debug-command", "yes"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process, port
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.05)


def sleeper(port: int, sleep_s: float, for_s: float, done: list[int]) -> None:
    """`DEBUG SLEEP sleep_s` back to back for `for_s` seconds, on its own connection."""
    command = f"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${len(str(sleep_s))}\r\n{sleep_s}\r\n"
    end = time.monotonic() + for_s
    with socket.create_connection(("127.0.0.1", port), timeout=sleep_s + 5) as s:
        while time.monotonic() < end:
            s.sendall(command.encode())
            if not s.recv(64).startswith(b"+OK"):
                raise RuntimeError("DEBUG SLEEP refused")
            done[0] += 1


def code_of(r: httpx.Response) -> str:
    if r.status_code == 200:
        return "ok"
    try:
        return str(r.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "-"


async def load(url: str, rate: float, seconds: float, t0: float) -> list[Sent]:
    sent: list[Sent] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        async def one(n: int) -> None:
            keyed = n % 2 == 1
            headers = {**PAID, "Idempotency-Key": f"k-{n}"} if keyed else PAID
            start = time.monotonic()
            r = await client.post("/v1/batchstring", json={"input": f"text {n}"},
                                  headers=headers)
            sent.append(Sent(start - t0, keyed, r.status_code, code_of(r),
                             time.monotonic() - start))

        async with anyio.create_task_group() as tg:
            for n in range(int(rate * seconds)):
                await anyio.sleep_until(t0 + n / rate)
                tg.start_soon(one, n)
    return sent


def p(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def report(name: str, sent: Sequence[Sent]) -> dict[str, object]:
    out: dict[str, object] = {"window": name}
    for keyed in (True, False):
        part = [s for s in sent if s.keyed == keyed]
        ok = [s.took * 1000 for s in part if s.status == 200]
        label = "keyed" if keyed else "plain"
        out[label] = {
            "sent": len(part),
            "codes": dict(Counter(f"{s.status} {s.code}" for s in part)),
            "p50_ms_ok": round(p(ok, 50), 1), "p95_ms_ok": round(p(ok, 95), 1),
            "p95_ms_all": round(p([s.took * 1000 for s in part], 95), 1),
        }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--root", type=Path, default=Path(__file__).parents[1],
                   help="the checkout whose server runs (default: this one)")
    a.add_argument("--rate", type=float, default=40.0, help="paid requests a second")
    a.add_argument("--sleep-s", type=float, default=0.4)
    a.add_argument("--for-s", type=float, default=5.0)
    a.add_argument("--gateways", type=int, default=1)
    args = a.parse_args(argv)
    root = args.root.resolve()
    with tempfile.TemporaryDirectory() as folder:
        process, port = redis(Path(folder))
        try:
            serve = ["--keys", str(root / "examples" / "keys.toml"), "--gateways",
                     str(args.gateways), "--state", f"redis://127.0.0.1:{port}/0"]
            with running_server(workers=2, args=serve, cwd=root) as srv:
                t0 = time.monotonic() + 0.5
                done = [0]
                thread = threading.Timer(
                    t0 + CALM_S - time.monotonic(), sleeper,
                    (port, args.sleep_s, args.for_s, done))
                thread.start()
                sent = anyio.run(load, srv.url, args.rate, 2 * CALM_S + args.for_s, t0)
                thread.join(args.for_s + args.sleep_s + 10)
        finally:
            process.kill()
            process.wait(5)
    slow_end = CALM_S + args.for_s
    print(f"root {root}; {args.rate:g} paid/s, half keyed; DEBUG SLEEP {args.sleep_s:g} x "
          f"{done[0]} from {CALM_S:g} s to {slow_end:g} s; gateways {args.gateways}")
    for name, lo, hi in (("calm", 0.0, CALM_S), ("slow", CALM_S, slow_end),
                         ("after", slow_end, slow_end + CALM_S)):
        print(json.dumps(report(name, [s for s in sent if lo <= s.at < hi])))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
