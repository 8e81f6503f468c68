"""Core processes for the supervisor's tests (importable under spawn): each writes what it
saw to a file beside the status file, as `<incarnation>:<event>` lines."""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType

from api.cell import DRAIN_SIGNAL, LEAVE_SIGNAL
from api.config import Settings
from gpu_pool import INCARNATION_ENV

FOREVER_S = 600.0


def _note(status: str, event: str) -> None:
    with (Path(status).parent / "events").open("a") as out:
        out.write(f"{os.environ.get(INCARNATION_ENV)}:{event}\n")


def _serve(status: str, ready: Connection) -> None:
    def left(sig: int, frame: FrameType | None) -> None:
        _note(status, "left")

    def drained(sig: int, frame: FrameType | None) -> None:
        _note(status, "drained")
        os._exit(0)

    signal.signal(LEAVE_SIGNAL, left)
    signal.signal(DRAIN_SIGNAL, drained)
    _note(status, "up")
    ready.send("ready")
    deadline = time.monotonic() + FOREVER_S
    while time.monotonic() < deadline:  # bounded: a test that fails leaves nothing for long
        signal.pause()


def dies_before_ready(settings: Settings, gpus: int, link: str, status: str,
                      ready: Connection) -> None:
    _note(status, "died")
    os._exit(3)


def first_dies_once_up(settings: Settings, gpus: int, link: str, status: str,
                       ready: Connection) -> None:
    """The first incarnation comes up, then dies; the next ones serve until drained."""
    if os.environ.get(INCARNATION_ENV) == "0":
        signal.signal(LEAVE_SIGNAL, signal.SIG_IGN)  # as a core's loop takes it before it is up
        _note(status, "up")
        ready.send("ready")
        _note(status, "died")
        os._exit(3)
    _serve(status, ready)


def serves(settings: Settings, gpus: int, link: str, status: str, ready: Connection) -> None:
    _serve(status, ready)
