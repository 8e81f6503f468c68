"""Groups: items that wait in the dispatch table to run again, ahead of new batches.

A batch whose worker died runs again whole (per tier), a failed one is halved until its
culprit runs alone, a stalled one is copied to another worker. Groups keep their items'
tier: the core lets a group run only when no better tier has work queued, and lets isolation
runs hold every worker but one, so that a query of death under investigation never takes
the whole pool.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from batcher import Item, Tier
from gpu_pool import BatchId


@dataclass(slots=True)
class Lineage:
    """Shared by every group bisected out of one failed batch: bounds the extra runs."""

    budget: int


class Rerun(enum.Enum):
    """Why a group runs again."""

    RETRY = "retry"  # its batch's worker died once: run it again, whole
    ISOLATE = "isolate"  # died twice, or a model error: halved until the culprit runs alone
    HEDGE = "hedge"  # its batch stalled: a second copy elsewhere, the first answer wins


@dataclass(slots=True)
class Group:
    """Items waiting in the table for a worker, ahead of new batches of their tier."""

    items: list[Item]
    kind: Rerun
    lineage: Lineage | None = None
    twin: BatchId | None = None  # a hedge: the batch it copies

    @property
    def tier(self) -> Tier:
        """The best tier among the items it would run now: a hedge whose paid items were
        cancelled is free work and waits behind queued paid work. An empty group counts as
        paid, so that it is reached (and dropped) at once."""
        return min((i.tier for i in self.live()), default=Tier.PAID)

    @property
    def killed(self) -> bool:
        """Its items killed a worker (rather than made the model raise)."""
        return any(i.attempts for i in self.items)

    def live(self) -> list[Item]:
        """The items still to run: a hedge's only while someone waits for them; a
        suspect's until it is answered or convicted."""
        if self.kind is Rerun.HEDGE:
            return [i for i in self.items if not i.done and not i.cancelled]
        return [i for i in self.items if not i.done]


__all__ = ["Group", "Lineage", "Rerun"]
