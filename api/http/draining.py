"""uvicorn's server with a drain delay, as load balancers expect of a server they route to.

On the first SIGTERM (or SIGINT) `leaving` is called, so /readyz turns 503 at once, and the
server goes on accepting and serving for `delay` seconds while balancers take it out of
rotation; then uvicorn's own graceful shutdown runs: the listener closes, idle keep-alive
connections are closed and busy ones get `Connection: close` on their answer, the lifespan
drains the core, and the process exits 0. A second signal skips what is left of the delay
(and ends as uvicorn ends on a signal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import FrameType

import uvicorn


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, delay: float, leaving: Callable[[], None]) -> None:
        super().__init__(config)
        self._delay = delay
        self._leaving = leaving
        self._stop_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
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


__all__ = ["DrainingServer"]
