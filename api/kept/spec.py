"""What a durable layer is built from (frozen, validated records that `api/` fills from
`--state` and the idempotency flags); `api.kept.opening` builds the layer from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SqliteSettings:
    path: Path
    ttl: float  # seconds an answer is kept
    max_entries: int
    max_bytes: int
    lock_wait: float = 5.0  # seconds to wait for the lock of a server that is exiting

    def __post_init__(self) -> None:
        if not self.ttl > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {self.ttl}")
        if self.max_entries < 1 or self.max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be at least 1")


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a claim: the cell (the same across its core's restarts) and the
    incarnation of its core process (one more at each restart)."""

    cell: str
    incarnation: int = 0

    def __post_init__(self) -> None:
        if not self.cell or ":" in self.cell:
            raise ValueError(f"a cell id must be non-empty, without ':', got {self.cell!r}")
        if self.incarnation < 0:
            raise ValueError(f"an incarnation must be >= 0, got {self.incarnation}")


@dataclass(frozen=True, slots=True)
class RedisSettings:
    host: str
    port: int
    db: int
    owner: Owner
    ttl: float  # seconds an answer is kept
    timeout: float = 0.5  # to connect, and for each call
    max_connections: int = 64

    def __post_init__(self) -> None:
        if not self.ttl > 0 or not self.timeout > 0:
            raise ValueError("ttl and timeout must be > 0 seconds")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")


__all__ = ["Owner", "RedisSettings", "SqliteSettings"]
