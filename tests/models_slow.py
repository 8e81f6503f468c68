"""`tests.models_versions`' second version behind a slow load: importing this module takes
`LOAD_S`, as loading a real model's weights does, so a test can tell a request that waited
for the load from one that did not."""

from __future__ import annotations

import time

from tests.models_versions import v2

LOAD_S = 3.0

time.sleep(LOAD_S)  # the load itself: every process that imports this pays it once

__all__ = ["LOAD_S", "v2"]
