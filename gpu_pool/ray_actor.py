"""The Ray actor: one worker on one GPU anywhere in the cluster, the process worker's twin.

It loads the model once (`load`, which answers `Ready`), then runs one batch per `run`
call through the same `run_batch` as the process worker, so the contract is checked alike,
and says with each answer how much memory it holds (the pool may be far from its node, so
it cannot read the kernel's figure itself; `gpu_pool.memory`).
It holds no state a restart would lose. `sentinel` never answers while the actor lives: the
pool keeps one call to it pending, and its failure is how a death is seen at once whether
or not a batch is running (actor crash, `ray.kill`, its node lost), as the process pool
watches a process sentinel. Two threads (`max_concurrency=2`): one waits in `sentinel`,
the other runs the calls in turn.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from typing import Any

import ray

from gpu_pool.memory import resident_bytes
from gpu_pool.models import BatchModel
from gpu_pool.protocol import Err, Ok, Ready, Run
from gpu_pool.worker import WorkerConfig, load_worker, run_batch


class BatchActor:
    """Created in a Ray worker process by `spawn_actor`; never directly."""

    def __init__(self, config: WorkerConfig) -> None:
        self._config = config
        self._model: BatchModel | None = None
        self._gone = threading.Event()  # never set: the sentinel waits for the process's end

    def where(self) -> tuple[str, int]:
        """The node and pid this actor was placed on; answers as soon as it is placed."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def load(self) -> Ready:
        # Ray pins the actor's GPUs with CUDA_VISIBLE_DEVICES: device 0 is its own.
        config = replace(self._config, gpu=0 if ray.get_gpu_ids() else None)
        self._model, device = load_worker(config)
        return Ready(pid=os.getpid(), device=device)

    def run(self, msg: Run) -> tuple[Ok | Err, int | None]:
        """The batch's answer, and this process's resident set after it (None: unknown)."""
        if self._model is None:
            raise RuntimeError("run before load")  # the pool never does this
        reply = run_batch(self._model, msg, self._config.latency_floor)
        return reply, resident_bytes(os.getpid())

    def sentinel(self) -> None:
        self._gone.wait()


_Remote = ray.remote(BatchActor)


def spawn_actor(config: WorkerConfig, name: str, namespace: str, **placement: Any) -> Any:
    """Create one incarnation (Ray places it when the cluster has room); its handle.

    Ray restarts nothing and retries nothing: a new incarnation is the pool's decision,
    under a new `WorkerId`, so a batch never runs twice behind the core's back. The handle
    is untyped: its methods are Ray's dynamic attributes.
    """
    return _Remote.options(
        name=name, namespace=namespace, max_restarts=0, max_task_retries=0,
        max_concurrency=2, **placement,
    ).remote(config)


__all__ = ["BatchActor", "spawn_actor"]
