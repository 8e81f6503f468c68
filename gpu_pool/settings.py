"""The process pool's settings: what each slot starts with, how dead workers come back, and
where a cell's workers wait for the next core (`attach`). The Ray pool's build on them
(`gpu_pool.ray_settings`)."""

from __future__ import annotations

from dataclasses import dataclass

from batcher.shared import Backoff
from gpu_pool.load import DEFAULT_VERSION, Load
from gpu_pool.memory import MemoryBound


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """`model`: the one model's spec, every slot's when `loads` is empty. `loads`: the
    version each slot starts with, one per worker. `latency_floor`: seconds every batch is
    padded to, for every load naming no floor of its own; None: each spec's default."""

    model: str
    workers: int
    latency_floor: float | None = None
    gpus: int = 0  # CUDA devices present; the first workers are pinned round-robin
    ready_timeout: float = 300.0
    restart_backoff: float = 0.5
    restart_backoff_max: float = 30.0
    stable_after: float = 30.0  # a worker alive this long resets its slot's backoff
    restart: bool = True
    max_rss_mb: int | None = None  # a worker holding more is replaced between batches
    loads: tuple[Load, ...] = ()  # each slot's first version; (): `model` on every slot
    attach: str | None = None  # a cell's workers folder: they outlive the core there
    claimable: tuple[Load, ...] = ()  # what else a worker found there may hold
    otlp_endpoint: str | None = None  # where workers send their spans; None: tracing off
    launcher: bool = True  # workers forked from a launcher that preloads (`gpu_pool.launcher`)
    parked_max: int = 0  # workers let go that park instead of exiting; 0: none parks
    parked_ram_mb: int | None = None  # host memory the parked may hold in all; None: no bound

    @property
    def memory(self) -> MemoryBound:
        return MemoryBound(self.max_rss_mb)

    @property
    def backoff(self) -> Backoff:
        """When a dead slot starts again, in every pool."""
        return Backoff(first=self.restart_backoff, cap=self.restart_backoff_max,
                       stable_after=self.stable_after)

    def slot_loads(self) -> tuple[Load, ...]:
        """The version each slot starts with."""
        return self.loads or (Load(DEFAULT_VERSION, self.model),) * self.workers

    def floor(self, load: Load) -> float:
        """Seconds every batch of `load` is padded to."""
        return load.floor(self.latency_floor)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.latency_floor is not None and self.latency_floor < 0:
            raise ValueError("batch latency floor must be >= 0")
        if self.loads and len(self.loads) != self.workers:
            raise ValueError(f"{len(self.loads)} loads for {self.workers} workers: name one "
                             "per worker")
        MemoryBound(self.max_rss_mb)  # raises on a bound under 1 MiB
        if self.parked_max < 0:
            raise ValueError(f"parked_max must be >= 0, got {self.parked_max}")
        if self.parked_ram_mb is not None and self.parked_ram_mb < 1:
            raise ValueError(f"parked_ram_mb must be >= 1, got {self.parked_ram_mb}")


__all__ = ["PoolSettings"]
