"""What a worker slot holds: one version of one model (`Load`).

A pool slot holds one resident version at a time (a GPU's memory). The version key
(`batcher.VersionKey`) is the core's name for it and opaque here: the pool only stores it, so
that its events can say which version a worker holds. The spec says
what to load, as `--model` takes it. The one-model shorthand is a single version,
`DEFAULT_VERSION`, on every slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from batcher import VersionKey
from gpu_pool.models import default_latency_floor, validate_spec

DEFAULT_VERSION = VersionKey.of("default", "v1")  # the version key of the one model `--model` names


@dataclass(frozen=True, slots=True)
class Load:
    """One model version a slot loads. ValueError on a malformed spec or a negative floor
    (the spec is only checked for its shape: nothing is imported)."""

    version: VersionKey  # the core's name for it, opaque to the pool
    spec: str  # as --model takes it: minilm, sim, module:function
    latency_floor: float | None = None  # None: the pool's floor if set, else the spec's own
    spawn: bool = False  # never forked from the launcher: a fresh interpreter each start
    preload: bool = False  # a user's function the launcher looks up (imports) once for all

    def __post_init__(self) -> None:
        if not self.version:
            raise ValueError("a load needs a version key")
        validate_spec(self.spec)
        if self.latency_floor is not None and self.latency_floor < 0:
            raise ValueError(f"{self.version}: batch latency floor must be >= 0")
        if self.spawn and self.preload:
            raise ValueError(f"{self.version}: a spawned version is not preloaded")

    def floor(self, pool_floor: float | None) -> float:
        """Seconds every batch of this load is padded to: its own floor, else the pool's
        (a `--batch-latency-ms` for every model), else the spec's default."""
        if self.latency_floor is not None:
            return self.latency_floor
        if pool_floor is not None:
            return pool_floor
        return default_latency_floor(self.spec)


__all__ = ["DEFAULT_VERSION", "Load"]
