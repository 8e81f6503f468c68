"""`tests.ray.models:marking` as a model whose load (this module's import, in the actor)
takes `SLOW_LOAD_S`, as a real model's does."""

from __future__ import annotations

import time

from tests.ray.lab import SLOW_LOAD_S
from tests.ray.models import marking

time.sleep(SLOW_LOAD_S)

__all__ = ["marking"]
