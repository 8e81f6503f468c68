"""The HTTP front door: settings, keys, routes, metrics, the core's door and its link to
gateway processes. The `batchgate` command is `api.cli:main` (not imported here, so that
`python -m api.cli` and the gateways it spawns load it once)."""

from api.app import create_app
from api.auth import KeyRing, Principal, Unauthorized, load_keys
from api.errors import ApiError
from api.metrics import Metrics
from api.service import Service
from api.settings import Settings

__all__ = [
    "ApiError",
    "KeyRing",
    "Metrics",
    "Principal",
    "Service",
    "Settings",
    "Unauthorized",
    "create_app",
    "load_keys",
]
