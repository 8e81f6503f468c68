"""Ctrl-C before a server handles it: the line the command line writes, and the handler that
ends a start which has begun nothing yet. The standard library alone, so the entry
(`api.__main__.main`) installs the handler before the server's modules load: ~0.1 s of
imports in which Python's own KeyboardInterrupt printed a traceback."""

from __future__ import annotations

import os
import signal
import sys

PROG = "batchgate"


def stop_now(sig: int, frame: object) -> None:
    """Ctrl-C before a server handles it (uvicorn's, from the first step of its task:
    `api.http.DrainingServer.serve`; a cell's supervisor's loop handlers): nothing is
    started yet, so the process ends here with its line. Not a KeyboardInterrupt: one
    raised in a weakref callback or a finalizer (the imports and the building of a server
    run many) is printed and ignored, and the start went on to serve (the start-up's
    Ctrl-C test caught it: 'Exception ignored in ... KeyboardInterrupt', then 'Application
    startup complete'). The signal is ignored first: a second Ctrl-C landing while the line
    is written would write it again, into the middle of the first."""
    signal.signal(sig, signal.SIG_IGN)
    say_stopped(sig)
    sys.stderr.flush()
    os._exit(128 + sig)


def say_stopped(sig: int) -> None:
    print(f"{PROG}: stopped by {signal.Signals(sig).name}", file=sys.stderr)


__all__ = ["PROG", "say_stopped", "stop_now"]
