"""The core's side of the front door: the door (the one way in: a frame's rate step, then
admission; the wait, answers), the keyed path, the rate steps (this cell's own buckets, or
those cells share in Redis), the service that builds and runs the dispatch core (and its
durable layer for kept answers, `api.door.state`), the status views, the direct way's local
route, and the single process's composition root.

It loads the dispatch core (`failover`, `gpu_pool`); a gateway never imports it.
"""

from api.door.app import (
    EXIT_CORE_FAILED,
    Built,
    CoreParts,
    build,
    build_door,
    create_app,
    supervised,
)
from api.door.door import Admitted, Core, Door
from api.door.keyed import KeptRequest, KeyedPath, is_kept
from api.door.limits import Check, Checked, RateLimiter, RateStep, TokenBucket, pressure_factor
from api.door.local import LocalCore, LocalRoute
from api.door.service import (
    Service,
    build_pool,
    catalogue_of,
    check_core_settings,
    check_state,
    core_settings,
    hang_settings,
    latency_floor,
)
from api.door.shared_limits import SharedLimits, rate_step
from api.door.status import Running, StatusView
from api.door.streams import StreamStart

__all__ = [
    "EXIT_CORE_FAILED",
    "Admitted",
    "Built",
    "Check",
    "Checked",
    "Core",
    "CoreParts",
    "Door",
    "KeptRequest",
    "KeyedPath",
    "LocalCore",
    "LocalRoute",
    "RateLimiter",
    "RateStep",
    "Running",
    "Service",
    "SharedLimits",
    "StatusView",
    "StreamStart",
    "TokenBucket",
    "build",
    "build_door",
    "build_pool",
    "catalogue_of",
    "check_core_settings",
    "check_state",
    "core_settings",
    "create_app",
    "hang_settings",
    "is_kept",
    "latency_floor",
    "pressure_factor",
    "rate_step",
    "supervised",
]
