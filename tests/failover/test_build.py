"""The core as `build_core` assembles it from its settings."""

from __future__ import annotations

from dataclasses import replace

from batcher import FlushPolicy, Item, ItemId, Tier
from failover import CoreSettings, build_core
from failover.build import longest_batch
from gpu_pool import WorkerId


def test_a_long_batch_may_take_half_of_what_the_top_budget_leaves_after_max_wait() -> None:
    # A paid item that waits for one such batch and runs in another is still in budget.
    settings = CoreSettings(budgets={Tier.PAID: 0.4, Tier.FREE: 0.25})
    assert longest_batch(settings) == (0.4 - 0.05) / 2


def test_a_budget_past_reach_asks_for_no_time() -> None:
    assert longest_batch(CoreSettings.unbounded(FlushPolicy(), 0.1, 10)) is None


class _Sink:
    def item_done(self, item: Item, result: str | BaseException) -> None:
        raise AssertionError("no item is answered here")


def _first_batch(fair_share: bool) -> str:
    """The accounts of the first batch a core built with weight a=3 cuts from two equal
    backlogs, a's queued first."""
    policy = FlushPolicy(max_batch=8, max_wait=0.05, idle_trigger=False)
    settings = replace(CoreSettings.unbounded(policy, 0.1, 1000), fair_share=fair_share,
                       weights={"a": 3.0})
    core = build_core(settings)
    core.worker_ready(WorkerId(0), 0.0)
    for n, account in enumerate("ab"):
        core.admit([Item(ItemId(100 * n + i), account, Tier.FREE, 0.0, 60.0, _Sink(),
                         caller=account) for i in range(50)], 60.0, 0.0)
    (send,) = core.poll(0.1).send
    return "".join(send.run.inputs)


def test_the_core_shares_a_tier_by_the_weights_it_is_built_with() -> None:
    assert _first_batch(fair_share=True).count("a") == 6  # 3 : 1
    assert _first_batch(fair_share=False) == "a" * 8  # first come, first served
