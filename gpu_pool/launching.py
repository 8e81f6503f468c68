"""The pool's end of its launcher (`gpu_pool.launcher`): one kept running for the pool's
life, restarted after its backoff when it dies, and a worker forked through it on request.

While no launcher is up (it preloads, or died and waits out its backoff) `fork` answers
None at once and the pool spawns: a start never waits for a launcher, except the pool's
first starts, which wait for its first preload (`settled`), for they would pay the same
load in each spawned worker, all at once.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
import socket
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import anyio

from batcher.shared import Backoff
from gpu_pool.attach import AttachedProcess
from gpu_pool.lasting import Stay
from gpu_pool.launcher import PACKET, Fork, Forked, Refused, Up, launcher_main
from gpu_pool.worker import WorkerConfig

log = logging.getLogger("batchgate.pool")
ANSWER_S = 10.0  # for the launcher to answer a fork; past it, it is taken for hung


class ForkedProcess(AttachedProcess):
    """A worker the launcher forked: watched through the pidfd the launcher opened for it
    (it is the launcher's child, not ours, and outlives it)."""

    def __init__(self, pid: int, pidfd: int) -> None:  # no pidfd_open: the launcher's
        self.pid = pid
        self._fd = pidfd


class Launcher:
    """Keeps the pool's launcher running and forks workers through it."""

    def __init__(self, specs: tuple[str, ...], backoff: Backoff, up_within: float) -> None:
        """`specs`: what it preloads; `up_within`: seconds its preload may take before it
        is taken for hung and killed (the pool's ready timeout)."""
        self._specs = specs
        self._backoff = backoff
        self._up_within = up_within
        self._ctx = multiprocessing.get_context("spawn")
        self._process: BaseProcess | None = None
        self._sock: socket.socket | None = None
        self._lock = anyio.Lock()  # one fork asked at a time: answers come in order
        self._settled = anyio.Event()  # its first start came up or failed
        self._up: Up | None = None
        self._changed = anyio.Event()
        self.deaths = 0

    @property
    def up(self) -> Up | None:
        """What the launcher said once preloaded; None while none is up."""
        return self._up

    @up.setter
    def up(self, up: Up | None) -> None:
        if up is not self._up:
            self._up = up
            self._changed.set()
            self._changed = anyio.Event()

    def changed(self) -> anyio.Event:
        """Set when it next comes up or goes down."""
        return self._changed

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def run(self) -> None:
        """Start the launcher and start it again whenever it dies, until cancelled; the
        pool ends the last one (`stop`) once its workers are gone, so that it reaps them."""
        failures = 0
        while True:
            began = time.monotonic()
            await self._start()
            self._settled.set()
            if self.up is not None:
                await self._exited()
                log.warning("the launcher (pid %s) died: workers spawn until it is back",
                            self.pid)
            self.deaths += 1
            self._close()
            failures = self._backoff.after_exit(failures, time.monotonic() - began)
            await anyio.sleep(self._backoff.delay(max(1, failures)))

    async def settled(self, within: float) -> None:
        """Wait until its first start came up or failed (at most `within` seconds)."""
        with anyio.move_on_after(within):
            await self._settled.wait()

    async def fork(self, conn: Connection, config: WorkerConfig,
                   stay: Stay | None) -> ForkedProcess | None:
        """A worker forked for `config` on the worker's end of its pipe, `conn` (the caller
        closes its copy); None when no launcher is up or it could not fork."""
        async with self._lock:
            sock = self._sock
            if self.up is None or sock is None:
                return None
            try:
                socket.send_fds(sock, [pickle.dumps(Fork(config, stay))], [conn.fileno()])
                with anyio.fail_after(ANSWER_S):
                    data, fds = await _receive(sock)
            except (OSError, TimeoutError) as exc:
                log.warning("the launcher did not fork (%s): spawning; it is restarted",
                            exc or type(exc).__name__)
                self._kill()
                return None
            answer = pickle.loads(data) if data else None
            if isinstance(answer, Forked) and len(fds) == 1:
                return ForkedProcess(answer.pid, fds[0])
            for fd in fds:
                os.close(fd)
            if isinstance(answer, Refused):
                log.warning("the launcher could not fork (%s): spawning", answer.reason)
            return None

    async def stop(self, grace: float = 2.0) -> None:
        """End the launcher: told by its socket closing, it reaps the workers it forked
        that have exited (call this once the pool's workers are gone: a worker that
        outlives its launcher is reaped by whoever adopts it) and exits; killed past
        `grace`."""
        self.up = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        process = self._process
        if process is not None:
            with anyio.move_on_after(grace):
                await self._exited()
        self._close()

    # -- internals ---------------------------------------------------------------------------
    async def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        process = self._ctx.Process(target=launcher_main, args=(theirs, self._specs),
                                    name="batchgate-launcher", daemon=True)
        try:  # on the loop's thread: the launcher dies with the thread that started it
            process.start()
        except OSError as exc:
            log.warning("could not start the launcher (%s): workers spawn", exc)
            ours.close()
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self._process, self._sock = process, ours
        with anyio.move_on_after(self._up_within):
            try:
                data, _ = await _receive(ours)
            except OSError:
                data = b""
            up = pickle.loads(data) if data else None
            if isinstance(up, Up):
                self.up = up
                log.info("launcher up (pid %d) in %.1fs, holding %s", up.pid, up.seconds,
                         ", ".join(up.held) or "imports only")
                if up.threads:
                    log.warning("the launcher runs %d threads besides its own: a fork may "
                                "inherit a lock one of them held", up.threads)
                return
        log.warning("the launcher did not come up: workers spawn")
        self._kill()

    async def _exited(self) -> None:
        """Until the launcher has exited. Watched through a pidfd, not its sentinel: the
        workers it forked hold the sentinel pipe's other end too."""
        process = self._process
        if process is None or process.pid is None or process.exitcode is not None:
            return
        try:
            pidfd = os.pidfd_open(process.pid)
        except ProcessLookupError:
            return
        gone = anyio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(pidfd, gone.set)
        try:
            await gone.wait()
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)

    def _kill(self) -> None:
        """Kill a launcher that failed us; `run` sees it exit and starts another."""
        self.up = None
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    def _close(self) -> None:
        self.up = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        process, self._process = self._process, None
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)


async def _receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One packet from the non-blocking `sock`, with the descriptors it carries; b"" once
    the other end has closed."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, PACKET, 1)
            return data, fds
        except BlockingIOError:
            readable = anyio.Event()
            loop.add_reader(sock.fileno(), readable.set)
            try:
                await readable.wait()
            finally:
                loop.remove_reader(sock.fileno())


__all__ = ["ANSWER_S", "ForkedProcess", "Launcher"]
