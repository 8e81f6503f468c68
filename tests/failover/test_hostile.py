"""Hostile inputs against the dispatch core, in exact virtual time (issue 28, items 2-5):
an input that hangs every worker it meets, isolation runs that would jump the paid queue,
a killer whose client leaves before it is caught, and a caller who keeps sending fresh
killers."""

from __future__ import annotations

import pytest

from batcher import FlushPolicy, Item, ItemId, Tier
from failover import CoreSettings, QueryOfDeath, build_core
from failover.errors import CallerRefused, SuspectInput
from gpu_pool import Err, WorkerId
from tests.failover.test_core import HANG, HEDGE, MAX_WAIT, CoreMachine, _Draw


def sent(m: CoreMachine) -> dict[WorkerId, tuple[str, ...]]:
    return {w: f.run.inputs for w, f in m.m.flights.items()}


def item(m: CoreMachine, name: str, tier: Tier = Tier.FREE, caller: str = "mallory") -> Item:
    """An item whose text is `name:<id>`, as the machine's items are."""
    m.next_id += 1
    ident = ItemId(1000 + m.next_id)
    it = Item(ident, f"{name}:{ident}", tier, m.now, m.now + 5.0, m, caller=caller)
    m.items[it.id] = it
    return it


@pytest.mark.parametrize("tier", [Tier.PAID, Tier.FREE])
def test_an_input_that_stalls_its_batch_and_then_its_hedge_is_a_query_of_death(
        tier: Tier) -> None:
    m = CoreMachine()
    for _ in range(3):
        m.worker_up()
    m.admit(tier, 1, 5.0)  # r:0 hangs whatever worker runs it
    m.advance(MAX_WAIT)
    m.advance(MAX_WAIT + HEDGE)  # stalled: its hedge takes another worker (a third is left)
    assert sorted(sent(m).values()) == [("r:0",), ("r:0",)]
    m.advance(MAX_WAIT + 2 * HEDGE)  # the hedge stalls too: both killed, long before HANG
    assert MAX_WAIT + 2 * HEDGE < HANG and not m.m.flights and len(m.up) == 1
    (result,) = m.m.settled[0]
    assert isinstance(result, QueryOfDeath)
    with pytest.raises(QueryOfDeath):  # refused on sight from now on
        m.core.admit([Item(ItemId(99), "r:0", Tier.PAID, m.now, m.now + 5.0, m)], 5.0, m.now)


def test_a_free_input_that_hangs_never_holds_both_workers_of_two() -> None:
    m = CoreMachine()
    m.worker_up()
    m.worker_up()
    m.admit(Tier.FREE, 1, 5.0)  # r:0 hangs
    m.advance(MAX_WAIT + HEDGE + 0.01)  # stalled, but not hedged on the last free worker
    assert list(sent(m).values()) == [("r:0",)]
    m.admit(Tier.PAID, 1, 5.0)  # r:1: the other worker serves it
    m.advance(m.now + MAX_WAIT)
    assert sorted(sent(m).values()) == [("r:0",), ("r:1",)]
    m.reply(_Draw(next(w for w, i in sent(m).items() if i == ("r:1",))), "ok")
    m.advance(MAX_WAIT + HANG)  # the hung worker is killed; its input waits for a spare one
    assert not m.m.flights and len(m.up) == 1
    m.worker_up()  # now it runs again, alone, on one of two
    assert list(sent(m).values()) == [("r:0",)]
    m.advance(m.now + HEDGE)  # a suspect that stalls again is killed at once, and convicted
    (result,) = m.m.settled[0]
    assert isinstance(result, QueryOfDeath) and len(m.up) == 1


def test_a_batch_whose_requests_all_left_is_not_hedged() -> None:
    m = CoreMachine()
    m.worker_up()
    m.worker_up()
    m.admit(Tier.FREE, 1, 5.0)
    m.advance(MAX_WAIT)
    m.cancel(_Draw(m.requests[0]))
    m.advance(MAX_WAIT + HEDGE + 0.01)
    assert len(m.m.flights) == 1 and m.core.statistics(m.now).table.hedges == 0


def test_isolation_runs_keep_their_tier_behind_queued_paid_work() -> None:
    m = CoreMachine()
    m.worker_up()
    m.admit(Tier.FREE, 2, 5.0)  # r:0, r:1: the model raises on the batch
    m.advance(MAX_WAIT)
    m.admit(Tier.PAID, 1, 5.0)  # r:2 queued while they run
    (worker,) = m.m.flights
    run = m.m.flights.pop(worker).run
    m.perform(m.core.reply(worker, Err(run.batch_id, "model", "ValueError", "no"), m.now,
                           m.now))
    m.advance(m.now + MAX_WAIT)  # the paid item's flush: before the free halves
    assert sent(m) == {worker: ("r:2",)}


