"""Every knob of the service in one frozen record, validated with a readable message.

Built once, at the edge (`api/cli.py` reads flags and `BATCHGATE_*` variables); packages
below `api/` receive the parts they need and never read the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batcher import MAX_BATCH
from gpu_pool import validate_spec


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "minilm"
    workers: int = 1
    max_batch: int = MAX_BATCH
    max_wait_ms: float = 50.0
    idle_trigger: bool = True
    keys: Path | None = None
    admin_key: str | None = None
    batch_latency_ms: float | None = None  # None: 100 for sim, 0 otherwise
    max_attempts: int = 3
    hang_timeout_ms: float | None = None  # None: max(10 x latency floor, 5 s)
    restart: bool = True
    ready_timeout_s: float = 300.0
    queue_capacity: int = 20_000  # items per tier: the hard memory bound
    max_request_timeout_ms: float = 60_000.0  # cap on X-Request-Timeout-Ms
    max_body_bytes: int = 1_048_576
    max_input_chars: int = 10_000
    max_inputs: int = MAX_BATCH
    idempotency_ttl_s: float = 86_400.0
    idempotency_max_entries: int = 100_000
    log_level: str = "info"

    def __post_init__(self) -> None:
        validate_spec(self.model)
        _check(1 <= self.port <= 65535, f"port must be within 1..65535, got {self.port}")
        _check(self.workers >= 1, f"workers must be at least 1, got {self.workers}")
        _check(
            1 <= self.max_batch <= MAX_BATCH,
            f"max-batch must be within 1..{MAX_BATCH} (the contract's limit), "
            f"got {self.max_batch}",
        )
        _check(self.max_wait_ms >= 0, f"max-wait-ms must be >= 0, got {self.max_wait_ms}")
        _check(
            self.batch_latency_ms is None or self.batch_latency_ms >= 0,
            "batch-latency-ms must be >= 0",
        )
        _check(self.max_attempts >= 1, "max-attempts must be at least 1")
        _check(
            self.hang_timeout_ms is None or self.hang_timeout_ms > 0,
            "hang-timeout-ms must be > 0",
        )
        _check(self.queue_capacity >= 1, "queue-capacity must be at least 1")
        _check(self.max_request_timeout_ms > 0, "max-request-timeout-ms must be > 0")
        _check(self.max_body_bytes >= 1024, "max-body-bytes must be at least 1024")
        _check(self.max_input_chars >= 1, "max-input-chars must be at least 1")
        _check(1 <= self.max_inputs <= MAX_BATCH, f"max-inputs must be within 1..{MAX_BATCH}")
        _check(self.idempotency_ttl_s > 0, "idempotency-ttl-s must be > 0")
        _check(self.idempotency_max_entries >= 1, "idempotency-max-entries must be >= 1")
        _check(self.keys is None or self.keys.is_file(), f"keys file {self.keys} not found")

    @property
    def latency_floor(self) -> float:
        """Seconds every batch is padded to; emulates the contract's fixed GPU latency."""
        if self.batch_latency_ms is not None:
            return self.batch_latency_ms / 1000
        return 0.100 if self.model == "sim" else 0.0

    @property
    def hang_timeout(self) -> float:
        if self.hang_timeout_ms is not None:
            return self.hang_timeout_ms / 1000
        return max(10 * self.latency_floor, 5.0)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


__all__ = ["Settings"]
