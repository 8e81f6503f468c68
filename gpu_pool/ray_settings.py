"""What the Ray pool needs to know, importable without Ray: where the cluster is and what
each worker actor holds there.

Each worker is one actor holding one GPU by default. A CPU-only cluster names a custom
resource instead (`batchgate_slot`: one actor per unit a node declares), which is also how
the tests place exactly one worker per slot on a cluster of CPU nodes.

In a cell whose core is restarted by a supervisor, the actors outlive the core: they are
named after the cell (`CellIdentity`), so the next core finds them and attaches. One that
no core claims for `orphan_after` seconds (the whole cell is gone) ends itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_pool.load import Load
from gpu_pool.settings import PoolSettings

_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
CELL_ID_ENV = "BATCHGATE_CELL_ID"  # set by the cell's supervisor on each core it starts
INCARNATION_ENV = "BATCHGATE_CORE_INCARNATION"  # 0, 1, 2, ... across that cell's cores


@dataclass(frozen=True, slots=True)
class CellIdentity:
    """Which cell a core serves, stable across the core's restarts, and which of its
    cores this is: a later one takes actors over from an earlier one, never the reverse."""

    cell: str
    incarnation: int = 0
    workers: str | None = None  # where its process workers wait for the next core

    def __post_init__(self) -> None:
        if not _NAME.match(self.cell):
            raise ValueError(f"cell id {self.cell!r}: letters, digits and _.:- only")
        if self.incarnation < 0:
            raise ValueError(f"core incarnation must be >= 0, got {self.incarnation}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CellIdentity | None:
        """The identity a supervisor hands its core in `env`; None outside a cell."""
        cell = env.get(CELL_ID_ENV)
        if not cell:
            return None
        text = env.get(INCARNATION_ENV, "0")
        try:
            return cls(cell, int(text))
        except ValueError as exc:
            raise ValueError(f"{CELL_ID_ENV}={cell!r} {INCARNATION_ENV}={text!r}: {exc}") from None

    @property
    def namespace(self) -> str:
        return f"batchgate-cell-{self.cell}"


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
    """The process pool's settings (loads, count, latency floor, ready timeout, restart
    backoff), plus where the cluster is and what each actor holds."""

    pool: PoolSettings
    address: str | None = None  # None: start a local Ray for this pool, stopped with it
    resources: dict[str, float] = field(default_factory=lambda: {"GPU": 1.0})
    namespace: str | None = None  # actors are named in it; None: the cell's, else one per pool
    cell: CellIdentity | None = None  # None: the actors die with the pool's process
    orphan_after: float = 120.0  # a cell's actor that no core has renewed this long ends
    # Versions an earlier core's actor may hold and still be claimed with, beyond the slots'
    # loads (the catalogue's); one holding any other is replaced.
    claimable: tuple[Load, ...] = ()
    max_workers: int | None = None  # the most the pool may grow to (None: its size)

    def __post_init__(self) -> None:
        if not self.resources or any(not v > 0 for v in self.resources.values()):
            raise ValueError(f"worker resources must be positive, got {self.resources}")
        if not self.orphan_after > 0:
            raise ValueError(f"orphan_after must be > 0, got {self.orphan_after}")

    def actor_options(self) -> dict[str, object]:
        """`ActorClass.options(...)` arguments: CPU and GPU are Ray's own keywords, every
        other name a custom resource. Nothing unnamed is reserved (Ray's default CPU for
        actors would otherwise decide placement on CPU-only nodes)."""
        return {"num_cpus": self.resources.get("CPU", 0.0),
                "num_gpus": self.resources.get("GPU", 0.0), "resources": self._custom()}

    def local_resources(self) -> dict[str, float]:
        """What a local Ray started for this pool declares beyond its CPUs and GPUs: room for
        every worker it may hold in each custom resource."""
        most = max(self.pool.workers, self.max_workers or 0)
        return {k: v * most for k, v in self._custom().items()}

    def _custom(self) -> dict[str, float]:
        return {k: v for k, v in self.resources.items() if k not in ("CPU", "GPU")}

    @property
    def threads(self) -> int:
        """torch threads in each actor: the CPUs it reserves, else one (actors sharing a
        node must not each take every core)."""
        return max(1, int(self.resources.get("CPU", 1.0)))


__all__ = ["CELL_ID_ENV", "INCARNATION_ENV", "CellIdentity", "RayPoolSettings",
           "parse_resources"]
