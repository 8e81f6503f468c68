"""A model whose import kills its worker, as a version whose weights are gone or whose code
crashes at load does: served as `tests.models_broken:never`, every load dies before the
worker says it is ready. Never import this module from a test: it ends the process.
"""

from __future__ import annotations

import os
import sys

sys.stderr.write("tests.models_broken: the load dies here\n")
sys.stderr.flush()
os._exit(3)


def never(inputs: list[str]) -> list[str]:  # pragma: no cover - the import never returns
    return inputs
