"""Models a worker can run: the real `minilm`, the guard `minilm-guard` on its embeddings,
the latency-only `sim`, or `module:function`.

`registry` tells what a name means without loading anything (the parent's questions);
`loading` loads it, inside the worker; `moving` moves its weights off its device and back
(a parked worker).
"""

from gpu_pool.models.loading import BatchModel, load_model, preload
from gpu_pool.models.moving import HOST, move
from gpu_pool.models.registry import (
    BUILTIN_MODELS,
    ModelEntry,
    default_latency_floor,
    missing_extra,
    parse_spec,
    uses_gpu,
    validate_spec,
)

__all__ = [
    "BUILTIN_MODELS",
    "HOST",
    "BatchModel",
    "ModelEntry",
    "default_latency_floor",
    "load_model",
    "missing_extra",
    "move",
    "parse_spec",
    "preload",
    "uses_gpu",
    "validate_spec",
]
