"""What the access log costs a request on the direct way: CPU per request with the log off
and on, in one process, without sockets or a core. Each request goes the whole direct way
(its head and body, the key, parsing, the answer rendered and written to a transport that
drops it, the bookkeeping); the core answers at once. Batches of 100 answers end a loop
turn together, as a batch's answers do in the server, so the log writes one chunk a turn.

    python -m loadtest.bench_access_log [--requests 20000] [--rounds 15] [--to PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Sequence
from typing import TextIO

from api.config import KeyRing, Principal, Settings
from api.http import Answered, ClientWatch, DirectCall, DirectRoute, Job, Routes
from api.http.access_log import AccessLog
from api.metrics import Metrics
from batcher import Tier

KEYS = KeyRing({"k1": Principal(Tier.PAID, "acme", "k1")}, frozenset())
HEAD = [(b"host", b"t"), (b"content-length", b"14"), (b"authorization", b"Bearer k1"),
        (b"content-type", b"application/json")]
BODY = b'{"input":"ab"}'
ANSWER = Answered(["ba"], (0.012,), 0.1, (1,), 1)
TURN = 100  # answers per loop turn


class _Dropped(asyncio.Transport):
    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def is_closing(self) -> bool:
        return False


class _Connection:
    def __init__(self) -> None:
        self.transport: asyncio.Transport = _Dropped()
        self.default_headers = [(b"server", b"uvicorn")]

    @property
    def departure(self) -> ClientWatch:
        raise NotImplementedError  # the answer comes before anyone watches

    def on_response_complete(self) -> None:
        pass


class _Instant(DirectRoute):
    def admit(self, call: DirectCall, job: Job) -> None:
        self.answer(call, ANSWER)


async def cpu_per_request(log: AccessLog | None, requests: int) -> float:
    """Microseconds of this process's CPU per request."""
    routes = Routes(None, Settings(model="sim"), KEYS, Metrics())  # type: ignore[arg-type]
    route = _Instant(routes)
    route.access_log = routes.access_log = log
    conn = _Connection()
    gc.disable()
    try:
        started = time.process_time()
        for _ in range(requests // TURN):
            for _ in range(TURN):
                call = route.call(conn, HEAD, True)
                assert call is not None
                call.body += BODY
                route.start(call)
            await asyncio.sleep(0)  # the turn ends: the bookkeeping, and the log's write
            await asyncio.sleep(0)
        return (time.process_time() - started) / requests * 1e6
    finally:
        gc.enable()


async def compare(stream: TextIO, requests: int, rounds: int) -> tuple[float, float]:
    """The median CPU per request, log off and on, the runs interleaved."""
    off, on = [], []
    for _ in range(rounds):
        off.append(await cpu_per_request(None, requests))
        on.append(await cpu_per_request(AccessLog(stream), requests))
    return statistics.median(off), statistics.median(on)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20_000, help="per run")
    p.add_argument("--rounds", type=int, default=15, help="runs each way, interleaved")
    p.add_argument("--to", default="/dev/null", help="where the log is written")
    args = p.parse_args(argv)
    with open(args.to, "w") as stream:
        off, on = asyncio.run(compare(stream, args.requests, args.rounds))
    print(f"CPU per request on the direct way (median of {args.rounds} x {args.requests}): "
          f"log off {off:.1f} us, on {on:.1f} us: the log costs {on - off:.1f} us")


if __name__ == "__main__":
    main()
