"""What each tier is promised: rate limits, the admission budget and the default deadline.

Read from the keys file's `[tiers.paid]` / `[tiers.free]` tables; every field has a default.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from batcher import Tier


@dataclass(frozen=True, slots=True)
class TierPolicy:
    rate: float  # requests/s per key
    burst: float
    account_rate: float  # requests/s per account, all its keys together
    account_burst: float
    budget_ms: float  # admission: refuse when the expected completion exceeds this
    timeout_ms: float  # a request's deadline when it sends no X-Request-Timeout-Ms

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{f.name} must be a positive number, got {value!r}")


DEFAULT_TIERS = {
    Tier.PAID: TierPolicy(
        rate=5000, burst=10000, account_rate=10000, account_burst=20000, budget_ms=400,
        timeout_ms=5000,
    ),
    Tier.FREE: TierPolicy(
        rate=1500, burst=3000, account_rate=3000, account_burst=6000, budget_ms=250,
        timeout_ms=2000,
    ),
}


def tiers_from(table: dict[str, Any]) -> dict[Tier, TierPolicy]:
    """Overlay a keys file's `[tiers.*]` tables on the defaults; ValueError if malformed."""
    out = dict(DEFAULT_TIERS)
    names = {f.name for f in fields(TierPolicy)}
    for name, values in table.items():
        if name not in ("paid", "free") or not isinstance(values, dict):
            raise ValueError(f"unknown tier table [tiers.{name}]")
        unknown = set(values) - names
        if unknown:
            raise ValueError(f"[tiers.{name}] has unknown fields {sorted(unknown)}")
        tier = Tier[name.upper()]
        out[tier] = replace(out[tier], **values)
    return out


__all__ = ["DEFAULT_TIERS", "TierPolicy", "tiers_from"]
