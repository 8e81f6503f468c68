"""Two versions of one test model, answering differently so a test tells which one ran,
importable by spawned workers (and Ray actors) as `tests.models_versions:<name>`."""

from __future__ import annotations


def v1(inputs: list[str]) -> list[str]:
    """Version one: each input reversed, marked `v1:`."""
    return [f"v1:{s[::-1]}" for s in inputs]


def v2(inputs: list[str]) -> list[str]:
    """Version two: each input upper-cased, marked `v2:`."""
    return [f"v2:{s.upper()}" for s in inputs]
