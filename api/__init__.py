"""The HTTP front door: settings, keys, routes, metrics and the `batchgate` command."""

from api.app import create_app
from api.auth import KeyRing, Principal, Unauthorized, load_keys
from api.cli import main
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
    "main",
]
