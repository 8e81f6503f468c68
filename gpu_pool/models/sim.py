"""The `sim` model: no compute at all, each input reversed.

Its latency comes from the worker's batch-latency floor (100 ms by default for `sim`), so a
sim worker sleeps through the contract's fixed latency without using the CPU and a dozen of
them fit on two cores.
"""

from __future__ import annotations


def reverse_batch(inputs: list[str]) -> list[str]:
    """Return every input reversed; cheap, deterministic and checkable by the client."""
    return [s[::-1] for s in inputs]
