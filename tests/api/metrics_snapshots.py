"""Snapshots for the metrics' tests, made of a real core's and store's statistics."""

from __future__ import annotations

from typing import Any

from api.config import DEFAULT_TIERS, Settings
from api.door import core_settings
from api.kept import MemoryIdempotencyStore
from api.metrics import Snapshot
from failover import build_core


def snapshot(**fields: Any) -> Snapshot:
    """An idle service's snapshot, with `fields` in place of its own."""
    store = MemoryIdempotencyStore(ttl=60, max_entries=10)
    base: dict[str, Any] = {
        "core": build_core(core_settings(Settings(), DEFAULT_TIERS)).statistics(0.0),
        "workers": {"ready": 1}, "crashes": 0, "tier_gauges": {},
        "idempotency": store.statistics(),
    }
    return Snapshot(**{**base, **fields})
