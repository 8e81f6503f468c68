"""What the Ray pool needs to know, importable without Ray: where the cluster is and what
each worker actor holds there.

Each worker is one actor holding one GPU by default. A CPU-only cluster names a custom
resource instead (`batchgate_slot`: one actor per unit a node declares), which is also how
the tests place exactly one worker per slot on a cluster of CPU nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpu_pool.pool import PoolSettings

_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")


def parse_resources(text: str) -> dict[str, float]:
    """`NAME[=AMOUNT],...` (amount 1 when left out) as a dict; ValueError says what is wrong.

    >>> parse_resources("GPU=1")
    {'GPU': 1.0}
    >>> parse_resources("batchgate_slot, CPU=2")
    {'batchgate_slot': 1.0, 'CPU': 2.0}
    """
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, amount = (s.strip() for s in part.partition("="))
        if not _NAME.match(name):
            raise ValueError(f"resource name {name!r}: letters, digits and _.:- only")
        try:
            value = float(amount) if sep else 1.0
        except ValueError:
            raise ValueError(f"resource {name}: amount {amount!r} is not a number") from None
        if not value > 0:
            raise ValueError(f"resource {name}: amount must be > 0, got {amount}")
        if name in out:
            raise ValueError(f"resource {name} given twice")
        out[name] = value
    if not out:
        raise ValueError("name at least one resource, e.g. GPU=1 or batchgate_slot")
    return out


@dataclass(frozen=True, slots=True)
class RayPoolSettings:
    """The process pool's settings (model, count, latency floor, ready timeout, restart
    backoff), plus where the cluster is and what each actor holds."""

    pool: PoolSettings
    address: str | None = None  # None: start a local Ray for this pool, stopped with it
    resources: dict[str, float] = field(default_factory=lambda: {"GPU": 1.0})
    namespace: str | None = None  # actors are named worker-<id> in it; None: one per pool

    def __post_init__(self) -> None:
        if not self.resources or any(not v > 0 for v in self.resources.values()):
            raise ValueError(f"worker resources must be positive, got {self.resources}")

    def actor_options(self) -> dict[str, object]:
        """`ActorClass.options(...)` arguments: CPU and GPU are Ray's own keywords, every
        other name a custom resource. Nothing unnamed is reserved (Ray's default CPU for
        actors would otherwise decide placement on CPU-only nodes)."""
        return {"num_cpus": self.resources.get("CPU", 0.0),
                "num_gpus": self.resources.get("GPU", 0.0), "resources": self._custom()}

    def local_resources(self) -> dict[str, float]:
        """What a local Ray started for this pool declares beyond its CPUs and GPUs: room for
        every worker in each custom resource."""
        return {k: v * self.pool.workers for k, v in self._custom().items()}

    def _custom(self) -> dict[str, float]:
        return {k: v for k, v in self.resources.items() if k not in ("CPU", "GPU")}

    @property
    def threads(self) -> int:
        """torch threads in each actor: the CPUs it reserves, else one (actors sharing a
        node must not each take every core)."""
        return max(1, int(self.resources.get("CPU", 1.0)))


__all__ = ["RayPoolSettings", "parse_resources"]
