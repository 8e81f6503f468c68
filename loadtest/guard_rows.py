"""The rows of the guard-stage benchmark (`loadtest.bench_guards`) and each row's bound: the
same catalogue served by the real core over contract workers in virtual time
(`failover.sim`), so the bound is what the policy itself costs, with nothing else in the way.

A model ("topics", 100 ms batches) and a guard ("safety", 100 ms batches) each hold 2
workers of 4 (`min_workers` = `max_workers` = 2). The three-stage row runs the same guard
before and after the model, so the 4 workers stay the issue's: the guard takes both stages'
batches. In the half-refused row the guard refuses every odd input
(`loadtest.guard_models.refuse_odd`), so the model's batches show whether refused inputs
take slots in them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from api.config import Settings, load_keys
from api.door import core_settings
from batcher import Tier
from failover import CoreSettings
from failover.sim import Model, Outcome, Stream, World, constant, simulate
from loadtest.guard_models import REFUSED

ROOT = Path(__file__).resolve().parents[1]
KEYS = ROOT / "loadtest" / "reference-keys.toml"  # anonymous free tier, nothing refused
MODEL, GUARD = "topics", "safety"
BATCH_S = 0.1
EACH = 2  # workers per model
TIMEOUT_S = 10.0  # the free tier's timeout in KEYS


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    pre: bool = False
    post: bool = False
    parallel: bool = False
    refuse_half: bool = False

    @property
    def guards(self) -> tuple[tuple[str, ...], tuple[str, ...], str]:
        """The guarded model's pre, post and guard_mode, as the catalogue takes them."""
        return ((GUARD,) if self.pre else (), (GUARD,) if self.post else (),
                "parallel" if self.parallel else "sequential")


ROWS = (
    Row("model alone"),
    Row("pre+model seq", pre=True),
    Row("pre+model par", pre=True, parallel=True),
    Row("pre+model+post", pre=True, post=True),
    Row("half refused", pre=True, refuse_half=True),
)


def _allow(text: str) -> str:
    return "allow"


def _refuse_odd_sim(text: str) -> str:
    """The simulation's inputs are their counters in hex."""
    return REFUSED if int(text, 16) % 2 else "allow"


def catalogue_toml(row: Row, model_spec: str, guard_spec: str) -> str:
    """The models file a server serves `row` with."""
    pre, post, mode = row.guards
    lines = [f"[models.{MODEL}]", f"pre = {list(pre)!r}", f"post = {list(post)!r}",
             f"guard_mode = {mode!r}", f"min_workers = {EACH}",
             f"max_workers = {EACH}", f"[models.{MODEL}.versions.v1]",
             f"spec = {model_spec!r}", f"[models.{GUARD}]", f"min_workers = {EACH}",
             f"max_workers = {EACH}", f"[models.{GUARD}.versions.v1]",
             f"spec = {guard_spec!r}"]
    return "\n".join(lines).replace("'", '"') + "\n"


def core() -> CoreSettings:
    """The core settings `batchgate serve --keys KEYS --batch-latency-ms 100` builds."""
    return core_settings(Settings(batch_latency_ms=BATCH_S * 1e3), load_keys(KEYS).tiers)


def bound(row: Row, rate: float, duration_s: float, warmup_s: float = 3.0,
          seed: int = 1) -> Outcome:
    """`row` at `rate` requests/s (one input each, free tier) for `warmup_s + duration_s`
    of virtual time, the warm-up left out of the latencies."""
    pre, post, mode = row.guards
    models = (
        Model(MODEL, BATCH_S, min_workers=EACH, max_workers=EACH, pre=pre, post=post,
              guard_mode=mode),
        Model(GUARD, BATCH_S, min_workers=EACH, max_workers=EACH,
              verdict=_refuse_odd_sim if row.refuse_half else _allow),
    )
    stream = Stream(constant(rate), MODEL, Tier.FREE, timeout_s=TIMEOUT_S)
    return simulate(World((stream,), warmup_s + duration_s, core(), models, workers=2 * EACH,
                          measure_from=warmup_s, seed=seed))


def quantiles_ms(outcome: Outcome) -> tuple[float, float]:
    """P50 and P95 of the answered requests, in ms (nan with none)."""
    t = outcome.tally()
    return t.percentile(0.5) * 1e3, t.percentile(0.95) * 1e3


__all__ = ["BATCH_S", "EACH", "GUARD", "KEYS", "MODEL", "ROWS", "Row", "bound",
           "catalogue_toml", "core", "quantiles_ms"]
