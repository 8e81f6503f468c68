"""`batchgate_account_batch_slots_total`: each account's share of the batch slots, from the
queues' own count (no metric object in the core), summed over a model's cores."""

from __future__ import annotations

from dataclasses import replace

from api.config import ANONYMOUS_ACCOUNT
from api.metrics import Metrics
from api.metrics.gauges import NO_ACCOUNT
from failover import CoreStatistics
from loadtest.server import parse_metrics
from tests.api.metrics_snapshots import snapshot

SLOTS = "batchgate_account_batch_slots_total"


def with_slots(*parts: dict[tuple[str, str | None], int]) -> CoreStatistics:
    base = snapshot().core
    return CoreStatistics.merged([replace(base, batcher=replace(base.batcher, slots=slots))
                                  for slots in parts])


def test_each_accounts_slots_are_shown_by_tier_summed_over_cores() -> None:
    core = with_slots({("paid", "acme"): 30, ("free", None): 2},
                      {("paid", "acme"): 12, ("free", "hobby"): 7})
    metrics = Metrics()
    metrics.watch(lambda: snapshot(core=core))
    shown = parse_metrics(metrics.render().decode())
    assert shown[f'{SLOTS}{{account="acme",tier="paid"}}'] == 42
    assert shown[f'{SLOTS}{{account="hobby",tier="free"}}'] == 7
    assert shown[f'{SLOTS}{{account="anonymous",tier="free"}}'] == 2


def test_an_item_of_no_account_is_counted_as_the_keys_anonymous_account() -> None:
    assert NO_ACCOUNT == ANONYMOUS_ACCOUNT
