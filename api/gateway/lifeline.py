"""A cell's child processes end with their supervisor.

The supervisor holds nothing a client needs, but it is the only one that restarts a dead
core or gateway and stops them all: a child it leaves behind (the supervisor SIGKILLed, or
by the OOM killer) would hold the listening port, or the GPUs, for nobody, and a server
started again could not bind. Linux sends a child the signal asked for here when its parent
dies (`PR_SET_PDEATHSIG`); elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


SUPERVISOR_PID = "BATCHGATE_SUPERVISOR_PID"  # set by the supervisor for its children


def die_with_supervisor() -> None:
    """End (SIGKILL) with the supervisor named by `SUPERVISOR_PID`, if one is."""
    pid = os.environ.get(SUPERVISOR_PID, "")
    if pid.isdigit():
        die_with_parent(int(pid))


def name_process(name: str) -> None:
    """What `ps -o comm`, `top` and /proc/PID/comm show for this process (15 bytes at
    most): a cell's processes are otherwise all "python"."""
    prctl(PR_SET_NAME, name.encode()[:15])


def prctl(option: int, arg: int | bytes) -> bool:
    """Linux's prctl(2) with one argument; whether it succeeded (False where there is no C
    library to ask)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    return int(ctypes.CDLL(name, use_errno=True).prctl(option, arg, 0, 0, 0)) == 0


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have `sig` sent to this process when `parent` (its parent now) dies. If the parent is
    already gone (it died before this ran), the signal is raised at once."""
    if not prctl(PR_SET_PDEATHSIG, sig):
        return
    if os.getppid() != parent:
        signal.raise_signal(sig)


__all__ = ["SUPERVISOR_PID", "die_with_parent", "die_with_supervisor", "name_process", "prctl"]
