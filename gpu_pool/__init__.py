"""The GPU worker pool: one process per GPU running `batchstring` one batch at a time, forked
from a launcher that preloads (else spawned), parked rather than ended when let go.

Offers the pool seam (`Pool`, `PoolEvents`; the scaling the core decides included: `add`,
`retire`, `cancel_start`), the wire messages, the process pool (`WorkerPool`, its parked
workers in `gpu_pool.parking`), its settings, what a slot holds (`Load`: one model version),
the slot states both pools share, the model registry (what a model name means, asked without
loading it) and the model loader.
The Ray pool's settings are here too; the Ray pool itself is `gpu_pool.ray_pool.RayPool`,
imported only where Ray is wanted (it is an optional dependency, and importing `gpu_pool`
must not import it), its parked actors in `gpu_pool.ray_parking`.
"""

from gpu_pool.attach import listening, stat_of
from gpu_pool.load import DEFAULT_VERSION, Load
from gpu_pool.models import (
    BUILTIN_MODELS,
    BatchModel,
    ModelEntry,
    default_latency_floor,
    load_model,
    missing_extra,
    uses_gpu,
    validate_spec,
)
from gpu_pool.pool import WorkerPool
from gpu_pool.protocol import (
    BatchId,
    Err,
    Ok,
    Origin,
    Ready,
    Run,
    StartId,
    StartKind,
    Stop,
    WorkerId,
)
from gpu_pool.ray_settings import (
    CELL_ID_ENV,
    INCARNATION_ENV,
    CellIdentity,
    RayPoolSettings,
    parse_resources,
)
from gpu_pool.salvage import Salvage
from gpu_pool.seam import Pool, PoolEvents, WorkerInfo
from gpu_pool.settings import PoolSettings
from gpu_pool.slots import SlotState
from gpu_pool.worker import WorkerConfig, load_worker, run_batch, worker_main

__all__ = [
    "BUILTIN_MODELS",
    "CELL_ID_ENV",
    "DEFAULT_VERSION",
    "INCARNATION_ENV",
    "BatchId",
    "BatchModel",
    "CellIdentity",
    "Err",
    "Load",
    "ModelEntry",
    "Ok",
    "Origin",
    "Pool",
    "PoolEvents",
    "PoolSettings",
    "RayPoolSettings",
    "Ready",
    "Run",
    "Salvage",
    "SlotState",
    "StartId",
    "StartKind",
    "Stop",
    "WorkerConfig",
    "WorkerId",
    "WorkerInfo",
    "WorkerPool",
    "default_latency_floor",
    "listening",
    "load_model",
    "load_worker",
    "missing_extra",
    "parse_resources",
    "run_batch",
    "stat_of",
    "uses_gpu",
    "validate_spec",
    "worker_main",
]
