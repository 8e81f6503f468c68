"""`--grpc-port` in a server's lifespan: the gRPC side served beside HTTP while the server
runs, and stopped gracefully when it drains. grpcio (the `grpc` extra) is imported only
where a port is given, so a server without the flag never loads it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from api.config import Settings
from api.http import Routes


@asynccontextmanager
async def serving_grpc(routes: Routes, settings: Settings, *, reuse_port: bool = False
                       ) -> AsyncIterator[Any]:
    """Serve the protocol on `--grpc-port` beside HTTP while the block runs (nothing without
    the flag), and stop it gracefully on the way out. `reuse_port`: a cell's gateways share
    the port. Raises OSError when the port cannot be bound, RuntimeError without grpcio."""
    if settings.grpc_port is None:
        yield None
        return
    try:
        from api.oip.grpc_server import serve  # grpcio, loaded only where it serves
    except ImportError as exc:
        raise RuntimeError(f"--grpc-port needs grpcio and protobuf: pip install "
                           f"'batchgate[grpc]' ({exc})") from None
    async with serve(routes, settings, settings.grpc_port, reuse_port=reuse_port) as server:
        yield server


__all__ = ["serving_grpc"]
