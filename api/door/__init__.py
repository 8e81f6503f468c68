"""The core's side of the front door: the door (rate limits, admission, the wait, answers),
the keyed path, the service that builds and runs the dispatch core, the status views, the
direct way's local route, the rate limits shared by cells (Redis), and the single process's
composition root.

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
from api.door.door import Core, Door
from api.door.keyed import KeyedPath, is_kept
from api.door.limits import RateLimiter, TokenBucket, pressure_factor
from api.door.local import LocalCore, LocalRoute, SharedLocalRoute
from api.door.service import (
    Service,
    build_pool,
    catalogue_of,
    check_core_settings,
    core_settings,
    hang_settings,
    latency_floor,
)
from api.door.shared_limits import SharedLimits, shared_limits
from api.door.status import Running, StatusView

__all__ = [
    "EXIT_CORE_FAILED",
    "Built",
    "Core",
    "CoreParts",
    "Door",
    "KeyedPath",
    "LocalCore",
    "LocalRoute",
    "RateLimiter",
    "Running",
    "Service",
    "SharedLimits",
    "SharedLocalRoute",
    "StatusView",
    "TokenBucket",
    "build",
    "build_door",
    "build_pool",
    "catalogue_of",
    "check_core_settings",
    "core_settings",
    "create_app",
    "hang_settings",
    "is_kept",
    "latency_floor",
    "pressure_factor",
    "shared_limits",
    "supervised",
]
