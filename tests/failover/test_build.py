"""The core as `build_core` assembles it from its settings."""

from __future__ import annotations

from batcher import FlushPolicy, Tier
from failover import CoreSettings
from failover.build import longest_batch


def test_a_long_batch_may_take_half_of_what_the_top_budget_leaves_after_max_wait() -> None:
    # A paid item that waits for one such batch and runs in another is still in budget.
    settings = CoreSettings(budgets={Tier.PAID: 0.4, Tier.FREE: 0.25})
    assert longest_batch(settings) == (0.4 - 0.05) / 2


def test_a_budget_past_reach_asks_for_no_time() -> None:
    assert longest_batch(CoreSettings.unbounded(FlushPolicy(), 0.1, 10)) is None
