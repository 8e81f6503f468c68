"""What one simulated run measured: per stream what its callers saw, the pool's figures,
placement's loads and the scaling rule's events, and what the run cost to compute."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from batcher import Tier, VersionKey
from failover.sim.meter import Figures
from failover.sim.record import Tally


@dataclass(frozen=True, slots=True)
class Outcome:
    """Plain data (it crosses a process boundary when runs go in parallel)."""

    streams: tuple[tuple[str, Tier], ...]  # per stream: the model it calls, its tier
    tallies: tuple[Tally, ...]  # per stream, in the same order
    duration_s: float
    pool: Figures
    loads: dict[tuple[VersionKey, str], int]  # placement's switches: (version, reason) -> count
    scaling: dict[tuple[str, str], int]  # the rule's events: (direction, reason) -> count
    events: int  # requests offered and pool events handled
    wall_s: float  # seconds of real time the run took
    fill: dict[str, float] = field(default_factory=dict)  # per model: mean inputs a batch

    def tally(self, tier: Tier | None = None, model: str | None = None) -> Tally:
        """The streams of `tier` for `model` (None: any), merged."""
        return Tally.merged(t for (m, k), t in zip(self.streams, self.tallies, strict=True)
                            if (tier is None or k is tier) and (model is None or m == model))

    @property
    def offered(self) -> int:
        return sum(t.offered for t in self.tallies)

    @property
    def loads_total(self) -> int:
        return sum(self.loads.values())

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else math.inf

    def describe(self, tiers: Sequence[Tier] = tuple(Tier)) -> str:
        """A few lines for a person: per tier, then the pool."""
        lines = []
        for tier in tiers:
            t = self.tally(tier)
            if not t.offered:
                continue
            lines.append(
                f"{tier.label}: {t.offered:,} offered, {t.answered:,} answered "
                f"(P50 {ms(t.percentile(0.5))} / P95 {ms(t.percentile(0.95))} / P99 "
                f"{ms(t.percentile(0.99))} ms), refused {dict(t.refused)}, failed "
                f"{dict(t.failed)}, unanswered {t.unanswered}")
        p = self.pool
        lines.append(f"pool: {p.gpu_s:,.0f} GPU-s, peak {p.peak}, starts/stops "
                     f"{p.started}/{p.stopped}, switches {p.switches}, crashes {p.crashes}, "
                     f"{p.batches:,} batches (fill {p.fill:.1f})")
        lines.append(f"{self.events:,} events in {self.wall_s:.2f} s "
                     f"({self.events_per_s:,.0f} events/s)")
        return "\n".join(lines)


def ms(seconds: float) -> str:
    """Milliseconds, whole; "-" for nan (no latency)."""
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.0f}"


__all__ = ["Outcome", "ms"]
