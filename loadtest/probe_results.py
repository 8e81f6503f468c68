"""What one probe run measured: counts, latency percentiles, the generator's own lag."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LAG_BEHIND_S = 0.005  # p95 generator lag past this: the offered load was not offered


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (0.0 when empty)."""
    if not sorted_xs:
        return 0.0
    return sorted_xs[min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))]


@dataclass(frozen=True, slots=True)
class Latency:
    """Seconds: p50/p95/p99/max of `count` samples."""

    count: int = 0
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, samples: Sequence[float]) -> Latency:
        xs = sorted(samples)
        p50, p95, p99 = (percentile(xs, q) for q in (0.5, 0.95, 0.99))
        return cls(len(xs), p50, p95, p99, xs[-1] if xs else 0.0)


@dataclass(frozen=True, slots=True)
class ClassResult:
    sent: int
    ok: int
    wrong: int
    lost: int
    statuses: Mapping[int, int]
    latency: Latency  # correct answers
    refusal_latency: Latency = Latency()  # non-200 answers: refusals should be fast


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One run. `lost`: sent, never answered (timeout or connection error, by kind in
    `errors`); `shed`: never sent (max_in_flight); latencies of correct answers only."""

    offered_rps: float
    duration_s: float
    wall_s: float
    scheduled: int
    sent: int
    ok: int
    wrong: int
    lost: int
    shed: int
    statuses: Mapping[int, int]
    errors: Mapping[str, int]
    latency: Latency
    lag: Latency  # how late the generator reached each scheduled send
    achieved_rps: float  # correct answers per second, first to last
    conn_waits: int  # requests that found no free connection
    connections: int  # most connections open at once
    classes: Mapping[str, ClassResult]
    refusal_latency: Latency = Latency()  # non-200 answers, from the scheduled time

    @property
    def rejected(self) -> int:
        return sum(n for s, n in self.statuses.items() if s != 200)

    @property
    def generator_behind(self) -> bool:
        return self.lag.p95 > LAG_BEHIND_S


def _ms(lat: Latency) -> str:
    return f"p50 {lat.p50 * 1e3:.1f} p95 {lat.p95 * 1e3:.1f} p99 {lat.p99 * 1e3:.1f} ms"


def format_result(r: ProbeResult) -> str:
    """A few human lines; the generator's own lateness is always shown."""
    statuses = " ".join(f"{s}:{n}" for s, n in sorted(r.statuses.items())) or "-"
    errors = " ".join(f"{k}:{n}" for k, n in sorted(r.errors.items())) or "-"
    behind = "GENERATOR FELL BEHIND" if r.generator_behind else "generator kept up"
    lines = [
        f"offered {r.offered_rps:.0f} RPS x {r.duration_s:.1f} s: scheduled {r.scheduled}, "
        f"sent {r.sent}, ok {r.ok}, wrong {r.wrong}, lost {r.lost}, shed {r.shed}, "
        f"wall {r.wall_s:.1f} s",
        f"achieved {r.achieved_rps:.1f} RPS; latency {_ms(r.latency)} max "
        f"{r.latency.max * 1e3:.1f} ms; statuses {statuses}; errors {errors}"
        + (f"; refusals {_ms(r.refusal_latency)}" if r.refusal_latency.count else ""),
        f"{behind}: lag p95 {r.lag.p95 * 1e3:.2f} ms max {r.lag.max * 1e3:.1f} ms; "
        f"{r.connections} connections, {r.conn_waits} waits for one",
    ]
    if len(r.classes) > 1:
        lines += [f"  {name}: sent {c.sent} ok {c.ok} wrong {c.wrong} lost {c.lost} "
                  f"{_ms(c.latency)}" for name, c in r.classes.items()]
    return "\n".join(lines)


__all__ = ["LAG_BEHIND_S", "ClassResult", "Latency", "ProbeResult", "format_result", "percentile"]
