"""A test model that loads slowly, standing in for a GPU's minutes of start-up in the scaling
tests: `tests.models_scaling:reverse`, served with `--batch-latency-ms 100` (its batches then
take the contract's fixed latency without using the CPU, as `sim`'s do).

Looking the model up is its load: every worker process that resolves `reverse` pays `LOAD_S`
once, as a worker that loads weights does, so a worker added while serving comes up that long
after it was asked for. While the file named by `$BATCHGATE_TEST_REFUSE_LOAD` exists, the load
raises instead (a lost device: the model cannot load), so a test makes restarts fail and, by
removing the file, succeed again. The load is a module `__getattr__` (PEP 562), not the
import, so that a test reads `LOAD_S` and `SPEC` from here without paying it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

LOAD_S = 5.0
REFUSE_ENV = "BATCHGATE_TEST_REFUSE_LOAD"  # names the marker file; unset: never refuses
SPEC = "tests.models_scaling:reverse"
BATCH_MS = 100  # --batch-latency-ms to serve it with


class LoadRefused(RuntimeError):
    """Raised by the load while the marker file exists."""


def refused() -> bool:
    """Whether a load now would be refused (the marker file exists)."""
    marker = os.environ.get(REFUSE_ENV)
    return marker is not None and Path(marker).exists()


def _reverse(inputs: list[str]) -> list[str]:
    """Each input reversed, as `sim` answers, so the load generator checks every answer."""
    return [s[::-1] for s in inputs]


def __getattr__(name: str) -> Callable[[list[str]], list[str]]:
    if name != "reverse":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if refused():
        raise LoadRefused(f"{os.environ[REFUSE_ENV]} exists: this model refuses to load")
    time.sleep(LOAD_S)  # the load itself
    globals()["reverse"] = _reverse  # loaded: a second look-up in this process is free
    return _reverse


__all__ = ["BATCH_MS", "LOAD_S", "REFUSE_ENV", "SPEC", "LoadRefused", "refused"]
