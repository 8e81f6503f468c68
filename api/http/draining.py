"""uvicorn's server with a drain delay, as load balancers expect of a server they route to.

On the first SIGTERM (or SIGINT) `leaving` is called, so /readyz turns 503 at once, and the
server goes on accepting and serving for `delay` seconds while balancers take it out of
rotation; then uvicorn's own graceful shutdown runs: the listener closes, idle keep-alive
connections are closed and busy ones get `Connection: close` on their answer, the lifespan
drains the core, and the process exits 0. A second signal skips what is left of the delay
(and ends as uvicorn ends on a signal).

A signal while the lifespan still starts (the models loading) has nothing to drain: the
start is cancelled at once (the lifespan's task: the pool's own clean-up stops the workers;
one made but not yet run, a loop pass later, once it has), `run` returns and `interrupted`
names the signal; the lifespan's cancellation is not reported as a failure.
Until the first step of `serve`, Ctrl-C is the command line's (`api.stopped.stop_now`: nothing
is started yet); from there uvicorn's, as it hands it back to Python's own handler.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from socket import socket
from types import FrameType
from typing import cast

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
        if threading.current_thread() is threading.main_thread():
            # Ctrl-C is uvicorn's from here (`capture_signals`), Python's after it; until
            # now it was the command line's, which ends a process that started nothing.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        await super().serve(sockets)

    def run(self, sockets: list[socket] | None = None) -> None:
        """Serve until stopped; returns (with `interrupted` set) when a signal came while
        starting."""
        try:
            super().run(sockets)
        except (asyncio.CancelledError, SystemExit):  # the serve, or the lifespan, cancelled
            if self.interrupted is None:
                raise

    def _stop_starting(self, sig: int) -> None:
        """From the signal handler: stop the start, once (a second signal while it stops
        changes nothing: the stop is under way)."""
        if self.interrupted is not None:
            return
        self.interrupted = sig
        self._leaving()
        # The lifespan ends cancelled: not a failed start to report.
        logging.getLogger("uvicorn.error").disabled = True
        serving = self._serving
        if serving is not None:
            serving.get_loop().call_soon_threadsafe(self._cancel_start)

    def _cancel_start(self) -> None:
        """Cancel the lifespan's task and have the serve exit: the lifespan's anyio tasks
        unwind as anyio cancels them, the lifespan fails, and uvicorn's serve returns with
        none of them left. Cancelled from the serve instead, they were left to asyncio's
        close, which cancels every task at once, and anyio (4.16) then waited for good in
        `TaskGroup.start` for a child cancelled before its first step (the start-up's
        Ctrl-C test hung). Before the lifespan's task has run, the serve is cancelled: no
        task of the lifespan's is there yet."""
        self.should_exit = True
        lifespan = self._lifespan_task()
        if lifespan is None:
            if self._serving is not None:
                self._serving.cancel()
        elif inspect.getcoroutinestate(
                cast(Coroutine[object, object, object], lifespan.get_coro())) \
                == inspect.CORO_CREATED:
            # Made, not yet run (the signal came in the serve's step that made it): its
            # first step is due before this again. Cancelling the serve now would leave it
            # to start the service and be cancelled by asyncio's close (the same hang, about
            # one start in a hundred interrupted at random).
            asyncio.get_running_loop().call_soon(self._cancel_start)
        else:
            lifespan.cancel()

    def _lifespan_task(self) -> asyncio.Task[object] | None:
        """uvicorn's lifespan task (`LifespanOn.main`), once it is made."""
        lifespan = getattr(self, "lifespan", None)
        if lifespan is None:
            return None
        for task in asyncio.all_tasks():
            frame = getattr(task.get_coro(), "cr_frame", None)
            if frame is not None and frame.f_locals.get("self") is lifespan:
                return task
        return None


__all__ = ["DrainingServer"]
