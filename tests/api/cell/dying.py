"""A gateway process that dies at once: spawned by the supervisor's tests."""

from __future__ import annotations

import os
import socket

from api.config import Settings
from api.gateway import Lifeline


def exit_at_once(settings: Settings, link: str, sock: socket.socket, slot: int,
                 lifeline: Lifeline) -> None:
    os._exit(3)
