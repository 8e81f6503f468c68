"""A model for the attach tests whose batches can be made to hang, or to run long, telling
the test when they have begun."""

from __future__ import annotations

import time
from pathlib import Path

STALE_BATCH_S = 2.0  # how long a SLOW batch runs once it has begun


def marking(inputs: list[str]) -> list[str]:
    """Reverse each input; one written `HANG:<path>` or `SLOW:<path>` first creates the
    file at `path` (the batch has begun), then hangs, or runs `STALE_BATCH_S` more."""
    for text in inputs:
        kind, _, path = text.partition(":")
        if kind in ("HANG", "SLOW"):
            Path(path).touch()
            time.sleep(3600 if kind == "HANG" else STALE_BATCH_S)
    return [s[::-1] for s in inputs]
