"""The worker process: load the model once, say READY, then run one batch at a time.

Runs in a spawned child, or one forked from the pool's launcher (`gpu_pool.launcher`). It
holds no state a restart would lose. Parked (`Park`), it moves its weights to host memory and
waits to be woken or stopped. A Python exception from
the model is answered as `Err` and the worker lives on; anything that kills the process is
noticed by the parent through EOF and the process sentinel.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection

from batcher import VersionKey
from batcher.tracing import Tracing
from gpu_pool.lasting import Lasting, Stay
from gpu_pool.load import DEFAULT_VERSION
from gpu_pool.models import HOST, BatchModel, load_model, move, parse_spec, uses_gpu
from gpu_pool.protocol import Err, Ok, Park, Parked, Ready, Run, Stop, Wake


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a child needs to start; picklable, passed at spawn."""

    model: str
    gpu: int | None  # CUDA device to pin, None on the CPU
    threads: int  # torch intra-op threads on the CPU
    latency_floor: float  # seconds: every batch takes at least this long
    version: VersionKey = DEFAULT_VERSION  # the version key it holds: an actor says it when claimed
    otlp_endpoint: str | None = None  # where its "worker.run" spans go; None: tracing off


def worker_main(conn: Connection, config: WorkerConfig, stay: Stay | None = None) -> None:
    """Entry point of the child process. `stay`: how a cell's worker outlives its core
    (`gpu_pool.lasting`); None: it ends with its pipe."""
    # The parent owns shutdown (it sends Stop): Ctrl-C in a terminal and SIGTERM to the
    # whole process group (systemd's default) reach workers too, mid-batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if config.gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(config.gpu)
    model, device = load_worker(config)
    ready = Ready(pid=os.getpid(), device=device)
    spans = RunSpans.of(config.otlp_endpoint)
    try:
        _serve(conn, config, model, ready, stay, spans)
    finally:
        if spans is not None:
            spans.close()


def _serve(conn: Connection, config: WorkerConfig, model: BatchModel, ready: Ready,
           stay: Stay | None, spans: RunSpans | None) -> None:
    floor = config.latency_floor
    if stay is not None:
        lasting = Lasting(stay, ready, config.version, config.model, floor)
        try:
            conn.send(ready)
        except OSError:  # its core died while it loaded: it waits, loaded, for the next
            conn.close()
        run = partial(run_batch, model, floor=floor)
        lasting.serve(None if conn.closed else conn,
                      run if spans is None else partial(spans.run, run))
        return
    conn.send(ready)
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the parent is gone
            return
        if isinstance(msg, Stop):
            return
        if isinstance(msg, Park):
            conn.send(Parked(move(model, HOST)))
        elif isinstance(msg, Wake):
            conn.send(wake(model, msg, ready))
        elif isinstance(msg, Run):
            if spans is None or msg.traces is None:
                conn.send(run_batch(model, msg, floor))
                continue
            start = time.monotonic()
            outcome = run_batch(model, msg, floor)
            end = time.monotonic()
            conn.send(outcome)
            spans.ran(msg, start, end)  # once its answer is on its way


def wake(model: BatchModel, msg: Wake, ready: Ready) -> Ready:
    """A parked worker takes its device again: its threads as its slot now has them, its
    weights back where it first loaded them."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(max(1, msg.threads))
    if ready.device != HOST:
        move(model, ready.device)
    return ready


def load_worker(config: WorkerConfig) -> tuple[BatchModel, str]:
    """Prepare this process (offline hub, torch threads and device) and load the model once;
    return it with the device it runs on. Shared by the process worker and the Ray actor, so
    both load a model the same way."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if parse_spec(config.model)[0] is not None:  # built in, with its choices or not
        device = _torch_device(config) if uses_gpu(config.model) else "cpu"
        return load_model(config.model, device), device
    # A user's function: torch is its own business. Only when loading it brought torch in
    # are its threads split and its device probed; a function without torch starts light.
    model = load_model(config.model, "cpu")
    return model, _torch_device(config) if "torch" in sys.modules else "cpu"


def run_batch(
    model: BatchModel, msg: Run, floor: float, *,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> Ok | Err:
    """Run one batch and hold the model to the contract (strings, one per input), padded to
    at least `floor` seconds on `clock`. Whatever the model raises, `SystemExit` and
    `KeyboardInterrupt` included, is an `Err`: the worker lives on. Every worker, process
    or actor, answers through this, so all check the contract alike."""
    start = clock()
    try:
        outputs = model(list(msg.inputs))
    except BaseException as exc:  # sys.exit in a model must not end the worker
        return Err(msg.batch_id, "model", type(exc).__name__, _message(exc))
    if not isinstance(outputs, list | tuple) or not all(type(o) is str for o in outputs):
        return Err(msg.batch_id, "contract", "ContractViolation", "outputs must be strings")
    if len(outputs) != len(msg.inputs):
        detail = f"{len(outputs)} outputs for {len(msg.inputs)} inputs"
        return Err(msg.batch_id, "contract", "ContractViolation", detail)
    remaining = floor - (clock() - start)
    if remaining > 0:
        sleep(remaining)
    return Ok(msg.batch_id, tuple(outputs), clock() - start)


class RunSpans:
    """A traced worker's "worker.run" spans, one per traced request of a batch, child of
    its attempt's span in the core. They are made by a thread of their own from what the
    batch loop hands it (`ran`, after the answer is sent), so an answer never waits on
    them."""

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing
        self._done: queue.SimpleQueue[tuple[Run, float, float, int] | None] = \
            queue.SimpleQueue()
        self._thread = threading.Thread(target=self._emit, name="spans", daemon=True)
        self._thread.start()

    @classmethod
    def of(cls, endpoint: str | None) -> RunSpans | None:
        tracing = Tracing.of(endpoint, "worker")
        return None if tracing is None else cls(tracing)

    def run(self, run: Callable[[Run], Ok | Err], msg: Run) -> Ok | Err:
        """`run(msg)`, its span handed on (the lasting worker's loop sends the answer
        itself: only a queue's put comes before it)."""
        start = time.monotonic()
        outcome = run(msg)
        if msg.traces is not None:
            self.ran(msg, start, time.monotonic())
        return outcome

    def ran(self, msg: Run, start: float, end: float) -> None:
        self._done.put((msg, start, end, os.getpid()))

    def close(self) -> None:
        """Emit what is left, then flush."""
        self._done.put(None)
        self._thread.join(timeout=2.0)
        self._tracing.shutdown()

    def _emit(self) -> None:
        while (done := self._done.get()) is not None:
            msg, start, end, pid = done
            for parent in msg.traces or ():
                self._tracing.emit("worker.run", parent, start, end, {
                    "batchgate.batch_id": msg.batch_id, "batchgate.batch_size": len(msg.inputs),
                    "process.pid": pid})


def _message(exc: BaseException) -> str:
    """The error's text, cut short; a placeholder when its own `str()` raises."""
    try:
        return str(exc)[:500]
    except BaseException:  # a user's __str__ may raise anything
        return "(the error's message failed)"


def _torch_device(config: WorkerConfig) -> str:
    """Split CPU threads between workers and pick the device: CUDA when this worker was
    given a GPU and torch sees one, the CPU otherwise (a build without CUDA included)."""
    try:
        import torch
    except ImportError:
        return "cpu"
    torch.set_num_threads(max(1, config.threads))
    if config.gpu is not None and torch.cuda.is_available():
        return "cuda"
    return "cpu"


__all__ = ["RunSpans", "WorkerConfig", "load_worker", "run_batch", "wake", "worker_main"]
