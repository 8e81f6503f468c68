"""A worker's memory and its bound: a worker whose resident set has grown past
`--worker-max-rss-mb` (a model that leaks) is replaced between batches, before the kernel's
OOM killer ends it mid-batch or the host runs out.

The resident set is read from the kernel (`/proc/<pid>/statm`, Linux): the worker is not
asked, so a worker too far gone to answer is measured all the same, and the read costs
the parent a few microseconds per batch, only while a bound is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MIB = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int) -> int | None:
    """The resident set of process `pid` in bytes; None where the kernel does not say (no
    /proc, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class MemoryBound:
    """The most a worker may hold resident, in MiB (None: no bound)."""

    max_rss_mb: int | None = None

    def __post_init__(self) -> None:
        if self.max_rss_mb is not None and self.max_rss_mb < 1:
            raise ValueError(f"the worker memory bound must be at least 1 MiB, got "
                             f"{self.max_rss_mb}")

    def exceeded(self, rss: int | None) -> bool:
        """Whether a worker holding `rss` bytes (None: unknown) must be replaced: only
        past the bound, never when there is none or the size is unknown."""
        return self.max_rss_mb is not None and rss is not None and rss > self.max_rss_mb * MIB


__all__ = ["MIB", "MemoryBound", "resident_bytes"]
