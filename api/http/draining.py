"""uvicorn's server with a drain delay, as load balancers expect of a server they route to.

On the first SIGTERM (or SIGINT) `leaving` is called, so /readyz turns 503 at once, and the
server goes on accepting and serving for `delay` seconds while balancers take it out of
rotation; then uvicorn's own graceful shutdown runs: the listener closes, idle keep-alive
connections are closed and busy ones get `Connection: close` on their answer, the lifespan
drains the core, and the process exits 0. A second signal skips what is left of the delay
(and ends as uvicorn ends on a signal).

A signal while the lifespan still starts (the models loading) has nothing to drain: the
start is cancelled at once (the pool's own clean-up stops the workers), `run` returns and
`interrupted` names the signal; the lifespan's cancellation is not reported as a failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from socket import socket
from types import FrameType

import uvicorn


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, delay: float, leaving: Callable[[], None]) -> None:
        super().__init__(config)
        self._delay = delay
        self._leaving = leaving
        self._stop_at: float | None = None
        self._serving: asyncio.Task[None] | None = None
        self.interrupted: int | None = None  # the signal that stopped it while starting

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.started and self._serving is not None:
            self._stop_starting(sig)
            return
        if self._stop_at is None and self._delay > 0 and not self.should_exit:
            self._stop_at = time.monotonic() + self._delay
            self._leaving()
            return
        self._leaving()
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._stop_at is not None and time.monotonic() >= self._stop_at:
            self.should_exit = True
        return await super().on_tick(counter)

    async def serve(self, sockets: list[socket] | None = None) -> None:
        self._serving = asyncio.current_task()
        await super().serve(sockets)

    def run(self, sockets: list[socket] | None = None) -> None:
        """Serve until stopped; returns (with `interrupted` set) when a signal came while
        starting."""
        try:
            super().run(sockets)
        except asyncio.CancelledError:
            if self.interrupted is None:
                raise

    def _stop_starting(self, sig: int) -> None:
        """From the signal handler: cancel the start (a second signal meanwhile does the
        same, at once)."""
        if self.interrupted is None:
            self.interrupted = sig
            self._leaving()
            # The lifespan's task is cancelled with the loop: not a failed start to report.
            logging.getLogger("uvicorn.error").disabled = True
        serving = self._serving
        if serving is not None:
            serving.get_loop().call_soon_threadsafe(serving.cancel)


__all__ = ["DrainingServer"]
