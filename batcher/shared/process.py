"""This process's own settings on Linux (prctl(2)): its name, and the signal it gets when its
parent dies. A cell's children and a pool's launcher both need them; elsewhere they do
nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


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


__all__ = ["PR_SET_NAME", "PR_SET_PDEATHSIG", "die_with_parent", "name_process", "prctl"]
