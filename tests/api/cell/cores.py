"""Core processes for the supervisor's tests (importable under spawn): each writes what it
saw to a file beside the link, as `<incarnation>:<event>` lines, and hears its supervisor
on its lifeline's channel as a plain blocking Connection."""

from __future__ import annotations

import os
from pathlib import Path

from api.config import Settings
from api.gateway import Lifeline, Order, Report

FOREVER_S = 600.0


def _note(link: str, lifeline: Lifeline, event: str) -> None:
    with (Path(link).parent / "events").open("a") as out:
        out.write(f"{lifeline.incarnation}:{event}\n")


def _serve(link: str, lifeline: Lifeline) -> None:
    channel = lifeline.channel
    _note(link, lifeline, "up")
    channel.send(Report.UP)
    # bounded: a test that fails leaves nothing for long
    while channel.poll(FOREVER_S):
        message = channel.recv()
        if message is Order.LEAVE:
            _note(link, lifeline, "left")
        elif message is Order.STOP:
            _note(link, lifeline, "drained")
            os._exit(0)


def dies_before_ready(settings: Settings, link: str, cell: str, lifeline: Lifeline) -> None:
    _note(link, lifeline, "died")
    os._exit(3)


def first_dies_once_up(settings: Settings, link: str, cell: str, lifeline: Lifeline) -> None:
    """The first incarnation comes up, then dies; the next ones serve until drained."""
    if lifeline.incarnation == 0:
        _note(link, lifeline, "up")
        lifeline.channel.send(Report.UP)
        _note(link, lifeline, "died")
        os._exit(3)
    _serve(link, lifeline)


def serves(settings: Settings, link: str, cell: str, lifeline: Lifeline) -> None:
    _serve(link, lifeline)
