"""The built-in models by name, and what a model name tells before anything is loaded.

A name is a key of `BUILTIN_MODELS`, such a key with the choices its entry offers
(`minilm-guard:violence,weapons`), or `module:function` naming any batchstring. The parent
asks here whether a model wants a GPU and how long its batches are padded to, without
loading it: what sets one model apart is data in its entry, never its name tested in code.
This module imports nothing but the standard library and data, so asking costs nothing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_pool.models.guard_topics import TOPICS

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
    # What `name:a,b` may pick, passed to the loader after the device; empty: the name takes
    # nothing after it. Such a name is no module name, so `name:...` is never a function.
    choices: tuple[str, ...] = ()
    # "module:function" a pool's launcher calls once, with no argument, before it forks
    # workers of this model: it holds what every worker would load (`gpu_pool.launcher`).
    preload: str | None = None


BUILTIN_MODELS: Mapping[str, ModelEntry] = MappingProxyType({
    entry.name: entry for entry in (
        ModelEntry("minilm", "gpu_pool.models.minilm:load", latency_floor=0.0, uses_gpu=True,
                   needs=("sentence_transformers",), extra="minilm",
                   preload="gpu_pool.models.minilm:preload"),
        ModelEntry("minilm-guard", "gpu_pool.models.minilm_guard:load", latency_floor=0.0,
                   uses_gpu=True, needs=("sentence_transformers",), extra="minilm",
                   choices=tuple(TOPICS), preload="gpu_pool.models.minilm:preload"),
        # No compute: the floor alone gives it the contract's latency, so load tests see
        # a GPU's timing without using the CPU.
        ModelEntry("sim", "gpu_pool.models.sim:load", latency_floor=_CONTRACT_LATENCY,
                   uses_gpu=False),
    )
})


def validate_spec(spec: str) -> str:
    """Return `spec` if it names a built-in model (with choices its entry offers) or has the
    `module:function` shape; raise ValueError with a readable message otherwise. Imports
    nothing."""
    parse_spec(spec)
    return spec


def parse_spec(spec: str) -> tuple[ModelEntry | None, tuple[str, ...]]:
    """The built-in entry `spec` names (None for a user's function) and the choices it picks,
    in its order. Raises ValueError as `validate_spec`."""
    if spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[spec], ()
    name, sep, rest = spec.partition(":")
    entry = BUILTIN_MODELS.get(name)
    if entry is not None and entry.choices:
        return entry, _choices(spec, entry, rest)
    if not sep or not name or not rest or not all(p.isidentifier() for p in name.split(".")):
        names = ", ".join(repr(key) for key in BUILTIN_MODELS)
        raise ValueError(f"model {spec!r}: expected {names} or 'module:function'")
    return None, ()


def _choices(spec: str, entry: ModelEntry, text: str) -> tuple[str, ...]:
    picked = tuple(text.split(","))
    unknown = [c for c in picked if c not in entry.choices]
    if unknown or len(set(picked)) != len(picked):
        offered = ",".join(entry.choices)
        what = f"unknown {unknown[0]!r}" if unknown else "a choice named twice"
        raise ValueError(f"model {spec!r}: {what}; {entry.name} takes "
                         f"{entry.name}:<one or more of {offered}, comma-separated>")
    return picked


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
    return parse_spec(spec)[0]


__all__ = [
    "BUILTIN_MODELS",
    "ModelEntry",
    "default_latency_floor",
    "missing_extra",
    "parse_spec",
    "uses_gpu",
    "validate_spec",
]
