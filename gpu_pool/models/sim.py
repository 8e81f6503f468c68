"""The `sim` model: no compute at all, each input reversed.

Its latency comes from the worker's batch-latency floor (its registry entry's, unless the
user sets one), so a sim worker sleeps through the contract's fixed latency without using
the CPU and a dozen of them fit on two cores.
"""

from __future__ import annotations

from collections.abc import Callable


def reverse_batch(inputs: list[str]) -> list[str]:
    """Return every input reversed; cheap, deterministic and checkable by the client."""
    return [s[::-1] for s in inputs]


def load(device: str) -> Callable[[list[str]], list[str]]:
    """The registry's loader: nothing to load, and the same on any device."""
    return reverse_batch
