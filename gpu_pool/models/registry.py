"""The built-in models by name, and what a model name tells before anything is loaded.

A name is a key of `BUILTIN_MODELS` or `module:function` naming any batchstring. The parent
asks here whether a model wants a GPU and how long its batches are padded to, without
loading it: what sets one model apart is data in its entry, never its name tested in code.
This module imports nothing but the standard library, so asking costs nothing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

_CONTRACT_LATENCY = 0.100  # seconds a batch takes on the GPU whatever its size (the contract)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A built-in model: how a worker loads it and what the parent may assume of it."""

    name: str
    loader: str  # "module:function" taking the device ("cpu" or "cuda"), imported in the worker
    latency_floor: float  # seconds every batch is padded to unless the user sets one
    uses_gpu: bool  # False: the worker never imports torch and nobody probes for CUDA
    needs: tuple[str, ...] = ()  # modules its loading imports, from `extra` below
    extra: str | None = None  # the pip extra of batchgate that installs them


BUILTIN_MODELS: Mapping[str, ModelEntry] = MappingProxyType({
    entry.name: entry for entry in (
        ModelEntry("minilm", "gpu_pool.models.minilm:load", latency_floor=0.0, uses_gpu=True,
                   needs=("sentence_transformers",), extra="minilm"),
        # No compute: the floor alone gives it the contract's latency, so load tests see
        # a GPU's timing without using the CPU.
        ModelEntry("sim", "gpu_pool.models.sim:load", latency_floor=_CONTRACT_LATENCY,
                   uses_gpu=False),
    )
})


def validate_spec(spec: str) -> str:
    """Return `spec` if it names a built-in model or has the `module:function` shape;
    raise ValueError with a readable message otherwise. Imports nothing."""
    if spec in BUILTIN_MODELS:
        return spec
    module, sep, func = spec.partition(":")
    if not sep or not module or not func or not all(p.isidentifier() for p in module.split(".")):
        names = ", ".join(repr(name) for name in BUILTIN_MODELS)
        raise ValueError(f"model {spec!r}: expected {names} or 'module:function'")
    return spec


def default_latency_floor(spec: str) -> float:
    """Seconds every batch of `spec` is padded to when the user sets no floor: the entry's
    for a built-in model, none for a user's function. Raises ValueError as `validate_spec`."""
    entry = _entry(spec)
    return entry.latency_floor if entry is not None else 0.0


def uses_gpu(spec: str) -> bool:
    """Whether `spec` wants CUDA (worth probing for, worth importing torch for). A user's
    function is assumed to. Raises ValueError as `validate_spec`."""
    entry = _entry(spec)
    return entry.uses_gpu if entry is not None else True


def missing_extra(spec: str) -> str | None:
    """The pip extra that installs what a built-in model needs, if any of it is missing
    here; None otherwise (a user's function brings its own). Imports nothing."""
    entry = _entry(spec)
    if entry is None or entry.extra is None:
        return None
    missing = any(importlib.util.find_spec(module) is None for module in entry.needs)
    return entry.extra if missing else None


def _entry(spec: str) -> ModelEntry | None:
    """The entry of a built-in model; None for a (well-formed) user's function."""
    return BUILTIN_MODELS.get(validate_spec(spec))


__all__ = [
    "BUILTIN_MODELS",
    "ModelEntry",
    "default_latency_floor",
    "missing_extra",
    "uses_gpu",
    "validate_spec",
]
