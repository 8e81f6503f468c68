"""A cell's worker outlives its core (`gpu_pool.lasting`): driven in this process, the
worker's loop in a thread and the "cores" as the two ends of its connections, so each step
is waited on, never slept through."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from gpu_pool.lasting import KEPT_BATCHES, Lasting, Stay
from gpu_pool.protocol import Attached, BatchId, Err, Ok, Ready, Run, Salvaged, Stop

TAG = ("acme", "key-1", 0)
TIMEOUT_S = 10.0


class Model:
    """Answers each input upper-cased; a batch holding "hold" waits until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.running = threading.Event()

    def __call__(self, msg: Run) -> Ok | Err:
        self.running.set()
        if "hold" in msg.inputs:
            assert self.release.wait(TIMEOUT_S)
        return Ok(msg.batch_id, tuple(t.upper() for t in msg.inputs), 0.0)


class Worker:
    def __init__(self, folder: Path, wait_s: float = 60.0) -> None:
        self.stay = Stay(str(folder), 3, keeper=os.getppid(), wait_s=wait_s)
        self.lasting = Lasting(self.stay, Ready(os.getpid(), "cpu"), "m@v1", "sim", 0.0)
        self.model = Model()
        self.core, end = Pipe()
        self.done = threading.Event()

        def serve() -> None:
            try:
                self.lasting.serve(end, self.model)
            finally:
                self.done.set()

        threading.Thread(target=serve, daemon=True).start()

    def attach(self) -> tuple[Connection, Attached]:
        """Connect as the next core: its connection and the worker's first word."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(self.stay.path(os.getpid())))
        conn = Connection(sock.detach())
        assert conn.poll(TIMEOUT_S)
        hello = conn.recv()
        assert isinstance(hello, Attached)
        return conn, hello


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path)
    yield w
    w.lasting.close()


def answer(conn: Connection) -> object:
    assert conn.poll(TIMEOUT_S)
    return conn.recv()


def test_the_next_core_gets_the_running_batch_as_salvage_then_serves(worker: Worker) -> None:
    worker.core.send(Run(BatchId(1), ("a", "hold"), (TAG, None)))
    assert worker.model.running.wait(TIMEOUT_S)
    worker.core.close()  # the core dies mid-batch
    conn, hello = worker.attach()
    assert hello.version == "m@v1" and hello.spec == "sim" and hello.ready.pid == os.getpid()
    assert hello.salvaged == (Salvaged((TAG, None), ("a", "hold"), None, running=True),)
    worker.model.release.set()
    assert answer(conn) == Salvaged((TAG, None), ("a", "hold"), ("A", "HOLD"))
    conn.send(Run(BatchId(1), ("b",)))  # the next core's own batch: an answer as usual
    assert answer(conn) == Ok(BatchId(1), ("B",), 0.0)
    conn.send(Stop())
    assert worker.done.wait(TIMEOUT_S)
    assert not worker.stay.path(os.getpid()).exists()


def test_keyed_batches_answered_before_the_death_are_kept_the_last_few(worker: Worker) -> None:
    for n in range(KEPT_BATCHES + 2):
        tags = None if n == 0 else (("acme", f"key-{n}", 0),)
        worker.core.send(Run(BatchId(n), (f"t{n}",), tags))
        assert answer(worker.core) == Ok(BatchId(n), (f"T{n}",), 0.0)
    worker.core.close()
    _, hello = worker.attach()
    kept = [s.inputs[0] for s in hello.salvaged]
    assert kept == [f"t{n}" for n in range(2, KEPT_BATCHES + 2)]  # unkeyed batch 0 is not
    assert all(s.outputs == (s.inputs[0].upper(),) and not s.running for s in hello.salvaged)


def test_a_worker_no_core_comes_for_leaves_and_removes_its_socket(tmp_path: Path) -> None:
    worker = Worker(tmp_path, wait_s=0.0)
    assert worker.stay.path(os.getpid()).exists()
    worker.core.close()
    assert worker.done.wait(TIMEOUT_S)
    assert not worker.stay.path(os.getpid()).exists()
