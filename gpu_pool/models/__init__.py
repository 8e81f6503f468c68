"""Models a worker can run: the real `minilm`, the latency-only `sim`, or `module:function`.

A model is any callable honouring the contract `batchstring(list[str]) -> list[str]`.
Loading happens inside the worker process, never in the parent, so torch is imported
only where it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol


class BatchModel(Protocol):
    """The contract: 1..100 inputs, exactly one output string per input, in order."""

    def __call__(self, inputs: list[str], /) -> list[str]: ...


BUILTIN_MODELS = ("minilm", "sim")


def validate_spec(spec: str) -> str:
    """Check a model name without importing it; raise ValueError with a readable message."""
    if spec in BUILTIN_MODELS:
        return spec
    module, sep, func = spec.partition(":")
    if not sep or not module or not func or not all(p.isidentifier() for p in module.split(".")):
        raise ValueError(
            f"model {spec!r}: expected 'minilm', 'sim' or 'module:function'"
        )
    return spec


def load_model(spec: str, device: str) -> BatchModel:
    """Load the model named by `spec` on `device` ('cpu' or 'cuda')."""
    if spec == "sim":
        from gpu_pool.models.sim import reverse_batch

        return reverse_batch
    if spec == "minilm":
        from gpu_pool.models.minilm import load

        return load(device)
    module_name, _, func_name = validate_spec(spec).partition(":")
    obj: object = getattr(importlib.import_module(module_name), func_name)
    if not callable(obj):
        raise TypeError(f"model {spec!r} is not callable")
    model: Callable[[list[str]], list[str]] = obj
    return model


__all__ = ["BUILTIN_MODELS", "BatchModel", "load_model", "validate_spec"]
