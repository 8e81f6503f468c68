"""`tests.models_broken`, but each load dies only after `LOAD_S` of wall time, as a large
model's load that fails at its end: a test sees one load fail long before the third. Never
import this module from a test: it ends the process.
"""

from __future__ import annotations

import os
import sys
import time

LOAD_S = 3.0
time.sleep(LOAD_S)
sys.stderr.write("tests.models_broken_slow: the load dies here\n")
sys.stderr.flush()
os._exit(3)


def never(inputs: list[str]) -> list[str]:  # pragma: no cover - the import never returns
    return inputs
