"""Loading a model by name, in the process that runs it.

A model is any callable honouring the contract `batchstring(list[str]) -> list[str]`. A
built-in model is made by its entry's loader (given the device, then the choices its spec
picks), a user's `module:function` is the function itself. This runs inside the worker,
never in the parent, so torch is imported only where the model runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol

from gpu_pool.models.registry import parse_spec


class BatchModel(Protocol):
    """The contract: 1..100 inputs, exactly one output string per input, in order."""

    def __call__(self, inputs: list[str], /) -> list[str]: ...


def load_model(spec: str, device: str) -> BatchModel:
    """Load the model named by `spec` on `device` ('cpu' or 'cuda').

    Raises ValueError for a malformed name, ImportError or AttributeError for one that
    names nothing, TypeError for one that names something other than a model.
    """
    entry, choices = parse_spec(spec)
    if entry is None:
        return _as_model(spec, _held[spec] if spec in _held else _resolve(spec))
    loader = _resolve(entry.loader)
    if not callable(loader):
        raise TypeError(f"model {spec!r}: loader {entry.loader} is not callable")
    return _as_model(spec, loader(device, *choices))


def preload(spec: str) -> bool:
    """Hold in this process what every worker of `spec` would load (a pool's launcher calls
    it before it forks them); whether there was anything to hold. A built-in model holds
    what its entry's `preload` does; a user's function is looked up (its module imported,
    whatever that loads), which a pool asks only of a version that opted in: an import that
    kills its process must not kill the launcher."""
    entry, _ = parse_spec(spec)
    if entry is None:
        _held[spec] = _resolve(spec)
        return True
    if entry.preload is None:
        return False
    hold = _resolve(entry.preload)
    if not callable(hold):
        raise TypeError(f"model {spec!r}: preload {entry.preload} is not callable")
    hold()
    return True


_held: dict[str, object] = {}  # users' functions a launcher looked up before forking


def _resolve(target: str) -> object:
    """The object `module:name` names, importing its module."""
    module_name, _, name = target.partition(":")
    obj: object = getattr(importlib.import_module(module_name), name)
    return obj


def _as_model(spec: str, obj: object) -> BatchModel:
    if not callable(obj):
        raise TypeError(f"model {spec!r} is not callable")
    model: Callable[[list[str]], list[str]] = obj
    return model


__all__ = ["BatchModel", "load_model", "preload"]
