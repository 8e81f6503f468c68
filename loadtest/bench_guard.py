"""What the door's limits cost per request: uvicorn's httptools protocol against the guarded
one (`api/http/protocol.py`), fed the same keep-alive requests in one process, no sockets.

    python -m loadtest.bench_guard [--requests 20000] [--rounds 3]

Prints microseconds per request for each, round by round (the two alternate, so drift on a
busy machine hits both).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from api.http import ConnectionLimits, guarded_protocol

REQUEST = (b"POST /v1/batchstring HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
           b"Content-Type: application/json\r\nAuthorization: Bearer paid-demo-key\r\n"
           b'Content-Length: 27\r\n\r\n{"input": "r1-abcdefghxxx"}')


async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class _Transport(asyncio.Transport):
    """Takes every write, never closes by itself."""

    def __init__(self) -> None:
        super().__init__()
        self._closing = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # it takes every write: never paused

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def per_request_us(protocol: type[HttpToolsProtocol], requests: int) -> float:
    config = Config(app=_app, log_level="error")
    config.load()
    proto = protocol(config=config, server_state=ServerState(), app_state={},
                     _loop=asyncio.get_running_loop())
    proto.connection_made(_Transport())
    start = time.perf_counter()
    for _ in range(requests):
        proto.data_received(REQUEST)
        await asyncio.sleep(0)  # the handler task runs and answers
        await asyncio.sleep(0)
    elapsed = time.perf_counter() - start
    proto.connection_lost(None)
    return elapsed / requests * 1e6


async def _main(requests: int, rounds: int) -> None:
    guarded = guarded_protocol(ConnectionLimits())
    for n in range(1, rounds + 1):
        plain = await per_request_us(HttpToolsProtocol, requests)
        limited = await per_request_us(guarded, requests)
        print(f"round {n}: plain {plain:.2f} us/req, guarded {limited:.2f} us/req, "
              f"difference {limited - plain:+.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_guard",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    uvloop.run(_main(args.requests, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
