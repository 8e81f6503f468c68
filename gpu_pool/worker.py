"""The worker process: load the model once, say READY, then run one batch at a time.

Runs in a spawned child. It holds no state a restart would lose. A Python exception from
the model is answered as `Err` and the worker lives on; anything that kills the process is
noticed by the parent through EOF and the process sentinel.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from batcher import VersionKey
from gpu_pool.lasting import Lasting, Stay
from gpu_pool.load import DEFAULT_VERSION
from gpu_pool.models import BatchModel, load_model, parse_spec, uses_gpu
from gpu_pool.protocol import Err, Ok, Ready, Run, Stop


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a child needs to start; picklable, passed at spawn."""

    model: str
    gpu: int | None  # CUDA device to pin, None on the CPU
    threads: int  # torch intra-op threads on the CPU
    latency_floor: float  # seconds: every batch takes at least this long
    version: VersionKey = DEFAULT_VERSION  # the version key it holds: an actor says it when claimed


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
    if stay is not None:
        lasting = Lasting(stay, ready, config.version, config.model, config.latency_floor)
        try:
            conn.send(ready)
        except OSError:  # its core died while it loaded: it waits, loaded, for the next
            conn.close()
        lasting.serve(None if conn.closed else conn,
                      lambda msg: run_batch(model, msg, config.latency_floor))
        return
    conn.send(ready)
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the parent is gone
            return
        if isinstance(msg, Stop):
            return
        if isinstance(msg, Run):
            conn.send(run_batch(model, msg, config.latency_floor))


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


__all__ = ["WorkerConfig", "load_worker", "run_batch", "worker_main"]