def test_a_killer_whose_client_left_is_still_run_alone_and_convicted() -> None:
    """One worker: the backoff outgrows a free deadline, and isolation finishes anyway."""
    m = CoreMachine()
    m.worker_up()
    killer, innocent = item(m, "kill"), item(m, "fine", Tier.PAID, caller="alice")
    m.core.admit([killer], 5.0, m.now)
    m.core.admit([innocent], 5.0, m.now)
    m.advance(MAX_WAIT)
    (worker,) = m.m.flights
    m.died(worker)  # the batch of both kills its worker
    killer.cancelled = True  # the killer's client gives up meanwhile
    m.worker_up()
    while m.m.flights:  # each runs again in its tier: the killer kills, the innocent not
        (worker,) = m.m.flights
        if sent(m)[worker] == (killer.text,):
            m.died(worker)
            m.worker_up()
        else:
            m.reply(_Draw(worker), "ok")
    assert isinstance(m.m.settled[killer.id][0], QueryOfDeath)
    assert m.m.settled[innocent.id] == [innocent.text[::-1]]


def test_a_caller_whose_fresh_inputs_keep_killing_workers_is_refused_for_a_while() -> None:
    m = CoreMachine()
    m.worker_up()
    for n in range(2):  # two fresh killers, each convicted run alone
        killer = item(m, f"kill-{n}")
        m.core.admit([killer], 5.0, m.now)
        m.advance(m.now + MAX_WAIT)
        killed = []
        while killer.id not in m.m.settled:
            (worker,) = m.m.flights
            killed.append(worker)
            m.died(worker)
            m.worker_up()
        assert isinstance(m.m.settled[killer.id][0], QueryOfDeath)
        assert m.m.forgiven[-2:] == killed  # no slot's backoff pays for its deaths
    with pytest.raises(CallerRefused) as refused:
        m.core.admit([item(m, "anything")], 5.0, m.now)
    assert refused.value.retry_after > 0
    m.core.admit([item(m, "anything", caller="alice")], 5.0, m.now)  # others are served


def test_isolation_leaves_one_worker_of_two_to_everyone_else() -> None:
    m = CoreMachine()
    m.worker_up()
    m.worker_up()
    killer, mate = item(m, "kill", Tier.PAID), item(m, "mate", Tier.PAID)
    m.core.admit([killer, mate], 5.0, m.now)
    m.advance(MAX_WAIT)
    (worker,) = m.m.flights
    m.died(worker)  # a paid re-run of the whole batch takes the other worker at once
    (worker,) = m.m.flights
    m.died(worker)  # died twice: isolation runs wait for a worker the pool can spare
    m.worker_up()
    assert not m.m.flights
    m.admit(Tier.PAID, 1, 5.0)
    m.advance(m.now + MAX_WAIT)
    assert list(sent(m).values()) == [(f"r:{m.next_id - 1}",)]  # the paid item got it
    m.worker_up()
    assert len(m.m.flights) == 2  # the second worker runs an isolation group
    m.reply(_Draw(next(w for w, i in sent(m).items() if i[0].startswith("r:"))), "ok")
    assert len(m.m.flights) == 1  # and the freed worker is not given to the other group


def test_an_input_is_suspected_only_while_it_is_judged() -> None:
    """Sent again while its batch's fate is open, an input is refused; once its re-run is
    answered, it is served again."""
    m = CoreMachine()
    m.worker_up()
    m.worker_up()
    a, b = item(m, "a", Tier.PAID), item(m, "b", Tier.PAID)
    m.core.admit([a, b], 5.0, m.now)
    m.advance(MAX_WAIT)
    (worker,) = m.m.flights
    m.died(worker)  # a paid re-run goes at once to the other worker
    with pytest.raises(SuspectInput):
        m.core.admit([Item(ItemId(98), a.text, Tier.PAID, m.now, m.now + 5.0, m)], 5.0, m.now)
    (worker,) = m.m.flights
    m.reply(_Draw(worker), "ok")
    assert m.m.settled[a.id] == [a.text[::-1]]
    m.core.admit([Item(ItemId(99), a.text, Tier.PAID, m.now, m.now + 5.0, m)], 5.0, m.now)


def test_a_queue_holding_a_batchs_worth_of_characters_is_cut_at_once() -> None:
    core = build_core(CoreSettings(
        budgets={Tier.PAID: 5.0, Tier.FREE: 5.0},
        policy=FlushPolicy(max_batch=100, max_wait=MAX_WAIT, max_batch_chars=10),
        queue_capacity=40, initial_latency=0.1))
    m = CoreMachine()
    core.worker_ready(WorkerId(1), 0.0)
    core.worker_ready(WorkerId(2), 0.0)
    assert core.poll(0.0).send == []
    first = Item(ItemId(1), "abcd", Tier.PAID, 0.0, 5.0, m)
    core.admit([first], 5.0, 0.0)
    core.poll(0.0)  # the first arrival goes at once to an idle worker
    core.admit([Item(ItemId(2), "ab", Tier.PAID, 0.0, 5.0, m)], 5.0, 0.0)
    assert core.poll(0.0).send == []  # one worker idle: it waits for a fuller batch
    turn = core.admit([Item(ItemId(3), "x" * 12, Tier.PAID, 0.001, 5.0, m)], 5.0, 0.001)
    assert turn  # a batch's worth of characters is waiting: the owner takes a turn now
    assert [s.run.inputs for s in core.poll(0.001).send] == [("ab",)]  # the cap: one more
