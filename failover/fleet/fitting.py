"""Whether a catalogue can be placed on a pool: checked when it is read (start-up, SIGHUP,
the admin API) and asked when a request finds its version cold.

Placement (`failover.fleet.placement`) never takes a model's worker below its `min_workers`,
not even for another version of the same model, and a rollout loads its new default from the
old one's workers. So the workers beyond the sum of the models' `min_workers` (counted on the
pool's largest size) are the only ones that ever move. With none to spare, a model with
`min_workers = 0` never gets a worker, and a model's workers hold its default and nothing
else; a model capped at its floor (`max_workers = min_workers`) is held so whatever the pool.
A version that placement can never give a worker would be told "loading" for ever: such a
catalogue is refused when the version carries traffic (a default, a weight), and a request
naming such a version otherwise is refused at once (`failover.ModelUnplaceable`).
"""

from __future__ import annotations

import math
from typing import NoReturn

from batcher import VersionKey
from failover.fleet.catalogue import Catalogue, CatalogueError, ModelConfig


def unreachable(catalogue: Catalogue, most: int) -> dict[VersionKey, str]:
    """The live versions no placement can give a worker on a pool of at most `most`
    workers, each with the reason and what to change, in the catalogue's order."""
    live = [m for m in catalogue.models.values() if m.live()]
    floors = sum(m.min_workers for m in live)
    locked = (f"the models' min_workers ({', '.join(f'{m.name} {m.min_workers}' for m in live)})"
              f" hold all {most} of the pool's workers")
    fix = f"serve it on --workers {floors + 1} or more, or lower a min_workers"
    out: dict[VersionKey, str] = {}
    for m in live:
        held = m.default  # what a model's workers hold when none of them may move
        if floors < most and m.min_workers == 0:
            continue
        if m.min_workers == 0:
            why, held = f"{m.name} has min_workers 0 and {locked}: {fix}", ""
        elif floors >= most:
            why = f"{locked}, and {m.name}'s hold its default {m.default}: {fix}"
        elif m.max_workers == m.min_workers:
            why = (f"{m.name}'s max_workers equals its min_workers ({m.min_workers}), so its "
                   f"workers hold its default {m.default}: raise its max_workers")
        else:
            continue
        out.update((m.key(v), why) for v in m.live() if v != held)
    return out


def check_fits(catalogue: Catalogue, least: int, most: int | None = None) -> None:
    """Raise CatalogueError unless a pool of `least` to `most` workers (None: `least`) can
    start it (every model's min_workers, the first model's at least 1, resident at once,
    every worker given a model) and give a worker to every version that carries traffic."""
    most = least if most is None else most
    models = list(catalogue.models.values())
    floors = [max(m.min_workers, 1 if i == 0 else 0) for i, m in enumerate(models)]
    if sum(floors) > least:
        each = ", ".join(f"{m.name} {n}" for m, n in zip(models, floors, strict=True))
        _fail("models", f"min_workers add up to {sum(floors)} ({each}; the first model "
                        f"counts at least 1), more than the pool's {least} workers")
    caps = sum(math.inf if m.max_workers is None else m.max_workers for m in models)
    if caps < least:
        _fail("models", f"max_workers add up to {caps}, fewer than the pool's {least} "
                        "workers: some would hold no model")
    lost = unreachable(catalogue, most)
    for m in models:
        for short in _carrying(m):
            why = lost.get(m.key(short))
            if why is not None:
                where = "min_workers" if m.min_workers == 0 else f"weights.{short}"
                _fail(f"models.{m.name}.{where}", f"{m.key(short)} could never get a worker: "
                                                  f"{why}")


def _carrying(model: ModelConfig) -> list[str]:
    """The versions requests that name no version get: the weighted ones, and the default."""
    return [model.default, *(v for v, w in model.weights.items() if w > 0 and v != model.default)]


def _fail(path: str, why: str) -> NoReturn:
    raise CatalogueError(f"{path}: {why}")


__all__ = ["check_fits", "unreachable"]
