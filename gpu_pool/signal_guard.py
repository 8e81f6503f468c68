"""Keep a library from changing how this process handles signals.

Ray's driver, when it connects, installs a failure handler of its own (absl's) for SIGTERM,
SIGSEGV, SIGABRT and others, at the C level: on SIGTERM it prints "SIGTERM received", passes
the signal on and arms an alarm that aborts the process (SIGABRT) three seconds later, in
the middle of the server's drain. Whoever owns the process decides what its signals do: the
single-process server drains on SIGTERM, a cell's core ignores it. So the dispositions are
saved before such a call and put back after it, byte for byte through `sigaction(2)` (which
any thread may call, and which also keeps handlers not set through Python's `signal`
module, faulthandler's). Where `sigaction` cannot be reached (not POSIX), nothing is done.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
from collections.abc import Iterator

_ACTION_BYTES = 512  # more than any platform's `struct sigaction`; only copied, never read


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sigaction  # noqa: B018 - present, or AttributeError
    except (OSError, AttributeError):
        return None
    return libc


def _save(libc: ctypes.CDLL) -> dict[int, ctypes.Array[ctypes.c_char]]:
    saved = {}
    for sig in range(1, signal.NSIG):
        action = ctypes.create_string_buffer(_ACTION_BYTES)
        if libc.sigaction(sig, None, action) == 0:  # glibc's own (32, 33) refuse: left alone
            saved[sig] = action
    return saved


@contextlib.contextmanager
def signals_kept() -> Iterator[None]:
    """Every signal's disposition after the block is what it was before it (SIGKILL and
    SIGSTOP cannot change). In the main thread, Python's own handler table too."""
    libc = _libc()
    saved = _save(libc) if libc is not None else {}
    python = {}
    if threading.current_thread() is threading.main_thread():
        python = {s: signal.getsignal(s) for s in signal.valid_signals()}
    try:
        yield
    finally:
        for sig, handler in python.items():
            if handler is not None:  # None: set outside Python, restored below
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, handler)
        if libc is not None:
            for number, action in saved.items():
                libc.sigaction(number, action, None)


__all__ = ["signals_kept"]
