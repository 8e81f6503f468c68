"""`tests.models_versions:v2` behind a load that takes `LOAD_S` of wall time, as a worker that
reads weights does: every process that imports this module pays it once. For tests whose
refused deadline must be shorter than any load (a user's model without torch loads in a
tenth of a second). Serve it as `tests.models_slow_load:v2`; importing it from a test pays
the load, so tests name it by its spec only.
"""

from __future__ import annotations

import time

from tests.models_versions import v2

LOAD_S = 1.0
time.sleep(LOAD_S)

__all__ = ["v2"]
