"""A gateway process that counts one request in the cell's metrics folder, then dies."""

from __future__ import annotations

import os
import socket

from prometheus_client import Counter, Gauge, Histogram

from api.config import Settings
from api.gateway import Lifeline


def count_and_exit(settings: Settings, link: str, sock: socket.socket, slot: int,
                   lifeline: Lifeline) -> None:
    # Created here, not at import: the folder comes from the environment the test set.
    Counter("served", "requests served").inc()
    Histogram("took_seconds", "time per request").observe(0.01)
    Gauge("open", "connections open", multiprocess_mode="livesum").set(1)
    os._exit(3)
