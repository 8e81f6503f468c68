"""The launcher: one process per pool that imports what its workers need once, holds the
weights a model lets it hold (`ModelEntry.preload`), and forks each worker on request.

A spawned worker pays for a fresh interpreter, torch and the model's libraries, and the
weights read again: seconds on the CPU, minutes for a large model on a GPU. A fork of this
process starts with all of it, the weights in pages it shares with the launcher until
written; the worker then moves them to its device and says READY as a spawned one does.
The launcher never touches CUDA, runs no forward pass and starts no thread it knows of, so
a fork inherits nothing half-made.

Why not `multiprocessing`'s forkserver with preloaded modules: it preloads imports, not
weights; it is one per process, restarted on the next start (which then waits for a full
preload); and a worker it forked is watched through a pipe to the forkserver itself, so the
forkserver's death reads as the death of every worker it forked, alive as they are. Here
the pool watches each forked worker through a pidfd the launcher opens for it, so a
worker outlives its launcher untouched, and the pool meanwhile spawns.

The pool's end (`gpu_pool.launching`) speaks over a SOCK_SEQPACKET socket pair, one message
a packet, pickled: the launcher says `Up` once preloaded; each `Fork` comes with the
worker's end of its pipe and is answered `Forked` with the child's pidfd, or `Refused`. The
launcher ends with its pool: when the socket closes, or by PR_SET_PDEATHSIG when the pool's
process dies (a cell's workers are then its supervisor's, as spawned ones would be).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from batcher.shared import die_with_parent, name_process
from gpu_pool.lasting import Stay
from gpu_pool.models import parse_spec, preload, uses_gpu
from gpu_pool.worker import WorkerConfig, worker_main

PACKET = 1 << 16  # bytes: any one message, a worker's config included
POLL_S = 1.0  # how often an idle launcher reaps its exited children


@dataclass(frozen=True, slots=True)
class Up:
    """Preloaded: `held` the specs whose weights it holds, in `seconds`."""

    pid: int
    held: tuple[str, ...]
    seconds: float
    threads: int  # Python threads besides its own: 0, or a fork may inherit a held lock


@dataclass(frozen=True, slots=True)
class Fork:
    """Fork a worker for `config` (its pipe's end comes with this packet)."""

    config: WorkerConfig
    stay: Stay | None


@dataclass(frozen=True, slots=True)
class Forked:
    """The worker's pid; its pidfd comes with this packet."""

    pid: int


@dataclass(frozen=True, slots=True)
class Refused:
    """The fork failed here (out of processes or memory): the pool spawns instead."""

    reason: str


def launcher_main(control: socket.socket, specs: tuple[str, ...]) -> None:
    """Entry point of the launcher process: preload `specs`, say `Up`, then fork a worker
    for each `Fork` until the pool closes `control`."""
    # Ctrl-C to the process group is the pool's to handle, as its workers'. SIGTERM ends it:
    # it holds no work, and multiprocessing's exit ends a daemonic child with it (ignored,
    # a server interrupted before its pool stopped would wait on it for ever).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(os.getppid())
    name_process("bg-launcher")
    signal.signal(signal.SIGCHLD, lambda *_: _reap())  # a worker's exit, collected at once
    began = time.monotonic()
    held = _preload(specs)
    threads = threading.active_count() - 1
    try:
        control.send(pickle.dumps(Up(os.getpid(), held, time.monotonic() - began, threads)))
        _serve(control)
    except OSError:  # the pool is gone (stopped while this preloaded): nothing to serve
        return


def _serve(control: socket.socket) -> None:
    """Fork a worker for each `Fork` until the pool closes `control`."""
    control.settimeout(POLL_S)
    while True:
        _reap()
        try:
            data, fds, _, _ = socket.recv_fds(control, PACKET, 1)
        except TimeoutError:
            continue
        if not data:  # the pool closed its end, its workers gone: reap them, then leave
            _reap()
            return
        request = pickle.loads(data)
        if not isinstance(request, Fork) or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        _fork(control, request, fds[0])


def _preload(specs: tuple[str, ...]) -> tuple[str, ...]:
    """Import torch when a built-in model uses it (a user's function imports what it needs,
    here when it opted in, else in each worker), and hold what each spec lets a launcher
    hold. A spec that fails to preload is left to each worker (which says why)."""
    if any(parse_spec(spec)[0] is not None and uses_gpu(spec) for spec in specs) and \
            importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401  (imported once, here, for every fork)
    with contextlib.suppress(ImportError):
        import tqdm  # type: ignore[import-untyped]

        tqdm.tqdm.monitor_interval = 0  # its monitor thread: a fork would lose it mid-lock
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    held = []
    for spec in dict.fromkeys(specs):
        try:
            if preload(spec):
                held.append(spec)
        except Exception:  # a worker loading it says why, as without a launcher
            print(f"launcher: could not preload {spec}: {traceback.format_exc(limit=1)}",
                  file=sys.stderr)
    return tuple(held)


def _fork(control: socket.socket, request: Fork, fd: int) -> None:
    # SIGCHLD held until the child's pidfd is open: reaped before, its pid could be anyone's.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(fd)
            control.send(pickle.dumps(Refused(str(exc))))
            return
        if pid == 0:
            _child(control, request, fd)  # never returns
        os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            control.send(pickle.dumps(Refused(str(exc))))
            return
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    try:
        socket.send_fds(control, [pickle.dumps(Forked(pid))], [pidfd])
    finally:
        os.close(pidfd)


def _child(control: socket.socket, request: Fork, fd: int) -> None:
    """The forked worker: the launcher's socket is not its business; its exit never runs
    the launcher's code again."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own children are its business
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        control.close()
        name_process("bg-worker")
        worker_main(Connection(fd), request.config, request.stay)
        code = 0
    except BaseException:  # its pool sees the exit; the trace says why
        traceback.print_exc()
    finally:
        os._exit(code)


def _reap() -> None:
    """Collect the children that have exited (their pool watched them through pidfds)."""
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return


__all__ = ["PACKET", "Fork", "Forked", "Refused", "Up", "launcher_main"]
