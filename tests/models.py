"""Test models with real behaviour, importable by spawned workers as `tests.models:<name>`."""

from __future__ import annotations

import os
import sys
import time


def poison(inputs: list[str]) -> list[str]:
    """Raise on any batch holding an input with POISON in it; reverse otherwise."""
    bad = [s for s in inputs if "POISON" in s]
    if bad:
        raise ValueError(f"cannot handle {bad[0]!r}")
    return [s[::-1] for s in inputs]


def leaky_poison(inputs: list[str]) -> list[str]:
    """A careless model: raises on any batch holding an input that starts with "boom", and
    quotes the whole batch (everyone's inputs) in its message."""
    if any(s.startswith("boom") for s in inputs):
        raise ValueError(f"cannot handle batch {inputs!r}")
    return [s[::-1] for s in inputs]


def counting(inputs: list[str]) -> list[str]:
    """Append one line per input to $BATCHGATE_TEST_COUNT_FILE, so a test counts model runs."""
    path = os.environ["BATCHGATE_TEST_COUNT_FILE"]
    with open(path, "a") as f:
        f.writelines(s + "\n" for s in inputs)
    return [s[::-1] for s in inputs]


def crash_on_marker(inputs: list[str]) -> list[str]:
    """Die like a segfaulting CUDA kernel when an input says CRASH."""
    if any("CRASH" in s for s in inputs):
        os._exit(137)
    return [s[::-1] for s in inputs]


def hang_on_marker(inputs: list[str]) -> list[str]:
    """Never return when an input says HANG (a wedged GPU)."""
    if any("HANG" in s for s in inputs):
        time.sleep(3600)
    return [s[::-1] for s in inputs]


def short_by_one(inputs: list[str]) -> list[str]:
    """Break the contract: one output too few."""
    return [s[::-1] for s in inputs][1:]


def slow_poison(inputs: list[str]) -> list[str]:
    """`poison` that takes 0.3 s to raise: long enough for a client to leave mid-batch."""
    if any("POISON" in s for s in inputs):
        time.sleep(0.3)
    return poison(inputs)


def exits(inputs: list[str]) -> list[str]:
    """A careless model: calls sys.exit on an input that says EXIT."""
    if any("EXIT" in s for s in inputs):
        sys.exit(3)
    return [s[::-1] for s in inputs]


def interrupts(inputs: list[str]) -> list[str]:
    """Raises KeyboardInterrupt on an input that says INTERRUPT."""
    if any("INTERRUPT" in s for s in inputs):
        raise KeyboardInterrupt
    return [s[::-1] for s in inputs]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this error cannot say what it is")


def bad_message(inputs: list[str]) -> list[str]:
    """Raises an exception whose str() itself raises, on an input that says BAD."""
    if any("BAD" in s for s in inputs):
        raise _Unprintable
    return [s[::-1] for s in inputs]


# -- the hostile models of issue 28: each misbehaves on a marker any client can send --------
_LEAKED: list[bytes] = []


def killer(inputs: list[str]) -> list[str]:
    """Dies (`os._exit`) on any batch holding an input with "kill" in it."""
    if any("kill" in s for s in inputs):
        os._exit(137)
    return [s[::-1] for s in inputs]


def hang(inputs: list[str]) -> list[str]:
    """Sleeps an hour on any batch holding an input with "hang" in it."""
    if any("hang" in s for s in inputs):
        time.sleep(3600)
    return [s[::-1] for s in inputs]


def slowlong(inputs: list[str]) -> list[str]:
    """Takes 8 s per MB of input (0.1 s at least): long contexts cost real time."""
    time.sleep(max(0.1, 8.0 * sum(map(len, inputs)) / 1e6))
    return [s[::-1] for s in inputs]


def leak(inputs: list[str]) -> list[str]:
    """Keeps 20 MB per batch for ever, touched so that it is resident."""
    _LEAKED.append(b"\x01" * (20 << 20))
    return [s[::-1] for s in inputs]
